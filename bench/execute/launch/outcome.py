"""How a cell attempt ended, from its exit code, result documents and log tail: the one classifier."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

from ...host import hostmem
from ...matrix.cells import Cell
from ...records.measured import WorkerDoc
from ...records.status import Status
from . import telemetry

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
    ranks: list[WorkerDoc] = field(default_factory=list)  # the worker's result documents, by rank, parsed once
    # "rank N: why" for each result document that does not match WorkerDoc (the record says so instead of guessing)
    unreadable: list[str] = field(default_factory=list)
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
    oom_evidence: str | None = None  # an OOM kill counted while the cell ran (bench.host.hostmem), in words
    warnings: list[str] = field(default_factory=list)  # what makes the measurement less clean (record.warnings)
    port: int | None = None  # the rendezvous port of the last launch
    # Wall-clock [start, end) of the measured phase, else of the whole launch: when neighbours count.
    window: tuple[float, float] | None = None
    # Cell hashes of the cells that ran beside it during that window (set by an executor that packs cells).
    beside: list[str] | None = None
    # A cell of several nodes: each node's launch (record.NodeRun's fields), in node order; [] on one node.
    nodes: list[dict] = field(default_factory=list)
    # The cluster node that ran it (set by a cluster executor): {"host", "gpus", "provenance", and Ray's
    # "node_id" or Slurm's "slurm_job", "slurm_nodes"}, the first node's where it spans several; provenance is
    # bench.host.env.provenance() taken on that node.
    node: dict | None = None


def ended_where(o: Outcome) -> str:
    """Where in the cell an attempt ended, for a reason: its phase, and its last step where it took one."""
    s = f"phase {o.phase_at_end or 'start'}"
    return s + (f", after step {o.last_step}" if o.last_step is not None else "")


def _who(o: Outcome, rank) -> str:
    """A rank as a reason names it: with its node and host when the cell spans several nodes."""
    node = next((n for n in o.nodes if rank in n["ranks"]), None)
    return f"rank {rank}" + (f" on node {node['node']} ({node['host']})" if node else "")


# A rank's error that another rank's end caused: its peer closed the connection (it died, or stopped
# after its own failure). It says nothing about the cell; the peer's end does.
_COLLATERAL_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|communicator was aborted"
    r"|remote process exited|NCCL Error 6|Socket closed|recvBytes|sendBytes"
)


def _collateral(d: WorkerDoc) -> bool:
    # An error with no reason is a rank stopped while it was writing one: it cannot be the cause.
    return d.status is Status.ERROR and (not d.reason or bool(_COLLATERAL_RE.search(d.reason)))


def _classify(o: Outcome, killed_for: str | None, cell: Cell) -> tuple[Status, str]:
    if killed_for == "timeout":
        return Status.TIMEOUT, f"ran past the {cell.timeout_s:g} s limit ({ended_where(o)})"
    if killed_for == "stall":
        return Status.TIMEOUT, f"no progress for too long ({ended_where(o)}): a hung collective or a stuck rank"
    if killed_for == "time_limit":
        return Status.TIMEOUT, f"stopped at the scheduler's time limit ({ended_where(o)})"
    if killed_for == "interrupt":
        return Status.INTERRUPTED, f"stopped by the user ({ended_where(o)})"
    ranks = o.ranks
    failed = [d for d in ranks if d.status is not Status.OK]
    if failed:
        # The cell ended the way its first failing rank did, by time: when one rank fails, the others
        # fail after it, of it. torchrun stops them with SIGTERM ("interrupted": we did not interrupt,
        # killed_for is None here), or their next collective finds the connection closed. Neither is
        # the cause. A rank that died without a document (killed, exited) shows in the exit code and log.
        victims = [d for d in failed if d.status is Status.INTERRUPTED or _collateral(d)] if cell.ranks > 1 else []
        causes = [d for d in failed if d not in victims]
        if not causes:
            st, reason = _classify_without_result(o)
            if st is Status.ERROR and not _torchrun_root_cause(o.log_tail) and (o.exit_code or 0) >= 0:
                first = min(victims, key=lambda d: d.t_end or float("inf"))
                # No other end to blame: the connection failure is what is known.
                if _collateral(first) and first.reason:
                    st, reason = Status.ERROR, f"{_who(o, first.rank)}: {first.reason}"
            return st, reason
        first = min(
            causes,
            key=lambda d: (d.t_end or float("inf"), -_SEVERITY.index(d.status)),
        )
        st, reason = first.status, first.reason
        if cell.ranks > 1:
            reason = f"{_who(o, first.rank)}: {reason}"
        return st, reason
    if ranks:
        if len(ranks) < cell.ranks:
            return Status.ERROR, f"only {len(ranks)} of {cell.ranks} ranks wrote a result (exit code {o.exit_code})"
        if o.exit_code not in (0, None):
            return Status.ERROR, f"the worker reported ok but exited with code {o.exit_code}"
        return Status.OK, ""
    return _classify_without_result(o)


_ROOT_CAUSE_RE = re.compile(r"Root Cause \(first observed failure\):(?P<block>.*?)(?:={8,}|$)", re.S)


def _torchrun_root_cause(log_tail: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first rank to fail, as torchrun's failure summary names it (the last
    summary in the tail: a multi-node cell's tail ends with the node it blames, _node_tails)."""
    found = list(_ROOT_CAUSE_RE.finditer(log_tail))
    if not found:
        return None
    m = found[-1]
    rank = re.search(r"rank\s*:\s*(\d+)", m["block"])
    code = re.search(r"exitcode\s*:\s*(-?\d+)", m["block"])
    return (int(rank[1]), int(code[1])) if rank and code else None


def _classify_without_result(o: Outcome) -> tuple[Status, str]:
    # No result document (or only from ranks stopped by another's end): the worker died before it could
    # write one. Under torchrun, its summary names the rank that failed first and how it ended.
    rss = o.telemetry.get("all", {}).get("host_rss_peak_bytes")
    fault = f"; fault injected: {o.fault}" if o.fault else ""
    cause = _torchrun_root_cause(o.log_tail)
    who, code = (f"{_who(o, cause[0])}: ", cause[1]) if cause else ("", o.exit_code)
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
                f"{who}the kernel's OOM killer stopped the worker ({ended_where(o)}): {evidence}{mem}{fault}",
            )
        return (
            Status.KILLED,
            f"{who}killed by signal 9 from outside zerobench; no OOM evidence ({ended_where(o)}{mem}{fault})",
        )
    if _CUDA_OOM_RE.search(o.log_tail):
        return Status.CUDA_OOM, f"{who}CUDA out of memory ({ended_where(o)}); see the log tail"
    if code is not None and code < 0:
        return Status.ERROR, f"{who}the worker died of signal {signal.Signals(-code).name} ({ended_where(o)}{fault})"
    last = next((ln for ln in reversed(o.log_tail.splitlines()) if ln.strip()), "")
    return (
        Status.ERROR,
        f"{who}the worker exited with code {code} without a result ({ended_where(o)}{fault}): {last[-300:]}",
    )


# -- a cell of several nodes ---------------------------------------------------------------------------


@dataclass
class NodeEnd:
    """One node's launch of a multi-node attempt, as that node saw it (bench.execute.launch.nodes.run_node):
    its Outcome is not classified; the attempt's is, from every node's (of_nodes)."""

    node: int
    """The node's rank in the cell: node 0 hosts the rendezvous and rank 0."""
    host: str
    addr: str
    """The address its peers reached the rendezvous at (the first node's)."""
    ranks: list[int]
    """The global ranks it ran."""
    outcome: Outcome
    killed_for: str | None
    """Why zerobench stopped its launch: timeout, stall, interrupt, or peer (another node ended first)."""
    provenance: dict
    """bench.host.env.provenance() where the node ran: its host, GPUs, driver and library versions."""
    log: str

    @property
    def failed(self) -> bool:
        """Its launch failed or was stopped: its peers will not finish the cell."""
        return self.killed_for is not None or self.outcome.exit_code not in (0, None)


def of_nodes(cell: Cell, ends: list[NodeEnd]) -> Outcome:
    """The attempt's Outcome, classified, from every node's launch: every rank's document, the telemetry
    across the nodes (bench.execute.launch.telemetry.across_nodes), rank 0's phases and steps, each node named in
    `nodes`, and a failing rank named with its node and host. One node (a cluster executor runs every cell
    through a node's launch): its own Outcome, classified as on one host."""
    ends = sorted(ends, key=lambda e: e.node)
    if len(ends) == 1 and cell.nodes == 1:
        out = ends[0].outcome
        out.status, out.reason = _classify(out, ends[0].killed_for, cell)
        return out
    first, blamed = ends[0].outcome, _node_tails(ends)
    out = Outcome(
        status=Status.ERROR,
        reason="",
        ranks=[d for e in ends for d in e.outcome.ranks],
        unreadable=[u for e in ends for u in e.outcome.unreadable],
        telemetry=telemetry.across_nodes([e.outcome.telemetry for e in ends]),
        exit_code=blamed[-1].outcome.exit_code,
        wall_s=max(e.outcome.wall_s for e in ends),
        log_tail="\n".join(f"--- node {e.node} ({e.host}) ---\n{e.outcome.log_tail}" for e in blamed),
        phase_at_end=first.phase_at_end,
        last_step=first.last_step,
        gpu_before={f"{e.node}:{i}": v for e in ends for i, v in e.outcome.gpu_before.items()},
        gpu_after={f"{e.node}:{i}": v for e in ends for i, v in e.outcome.gpu_after.items()},
        started_by={"mode": "spawn", "why": f"{len(ends)} nodes"},
        fault=first.fault,
        oom_evidence="; ".join(f"node {e.node}: {e.outcome.oom_evidence}" for e in ends if e.outcome.oom_evidence)
        or None,
        warnings=_version_warnings(ends) + [w for e in ends for w in e.outcome.warnings],
        window=first.window,
        nodes=[_node_run(e) for e in ends],
    )
    stops = {e.killed_for for e in ends}
    killed_for = next(
        (k for k in ("interrupt", "time_limit", "timeout", "stall") if k in stops), None
    )  # a peer's stop: no cause
    out.status, out.reason = _classify(out, killed_for, cell)
    return out


def _node_tails(ends: list[NodeEnd]) -> list[NodeEnd]:
    """The nodes in the order their log tails are joined, the one most likely to have failed first last (the
    classifier reads the last torchrun summary; a record keeps the end of the tail): a node stopped because
    another ended is never it; a node whose rank died without a document is before one that only exited
    non-zero; then node 0."""

    def blame(e: NodeEnd) -> tuple:
        bad_exit = e.outcome.exit_code not in (0, None)
        died = bad_exit and len(e.outcome.ranks) < len(e.ranks)
        return (e.killed_for != "peer", died, bad_exit, -e.node)

    return sorted(ends, key=blame)


_SAME_EVERYWHERE = ("python", "zerobench_version", "source_sha256")


def _version_warnings(ends: list[NodeEnd]) -> list[str]:
    """What differs between the nodes' Python, zerobench and libraries: a cell over nodes that run different
    code may still run, but is not one configuration."""
    base, out = ends[0].provenance, []
    for e in ends[1:]:
        p = e.provenance
        diff = [f"{k} {p.get(k)} vs {base.get(k)}" for k in _SAME_EVERYWHERE if p.get(k) != base.get(k)]
        libs = set(p.get("versions") or {}) | set(base.get("versions") or {})
        va, vb = p.get("versions") or {}, base.get("versions") or {}
        diff += [f"{lib} {va.get(lib)} vs {vb.get(lib)}" for lib in sorted(libs) if va.get(lib) != vb.get(lib)]
        if diff:
            out.append(f"node {e.node} ({e.host}) runs other versions than node 0 ({ends[0].host}): {', '.join(diff)}")
    return out


def _node_run(e: NodeEnd) -> dict:
    o = e.outcome
    return {
        "node": e.node,
        "host": e.host,
        "addr": e.addr,
        "ranks": list(e.ranks),
        "exit_code": o.exit_code,
        "stopped": e.killed_for,
        "wall_s": o.wall_s,
        "log": e.log,
        "telemetry": o.telemetry,
        "provenance": e.provenance,
    }
