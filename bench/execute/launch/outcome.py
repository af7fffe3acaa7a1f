"""How a cell attempt ended, from its exit code, result documents and log tail: the one classifier."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

from ... import hostmem
from ...cells import Cell
from ...status import Status

# Worse outcomes win when ranks disagree.
_SEVERITY = [
    Status.OK,
    Status.DIVERGED,
    Status.ERROR,
    Status.TIMEOUT,
    Status.CUDA_OOM,
    Status.HOST_OOM,
    Status.KILLED,
    Status.INTERRUPTED,
]
_CUDA_OOM_RE = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")
_SIGKILL_RE = re.compile(r"Signal 9 \(SIGKILL\)|exitcode\s*:\s*-9|Killed\b")


@dataclass
class Outcome:
    status: Status
    reason: str
    ranks: list[dict] = field(default_factory=list)  # the worker's result documents, by rank
    telemetry: dict = field(default_factory=dict)
    exit_code: int | None = None
    wall_s: float = 0.0
    log_tail: str = ""
    phase_at_end: str | None = None
    last_step: int | None = None
    gpu_before: dict = field(default_factory=dict)
    gpu_after: dict = field(default_factory=dict)
    started_by: dict = field(default_factory=dict)  # {"mode": "fork"|"spawn", "why": ...}: how the worker began
    fault: str | None = None  # ZEROBENCH_FAULT as passed to the worker (tests only)
    oom_evidence: str | None = None  # an OOM kill counted while the cell ran (bench.hostmem), in words
    warnings: list[str] = field(default_factory=list)  # what makes the measurement less clean (record.warnings)
    port: int | None = None  # the rendezvous port of the last launch
    # Wall-clock [start, end) of the measured phase, else of the whole launch: when neighbours count.
    window: tuple[float, float] | None = None


def _where(o: Outcome) -> str:
    s = f"phase {o.phase_at_end or 'start'}"
    return s + (f", after step {o.last_step}" if o.last_step is not None else "")


# A rank's error that another rank's end caused: its peer closed the connection (it died, or stopped
# after its own failure). It says nothing about the cell; the peer's end does.
_COLLATERAL_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|communicator was aborted"
    r"|remote process exited|NCCL Error 6|Socket closed|recvBytes|sendBytes"
)


def _collateral(d: dict) -> bool:
    # An error with no reason is a rank stopped while it was writing one: it cannot be the cause.
    reason = d.get("reason", "")
    return d.get("status") == Status.ERROR.value and (not reason or bool(_COLLATERAL_RE.search(reason)))


def _classify(o: Outcome, killed_for: str | None, cell: Cell) -> tuple[Status, str]:
    if killed_for == "timeout":
        return Status.TIMEOUT, f"ran past the {cell.timeout_s:g} s limit ({_where(o)})"
    if killed_for == "stall":
        return Status.TIMEOUT, f"no progress for too long ({_where(o)}): a hung collective or a stuck rank"
    if killed_for == "interrupt":
        return Status.INTERRUPTED, f"stopped by the user ({_where(o)})"
    ranks = o.ranks
    failed = [d for d in ranks if d.get("status") != Status.OK.value]
    if failed:
        # The cell ended the way its first failing rank did, by time: when one rank fails, the others
        # fail after it, of it. torchrun stops them with SIGTERM ("interrupted": we did not interrupt,
        # killed_for is None here), or their next collective finds the connection closed. Neither is
        # the cause. A rank that died without a document (killed, exited) shows in the exit code and log.
        victims = (
            [d for d in failed if d.get("status") == Status.INTERRUPTED.value or _collateral(d)]
            if cell.gpus > 1
            else []
        )
        causes = [d for d in failed if d not in victims]
        if not causes:
            st, reason = _classify_without_result(o)
            if st is Status.ERROR and not _torchrun_root_cause(o.log_tail) and (o.exit_code or 0) >= 0:
                first = min(victims, key=lambda d: d.get("t_end") or float("inf"))
                # No other end to blame: the connection failure is what is known.
                if _collateral(first) and first.get("reason"):
                    st, reason = Status.ERROR, f"rank {first.get('rank')}: {first.get('reason', '')}"
            return st, reason
        first = min(
            causes,
            key=lambda d: (d.get("t_end") or float("inf"), -_SEVERITY.index(Status(d.get("status", "error")))),
        )
        st, reason = Status(first.get("status", "error")), first.get("reason", "")
        if cell.gpus > 1:
            reason = f"rank {first.get('rank')}: {reason}"
        return st, reason
    if ranks:
        if len(ranks) < cell.gpus:
            return Status.ERROR, f"only {len(ranks)} of {cell.gpus} ranks wrote a result (exit code {o.exit_code})"
        if o.exit_code not in (0, None):
            return Status.ERROR, f"the worker reported ok but exited with code {o.exit_code}"
        return Status.OK, ""
    return _classify_without_result(o)


_ROOT_CAUSE_RE = re.compile(r"Root Cause \(first observed failure\):(?P<block>.*?)(?:={8,}|$)", re.S)


def _torchrun_root_cause(log_tail: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first rank to fail, as torchrun's failure summary names it."""
    m = _ROOT_CAUSE_RE.search(log_tail)
    if not m:
        return None
    rank = re.search(r"rank\s*:\s*(\d+)", m["block"])
    code = re.search(r"exitcode\s*:\s*(-?\d+)", m["block"])
    return (int(rank[1]), int(code[1])) if rank and code else None


def _classify_without_result(o: Outcome) -> tuple[Status, str]:
    # No result document (or only from ranks stopped by another's end): the worker died before it could
    # write one. Under torchrun, its summary names the rank that failed first and how it ended.
    rss = o.telemetry.get("all", {}).get("host_rss_peak_bytes")
    fault = f"; fault injected: {o.fault}" if o.fault else ""
    cause = _torchrun_root_cause(o.log_tail)
    who, code = (f"rank {cause[0]}: ", cause[1]) if cause else ("", o.exit_code)
    if code == -signal.SIGKILL or (code not in (0, None) and _SIGKILL_RE.search(o.log_tail)):
        limit = hostmem.memory_limit()
        mem = f"; host RSS peak {rss / 2**30:.2f} of {limit / 2**30:.2f} GiB" if rss and limit else ""
        # SIGKILL says only that someone killed it. The OOM killer leaves a count behind; a kill with
        # the tree's memory at the limit is one too, even where the count cannot be read.
        evidence = o.oom_evidence or (
            f"its host RSS peak was within 10% of the {limit / 2**30:.2f} GiB limit"
            if rss and limit and rss >= 0.9 * limit
            else None
        )
        if evidence:
            return (
                Status.HOST_OOM,
                f"{who}the kernel's OOM killer stopped the worker ({_where(o)}): {evidence}{mem}{fault}",
            )
        return (
            Status.KILLED,
            f"{who}killed by signal 9 from outside zerobench; no OOM evidence ({_where(o)}{mem}{fault})",
        )
    if _CUDA_OOM_RE.search(o.log_tail):
        return Status.CUDA_OOM, f"{who}CUDA out of memory ({_where(o)}); see the log tail"
    if code is not None and code < 0:
        return Status.ERROR, f"{who}the worker died of signal {signal.Signals(-code).name} ({_where(o)}{fault})"
    last = next((ln for ln in reversed(o.log_tail.splitlines()) if ln.strip()), "")
    return (
        Status.ERROR,
        f"{who}the worker exited with code {code} without a result ({_where(o)}{fault}): {last[-300:]}",
    )
