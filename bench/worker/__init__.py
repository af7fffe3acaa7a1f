"""The worker plane: one fresh process per cell attempt (one per rank), importing the heavy stack.

Entry point: `python -m bench.worker --spec SPEC.json` (written by bench.execute.launch); beside it, the
hand-written yardstick loop of `zerobench selfcheck`: `python -m bench.worker.reference --spec SPEC.json`."""
