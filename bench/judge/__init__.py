"""What the records mean: results tables, comparisons, knob effects, blocks and anchors."""
