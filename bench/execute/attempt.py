"""One attempt of one cell's end as a record: the Outcome its job (bench.execute.executors.executor.Job) came back with,
or how the job failed. Shared by the run (bench.execute.session, whichever executor ran the job) and
selfcheck (which runs it here). Whatever happens, a Record comes back, except for zerobench's own failure
to write its files (HarnessError), which stops the run.
"""

from __future__ import annotations

import datetime as dt
import errno
import traceback

from ..matrix.cells import Cell
from ..records.record import Record
from .executors.executor import Job
from .executors.replay import Replayed
from .launch import Launch

__all__ = ["HarnessError", "now", "attempt", "ended"]

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


def attempt(started: Record, cell: Cell, ds_config: dict | None, how: Launch, variant: str | None = None) -> Record:
    """Run the attempt that `started` opened here, in this thread, on how.gpus, and return its outcome record
    (selfcheck). A stop is raised again."""
    job = Job(cell, ds_config, how)
    try:
        out = job(how.gpus)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - a bug of ours in one cell must not lose the others
        return ended(started, job, error=e, tb=traceback.format_exc(), variant=variant)
    return ended(started, job, value=out, variant=variant)


def ended(
    started: Record, job: Job, *, value=None, error: BaseException | None = None, tb: str = "",
    variant: str | None = None,
) -> Record:  # fmt: skip
    """The record an attempt's end makes, wherever its job ran: the launcher's Outcome (value) as it
    classified it; interrupted for a stop (a KeyboardInterrupt: Ctrl-C, SIGTERM, a halt); an error record
    when zerobench itself failed around the cell. An OSError writing zerobench's own files is not the cell's
    outcome: it is raised as HarnessError."""
    log = str(job.launch.log_path)
    if isinstance(value, Replayed):
        return Record.replayed(started, value.record, source=value.source, reused=value.reused, ended_at=now())
    if error is None:
        try:
            # Inside the try: a record that cannot be built is an error record, not a lost run.
            return Record.from_outcome(
                started, value, ds_config=job.ds_config, log=log, ended_at=now(), variant=variant,
                beside=value.beside,
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001
            error, tb = e, traceback.format_exc()
    if isinstance(error, KeyboardInterrupt):
        reason = getattr(error, "reason", None) or "stopped by the user"  # Stopped, Halted: theirs
        return Record.interrupted(started, reason, ended_at=now(), log=log)
    if isinstance(error, OSError) and error.errno in HARNESS_ERRNOS:
        raise HarnessError(job.cell, error) from error
    return Record.error(
        started,
        f"zerobench failed around this cell: {type(error).__name__}: {error}",
        ended_at=now(),
        traceback=tb[-6000:],
        log=log,
    )
