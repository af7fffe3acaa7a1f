"""SIGINT and SIGTERM -> a clean stop: the running cells stopped and recorded, then Stopped raised."""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

__all__ = ["Stopped", "stop_on_signals"]


class Stopped(KeyboardInterrupt):
    """The run was stopped by SIGINT (Ctrl-C) or SIGTERM (`kill`, a job scheduler): the running cell's
    worker was stopped and recorded as interrupted; `results_path` holds what finished."""

    def __init__(self, signum: int, results_path: Path | None = None):
        super().__init__(signum)
        self.signum, self.results_path = signum, results_path

    @property
    def signame(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended: 130, 143."""
        return 128 + self.signum

    @property
    def reason(self) -> str:
        return "stopped by the user (SIGINT)" if self.signum == signal.SIGINT else f"stopped by {self.signame}"


_stopping: list[int] = []  # while stop_on_signals() is active: the signal that stopped the run, once one did
_active = False


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM stops a run the way Ctrl-C does: the first SIGINT or SIGTERM raises Stopped where the
    run is, so the worker is stopped, the cell recorded and the report written; repeats while that
    cleanup runs are ignored (it is bounded; SIGKILL still ends everything). Nests: the outermost wins."""
    global _active
    if _active or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        if not _stopping:
            _stopping.append(signum)
            raise Stopped(signum)

    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in old:
        signal.signal(sig, handler)
    _active = True
    _stopping.clear()
    try:
        yield
    finally:
        _active = False
        for sig, h in old.items():
            signal.signal(sig, h)
