"""The orchestrator's facts on a record, beside the worker's measurements: the inputs a cell was made from,
why a cell did not run (a rule's skip, an implied out-of-memory, answer mode's note), how each rank and node
ended, where the cell was placed, what the memory model predicted, a micro-batch search, a replay. Part of the
record (bench.records.record)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from .machine import Provenance
from .measured import CLOSED, OPEN
from .status import Status

__all__ = [
    "Inputs",
    "Skip",
    "RankEnd",
    "NodeRun",
    "StartedBy",
    "FixedCosts",
    "Placement",
    "Prediction",
    "SearchProbe",
    "Search",
    "ImpliedBy",
    "AnswerNote",
    "Replay",
    "UNMEASURED_NOT_NEEDED",
    "UNMEASURED_NEEDED",
    "UNMEASURED_STOPPED",
    "UNMEASURED_SPENT",
    "UNMEASURED_EXPECTED",
]


class Inputs(BaseModel):
    """The files a cell was made from, by content."""

    model_config = CLOSED
    matrix_sha256: str | None = None
    """The matrix file."""
    ds_config_sha256: str | None = None
    """The user's DeepSpeed config file, for a cell that runs one (the generated config is stored whole)."""


class Skip(BaseModel):
    """The rule that skipped a cell (bench.matrix.rules): what to change, and the source that makes it true."""

    model_config = CLOSED
    rule: str
    """The rule's id (bench.matrix.rules.RULES, or predicted-oom)."""
    fix: str | None = None
    """What to change so the cell runs (absent from a compact record: the rule's, docs/matrix.md#rules)."""
    source: str | None = None
    """What makes the rule true: a DeepSpeed version, an error seen on a run, a document (absent from a compact
    record, as fix)."""


class RankEnd(BaseModel):
    """How one rank of a multi-rank attempt ended, so a failure can be traced to the rank that caused it."""

    model_config = CLOSED
    rank: int | None = None
    """The rank."""
    status: Status | None = None
    """How it ended."""
    reason: str = ""
    """Why."""
    node: int | None = None
    """The node it ran on (a cell of several nodes only: `nodes` says where that is)."""


class NodeRun(BaseModel):
    """One node of a multi-node attempt: where it ran, which ranks, how its launch ended, what it held."""

    model_config = CLOSED
    node: int
    """Its rank among the cell's nodes: node 0 hosts the rendezvous and rank 0."""
    host: str | None = None
    node_id: str | None = None
    """The cluster's id of the node where its executor has one (Ray's node id): host names may repeat, ids do not."""
    addr: str | None = None
    """The rendezvous address its torchrun met the others at (the first node's)."""
    ranks: list[int] = []
    exit_code: int | None = None
    """Its torchrun's (or lone worker's) exit code."""
    stopped: str | None = None
    """Why zerobench stopped its launch, if it did: timeout, stall, interrupt, time_limit (the scheduler's time
    limit was near), or peer (another node had ended first and this one did not end by itself)."""
    wall_s: float | None = None
    log: str | None = None
    telemetry: dict[str, Any] | None = None
    """This node's own samples split by its first rank's phases (the record's telemetry combines all nodes')."""
    provenance: Provenance | None = None
    """bench.host.env.provenance() on the node: its host, GPUs, driver, library versions and zerobench's code."""


class StartedBy(BaseModel):
    """How the worker process began: forked from the pre-imported server, or a fresh interpreter."""

    model_config = OPEN
    mode: str
    """"fork" or "spawn"."""
    why: str | None = None
    """Why it was spawned ("several ranks", another program, why the fork server was unusable); None when forked."""
    server_import_s: float | None = None
    """The fork server's import time."""


class FixedCosts(BaseModel):
    """What the run paid once before its cells (bench.execute.prepare), the same on every record of the run:
    what the machine's cache (bench.records.cache) spared it, what it built, and how long that took."""

    model_config = OPEN
    setup_s: float | None = None
    """Wall seconds from the start of the preparation to the first cell (the helpers ran side by side)."""
    ops: dict[str, str] = {}
    """DeepSpeed op builder -> cached (no helper ran for it), built, loaded (found built by the helper),
    unavailable or failed."""
    ops_s: float | None = None
    """Wall seconds of the prebuild helper (each op compiled in a process of its own: the slowest op's imports
    and compile); absent when the cache spared it. Where it compiled an optimizer's op, the step-time model
    reads it as the host's speed (bench.estimate.steptime.host_time_of)."""
    checkpoints: dict[str, str] = {}
    """QLoRA source checkpoint ("preset precision") -> cached, built or failed."""
    checkpoints_s: float | None = None
    """Wall seconds of the longest checkpoint helper; absent when none ran."""
    forkserver_import_s: float | None = None
    """The fork server's imports (torch, DeepSpeed, transformers), paid in the background."""
    forkserver: str | None = None
    """Why there was no fork server to import, where there was none."""


class Placement(BaseModel):
    """Where the cell ran (on a cluster: which node, which job), and beside which cells (cells packed side by
    side on one host, bench.execute.executors.local, or on one node of a cluster)."""

    model_config = CLOSED
    gpus: list[int] | None = None
    """The physical GPUs (NVML's indexes) the cell held; absent on a CPU host. On a cluster, the first node's GPUs
    its scheduler gave the cell (on the outcome: the started record is written before they are known)."""
    cpu_slots: list[int] | None = None
    """On a CPU host, the slots it held of `--gpus-available N` (numbers 0..N-1; no core is bound to one)."""
    port: int | None = None
    """The rendezvous port of its (last) launch."""
    node: str | None = None
    """The host name of the cluster node that ran it (its first node: rank 0's); absent where the orchestrator's
    host ran it."""
    node_id: str | None = None
    """The cluster's id of that node (Ray's node id): host names may repeat, ids do not."""
    slurm_job: str | None = None
    """The Slurm job that ran it (`--executor slurm`: one job per attempt; `scontrol show job ID`)."""
    slurm_nodes: list[str] | None = None
    """The Slurm nodes of that job, in the cell's node order (Slurm's names, which need not be host names)."""
    beside: list[str] | None = None
    """Cell hashes of the cells that ran at some time during its measured phase (its whole launch when it
    measured nothing): [] when it ran alone. A cell run beside another shares the host's CPUs, memory
    bandwidth and PCIe with it."""


class Prediction(BaseModel):
    """What the memory model (bench.estimate) predicted for the cell before it ran, from the cell and the
    hardware alone: NVML's per-process peak on each GPU and the host RSS, as sums of named terms."""

    model_config = OPEN
    gpu_bytes: int
    """Predicted NVML per-process peak on the cell's largest GPU."""
    host_bytes: int
    """Predicted host RSS of the worker's process tree."""
    phase: str | None = None
    """The moment of a step the GPU peak is predicted at (forward, loss backward, backward, step)."""
    paged_bytes: int | None = None
    """Optimizer state in CUDA managed memory (paged optimizers), outside gpu_bytes."""
    terms: dict[str, int] = {}
    """gpu_bytes as named terms (weights, gradients, optimizer_state, activations, ...)."""
    host_terms: dict[str, int] = {}
    """host_bytes as named terms."""
    gpu_memory_bytes: int | None = None
    """The GPU memory it was judged against (NVML's total at the run's start, or --gpu-mem)."""
    host_memory_bytes: int | None = None
    """The host memory it was judged against."""
    margin: float | None = None
    """The margin of the verdicts (fits below 1 - margin of the capacity, won't fit above 1 + margin)."""
    gpu_verdict: str | None = None
    """fits, uncertain, won't fit (bench.estimate.verdict)."""
    host_verdict: str | None = None
    """The same for host memory."""


class SearchProbe(BaseModel):
    model_config = CLOSED
    micro_batch: int
    """The micro-batch this probe ran."""
    status: Status
    """How it ended."""
    cell_hash: str | None = None
    """The probe's cell hash (its record)."""


class Search(BaseModel):
    """`micro_batch: auto`: the probes run to find the largest micro-batch that runs (each its own record);
    the search's last record carries it whole."""

    model_config = CLOSED
    template: str
    """The cell's name with mb=auto."""
    seed: int | None = None
    """The memory model's largest micro-batch that fits, where the search began."""
    probes: list[SearchProbe] = []
    """Each probe in the order it ran."""
    largest_ok: int | None = None
    """The largest micro-batch that ran (ok or diverged); None if none did."""
    smallest_oom: int | None = None
    """The smallest that ran out of memory; largest_ok + 1 when the search closed the gap."""
    ended: str = ""
    """Why the search stopped."""


class ImpliedBy(BaseModel):
    """The cell whose out-of-memory end implies this one's (bench.execute.schedule): it needs no more memory than
    this cell in any respect, and it ran out."""

    model_config = CLOSED
    cell_name: str
    """Its name."""
    cell_hash: str
    """Its hash."""
    status: Status
    """cuda_oom or host_oom: which memory it ran out of."""
    how: str = ""
    """Where this cell is heavier ("mb=8 vs 2, gc=off vs on"); all else is equal."""
    run_id: str | None = None
    """The run that recorded its out-of-memory end."""


UNMEASURED_NOT_NEEDED = "answer mode: not needed to settle the answer (a run without --answer measures it)"
UNMEASURED_NEEDED = "answer mode: not measured, the --budget was spent; it could still change the answer"
UNMEASURED_STOPPED = "answer mode: not measured, the run was stopped first; it could still change the answer"
UNMEASURED_SPENT = "answer mode: not measured, the --budget was spent before this call could measure anything"
UNMEASURED_EXPECTED = (
    "answer mode: not measured, expected to repeat an error of cells with its settings (a run without --answer "
    "measures it)"
)


class AnswerNote(BaseModel):
    """Answer mode (`zerobench run --answer`, bench.execute.answer): why the cell was measured, or why not."""

    model_config = CLOSED
    role: Literal["leader", "contender", "frontier", "effect", "anchor", "unmeasured"]
    """What the measurement was for: a group's (predicted) fastest cell, a cell that could beat it, a cell
    that could be on the memory/speed frontier, a pair for a knob's effect, a cell measured before on another
    machine or in another run part, measured again to tie this block to the others (an anchor); or
    unmeasured."""
    why: str
    rung: int | None = None
    """0: the short schedule, a short look (bench.execute.answer.rung_cell: half the measured steps and time cap,
    twice the tolerance, a 2-step warm-up window, at least 4 measured steps); 1: the matrix's."""
    group: str | None = None
    """The group it belongs to (--group-by), as key=value."""
    needed: bool | None = None
    """Unmeasured only: whether it could still have changed the answer (the budget ran out) or not."""
    stopped: bool | None = None
    """Unmeasured only: the run was stopped (Ctrl-C, SIGTERM, a job's time limit) before the answer was settled."""
    predicted_tokens_per_s: list[float] | None = None
    """[low, mid, high] at 95% when it was left unmeasured: the step-time model corrected by the run."""
    predicted_peak_bytes: list[float] | None = None
    """[low, mid, high] of its peak memory, the same way."""
    predicted_wall_s: float | None = None
    """What measuring it once on the full schedule would take (the step-time model, corrected by the run)."""
    expected_error: str | None = None
    """Unmeasured only: the error signature (bench.execute.answer.failures) it was expected to repeat, as cells that
    share its failing settings ended twice or more; a run without --answer measures it."""
    chance: list[float] | None = None
    """Unmeasured only: [its chance of beating its group's fastest by more than the minimum effect, of adding a
    frontier point], under the models corrected by the run (bench.execute.answer.settle)."""
    settled: list[float] | None = None
    """Unmeasured only, when the search ended: [the chance that some unmeasured cell of its group beats the group's
    fastest by more than the minimum effect, that some unmeasured cell adds a frontier point, the level below
    which the search stops asking (--settle)]."""


class Replay(BaseModel):
    """A replayed end (`zerobench run --replay`, bench.execute.executors.replay): nothing ran; the measurement is the
    recorded one named here, with its provenance."""

    model_config = CLOSED
    source: str
    """The results file it was read from."""
    run_id: str
    attempt: int
    started_at: str | None = None
    reused: bool = False
    """The file had fewer ends of this cell than the replay asked for: an earlier attempt was served it too."""
