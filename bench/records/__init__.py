"""What a run writes: the record, its status, the append-only store, a measurement's quality."""
