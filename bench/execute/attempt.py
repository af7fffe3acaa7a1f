"""One attempt of one cell: its worker run to its end (bench.execute.launch), and the record of that end.

Shared by the run (bench.execute.session) and selfcheck. Whatever happens, a Record comes back: the
outcome the launcher classified, or an error record when zerobench itself failed around the cell. A stop
(KeyboardInterrupt: Ctrl-C, SIGTERM, a pool's halt) is raised again once the worker is stopped.
"""

from __future__ import annotations

import datetime as dt
import errno
import time
import traceback
from pathlib import Path

from ..cells import Cell
from ..record import Record
from . import launch
from .local import Lane

__all__ = ["HarnessError", "now", "attempt"]

# Errors writing zerobench's own files (the log, the attempt folder, the spec): the harness's, not the cell's.
HARNESS_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EFBIG}


class HarnessError(RuntimeError):
    """zerobench could not do its own part of an attempt (its files could not be written): not the cell's
    outcome. The run stops; the cell has no outcome, so --resume runs it again."""

    results_path = None  # set by the session that stops on it

    def __init__(self, cell: Cell | None, err: OSError):
        where = f" ({err.filename})" if err.filename else ""
        what = f" for {cell.name}" if cell is not None else ""
        super().__init__(f"zerobench could not write its own files{what}{where}: {err.strerror}")
        self.cell, self.err = cell, err


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def attempt(
    started: Record,
    cell: Cell,
    ds_config: dict | None,
    *,
    log_path: Path,
    gpus: list[int] | None,
    lane: Lane | None = None,
    variant: str | None = None,
    **launch_kw,
) -> Record:
    """Run the attempt that `started` opened and return its outcome record. lane: where a pool placed it
    (its stop request, and the neighbours whose measured phases overlapped its own); launch_kw go to
    launch.run_cell (stall_s, extra_env, sample_interval_s, module)."""
    try:
        token = lane.neighbours.enter(cell.hash, time.time()) if lane else None
        try:
            out = launch.run_cell(
                cell, ds_config, log_path=log_path, gpus=gpus, stop=lane.stop if lane else None, **launch_kw
            )
        finally:
            if lane:
                lane.neighbours.leave(token, time.time())
        beside = lane.neighbours.during(token, *out.window) if lane and out.window else None
        # Inside the try: a record that cannot be built is an error record, not a lost run
        # (seen on the H200: GPU-indexed figures the record model once refused).
        return Record.from_outcome(
            started, out, ds_config=ds_config, log=str(log_path), ended_at=now(), variant=variant, beside=beside
        )
    except OSError as e:
        if e.errno in HARNESS_ERRNOS:
            raise HarnessError(cell, e) from e
        return _error(started, e, log_path)
    except Exception as e:  # noqa: BLE001 - a bug of ours in one cell must not lose the others
        return _error(started, e, log_path)


def _error(started: Record, e: Exception, log_path: Path) -> Record:
    return Record.error(
        started,
        f"zerobench failed around this cell: {type(e).__name__}: {e}",
        ended_at=now(),
        traceback=traceback.format_exc()[-6000:],
        log=str(log_path),
    )
