"""What a worker measures and writes: its rank's result document (`WorkerDoc`, result.rank{N}.json) and the
measurements a record keeps of it (metrics, memory peaks, the worker's facts, the steps taken), with the
figures the orchestrator adds from its own sampling (bench.execute.launch.telemetry). Part of the record
(bench.records.record)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from . import adaptive
from .status import Status

__all__ = [
    "STEP_PARTS",
    "OPEN",
    "CLOSED",
    "ByGpu",
    "Bytes",
    "Rate",
    "Metrics",
    "AllocatorPeaks",
    "Memory",
    "WorkerFacts",
    "StepsTaken",
    "WorkerDoc",
    "worker_document",
    "worker_documents",
    "metrics_of",
    "memory_of",
    "warnings_of",
]

# The parts of a measured step whose allocator peaks the worker records (torch_max_allocated_<part>_bytes).
STEP_PARTS = ("forward", "backward", "step")

# NaN travels as JSON's NaN (a diverged cell's losses), as json.dumps writes it, not as null.
# The docstring under a field is its description in the published schema.
OPEN = ConfigDict(extra="allow", ser_json_inf_nan="constants", use_attribute_docstrings=True)
CLOSED = ConfigDict(extra="forbid", ser_json_inf_nan="constants", use_attribute_docstrings=True)
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


# -- the worker's measurements ---------------------------------------------------------------------


class Metrics(BaseModel):
    """Throughput and FLOPs of the measured steps (bench.worker.metrics), from rank 0. Open: a newer
    worker may add a figure; every key becomes a column of the results DataFrame."""

    model_config = OPEN
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

    model_config = OPEN
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

    model_config = OPEN
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

    model_config = CLOSED
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

    model_config = CLOSED
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
    model_config = OPEN
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


def worker_documents(raw: list) -> tuple[list[WorkerDoc], list[str]]:
    """The ranks' result documents as the orchestrator reads them (parsed JSON), by rank: each that matches
    WorkerDoc, and for each that does not, "rank N: why" (a worker of another version, or a bug)."""
    docs, bad = [], []
    for d in sorted(raw, key=_rank_of):
        try:
            docs.append(WorkerDoc.model_validate(d))
        except ValidationError as e:
            bad.append(f"rank {d.get('rank') if isinstance(d, dict) else None}: {_short(e)}")
    return docs, bad


def _rank_of(doc) -> int:
    rank = doc.get("rank") if isinstance(doc, dict) else None
    return rank if isinstance(rank, int) else 0


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


def metrics_of(rank0: WorkerDoc, tel: dict) -> Metrics | None:
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


def memory_of(docs: list[WorkerDoc], tel: dict) -> Memory:
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


def warnings_of(docs: list[WorkerDoc], launcher: list[str] | None) -> list[str]:
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
