"""The worker plane: one fresh process per cell attempt (one per rank), importing the heavy stack.

Entry point: `python -m bench.worker --spec SPEC.json` (written by bench.launch)."""
