"""The result record, typed and versioned: what a worker rank writes (`WorkerDoc`, result.rank{N}.json)
and what the store keeps (`Record`, one JSON line per cell attempt in results/*.jsonl).

worker -> WorkerDoc -> launch.Outcome -> Record -> store -> results (DataFrame)

Every stored record is made by one constructor per status: `Record.started`, `.skipped`,
`.implied_oom` (not run: a lighter cell ran out of memory), `.interrupted` (the orchestrator stopped),
`.error` (zerobench failed around the cell) and
`.from_outcome` (whatever the worker and the launcher made of the attempt: ok, diverged, cuda_oom,
host_oom, killed, timeout, error, interrupted). Each carries the provenance of the process that ran the cell
(on a cluster, the node's on its outcome, with the orchestrator's beside it).
`zerobench schema` prints the JSON Schema of `Record`; schema/record-v<N>.schema.json is its copy.

Versions (`schema_version` in every line):
  1  the first format.
  2  `provenance` on every record of every status (v1 wrote it on skipped records and outcomes only);
     `reason` on every record ("" where there is nothing to say; v1 started records had none).
     A v1 record that had no provenance reads as `provenance: null`: the only place a null appears,
     since every record written at v2 carries one.
  3  `machine` on every attempt (started records and their ends): where it ran, by GPU UUIDs, the host's
     boot id and name, CPU model and count (`provenance.boot_id` is new). A v2 record reads with the
     machine its provenance names: its GPUs' UUIDs, the boot id unknown; `machine: null` (unknown) where
     it names no GPU UUID (a CPU run: host names repeat, "vm" on every lent machine).
  4  a record of a cell that did not run (skipped, implied_oom, unmeasured) is compact: it names the cell
     (`cell_id`, `matrix`, `matrix_file`) and says why it did not run (`status`, `reason`, `skip`'s rule,
     `implied_by`, `answer`), nothing the matrix says (the cell's settings: bench.judge.results fills them from
     the matrix file), no provenance (nothing ran), no fixed costs; a pruned cell keeps the prediction's
     figures, not its terms. `cell_name` and `cell_hash` are read from `cell_id` where a record leaves them
     out. A v3 record is a valid v4 record.
Reading goes through `upgrade`, one function per version step, so every results file ever written
loads as the current version; the store writes only the current version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from ..host import env
from . import adaptive
from .status import Status

__all__ = [
    "SCHEMA_VERSION",
    "STEP_PARTS",
    "Record",
    "WorkerDoc",
    "WorkerFacts",
    "Metrics",
    "Memory",
    "AllocatorPeaks",
    "Provenance",
    "Gpu",
    "Machine",
    "machine_of",
    "Skip",
    "RankEnd",
    "NodeRun",
    "StartedBy",
    "upgrade",
    "parse",
    "json_schema",
    "worker_document",
    "RecordVersionError",
    "Placement",
    "Prediction",
    "FixedCosts",
    "Search",
    "SearchProbe",
    "ImpliedBy",
    "StepsTaken",
    "NOT_RUN",
    "AttemptContext",
]

SCHEMA_VERSION = 4

# The parts of a measured step whose allocator peaks the worker records (torch_max_allocated_<part>_bytes).
STEP_PARTS = ("forward", "backward", "step")

# NaN travels as JSON's NaN (a diverged cell's losses), as json.dumps writes it, not as null.
# The docstring under a field is its description in the published schema.
_OPEN = ConfigDict(extra="allow", ser_json_inf_nan="constants", use_attribute_docstrings=True)
_CLOSED = ConfigDict(extra="forbid", ser_json_inf_nan="constants", use_attribute_docstrings=True)
# Figures per GPU, keyed by the GPU's index: an int in memory (NVML's index), a string once written as JSON.
ByGpu = Annotated[
    dict[str, Any] | None, BeforeValidator(lambda d: {str(k): v for k, v in d.items()} if isinstance(d, dict) else d)
]


def _not_negative(v: float) -> float:
    if v < 0:  # NaN passes: a non-finite figure is written as null, with a warning (bench.records.store)
        raise ValueError(f"{v:g} is negative: a memory figure, a time or a rate is 0 or more")
    return v


# Memory in bytes, times, rates and utilisations: never below 0 (a negative peak would break answer mode's logarithm
# and show as a negative size). A record with one is no measurement: readers skip it and name the field.
Bytes = Annotated[int, AfterValidator(_not_negative), Field(json_schema_extra={"minimum": 0})]
Rate = Annotated[float, AfterValidator(_not_negative), Field(json_schema_extra={"minimum": 0})]


class RecordVersionError(ValueError):
    """A record from a newer zerobench than this one (or with no usable version)."""


# -- the worker's measurements ---------------------------------------------------------------------


class Metrics(BaseModel):
    """Throughput and FLOPs of the measured steps (bench.worker.metrics), from rank 0. Open: a newer
    worker may add a figure; every key becomes a column of the results DataFrame."""

    model_config = _OPEN
    # In the order the worker writes them, so DataFrame columns keep their order.
    step_time_median_s: Rate | None = None
    """Median wall time of a measured step (one optimizer step, its micro-batches included)."""
    step_time_p90_s: Rate | None = None
    """The 90th percentile of the measured steps' times."""
    step_time_mean_s: Rate | None = None
    """The mean of the measured steps' times."""
    tokens_per_s: Rate | None = None
    """Tokens trained per second, all GPUs together: tokens per step over the median step time."""
    samples_per_s: Rate | None = None
    """Sequences trained per second, all GPUs together."""
    tflops_per_gpu: Rate | None = None
    """Model FLOPs per second per GPU, in TFLOP/s."""
    hw_tflops_per_gpu: Rate | None = None
    """Hardware FLOPs (with gradient checkpointing's recompute) per second per GPU."""
    mfu: Rate | None = None
    """Model FLOPs utilisation against the GPU's dense peak for the precision; None without a known peak."""
    hfu: Rate | None = None
    """Hardware FLOPs utilisation: hw_tflops_per_gpu over the same peak."""
    model_flops_per_token: Rate | None = None
    """Training FLOPs per token: 6 per trained dense weight, 4 per frozen one (LoRA and QLoRA bases), plus
    causal attention (bench.worker.metrics)."""
    hw_flops_per_token: Rate | None = None
    """The same with gradient checkpointing's recomputed forward."""
    peak_tflops: Rate | None = None
    """The GPU's dense peak for the precision (bench.worker.metrics' table), TFLOP/s."""
    loss_first: float | None = None
    """The first step's loss (warmup included): before any update."""
    loss_final: float | None = None
    """The last step's loss."""
    loss_measured_first: float | None = None
    """The first measured step's loss."""
    energy_j_per_token: Rate | None = None
    """From NVML's energy counter over the measured phase (the orchestrator adds it)."""
    gpu_util_mean_pct: Rate | None = None
    """NVML's GPU utilisation over the measured phase, mean over samples and GPUs."""
    power_mean_w: Rate | None = None
    """NVML's power draw over the measured phase, all the cell's GPUs summed, mean over samples."""
    sm_clock_mean_mhz: Rate | None = None
    """NVML's SM clock over the measured phase, mean of the samples (the orchestrator adds this and below)."""
    sm_clock_min_mhz: Rate | None = None
    """The lowest SM clock sampled over the measured phase."""
    mem_clock_mean_mhz: Rate | None = None
    """NVML's memory clock over the measured phase, mean of the samples."""
    temperature_max_c: float | None = None
    """The hottest GPU temperature sampled over the measured phase."""
    power_max_w: Rate | None = None
    """The highest power draw sampled over the measured phase (all the cell's GPUs summed)."""
    throttle_reasons: list[str] | None = None
    """NVML's clock-throttle reasons seen in any sample of the measured phase ([] when none; idle excluded)."""


class AllocatorPeaks(BaseModel):
    """One rank's CUDA allocator figures over a phase (setup or measured)."""

    model_config = _OPEN
    torch_max_allocated_bytes: Bytes | None = None
    """torch.cuda.max_memory_allocated over the phase: tensors alive at once."""
    torch_max_reserved_bytes: Bytes | None = None
    """torch.cuda.max_memory_reserved over the phase: what the allocator held from the driver."""
    torch_allocated_between_steps_bytes: Bytes | None = None
    """Allocated at the start of a measured step: model states and what persists between steps."""
    torch_max_allocated_forward_bytes: Bytes | None = None
    """The allocator's peak within the forward passes of the measured steps."""
    torch_max_allocated_backward_bytes: Bytes | None = None
    """Within the backward passes, ZeRO's gradient reduction included."""
    torch_max_allocated_step_bytes: Bytes | None = None
    """Within the optimizer steps."""


class Memory(BaseModel):
    """Peaks of an attempt: host RSS and NVML sampled by the orchestrator, the allocator's from the
    ranks (max over ranks; per-GPU lists beside). Whole-attempt figures, then per phase. A cell of several
    nodes: host RSS is the largest node's, each node sampled where it ran; per-GPU lists in node order."""

    model_config = _OPEN
    host_rss_peak_bytes: Bytes | None = None
    """Peak resident memory of the worker's process tree (all ranks and their children), sampled by the
    orchestrator."""
    host_rss_peak_setup_bytes: Bytes | None = None
    """The same over setup (imports, model build, engine init)."""
    host_rss_peak_measured_bytes: Bytes | None = None
    """The same over the measured steps."""
    nvml_used_peak_setup_bytes: Bytes | None = None
    """nvml_used_peak_bytes over setup."""
    nvml_proc_peak_setup_bytes: Bytes | None = None
    """nvml_proc_peak_bytes over setup."""
    nvml_used_peak_measured_bytes: Bytes | None = None
    """nvml_used_peak_bytes over the measured steps."""
    nvml_proc_peak_measured_bytes: Bytes | None = None
    """nvml_proc_peak_bytes over the measured steps."""
    nvml_used_peak_bytes: Bytes | None = None
    """The whole device's used memory (other processes included)."""
    nvml_proc_peak_bytes: Bytes | None = None
    """The worker's processes' memory as NVML sees it: with the CUDA context and NCCL buffers."""
    nvml_proc_peak_per_gpu: list[Bytes | None] | None = None
    """nvml_proc_peak_bytes of each of the cell's GPUs (the figure above is their largest)."""
    torch_max_allocated_bytes: Bytes | None = None
    """The allocator's peak over the attempt, the largest rank's."""
    torch_max_reserved_bytes: Bytes | None = None
    """The allocator's peak reservation over the attempt, the largest rank's."""
    torch_max_allocated_per_gpu: list[Bytes | None] | None = None
    """torch_max_allocated_bytes of each rank."""
    torch_max_allocated_forward_bytes: Bytes | None = None
    """The allocator's peak within the measured forward passes (largest rank)."""
    torch_max_allocated_backward_bytes: Bytes | None = None
    """Within the measured backward passes, ZeRO's gradient reduction included."""
    torch_max_allocated_step_bytes: Bytes | None = None
    """Within the measured optimizer steps."""
    torch_allocated_between_steps_bytes: Bytes | None = None
    """Allocated at the start of a measured step: model states and what persists between steps (largest rank)."""
    torch_allocated_between_steps_per_gpu: list[Bytes | None] | None = None
    """torch_allocated_between_steps_bytes of each rank."""
    torch_max_allocated_setup_bytes: Bytes | None = None
    """The allocator's peak over setup (model build, engine init)."""
    torch_max_reserved_setup_bytes: Bytes | None = None
    """The allocator's peak reservation over setup."""


class WorkerFacts(BaseModel):
    """What the worker found out about the attempt (rank 0's), kept in the stored record's `worker`."""

    model_config = _CLOSED
    optimizer_class: str | None = None
    """The optimizer class that actually ran (module.Class)."""
    zero_optimizer_class: str | None = None
    """The optimizer wrapper DeepSpeed built around it (DeepSpeedZeroOptimizer, FP16_Optimizer, ...)."""
    params_total: int | None = None
    """Parameters of the built model (4-bit weights counted by their real shape)."""
    params_trainable: int | None = None
    """Parameters that train (the adapters under LoRA and QLoRA)."""
    params_embedding: int | None = None
    """Parameters of the token embeddings."""
    model_build_s: float | None = None
    """Seconds to build the model (random weights, or a local checkpoint loaded)."""
    engine_init_s: float | None = None
    """Seconds in deepspeed.initialize (or the Trainer's setup)."""
    setup_s: float | None = None
    """Seconds from the worker's start to its first step."""
    fp16_skipped_steps: int | None = None
    """Steps the fp16 loss scaler skipped during the measured phase."""
    fp16_skipped_warmup_steps: int | None = None
    """Steps the fp16 loss scaler skipped during the warmup steps (absent from older records)."""
    loss_scale_final: float | None = None
    """The fp16 loss scale the optimizer held at the end (None where the engine has none)."""
    weights_init: str | None = None
    """How a preset's initial weights were made: "seeded-per-name" (each parameter from its own generator,
    the same at every ZeRO stage, offload and engine); absent: from the global RNG (ZeRO-3 differed)."""
    gpu_name: str | None = None
    """The GPU the worker ran on, as torch names it."""
    nvme_swap_bytes: int | None = None
    """What DeepSpeed wrote to the attempt's NVMe swap folder: evidence it really swapped."""
    train_mode: bool | None = None
    """The model was in training mode for the steps (checkpointing and dropout act only then)."""
    compiled: bool | None = None
    """torch.compile ran on the model."""
    kernels: dict[str, Any] | None = None
    """{"asked", "liger_modules", "liger_settings"}: which kernels the built model runs."""
    versions: dict[str, str | None] | None = None
    """Library versions inside the worker (torch's CUDA included)."""
    ds_config_added: dict[str, Any] | None = None
    """What the worker added to the DeepSpeed config it was given before running it (bench.worker.setup.gloo_safe:
    ZeRO-3 on CPU ranks gathers one parameter at a time); absent: it ran the config as given."""
    fault_injected: str | None = None
    """The ZEROBENCH_FAULT the worker ran with (tests only; bench.matrix.faults): as rank 0 applied it, or as the
    orchestrator passed it when the fault left no result document (a kill). None in a benchmark."""
    fault_wait_s: list[float] | None = None
    """The host wait a slow= fault added to each step from its step on (fault_injected's @N: step_times_s[N:]),
    as timed around it (tests only): the part of each of those step times that is the fault's."""
    ops_built: list[dict[str, Any]] | None = None
    """DeepSpeed ops compiled inside the cell ({"op", "s"} each): its wall time and setup memory include
    a compiler. None when every op came ready-built."""
    stale_locks_removed: list[str] | None = None
    """Locks of dead builds the worker removed from the extensions folder (each would have made it wait forever)."""
    allocator_at_failure: dict[str, Any] | None = None
    """torch.cuda.memory_stats() excerpt at a CUDA OOM."""


class StepsTaken(BaseModel):
    """How many steps the cell ran and why each phase ended (bench/records/adaptive.py has the rules), with the
    median step time's interval over the measured steps. Absent from older records."""

    model_config = _CLOSED
    warmup: int
    """Warmup steps run (not timed)."""
    measured: int
    """Measured steps run: the metrics are theirs."""
    warmup_ended: Literal[adaptive.WARMUP_ENDINGS]
    """fixed (the matrix's count), settled (step time settled), step cap, time cap, or stopped (the steps
    ended first: a diverged loss)."""
    ended: Literal[adaptive.MEASURED_ENDINGS]
    """Why measuring ended: fixed, converged (the interval within the tolerance), step cap, time cap, stopped."""
    median_s: float | None = None
    ci_low_s: float | None = None
    """The median step time's distribution-free interval (bench.stats.median_ci), low end."""
    ci_high_s: float | None = None
    ci_level: float | None = None
    """The confidence the interval has (below the asked level when there were too few steps)."""
    half_width: float | None = None
    """The interval's wider side, as a fraction of the median."""
    tolerance: float | None = None
    """The half-width measurement stopped at (adaptive measurement only)."""
    max_seconds: float | None = None
    """The time cap on the steps (adaptive only; None: no cap)."""
    steps_s: float | None = None
    """The steps' own time, warmup and measured summed (what max_seconds caps)."""


class WorkerDoc(WorkerFacts):
    """What one rank writes to result.rank{N}.json (bench.worker.main; bench.worker.reference writes a subset)."""

    # Open: the worker may write more than the orchestrator reads; the fields below are what it reads.
    model_config = _OPEN
    rank: int = 0
    world_size: int | None = None
    status: Status = Status.ERROR
    reason: str = ""
    t_start: float | None = None
    t_end: float | None = None
    phase: str | None = None
    """The phase the rank was in when it wrote the document (import, setup, warmup, measured, teardown)."""
    traceback: str | None = None
    losses: list[float | None] | None = None
    step_times_s: list[Rate] | None = None
    metrics: Metrics | None = None
    memory_setup: AllocatorPeaks | None = None
    memory_measured: AllocatorPeaks | None = None
    steps: StepsTaken | None = None


def worker_document(doc: dict) -> dict:
    """The JSON a rank writes: its document checked against WorkerDoc. A document that does not match
    is written anyway, as an error that says why (the orchestrator reads every field it needs from here)."""
    try:
        return WorkerDoc.model_validate(doc).model_dump(mode="json", exclude_unset=True)
    except Exception as e:  # noqa: BLE001 - a value that does not serialise either: the rank must still report
        why = _short(e) if isinstance(e, ValidationError) else f"{type(e).__name__}: {e}"[:600]
        return {
            "rank": doc.get("rank", 0) if isinstance(doc.get("rank"), int) else 0,
            "status": Status.ERROR.value,
            "reason": f"the worker's result document does not match bench.records.record.WorkerDoc: {why}",
            "traceback": str(doc.get("traceback") or "")[-8000:] or None,
        }


# -- the orchestrator's facts ---------------------------------------------------------------------


class Gpu(BaseModel):
    model_config = _OPEN
    index: int
    """NVML's index."""
    name: str
    """NVML's name."""
    memory_bytes: int | None = None
    """Total memory, as NVML reports it."""
    uuid: str | None = None
    """NVML's UUID."""


class Provenance(BaseModel):
    """Where a record came from (bench.host.env.provenance()): host, hardware, versions, git commit."""

    model_config = _OPEN
    host: str | None = None
    """Host name."""
    boot_id: str | None = None
    """The host's boot id (bench.host.env.boot_id): new at every boot; absent from records before schema v3."""
    os: str | None = None
    """platform.platform()."""
    python: str | None = None
    """Python version."""
    cpu: str | None = None
    """CPU model."""
    cpu_count: int | None = None
    """Logical CPUs."""
    host_memory_bytes: int | None = None
    """Total host memory."""
    gpus: list[Gpu] = []
    """The GPUs NVML shows (within CUDA_VISIBLE_DEVICES)."""
    gpu_name: str | None = None
    """The first GPU's name."""
    gpu_count: int | None = None
    """How many GPUs NVML shows."""
    driver: str | None = None
    """NVIDIA driver version."""
    nvml: bool | None = None
    """Whether NVML answered (False on a GPU host without nvidia-ml-py: no NVML figures)."""
    versions: dict[str, str | None] = {}
    """The orchestrator's library versions; the worker's own are in worker.versions."""
    zerobench_version: str | None = None
    """The installed zerobench's version."""
    source_sha256: str | None = None
    """sha256 of the bench package's files: which code ran, whether or not it came from a git checkout."""
    git_commit: str | None = None
    """Only when zerobench ran from its own git checkout (never an enclosing repository's commit)."""
    git_dirty: bool | None = None
    """The checkout had uncommitted changes."""


class Machine(BaseModel):
    """Where an attempt ran, as a stable identity: measurements from one machine in one run part (a block,
    `Record.block`) compare directly; across blocks only through cells measured in both (bench.judge.blocks)."""

    model_config = _CLOSED
    id: str
    """A short hash of the host's identity: boot id, host name, CPU model and count, the UUIDs of the GPUs it
    shows. Two records with one id ran on one machine (one boot of one host)."""
    gpus: list[str] = []
    """The UUIDs of the GPUs the attempt's ranks held (its placement's), else every GPU the host showed."""
    host: str | None = None
    boot_id: str | None = None
    """None where it is unknown (records before schema v3, a system without one)."""
    cpu: str | None = None
    cpu_count: int | None = None
    rates: dict[str, float | str] | None = None
    """The machine's rates as `zerobench probe` measured them (bench.host.rates.Rates.to_dict), where probed."""


def _with_rates(m: Machine | None, rates: dict | None) -> Machine | None:
    """m with the probe's figures, validated as a record's (a thread count is a number like the rest)."""
    return Machine.model_validate({**m.model_dump(), "rates": rates}) if m is not None and rates else m


def machine_of(provenance: Any, held: list[int] | None = None) -> Machine | None:
    """The machine a provenance (Provenance or its dict) names, with the GPUs of `held` (NVML indexes, the
    placement's) as the attempt's; None where it names neither a boot id nor a GPU UUID (unknown)."""
    if provenance is None:
        return None
    p = provenance if isinstance(provenance, Provenance) else Provenance.model_validate(provenance)
    uuids = {g.index: g.uuid for g in p.gpus if g.uuid}
    if not p.boot_id and not uuids:
        return None
    key = [p.boot_id, p.host, p.cpu, p.cpu_count, sorted(uuids.values())]
    mine = [uuids[i] for i in held or () if i in uuids] or sorted(uuids.values())
    return Machine(
        id=hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12],
        gpus=mine,
        host=p.host,
        boot_id=p.boot_id,
        cpu=p.cpu,
        cpu_count=p.cpu_count,
    )


class Inputs(BaseModel):
    """The files a cell was made from, by content."""

    model_config = _CLOSED
    matrix_sha256: str | None = None
    """The matrix file."""
    ds_config_sha256: str | None = None
    """The user's DeepSpeed config file, for a cell that runs one (the generated config is stored whole)."""


class Skip(BaseModel):
    """The rule that skipped a cell (bench.matrix.rules): what to change, and the source that makes it true."""

    model_config = _CLOSED
    rule: str
    """The rule's id (bench.matrix.rules.RULES, or predicted-oom)."""
    fix: str | None = None
    """What to change so the cell runs (absent from a compact record: the rule's, docs/matrix.md#rules)."""
    source: str | None = None
    """What makes the rule true: a DeepSpeed version, an error seen on a run, a document (absent from a compact
    record, as fix)."""


class RankEnd(BaseModel):
    """How one rank of a multi-rank attempt ended, so a failure can be traced to the rank that caused it."""

    model_config = _CLOSED
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

    model_config = _CLOSED
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

    model_config = _OPEN
    mode: str
    """"fork" or "spawn"."""
    why: str | None = None
    """Why it was spawned ("several ranks", another program, why the fork server was unusable); None when forked."""
    server_import_s: float | None = None
    """The fork server's import time."""


class FixedCosts(BaseModel):
    """What the run paid once before its cells (bench.execute.prepare), the same on every record of the run:
    what the machine's cache (bench.records.cache) spared it, what it built, and how long that took."""

    model_config = _OPEN
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

    model_config = _CLOSED
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

    model_config = _OPEN
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
    model_config = _CLOSED
    micro_batch: int
    """The micro-batch this probe ran."""
    status: Status
    """How it ended."""
    cell_hash: str | None = None
    """The probe's cell hash (its record)."""


class Search(BaseModel):
    """`micro_batch: auto`: the probes run to find the largest micro-batch that runs (each its own record);
    the search's last record carries it whole."""

    model_config = _CLOSED
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

    model_config = _CLOSED
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

    model_config = _CLOSED
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

    model_config = _CLOSED
    source: str
    """The results file it was read from."""
    run_id: str
    attempt: int
    started_at: str | None = None
    reused: bool = False
    """The file had fewer ends of this cell than the replay asked for: an earlier attempt was served it too."""


# What a replayed record takes from the recorded one: the measurement and where it was made.
_REPLAYED = {
    "wall_s", "exit_code", "phase_at_end", "world_size", "ranks", "metrics", "memory", "losses", "step_times_s",
    "steps", "worker", "warnings", "telemetry", "ds_config", "foreign_gpu_processes", "gpu_after", "started_by",
    "log_tail", "traceback", "provenance", "machine",
}  # fmt: skip


class _Cell(Protocol):
    """What a record needs of a bench.matrix.cells.Cell (not imported: this module sits below it)."""

    matrix: str
    id: str
    hash: str
    name: str

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True)
class AttemptContext:
    """What the run knows of an attempt as it starts it, beyond which cell and attempt it is: each part given
    goes into its started record (and on to its end)."""

    predicted: dict | None = None
    """The memory model's prediction (bench.estimate), where a GPU is known."""
    fixed_costs: dict | None = None
    """What the run paid once before its cells."""
    placement: dict | None = None
    """Its GPUs (or CPU slots), port and neighbours; on a cluster its node and job."""
    answer: dict | None = None
    """In answer mode: why it is measured (its role, why, rung and group)."""
    rates: dict | None = None
    """The run's machine's rates as the probe gave them (bench.host.rates.Rates.to_dict): its machine section's."""


class Record(BaseModel):
    """One cell attempt, as the store keeps it (one JSON line). The record of a cell that did not run (skipped,
    implied_oom, unmeasured) is compact: its cell by `cell_id` within its `matrix` and `matrix_file`, and why it
    did not run (`status`, `reason`, the rule's id in `skip`, `implied_by`, or the `answer` note; a pruned cell's
    `predicted` figures), nothing the matrix says: reading it (`bench.judge.results.load`) takes the cell's settings
    from the matrix file, and a skip's fix and source from its rule. An answer run writes a cell's `unmeasured`
    record once: a later call (`--resume`) writes another only when its reason changes, and a measurement
    supersedes it."""

    model_config = _CLOSED
    schema_version: Literal[SCHEMA_VERSION]
    """The record format's version (bench.records.record.SCHEMA_VERSION); older records are upgraded on reading."""
    # -- which cell, which attempt
    run_id: str
    """The run (one `zerobench run`) that wrote it: start time and a random suffix."""
    attempt: int
    """1 for a cell's first attempt in a results file, then counting up (resume, reruns, repeats)."""
    repeat: int = 1
    """Which process-level repeat of the cell this is (`repeats: N` in the matrix, `--repeats`): 1..N.
    Absent from records before repeats existed: those are repeat 1. Not part of the cell's identity."""
    matrix: str
    """The matrix's name."""
    matrix_file: str | None = None
    """The matrix file as given."""
    inputs: Inputs | None = None
    """sha256 of the matrix file and of the user's DeepSpeed config (absent from records before 2026-12)."""
    cell_id: str
    """`cell_name#cell_hash`; the hash is stable across runs and zerobench versions."""
    cell_hash: str
    """Short stable hash of the cell's canonical config: two runs of the same cell share it (a compact record
    leaves it out: it is cell_id's end)."""
    cell_name: str
    """The readable key=value name (axes off their default, in bench.matrix.axes order; a compact record leaves it out:
    it is cell_id's start)."""
    cell: dict[str, Any] | None = None
    """The cell as bench.matrix.cells.Cell.to_dict() wrote it (a field added later is absent from older records:
    it ran at that field's default). Absent from a compact record (a cell that did not run): the matrix
    file's cell of that hash (bench.judge.results fills it in)."""
    variant: str | None = None
    """selfcheck only: reference, zerobench or no-telemetry."""
    # -- how it ended
    status: Status
    """How the attempt ended (the statuses below)."""
    reason: str
    """Why it ended so ("" when it simply ran); for a skip, the rule's reason (before version 4 with its fix and
    source); for a multi-rank cell, the end of the rank that failed first (the others' lost connections are its
    consequence)."""
    warnings: list[str] | None = None
    """What makes the measurement less clean than its status says (an op compiled inside the cell, a
    relaunch after a taken port); shown in the report's notes. None when there is nothing to say."""
    skip: Skip | None = None
    """For a skipped cell: the rule, the fix and the source."""
    started_at: str
    """ISO 8601, UTC."""
    ended_at: str | None = None
    """ISO 8601, UTC."""
    wall_s: float | None = None
    """Wall seconds from launch to the worker's end."""
    exit_code: int | None = None
    """The worker's exit code (negative: the signal that ended it)."""
    phase_at_end: str | None = None
    """The phase the worker was in when it ended (import, setup, warmup, measured, teardown, exit)."""
    world_size: int | None = None
    """Ranks of the attempt."""
    ranks: list[RankEnd] | None = None
    """Every rank's own end (multi-rank attempts only)."""
    nodes: list[NodeRun] | None = None
    """Every node's launch (cells of several nodes only); the memory and telemetry figures are then the
    largest node's or GPU's (host RSS per node, NVML per GPU), the metrics rank 0's."""
    # -- what was measured
    metrics: Metrics | None = None
    """Throughput, FLOPs and the GPU's state over the measured steps (ok and diverged records)."""
    memory: Memory | None = None
    """Peaks of the attempt: host RSS, NVML and the allocator, whole and per phase."""
    losses: list[float | None] | None = None
    """Every step's loss, warmup included."""
    step_times_s: list[Rate] | None = None
    """Every measured step's wall time."""
    steps: StepsTaken | None = None
    """Steps taken and why measuring ended (adaptive or fixed; absent from older records)."""
    worker: WorkerFacts | None = None
    """What the worker found out: the optimizer that ran, parameter counts, build times, versions."""
    telemetry: dict[str, Any] | None = None
    """The orchestrator's samples split by phase (bench.execute.launch.telemetry): open-ended."""
    # -- where and how it ran
    ds_config: dict[str, Any] | None = None
    """The exact DeepSpeed config the worker was given."""
    foreign_gpu_processes: ByGpu = None
    """Other processes on the cell's GPUs before it started, by GPU index."""
    gpu_after: ByGpu = None
    """NVML's used memory on the cell's GPUs after it ended, by GPU index (back to baseline or not)."""
    started_by: StartedBy | None = None
    """How the worker process began: forked from the pre-imported server or spawned."""
    fixed_costs: FixedCosts | None = None
    """What the run paid once before its cells (absent from records before 2026-12)."""
    placement: Placement | None = None
    """Its GPUs (or CPU slots), port and neighbours (absent from records before packing existed); on a cluster its
    node and job."""
    provenance: Provenance | None = None
    """The machine that ran the cell: on an outcome from a cluster node, that node's (its first node's; `nodes` has
    each node's), taken there; otherwise the orchestrator's host. Absent from a compact record (nothing ran); null
    only on a record upgraded from v1 that was written without one."""
    machine: Machine | None = None
    """Where the attempt ran (started records and their ends; absent from records of cells that did not run):
    on a cluster, the node that ran it (its first node's). None: unknown (a record from before schema v3 that
    names no GPU UUID)."""
    orchestrator: Provenance | None = None
    """On an outcome a cluster node ran (`--executor ray` or `slurm`): the provenance of the host that planned the
    run and wrote this record (its started record's). Absent where one host did both."""
    predicted: Prediction | None = None
    """The memory model's prediction, where a GPU was known (absent from records before 2026-12)."""
    search: Search | None = None
    """On the last record of a `micro_batch: auto` search: the whole search."""
    implied_by: ImpliedBy | None = None
    """On an implied_oom record: the cell that ran out of memory and proves it (absent from older records)."""
    answer: AnswerNote | None = None
    """In answer mode: why it was measured (its role and rung) or why it was not (status unmeasured)."""
    replay: Replay | None = None
    """A replayed end: the recorded record it repeats (nothing ran)."""
    log: str | None = None
    """Path of the worker's log file."""
    log_tail: str | None = None
    """The end of the worker's log (failures)."""
    traceback: str | None = None
    """The worker's traceback (failures)."""

    # -- one constructor per status ---------------------------------------------------------------

    @classmethod
    def started(
        cls,
        cell: _Cell,
        *,
        run_id: str,
        attempt: int,
        matrix_file: str,
        started_at: str,
        repeat: int = 1,
        context: AttemptContext = AttemptContext(),
    ) -> "Record":
        """Written before launch, so a run killed mid-cell is found by --resume; with what the run knows of the
        attempt as it starts it (`context`)."""
        prov = env.provenance()
        return cls(
            **_identity(cell, run_id, attempt, matrix_file, repeat),
            status=Status.STARTED,
            reason="",
            started_at=started_at,
            provenance=prov,
            machine=_with_rates(machine_of(prov, (context.placement or {}).get("gpus")), context.rates),
            **({"predicted": context.predicted} if context.predicted else {}),
            **({"fixed_costs": context.fixed_costs} if context.fixed_costs else {}),
            **({"placement": context.placement} if context.placement else {}),
            **({"answer": context.answer} if context.answer else {}),
        )

    @model_validator(mode="before")
    @classmethod
    def _name_and_hash(cls, data: Any) -> Any:
        """A compact record writes cell_id alone: cell_name and cell_hash are its two parts."""
        if isinstance(data, dict) and not ("cell_name" in data and "cell_hash" in data):
            cid = data.get("cell_id")
            if isinstance(cid, str) and "#" in cid:
                name, _, h = cid.rpartition("#")
                data = {"cell_name": name, "cell_hash": h, **data}
        return data

    @classmethod
    def skipped(
        cls, cell: _Cell, skip: Any, *, run_id: str, attempt: int, matrix_file: str, at: str,
        predicted: dict | None = None,
    ) -> "Record":  # fmt: skip
        """A rule (bench.matrix.rules.Skip) says the cell cannot run here, or the memory model that it cannot fit: a
        compact record with the rule's id and reason (its fix and source are the rule table's); predicted, given for a
        pruned cell, keeps its figures (the why), not its terms."""
        return cls(
            **_not_run(cell, run_id, attempt, matrix_file, at),
            status=Status.SKIPPED,
            reason=skip.reason,
            skip=Skip(rule=skip.rule),
            **({"predicted": _figures(predicted)} if predicted else {}),
        )

    @classmethod
    def implied_oom(cls, cell: _Cell, by: dict, *, run_id: str, attempt: int, matrix_file: str, at: str) -> "Record":
        """Not run: the cell `by` (ImpliedBy's fields) ran out of memory and needs no more than this one in
        any respect. An outcome for --resume; never a measured out-of-memory. The reason is the same for every
        cell one prover implies (so reports group them); `implied_by.how` says how each differs. Compact."""
        implied = ImpliedBy.model_validate(by)
        where = "GPU" if implied.status is Status.CUDA_OOM else "host"
        return cls(
            **_not_run(cell, run_id, attempt, matrix_file, at),
            status=Status.IMPLIED_OOM,
            reason=f"implied out of {where} memory, not run: {implied.cell_name} (#{implied.cell_hash}) ran out "
            f"({implied.status.value}) and needs no more {where} memory in any respect",
            implied_by=implied,
        )

    @classmethod
    def unmeasured(
        cls, cell: _Cell, note: dict, *, run_id: str, attempt: int, matrix_file: str, at: str, spent: bool = False,
    ) -> "Record":  # fmt: skip
        """Answer mode left it unmeasured: its answer note says why (not needed, or the budget ran out) with its
        predicted figures (4 significant digits). The reason is one of a few fixed sentences, so reports group
        these. spent: a resumed call whose budget afforded no attempt: it measured nothing, so it says no cell is
        not needed (the note's `needed` and `why` keep the figures' verdict). Compact."""
        note = AnswerNote.model_validate({**_rounded(note), "role": "unmeasured"})
        return cls(
            **_not_run(cell, run_id, attempt, matrix_file, at),
            status=Status.UNMEASURED,
            reason=UNMEASURED_EXPECTED
            if note.expected_error
            else UNMEASURED_SPENT
            if spent and not note.needed
            else UNMEASURED_NOT_NEEDED
            if not note.needed
            else UNMEASURED_STOPPED
            if note.stopped
            else UNMEASURED_NEEDED,
            answer=note,
        )

    @classmethod
    def replayed(cls, started: "Record", recorded: dict, *, source: str, reused: bool, ended_at: str) -> "Record":
        """The recorded end `recorded` served for `started` by the replay executor: its measurement and
        provenance, with `replay` naming it."""
        rec = parse(recorded)
        replay = Replay(source=source, run_id=rec.run_id, attempt=rec.attempt, started_at=rec.started_at, reused=reused)
        fields = rec.model_dump(include=_REPLAYED, exclude_unset=True)
        return started._end(rec.status, rec.reason, ended_at=ended_at, replay=replay, **fields)

    @classmethod
    def interrupted(
        cls, started: "Record", reason: str, *, ended_at: str, log: str | None = None, wall_s: float | None = None,
        warnings: list[str] | None = None,
    ) -> "Record":  # fmt: skip
        """The orchestrator stopped while the cell ran (Ctrl-C), or --resume found an attempt that never ended
        (wall_s: how long it ran, as far as its log and the run's records tell; warnings say how it was told).
        It keeps the provenance of the attempt it ends (that of this process for a v1 start, which had none)."""
        return started._end(
            Status.INTERRUPTED,
            reason,
            ended_at=ended_at,
            log=log,
            provenance=started.provenance or Provenance.model_validate(env.provenance()),
            **({"wall_s": wall_s} if wall_s is not None else {}),
            **({"warnings": warnings} if warnings else {}),
        )

    @classmethod
    def error(cls, started: "Record", reason: str, *, ended_at: str, traceback: str, log: str) -> "Record":
        """zerobench itself failed around the cell (not the worker: that is an outcome)."""
        return started._end(Status.ERROR, reason, ended_at=ended_at, traceback=traceback, log=log)

    @classmethod
    def from_outcome(
        cls,
        started: "Record",
        out: Any,
        *,
        ds_config: dict | None,
        log: str,
        ended_at: str,
        variant: str | None = None,
        beside: list[str] | None = None,
    ) -> "Record":
        """The attempt as the launcher classified it (a bench.execute.launch.Outcome) with the ranks' documents;
        beside: the cells that ran during its measured phase, where it ran in a pool (bench.execute.executors.local)."""
        docs, bad = [], []
        for d in sorted(out.ranks, key=lambda d: d.get("rank", 0) if isinstance(d.get("rank"), int) else 0):
            try:
                docs.append(WorkerDoc.model_validate(d))
            except ValidationError as e:
                bad.append(f"rank {d.get('rank')}: {_short(e)}")
        status, reason = out.status, out.reason
        if bad:  # a worker of another version, or a bug: say so instead of guessing what it meant
            status, reason = (
                Status.ERROR,
                "a result document does not match bench.records.record.WorkerDoc: " + "; ".join(bad),
            )
        rank0 = next((d for d in docs if d.rank == 0), docs[0] if docs else WorkerDoc())
        facts = {k: getattr(rank0, k) for k in WorkerFacts.model_fields}
        facts["fault_injected"] = facts["fault_injected"] or getattr(out, "fault", None)
        tel = out.telemetry
        foreign = {i: list(s["procs"]) for i, s in out.gpu_before.items() if s.get("procs")}
        return started._end(
            status,
            reason,
            ended_at=ended_at,
            variant=variant,
            wall_s=out.wall_s,
            exit_code=out.exit_code,
            phase_at_end=out.phase_at_end,
            metrics=_metrics(rank0, tel),
            memory=_memory(docs, tel),
            losses=rank0.losses,
            step_times_s=rank0.step_times_s,
            **({"steps": rank0.steps} if rank0.steps is not None else {}),
            world_size=len(out.ranks) or None,
            ranks=[RankEnd(rank=d.rank, status=d.status, reason=d.reason[:600], **_node_of(out, d.rank)) for d in docs]
            if len(out.ranks) > 1
            else None,
            **({"nodes": [NodeRun.model_validate(n) for n in out.nodes]} if getattr(out, "nodes", None) else {}),
            # Every fact, None where the worker had none, so each record has the same keys.
            worker=WorkerFacts(**facts),
            warnings=_warnings(docs, getattr(out, "warnings", None)) or None,
            telemetry=tel,
            ds_config=ds_config,
            foreign_gpu_processes=foreign or None,
            gpu_after=out.gpu_after or None,
            started_by=out.started_by or None,
            **_placement(started.placement, getattr(out, "port", None), beside, getattr(out, "node", None)),
            **_node_provenance(started, getattr(out, "node", None)),
            log=log,
            log_tail=out.log_tail[-6000:],
            traceback=rank0.traceback,
        )

    def _end(self, status: Status, reason: str, **fields) -> "Record":
        if self.status is not Status.STARTED:
            raise ValueError(f"a record ends a started record, not a {self.status} one")
        keep = self.model_dump(
            include={
                "schema_version",
                "run_id",
                "attempt",
                "repeat",
                "matrix",
                "matrix_file",
                "inputs",
                "cell_id",
                "cell_hash",
                "cell_name",
                "cell",
                "started_at",
                "provenance",
                "predicted",
                "fixed_costs",
                "placement",
                "answer",
            }
        )
        for k in ("predicted", "fixed_costs", "placement", "answer"):
            if keep.get(k) is None:
                keep.pop(k, None)  # a record without one has no such key
        # As the started record has them, without the unset defaults.
        if self.fixed_costs is not None:
            keep["fixed_costs"] = self.fixed_costs.model_dump(exclude_unset=True)
        if self.placement is not None:
            keep["placement"] = self.placement.model_dump(exclude_unset=True)
        if self.answer is not None:
            keep["answer"] = self.answer.model_dump(exclude_unset=True)
        out = {**keep, "schema_version": SCHEMA_VERSION, "status": status, "reason": reason, **fields}
        if "machine" not in fields:  # where it ran as its end says: a cluster node's provenance and GPUs
            place = out.get("placement")
            held = place.gpus if isinstance(place, Placement) else (place or {}).get("gpus")
            m = machine_of(out.get("provenance"), held)
            # The probe's figures where it ended on the machine it started on (not on a cluster node beside it).
            same = m is not None and self.machine is not None and m.id == self.machine.id
            out["machine"] = _with_rates(m, self.machine.rates if same else None)
        return type(self).model_validate(out)

    @property
    def block(self) -> str:
        """The block the measurement belongs to: one run part (one `zerobench run`; a replayed record's, the run it
        replays) on one machine, "RUN@MACHINE" ("RUN@unknown" where the machine is). Measurements of one block
        compare directly; blocks differ by the machine's speed and compare only through cells measured in both."""
        run = self.replay.run_id if self.replay is not None else self.run_id
        return f"{run}@{self.machine.id if self.machine is not None else 'unknown'}"

    # -- serialisation ------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The record as read: the fields the constructor set (a started record has no metrics key at all)."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def compact(self) -> bool:
        """A record of a cell that did not run (format version 4): it names its cell and says why, nothing more."""
        return self.status in NOT_RUN

    def stored(self) -> dict:
        """The line the store writes: to_dict(), less a compact record's cell_name and cell_hash (its cell_id's)."""
        d = self.to_dict()
        if self.compact and d.get("cell_id") == f"{self.cell_name}#{self.cell_hash}":
            d.pop("cell_name", None)
            d.pop("cell_hash", None)
        return d


def _node_of(out: Any, rank: int) -> dict:
    """{"node": k} for a rank of a cell of several nodes; {} on one node."""
    node = next((n["node"] for n in getattr(out, "nodes", None) or [] if rank in n["ranks"]), None)
    return {"node": node} if node is not None else {}


def _placement(start: Placement | None, port: int | None, beside: list[str] | None, node: dict | None) -> dict:
    """The outcome's placement: where its start said it runs, with the port and the neighbours it had, and on a
    cluster what its executor learnt once it ran (the node, the GPUs its scheduler gave it, the job)."""
    if start is None and port is None and beside is None and not node:
        return {}
    p = (start or Placement()).model_copy()
    if port is not None:
        p.port = port
    if beside is not None:
        p.beside = beside
    for field_, key in (
        ("node", "host"), ("node_id", "node_id"), ("gpus", "gpus"), ("slurm_job", "slurm_job"),
        ("slurm_nodes", "slurm_nodes"),
    ):  # fmt: skip
        if node and node.get(key) is not None:
            setattr(p, field_, node[key])
    return {"placement": p}


def _node_provenance(started: "Record", node: dict | None) -> dict:
    """On an outcome a cluster node ran: the node's provenance, and the orchestrator's (the start's) beside it."""
    if not node or not node.get("provenance"):
        return {}
    return {"provenance": node["provenance"], "orchestrator": started.provenance}


NOT_RUN = (Status.SKIPPED, Status.IMPLIED_OOM, Status.UNMEASURED)
"""The statuses of cells that did not run, whose records are compact (version 4)."""


def _not_run(cell: _Cell, run_id: str, attempt: int, matrix_file: str, at: str) -> dict:
    """A compact record's identity: the cell by id within its matrix (its settings only where the matrix file
    cannot give them back: a DeepSpeed config given on the command line), when it was decided."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "attempt": attempt,
        "matrix": cell.matrix,
        "matrix_file": matrix_file,
        "cell_id": cell.id,
        "cell_name": cell.name,
        "cell_hash": cell.hash,
        **({"cell": cell.to_dict()} if getattr(cell, "ds_config", None) else {}),
        "started_at": at,
    }


# A pruned cell's prediction as its record keeps it: what was judged against what, not the terms.
_FIGURES = ("gpu_bytes", "host_bytes", "gpu_memory_bytes", "host_memory_bytes", "margin", "gpu_verdict", "host_verdict")


def _figures(predicted: dict) -> dict:
    return {k: predicted[k] for k in _FIGURES if predicted.get(k) is not None}


def _rounded(note: dict) -> dict:
    """An answer note with its predicted figures to 4 significant digits (model output, not measurements)."""

    def r(x):
        return float(f"{x:.4g}") if isinstance(x, float) else x

    return {k: [r(x) for x in v] if isinstance(v, list) else r(v) for k, v in note.items()}


def _identity(cell: _Cell, run_id: str, attempt: int, matrix_file: str, repeat: int = 1) -> dict:
    inputs = Inputs(
        matrix_sha256=env.file_sha(matrix_file) if matrix_file else None,
        ds_config_sha256=env.file_sha(cell.ds_config) if cell.ds_config else None,
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "attempt": attempt,
        "repeat": repeat,
        "matrix": cell.matrix,
        "matrix_file": matrix_file,
        "inputs": inputs,
        "cell_id": cell.id,
        "cell_hash": cell.hash,
        "cell_name": cell.name,
        "cell": cell.to_dict(),
    }


# What the sampler adds per measured phase about the GPU's state (bench.execute.launch.telemetry): a cell that ran
# hot or throttled is not comparable with one that did not.
_CLOCK_FIELDS = (
    "sm_clock_mean_mhz",
    "sm_clock_min_mhz",
    "mem_clock_mean_mhz",
    "temperature_max_c",
    "power_max_w",
    "throttle_reasons",
)


def _metrics(rank0: WorkerDoc, tel: dict) -> Metrics | None:
    """Rank 0's throughput, and the energy per token where NVML measured the measured phase."""
    if rank0.metrics is None or not rank0.metrics.model_fields_set:
        return None
    m = rank0.metrics.model_copy()
    measured = tel.get("phases", {}).get("measured", {})
    if measured.get("energy_j") and measured.get("duration_s"):
        m.energy_j_per_token = measured["energy_j"] / (m.tokens_per_s * measured["duration_s"])
        m.gpu_util_mean_pct = measured.get("gpu_util_mean_pct")
        m.power_mean_w = measured.get("power_mean_w")
    for k in _CLOCK_FIELDS:
        if measured.get(k) is not None:
            setattr(m, k, measured[k])
    return m


def _memory(docs: list[WorkerDoc], tel: dict) -> Memory:
    """The attempt's peaks: the sampler's (host RSS; NVML where present) and the ranks' allocator's."""
    ph = tel.get("phases", {})
    setup, measured = ph.get("setup", {}), ph.get("measured", {})
    mem: dict = {
        "host_rss_peak_bytes": tel.get("all", {}).get("host_rss_peak_bytes"),
        "host_rss_peak_setup_bytes": setup.get("host_rss_peak_bytes"),
        "host_rss_peak_measured_bytes": measured.get("host_rss_peak_bytes"),
    }
    if tel.get("nvml"):
        for name, w in (("setup", setup), ("measured", measured)):
            mem[f"nvml_used_peak_{name}_bytes"] = w.get("nvml_used_peak_bytes")
            mem[f"nvml_proc_peak_{name}_bytes"] = w.get("nvml_proc_peak_bytes")
        for k in ("nvml_used_peak_bytes", "nvml_proc_peak_bytes", "nvml_proc_peak_per_gpu"):
            mem[k] = tel["all"].get(k)
    alloc_m = [d.memory_measured for d in docs if d.memory_measured and d.memory_measured.model_fields_set]
    alloc_s = [d.memory_setup for d in docs if d.memory_setup and d.memory_setup.model_fields_set]
    if alloc_m:
        mem["torch_max_allocated_bytes"] = max(a.torch_max_allocated_bytes for a in alloc_m)
        mem["torch_max_reserved_bytes"] = max(a.torch_max_reserved_bytes for a in alloc_m)
        mem["torch_max_allocated_per_gpu"] = [a.torch_max_allocated_bytes for a in alloc_m]
        for part in STEP_PARTS:
            v = [x for a in alloc_m if (x := getattr(a, f"torch_max_allocated_{part}_bytes"))]
            if v:
                mem[f"torch_max_allocated_{part}_bytes"] = max(v)
        between = [a.torch_allocated_between_steps_bytes for a in alloc_m if a.torch_allocated_between_steps_bytes]
        if between:
            mem["torch_allocated_between_steps_bytes"] = max(between)
            mem["torch_allocated_between_steps_per_gpu"] = between
    if alloc_s:
        mem["torch_max_allocated_setup_bytes"] = max(a.torch_max_allocated_bytes for a in alloc_s)
        mem["torch_max_reserved_setup_bytes"] = max(a.torch_max_reserved_bytes for a in alloc_s)
    return Memory(**mem)


def _warnings(docs: list[WorkerDoc], launcher: list[str] | None) -> list[str]:
    """The launcher's notes on the attempt, then each rank's (the same op built on two ranks is said once)."""
    out = list(launcher or [])
    for d in docs:
        for b in d.ops_built or []:
            out.append(
                f"op {b.get('op')} was built inside the cell ({b.get('s')} s): its wall time and setup memory "
                "include the build"
            )
        out += d.stale_locks_removed or []
    return list(dict.fromkeys(out))


def _short(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()[:5])[:600]


# -- reading: the upgrade chain ---------------------------------------------------------------------


def _v1_to_v2(rec: dict) -> dict:
    rec.setdefault("provenance", None)
    if rec.get("reason") is None:
        rec["reason"] = ""
    return rec


def _v2_to_v3(rec: dict) -> dict:
    """The machine its provenance names (GPU UUIDs; no boot id then), for an attempt; unknown (null) where it
    names none."""
    try:
        status = Status(rec.get("status"))
    except ValueError:
        return rec  # validation says what is wrong with it
    if status is Status.STARTED or status.ran:
        m = machine_of(rec.get("provenance"), (rec.get("placement") or {}).get("gpus"))
        rec["machine"] = m.model_dump(mode="json") if m is not None else None
    return rec


def _v3_to_v4(rec: dict) -> dict:
    return rec  # v4 only leaves fields out of compact records: a v3 record is a v4 one


# UPGRADES[n] turns a version-n record into a version-(n + 1) one.
UPGRADES: dict[int, Callable[[dict], dict]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4}
assert set(UPGRADES) == set(range(1, SCHEMA_VERSION)), "one upgrade per version step"


def upgrade(rec: dict) -> dict:
    """A stored record of any version, as the current version (a new dict; the argument is left as it is)."""
    v = rec.get("schema_version", 1)
    if not isinstance(v, int) or v < 1:
        raise RecordVersionError(f"schema_version {v!r} is not a version")
    if v > SCHEMA_VERSION:
        raise RecordVersionError(
            f"schema_version {v} is newer than this zerobench reads ({SCHEMA_VERSION}): upgrade zerobench"
        )
    rec = dict(rec)
    while v < SCHEMA_VERSION:
        rec = UPGRADES[v](rec)
        v += 1
        rec["schema_version"] = v
    return rec


def parse(rec: dict) -> Record:
    """A stored record of any version, upgraded and validated."""
    return Record.model_validate(upgrade(rec))


def json_schema() -> dict:
    """The published JSON Schema of a stored record (the current version)."""
    s = Record.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **s,
        "title": f"zerobench result record, schema_version {SCHEMA_VERSION}",
    }
