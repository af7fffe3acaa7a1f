"""How a cell attempt ended. Failures are values that travel in every record, never exceptions."""

from __future__ import annotations

import enum

__all__ = ["Status"]


class Status(str, enum.Enum):
    OK = "ok"
    SKIPPED = "skipped"  # a rule says this combination cannot run here; the reason says what to change
    CUDA_OOM = "cuda_oom"  # the GPU allocator ran out; the record carries the allocator state
    HOST_OOM = "host_oom"  # the kernel's OOM killer stopped the worker: an OOM kill or RSS at the limit was seen
    # Not run: a cell needing no more memory in every respect ran out (bench.schedule); the record names it.
    IMPLIED_OOM = "implied_oom"
    KILLED = "killed"  # SIGKILLed from outside zerobench with no evidence of an OOM kill; --resume runs it again
    TIMEOUT = "timeout"  # wall-clock limit or no-progress watchdog
    DIVERGED = "diverged"  # NaN/inf loss
    ERROR = "error"  # anything else; the reason carries the exception and the log tail
    INTERRUPTED = "interrupted"  # the orchestrator was stopped while the cell ran
    STARTED = "started"  # not an outcome: written before launch so a killed run can be detected

    @property
    def is_outcome(self) -> bool:
        """A terminal record: the cell does not need to run again on --resume."""
        return self not in (Status.STARTED, Status.INTERRUPTED, Status.KILLED)

    @property
    def ran(self) -> bool:
        """The worker started training (as opposed to a skip decided before launch)."""
        return self not in (Status.SKIPPED, Status.STARTED, Status.IMPLIED_OOM)

    def __str__(self) -> str:  # so f-strings print "ok", not "Status.OK"
        return self.value
