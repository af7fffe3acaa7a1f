"""How a cell attempt ended. Failures are values that travel in every record, never exceptions."""

from __future__ import annotations

import enum

__all__ = ["Status", "MEANINGS"]


class Status(str, enum.Enum):
    OK = "ok"
    SKIPPED = "skipped"
    CUDA_OOM = "cuda_oom"
    HOST_OOM = "host_oom"
    IMPLIED_OOM = "implied_oom"
    KILLED = "killed"
    TIMEOUT = "timeout"
    DIVERGED = "diverged"
    ERROR = "error"
    INTERRUPTED = "interrupted"
    UNMEASURED = "unmeasured"
    STARTED = "started"

    @property
    def meaning(self) -> str:
        """What a record with this status says (the results reference, docs/results.md, prints it)."""
        return MEANINGS[self]

    @property
    def is_outcome(self) -> bool:
        """A terminal record: the cell does not need to run again on --resume. A skip is none: it was the plan's
        judgement, not an attempt, and --resume judges the cell again under its own plan."""
        return self not in (Status.STARTED, Status.INTERRUPTED, Status.KILLED, Status.UNMEASURED, Status.SKIPPED)

    @property
    def ran(self) -> bool:
        """The worker started training (as opposed to a skip decided before launch)."""
        return self not in (Status.SKIPPED, Status.STARTED, Status.IMPLIED_OOM, Status.UNMEASURED)

    def __str__(self) -> str:  # so f-strings print "ok", not "Status.OK"
        return self.value


MEANINGS = {
    Status.OK: "The cell ran its warmup and measured steps; its metrics and memory are measurements.",
    Status.SKIPPED: "Not run: a rule says this combination cannot run here, or the memory model predicts it "
    "does not fit (rule predicted-oom); the reason says why, what to change and the source. Not an outcome: "
    "--resume judges the cell again under its own rules and memory model, runs it if they let it run, and writes "
    "another skip only when its reason changes.",
    Status.CUDA_OOM: "The GPU allocator ran out of memory; the record carries the allocator's state at the failure.",
    Status.HOST_OOM: "The kernel's OOM killer stopped the worker: an OOM kill was counted, or the worker's RSS was "
    "at the memory limit; or Slurm ended its job for memory.",
    Status.IMPLIED_OOM: "Not run: a cell that needs no more memory in every respect ran out (bench.execute.schedule); "
    "implied_by names it. An outcome for --resume, never a measurement.",
    Status.KILLED: "SIGKILLed from outside zerobench with no evidence of an OOM kill, or its Slurm job's node failed; "
    "--resume runs it again.",
    Status.TIMEOUT: "The cell's wall-clock limit (timeout_s), the no-progress watchdog, or its Slurm job's time "
    "limit ended it.",
    Status.DIVERGED: "The loss became NaN or infinite.",
    Status.ERROR: "Anything else; the reason carries the exception, the traceback and the log's tail.",
    Status.INTERRUPTED: "The orchestrator was stopped (Ctrl-C, SIGTERM) while the cell ran, or its Slurm job was "
    "preempted or cancelled; --resume runs it again.",
    Status.UNMEASURED: "Not run: answer mode (run --answer) settled the answer without it, its --budget ran out "
    "while it could still change the answer, a resumed call found its --budget spent before it could measure "
    "anything, or it was expected to repeat an error that cells with its settings ended in; the record's answer "
    "note says which, with its predicted figures. Not an outcome: a run without "
    "--answer (or --resume) measures it.",
    Status.STARTED: "Not an outcome: written before the launch, so a run killed mid-cell is found by --resume.",
}
