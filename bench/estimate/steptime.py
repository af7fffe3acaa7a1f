"""Time a cell takes, predicted before it runs, from the cell and the hardware alone: seconds per optimizer
step (the record's `metrics.step_time_median_s`) and the cell's wall time (the record's `wall_s`: the fixed
cost of start-up and setup, then the warm-up and measured steps).

The step is a sum of parts (PARTS), each a quantity the cell implies over a rate of the machine (rates_of: its
probe's figures, else its GPU's data sheet, bench.host.rates), times a dimensionless efficiency: the matmuls'
FLOPs over the matmul rate for the precision; the elementwise kernels' activation traffic, LoRA's adapter
traffic, QLoRA's dequantization, ZeRO-3's gathers and the GPU's optimizer step over the memory bandwidth; under
offload the host's optimizer step over the CPU Adam rate and the copies over PCIe each way; NVMe swaps; a paged
optimizer's state beyond the GPU's memory, paged over PCIe each way every step; and the host's launches per
layer and pass, PEFT's wrappers per adapted linear and pass, ZeRO's gradient hooks per trainable tensor in each
micro-batch, the optimizer's per-tensor launches once per step, and per-layer waits (counts, times the host's
time). Each efficiency is the exponential of fitted log factors, one per thing that changes it (precision, PEFT
mode, ZeRO stage, offload, pinning, optimizer, GPU count, engine, compile, kernels), shared by every GPU. The
GPU's work and the host's work that feeds it overlap (a smooth maximum of the two, OVERLAP); the other parts add.
The factors are fitted on the committed records, each at its GPU's rates (bench.estimate.checks.timecheck.fit_section),
each machine's host speed apart (HOST_PARTS): the host's parts take the host's time as measured before any cell
ran (host_time_of, the op prebuild's), and a prediction for a host not measured is for the typical host. The fit
lives in fit.json's "step_time" section (FIT), and tests/estimate/test_steptime.py holds it to a refit. Setup and the
rest of the wall time are log-linear in model size and stage. The functions are pure (cell, hardware ->
seconds), so a search can rank cells by them; the model's error on records it was not fitted on is published
beside the fit (bench.estimate.band), and host_share says how much of a cell's step a faster or slower host
would move.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from ..host.rates import DEVICE_RATES, Rates, datasheet
from ..matrix import dsconfig
from ..matrix.axes import AUTO, optimizer_offloaded, params_offloaded
from ..matrix.shapes import Shape, adapted, shape_of, trainable_params
from ..records.adaptive import Schedule
from ..records.record import FixedCosts
from . import fitdata
from .model import Hardware

__all__ = [
    "FITTED_RUNS",
    "FITTED_TIME",
    "HOST_OPS",
    "HOST_PARTS",
    "REF_OPS_S",
    "STEP_BAND",
    "STEP_BAND_HOST",
    "TIME_NAMES",
    "TRAIT_FILES",
    "TimeConstants",
    "combine",
    "compute_seconds",
    "flops_per_token",
    "host_share",
    "host_time_of",
    "matmul_rate",
    "paged_excess",
    "pageable_ratio",
    "rates_of",
    "pinned",
    "predict_setup",
    "predict_start",
    "predict_step",
    "predict_wall",
    "run_seconds",
    "run_time_line",
    "searched",
    "step_and_share",
    "step_parts",
    "traits",
    "setup_features",
    "start_features",
]

# The rates a prediction divides by (bench.host.rates): the machine's probed figures, else its GPU's data sheet,
# else the H200's (the GPU the fit saw most). Host figures no data sheet gives are taken relative to the typical
# fitting host (REF_CORES, host_time), or at these reference rates, which the fitted efficiencies are relative to.
REFERENCE_GPU = "H200"
REF_CORES = 16
"""Host cores the fitting records' CPU optimizer mostly ran on: a hardware with no core count is taken to have
these."""
REF_CPU_ADAM = 1e9
"""A reference CPU Adam rate (parameters per second at REF_CORES cores): the host part's efficiency is fitted
against it, scaled by a host's cores, or by a probed rate (Rates.cpu_adam) over the fitting hosts' probed rate
(REF_PROBED_CPU_ADAM) where they carried one (_cpu_adam)."""
REF_NVME = 2e9
"""A reference NVMe rate (bytes per second each way; no probe measures it): the nvme part's efficiency is fitted
against it."""
DEQUANT_BYTES = 2.5
"""Bytes QLoRA's dequantize moves per parameter where no probe measured its rate: half a byte of NF4 read, two
bytes of bf16 written."""
UPDATE_BYTES = 32
"""Bytes a fused Adam step moves per trainable parameter on the GPU: fp32 master, momentum and variance read and
written (24), the fp32 gradient read (4), the 16-bit parameter written (2) and its gradient read (2)."""


def rates_of(hw: Hardware | None) -> Rates:
    """The rates a prediction on `hw` divides by: its probed rates (Hardware.rates), filled from its GPU's data
    sheet, then from REFERENCE_GPU's. The fitted efficiencies are relative to the data-sheet rates the fitting
    records were predicted at, so a GPU with a data sheet is predicted at it, and the probe's device figures stand
    in only for a GPU without one (a probe's achieved rate lies below the sheet's peak, and the fitted efficiencies
    already hold that gap: taking both would charge it twice, docs/step-time.md); the probe's host figures are used
    either way."""
    own = hw.rates if hw is not None else None
    sheet = datasheet(hw.gpu_name if hw else None)
    ref = datasheet(REFERENCE_GPU)
    if own is not None and sheet is not None:
        own = dataclasses.replace(own, **dict.fromkeys(DEVICE_RATES))
    return (own or sheet or ref).filled(sheet).filled(ref)


# The step's parts. Each is a base, a quantity the cell implies over a rate of the machine (rates_of): seconds
# at the rate, or for the host's parts a count times the host's time; times the exponential of a sum of fitted log
# factors, one per feature the cell has ("one" always): log 1/efficiency. A factor is named part_feature, or by the
# feature alone where one factor is shared by several parts. No factor names a GPU: what differs between GPUs is
# their rates.
PARTS = {
    "compute": (
        "compute_one",
        "compute_fp16",
        "compute_hf_trainer",
        "compute_compiled",
        "compute_liger",
        "compute_grad_ckpt",
        "compute_zero3",
        "compute_multi_gpu",
    ),
    "activations": ("activations_one",),
    "adapter": ("adapter_one", "adapter_qlora"),
    "dequant": ("dequant_one", "dequant_double_quant"),
    "params": (
        "params_one",
        "params_fp16",
        "params_multi_gpu",
        "params_zero12",
        "params_torch_adam",
        "params_paged",
        "params_bit8",
    ),
    "host": ("host_one", "host_torch_adam", "host_fp16"),
    "pcie": ("pcie_one", "pcie_unpinned"),
    "nvme": ("nvme_one",),
    "hooks": (
        "hooks_one",
        "hooks_zero2",
        "hooks_zero3",
        "hooks_fp16",
        "hooks_multi_gpu",
        "hooks_offload",
    ),
    "paged": ("paged_one",),
    "tensors": ("tensors_one", "tensors_bit8", "tensors_paged", "tensors_torch_adam", "tensors_zero12"),
    "launch": (
        "launch_one",
        "launch_qlora",
        "launch_hf_trainer",
        "launch_zero3",
        "launch_multi_gpu",
    ),
    "wrappers": ("wrappers_one", "wrappers_qlora", "wrappers_zero3"),
    "gather": ("gather_one", "gather_offload_params", "gather_multi_gpu", "gather_qlora", "gather_fp16"),
    "layers": ("layers_one", "layers_zero3", "layers_offload"),
}
PART_DOCS = {
    "compute": "the matmuls: FLOPs over the matmul rate for the precision (Rates.matmul_bf16, _fp16, _fp32)",
    "activations": "the elementwise kernels (norms, rotary, residual adds, SwiGLU's activation) reading and "
    "writing each block's activations: tokens x layers x (hidden + intermediate) x bytes per element x "
    "(passes + 1, backward reading and writing twice) over the memory bandwidth (Rates.hbm)",
    "adapter": "LoRA's adapters beside the frozen weights: their inputs and outputs read and written per "
    "token (tokens x the adapted linears' in + out features x 2 bytes x passes) over the memory bandwidth",
    "dequant": "QLoRA's 4-bit weights dequantized before each use (frozen linear parameters x micro-batches x "
    "passes) over the probed dequantize rate (Rates.dequant_4bit), else DEQUANT_BYTES each over the memory "
    "bandwidth",
    "params": "the optimizer step on the GPU (with the gradient copies, reduction and, in fp16, the overflow "
    "check): UPDATE_BYTES per trainable parameter over the memory bandwidth",
    "host": "the optimizer step on the host under offload: trainable parameters over the CPU Adam rate "
    "(REF_CPU_ADAM scaled by the host's cores over REF_CORES, or by a probed Rates.cpu_adam over the fitting "
    "hosts' probed rate, REF_PROBED_CPU_ADAM)",
    "pcie": "offload's copies between host and GPU: 16-bit gradients out (Rates.d2h_pinned), updated 16-bit "
    "parameters back and, with parameter offload, every parameter in for each pass (Rates.h2d_pinned); "
    "buffers not pinned take the pcie_unpinned factor, and a probed pageable-to-pinned ratio over the fitting "
    "machines' (REF_PAGEABLE)",
    "nvme": "ZeRO-Infinity's NVMe swaps: optimizer state read and written each step, parameters read for "
    "each pass, over REF_NVME",
    "paged": "bitsandbytes' paged optimizer state that does not fit beside the GPU's peak (the memory model's "
    "paged_bytes beyond the GPU's memory): paged in and out once a step, each way over PCIe (Rates.h2d_pinned, "
    "d2h_pinned)",
    "hooks": "DeepSpeed's ZeRO gradient hooks on the host, per trainable tensor in each micro-batch's backward "
    "(ZeRO-1 and -2 copy each gradient toward its partition, ZeRO-3 also releases it), overlapping the GPU's "
    "work: per 100 trainable tensors per micro-batch, times the host's time (ZeRO-0 has none)",
    "tensors": "per trainable tensor costs on the host once per optimizer step (the optimizer's and the "
    "gradient norm's per-tensor launches; not under optimizer offload, whose step is the host part): per 100 "
    "trainable tensors, times the host's time",
    "launch": "the host launching each block's kernels (and ZeRO-3's fetch and release hooks, QLoRA's "
    "bitsandbytes calls) while the GPU runs those queued before: per 100 layers per forward (a backward counts "
    "HOST_BACKWARD of one), times the host's time",
    "wrappers": "PEFT's wrapper of each adapted linear on the host (its dropout, the two small matmuls, the "
    "scale and add): per 1000 adapted linears per forward (a backward counts HOST_BACKWARD of one), times the "
    "host's time",
    "gather": "ZeRO-3's parameter gathers in forward, backward (and recompute): 16-bit parameters per pass "
    "over the memory bandwidth",
    "layers": "fixed costs per layer per micro-batch that the GPU waits on (ZeRO-3's fetch and release, "
    "offload's synchronisations): per 100 layers, times the host's time",
}


def _unique(names) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


STEP_NAMES = _unique(n for names in PARTS.values() for n in names)


def feature_of(part: str, name: str) -> str:
    """The cell feature a factor multiplies: its name less the part's prefix (a shared factor is named by
    its feature)."""
    return name.removeprefix(part + "_")


SETUP_FEATURES = ("setup_log", "setup_size", "setup_zero3", "setup_offload", "setup_qlora", "setup_multi_gpu")
START_FEATURES = ("start_log", "start_spawn", "start_compile", "start_zero3", "start_offload")
_FIELDS = [(n, float, dataclasses.field(default=0.0)) for n in STEP_NAMES + SETUP_FEATURES + START_FEATURES]

TimeConstants = dataclasses.make_dataclass("TimeConstants", _FIELDS, frozen=True, slots=True)
TimeConstants.__module__ = __name__
TimeConstants.__doc__ = (
    "The step-time model's fitted log factors (see PARTS and PART_DOCS); the setup's (the worker's "
    "setup_s: model build and engine init): log seconds of a 1B cell on one GPU (setup_log), the slope "
    "over log(parameters / 1e9) (setup_size), log factors for ZeRO-3, offload, QLoRA, more than one GPU; "
    "and the start's (the rest of the wall time beside setup and steps: the interpreter's imports unless "
    "forked from a warm server, the first step's compile and allocation, teardown): log seconds, and log "
    "factors for a spawned start, torch.compile, ZeRO-3 and offload."
)

TIME_NAMES = tuple(f.name for f in fields(TimeConstants))
SETUP_NAMES = SETUP_FEATURES + START_FEATURES
# The fit (bench.estimate.checks.timecheck.fit_section, written by `zerobench estimate --check --refit` into fit.json's
# "step_time" section): the constants, the error band, the traits' files and the runs it was fitted on.
FIT = fitdata.section("step_time")
FITTED_TIME = TimeConstants(**{n: v for n, v in FIT.get("constants", {}).items() if n in TIME_NAMES})

# The step-time model's error on records it was not fitted on (leave one results file out), published for a
# search (bench.estimate.band): per group of cells, the records, the median and 95th percentile of
# |log(predicted / measured)|, the edges of log(measured / predicted) at the calibrated central level, and that
# level. "familiar": every trait of the cell (traits()) was in at least FAMILIAR_FILES results files the fit
# saw; "unfamiliar": some trait was in fewer. STEP_BAND is the error of predictions for the typical host (a
# host whose time was not measured); STEP_BAND_HOST that of predictions that took the host's time where its
# record measured it.
STEP_BAND: dict[str, dict[str, float]] = FIT.get("band", {})
STEP_BAND_HOST: dict[str, dict[str, float]] = FIT.get("band_host", {})
TRAIT_FILES: dict[str, int] = FIT.get("trait_files", {})
"""Results files each trait appears in, among those the constants were fitted on."""
FITTED_RUNS: tuple[str, ...] = tuple(FIT.get("runs", ()))
"""The runs (record run ids) whose records the constants were fitted on: `zerobench estimate --check` counts a
record of any other run as held out."""


# The host's speed, measured on the machine before any cell runs. H200 machines differ in their hosts, not
# their GPUs (docs/step-time.md, "Machines"): the 7b answer's second machine ran the host's parts of a step in
# about half the typical time, and compiled DeepSpeed's optimizer ops in about half the typical time too (35-37
# s against 53-76 s). A run compiles them before its cells on a machine whose cache lacks them
# (bench.execute.prepare: each op in a process of its own, so the prebuild's wall time, the record's
# `fixed_costs.ops_s`, is the slowest op's import and compile: the same sources, compiler and flags on every
# H200 host, single-threaded CPU work of a fixed size). Its ratio to REF_OPS_S, the median over the fitted runs
# that compiled them, is the host's time (Hardware.host_time), and the host's parts (HOST_PARTS) take it as
# measured: a host that compiles in half the typical time launches kernels and runs hooks in half the typical
# time. The exponent is 1, the physics, not fitted (left free, the fit on every record puts it at 1.27:
# bench.estimate.checks.timecheck.host_exponent).
HOST_OPS = ("FusedAdamBuilder", "CPUAdamBuilder", "FusedLambBuilder")
"""The ops whose prebuild times the host (an AsyncIO or shared-memory op alone compiles far less)."""
REF_OPS_S: float = FIT.get("ref_ops_s", 60.0)
"""The median op prebuild of the fitted runs that compiled HOST_OPS (seconds): the typical host's."""
REF_HOST_OVERHEAD_S: float | None = FIT.get("ref_host_overhead_s")
"""The median per-step host overhead (Rates.host_overhead_s) the probe measured on the fitted runs' machines: the
typical host's; None where no fitting record carries a probe's figures (host_scale then reads host_time alone)."""
# A probe's host and link figures are read relative to the same figure probed on the fitting machines, as the GPU's
# are relative to the data sheets: each efficiency already holds the gap between the reference it was fitted against
# and what the fitting hosts achieved, so a probed figure used as is would count that gap twice.
REF_PROBED_CPU_ADAM: float | None = FIT.get("ref_cpu_adam")
"""The median CPU Adam rate (Rates.cpu_adam) the probe measured on the fitted runs' machines; None where none carried
one (a probed rate then tells nothing the fit can use: the host's cores scale REF_CPU_ADAM)."""
REF_PAGEABLE: float | None = FIT.get("ref_pageable")
"""The median ratio of pageable to pinned PCIe rates (both ways together) the probe measured on the fitted runs'
machines; None where none carried one (the pcie_unpinned factor alone then carries pageable buffers' slowdown)."""


def host_time_of(fixed_costs: FixedCosts | Mapping[str, Any] | None, ref: float | None = None) -> float | None:
    """The host's time (Hardware.host_time) from a run's one-off costs (a record's `fixed_costs`): its op
    prebuild's seconds over REF_OPS_S (`ref`), where the prebuild compiled one of HOST_OPS and none failed;
    None otherwise (the machine's cache held them: nothing was timed)."""
    if isinstance(fixed_costs, FixedCosts):
        ops, seconds = fixed_costs.ops, fixed_costs.ops_s
    else:
        ops, seconds = (fixed_costs or {}).get("ops") or {}, (fixed_costs or {}).get("ops_s")
    compiled = any(ops.get(op) == "built" for op in HOST_OPS) and "failed" not in ops.values()
    return seconds / (ref or REF_OPS_S) if compiled and seconds else None


def matmul_rate(hw: Hardware | None, precision: str = "bf16") -> float:
    """The dense matmul rate (FLOP/s) a cell of this precision runs at (rates_of): PyTorch's default fp32 matmul
    is full fp32, not TF32, so an fp32 cell runs at the fp32 rate."""
    r = rates_of(hw)
    return {"fp32": r.matmul_fp32, "fp16": r.matmul_fp16}.get(precision, r.matmul_bf16)


def flops_per_token(cell: Any, s: Shape) -> float:
    """Matmul FLOPs per token of one training step, the recompute of checkpointing included: 2N forward,
    2N for the input gradients, 2N more for the weight gradients of trainable weights only (a frozen weight
    needs none), plus attention's score and value matmuls (4 x seq x hidden per layer forward)."""
    dense = s.linear_params + s.head_params
    attn = 4 * cell.seq_len * s.hidden * s.layers
    lora = trainable_params(cell, s) if adapted(cell) else 0
    fwd = 2 * dense + attn + 2 * lora
    bwd = 2 * dense + 2 * attn + 4 * lora + (0 if adapted(cell) else 2 * dense)
    return fwd * (2 if cell.grad_ckpt else 1) + bwd


def tokens_per_step(cell: Any) -> int:
    return cell.micro_batch * cell.grad_accum * cell.seq_len


def compute_seconds(cell: Any, hw: Hardware | None = None) -> float | None:
    """Seconds of one step's matmuls at the matmul rate; None for a model whose shape is unknown."""
    s = shape_of(cell.model)
    if s is None:
        return None
    return tokens_per_step(cell) * flops_per_token(cell, s) / matmul_rate(hw, cell.precision)


def _compiled(cell: Any) -> bool:
    return bool(getattr(cell, "compile", False))


def pinned(cell: Any, ds_config: dict | None = None) -> bool:
    """Offload's host buffers are pinned: zerobench's generated config pins them; a user's config as it
    says (DeepSpeed's default: not pinned)."""
    if ds_config is None:
        if getattr(cell, "ds_config", None) is None:
            return True
        try:
            ds_config = dsconfig.build(cell)
        except Exception:  # noqa: BLE001 - a config that cannot be read: the generated config's choice
            return True
    z = (ds_config or {}).get("zero_optimization") or {}
    return any(
        isinstance(z.get(k), dict) and z[k].get("pin_memory", False) for k in ("offload_optimizer", "offload_param")
    )


def _flags(cell: Any, ds_config: dict | None) -> dict[str, float]:
    off = optimizer_offloaded(cell.offload)
    return {
        "one": True,
        "fp16": cell.precision == "fp16",
        "lora": cell.peft == "lora",
        "qlora": cell.peft == "qlora",
        "adapted": adapted(cell),
        "double_quant": cell.peft == "qlora" and bool(getattr(cell.qlora, "double_quant", True)),
        "hf_trainer": cell.engine == "hf_trainer",
        "compiled": _compiled(cell),
        "liger": getattr(cell, "kernels", "hf") == "liger",
        "grad_ckpt": bool(cell.grad_ckpt),
        "zero12": cell.zero_stage in (1, 2),
        "zero2": cell.zero_stage == 2,
        "zero3": cell.zero_stage == 3,
        "multi_gpu": _ranks(cell) > 1,
        "offload": off,
        "offload_params": params_offloaded(cell.offload),
        "unpinned": off and not pinned(cell, ds_config),
        "torch_adam": cell.optimizer == "adamw",
        "paged": "paged" in cell.optimizer,
        "bit8": "8bit" in cell.optimizer,
    }


# The parts every cell has (their bases are never 0).
EVERY_CELL = ("compute", "activations", "launch", "layers")


def traits(cell: Any, ds_config: dict | None = None) -> frozenset[str]:
    """What about a cell the fit must have seen to predict it: the features its factors multiply (PARTS),
    the parts it has beyond those every cell has, and its precision."""
    on = {n for n, v in _flags(cell, ds_config).items() if v and n != "one"}
    s = shape_of(cell.model)
    if s is not None:
        on |= {p for p, b in _bases(cell, s, None, ds_config).items() if b and p not in EVERY_CELL}
    return frozenset(on | {cell.precision})


def _adapted_width(cell: Any, s: Shape) -> int:
    """In + out features of the adapted linears of one block (what LoRA's A reads and B writes per token)."""
    lin = s.linears()
    targets = tuple(cell.lora.targets)
    names = lin if targets == ("all-linear",) else [t for t in targets if t in lin]
    return sum(lin[n][0] + lin[n][1] for n in names)


def trainable_tensors(cell: Any, s: Shape) -> int:
    """Tensors the optimizer steps: two per adapted linear (LoRA's A and B), else every weight (seven linears
    and two norms per block, the embedding, the final norm and an untied head)."""
    if adapted(cell):
        return 2 * s.layers * s.lora_targets(tuple(cell.lora.targets))
    return 9 * s.layers + 2 + (0 if s.tied else 1)


def _bases(cell: Any, s: Shape, hw: Hardware | None, ds_config: dict | None = None) -> dict[str, float]:
    """Each part's base (PART_DOCS says what over which rate): seconds at the machine's rates (rates_of), the
    host's parts a count times the host's time."""
    r = rates_of(hw)
    mbs = cell.grad_accum
    passes = 2 + bool(cell.grad_ckpt)  # forward, backward, and the recompute of checkpointing
    host_passes = passes - 1 + HOST_BACKWARD  # the forwards, and the backward at its share of the host's work
    train = trainable_params(cell, s)
    off, off_par = optimizer_offloaded(cell.offload), params_offloaded(cell.offload)
    # 16-bit parameters streamed in from the host (or NVMe) for every pass of every micro-batch.
    par_bytes = passes * 2 * s.params * mbs if off_par else 0.0
    # LoRA's A reads each adapted linear's input and B writes its output, in forward, both backward
    # matmuls and the recompute.
    adapter = tokens_per_step(cell) * s.layers * _adapted_width(cell, s) * (passes + 1) if adapted(cell) else 0
    adapted_linears = s.layers * s.lora_targets(tuple(cell.lora.targets)) if adapted(cell) else 0
    # Elements each block's elementwise kernels read or write per token (16-bit, fp32 in an fp32 cell).
    elements = s.layers * (s.hidden + s.intermediate) * (4 if cell.precision == "fp32" else 2)
    dequant = (cell.peft == "qlora") * s.linear_params * mbs * passes
    h2d, d2h = _pcie(cell, r, ds_config)
    bases = {
        "compute": compute_seconds(cell, hw),
        "activations": tokens_per_step(cell) * elements * (passes + 1) / r.hbm,
        "adapter": 2 * adapter / r.hbm,
        "dequant": dequant / r.dequant_4bit if r.dequant_4bit else dequant * DEQUANT_BYTES / r.hbm,
        "params": 0.0 if off else train * UPDATE_BYTES / r.hbm,
        "host": train / _cpu_adam(hw, r) if off else 0.0,
        # Gradients out and updated 16-bit parameters back each step, 2 bytes each.
        "pcie": 2 * train / d2h + (2 * train + par_bytes) / h2d if off else 0.0,
        # fp32 master, momentum and variance read and written each step, and the parameters.
        "nvme": (24 * train + par_bytes + 2 * s.params) / REF_NVME if cell.offload == "nvme" else 0.0,
        "paged": paged_excess(cell, hw, ds_config) * (1 / r.h2d_pinned + 1 / r.d2h_pinned),
        "hooks": trainable_tensors(cell, s) * mbs / 100 if cell.zero_stage else 0.0,
        "tensors": 0.0 if off else trainable_tensors(cell, s) / 100,
        "launch": s.layers * host_passes * mbs / 100,
        "wrappers": adapted_linears * host_passes * mbs / 1000,
        "gather": (cell.zero_stage == 3) * 2 * s.params * mbs * passes / r.hbm,
        "layers": s.layers / 100 * mbs,
    }
    host = host_scale(hw)
    return {part: base * host if part in HOST_PARTS else base for part, base in bases.items()}


def host_scale(hw: Hardware | None) -> float:
    """The host's time for its parts (HOST_PARTS) over the typical fitting host's: Hardware.host_time where the
    run measured it (host_time_of); else the probe's per-step host overhead (Rates.host_overhead_s) over the
    fitting records' (REF_HOST_OVERHEAD_S, where they carried probes); else 1 (a prediction for the typical host)."""
    if hw is not None and hw.host_time:
        return hw.host_time
    rates = hw.rates if hw is not None else None
    probed = rates.host_overhead_s if rates is not None and rates.source == "probe" else None
    return probed / REF_HOST_OVERHEAD_S if probed and REF_HOST_OVERHEAD_S else 1.0


def _cpu_adam(hw: Hardware | None, r: Rates) -> float:
    """The host's CPU Adam rate (parameters/s) against which the host part's efficiency was fitted: REF_CPU_ADAM
    times the probed rate over the fitting hosts' (REF_PROBED_CPU_ADAM) where both are known, else REF_CPU_ADAM
    at the host's cores."""
    if r.cpu_adam and REF_PROBED_CPU_ADAM:
        return REF_CPU_ADAM * r.cpu_adam / REF_PROBED_CPU_ADAM
    cores = (hw.host_cores if hw else None) or REF_CORES
    return REF_CPU_ADAM * cores / REF_CORES


def pageable_ratio(r: Rates) -> float | None:
    """Pageable over pinned PCIe rates, both ways together (harmonic: what a copy each way takes), where the
    probe measured all four."""
    if not (r.h2d_pageable and r.d2h_pageable and r.h2d_pinned and r.d2h_pinned):
        return None
    return (1 / r.h2d_pinned + 1 / r.d2h_pinned) / (1 / r.h2d_pageable + 1 / r.d2h_pageable)


def _pcie(cell: Any, r: Rates, ds_config: dict | None) -> tuple[float, float]:
    """(host to device, device to host) bytes/s for offload's buffers: the pinned rates; for buffers not pinned
    (whose slowdown the pcie_unpinned factor carries, fitted against the fitting machines' links) times this
    link's pageable-to-pinned ratio over the fitting machines' (REF_PAGEABLE), where both are known."""
    ratio = pageable_ratio(r)
    if pinned(cell, ds_config) or ratio is None or not REF_PAGEABLE:
        return r.h2d_pinned, r.d2h_pinned
    return r.h2d_pinned * ratio / REF_PAGEABLE, r.d2h_pinned * ratio / REF_PAGEABLE


def paged_excess(cell: Any, hw: Hardware | None, ds_config: dict | None = None) -> float:
    """Bytes of a paged optimizer's state (bench.estimate.model.Estimate.paged_bytes, in CUDA managed memory) that
    do not fit in the GPU's memory beside the predicted peak: the driver pages them to the host and back each
    step. 0 for an optimizer that does not page, and where the GPU's memory is not known."""
    cap = hw.gpu_memory_bytes if hw else None
    if not cap or "paged" not in cell.optimizer:
        return 0.0
    from .model import predict

    est = predict(cell, ds_config)
    return min(est.paged_bytes, max(0.0, est.gpu_bytes + est.paged_bytes - cap))


def _ranks(cell: Any) -> int:
    return cell.gpus * getattr(cell, "nodes", 1)


def step_parts(
    cell: Any, hw: Hardware | None = None, ds_config: dict | None = None
) -> dict[str, tuple[float, tuple[float, ...]]] | None:
    """Each part's base and the cell's value of each of its factors' features (PARTS); None for a model
    whose shape is unknown, and for a cell of several nodes: the constants were fitted on single-node runs,
    whose collectives never crossed a network."""
    s = shape_of(cell.model)
    if s is None or getattr(cell, "nodes", 1) > 1:
        return None
    flags = _flags(cell, ds_config)
    bases = _bases(cell, s, hw, ds_config)
    return {
        part: (bases[part], tuple(float(flags[feature_of(part, n)]) for n in names)) for part, names in PARTS.items()
    }


def _part_seconds(base: float, x: tuple[float, ...], part: str, k: Any) -> float:
    return base * math.exp(sum(v * getattr(k, n) for v, n in zip(x, PARTS[part])))


# The GPU's kernels and the host's work that feeds them overlap (the host launches a block's kernels, runs
# PEFT's wrappers and DeepSpeed's hooks while the GPU works through the kernels queued ahead): their time is a
# smooth maximum of the two, (gpu^p + host^p)^(1/p) with p = OVERLAP, so a small micro-batch waits on the host
# and a large one on the GPU. The other parts (the optimizer step, offload's copies and swaps, the per-layer
# costs the GPU waits on) add to it.
GPU_PARTS = ("compute", "activations", "adapter", "dequant", "gather")
CPU_PARTS = ("hooks", "launch", "wrappers")
# The parts the host runs or the GPU waits on it for, by the host's speed (its launches, hooks, per-tensor
# work and per-layer synchronisations): what differs between machines with the same GPU (the fit's machine
# offsets, bench.estimate.checks.timecheck) and what makes a cell's band wide (bench.estimate.band).
HOST_PARTS = ("hooks", "tensors", "launch", "wrappers", "layers")
OVERLAP = 4.0
# A forward's kernels are launched from Python, module by module (HF's and PEFT's forward methods, their
# hooks); the backward's are launched by autograd's C++ engine from the graph the forward recorded, at about
# half the host time per layer. The host parts count a backward as this share of a forward.
HOST_BACKWARD = 0.5


def combine(seconds: dict[str, Any], p: float | None = None) -> tuple[Any, dict[str, Any]]:
    """The step's seconds from its parts' seconds (floats, or arrays of them), and the step's derivative by
    each part's seconds (what the fit needs)."""
    p = OVERLAP if p is None else p
    gpu = sum(seconds[n] for n in GPU_PARTS)
    cpu = sum(seconds[n] for n in CPU_PARTS)
    both = (gpu**p + cpu**p) ** (1 / p)
    total = both + sum(v for n, v in seconds.items() if n not in GPU_PARTS + CPU_PARTS)
    dg, dc = (gpu / both) ** (p - 1), (cpu / both) ** (p - 1)
    return total, {n: dg if n in GPU_PARTS else dc if n in CPU_PARTS else 1.0 for n in seconds}


def searched(cell: Any, hw: Hardware | None) -> Any:
    """A micro_batch: auto cell as its search's first probe: at the largest micro-batch the memory model
    predicts to fit (bench.estimate.planning.search.seed_micro_batch; 1 without a GPU to judge against). The search's
    further probes are not counted."""
    if cell.micro_batch != AUTO:
        return cell
    from .planning.search import seed_micro_batch

    return dataclasses.replace(cell, micro_batch=seed_micro_batch(cell, hw or Hardware()))


def _seconds(cell: Any, hw: Hardware | None, k: Any, ds_config: dict | None) -> dict[str, float] | None:
    """Each part's predicted seconds (a micro_batch: auto cell at its search's first probe)."""
    cell = searched(cell, hw)
    parts = step_parts(cell, hw, ds_config)
    if parts is None:
        return None
    return {part: _part_seconds(base, x, part, k) for part, (base, x) in parts.items()}


def predict_step(
    cell: Any, hw: Hardware | None = None, k: Any = FITTED_TIME, ds_config: dict | None = None
) -> float | None:
    """Predicted seconds per optimizer step from its parts; None for a model whose shape is unknown. A
    micro_batch: auto cell is predicted at its search's first probe (searched)."""
    both = step_and_share(cell, hw, k, ds_config)
    return None if both is None else both[0]


def host_share(
    cell: Any, hw: Hardware | None = None, k: Any = FITTED_TIME, ds_config: dict | None = None
) -> float | None:
    """How much of the predicted step moves with its host's speed: d log(step) / d log(the HOST_PARTS'
    seconds), from 0 (the GPU's work hides the host's) to 1 (the step waits on the host); None for a model
    whose shape is unknown."""
    both = step_and_share(cell, hw, k, ds_config)
    return None if both is None else both[1]


def step_and_share(
    cell: Any, hw: Hardware | None = None, k: Any = FITTED_TIME, ds_config: dict | None = None
) -> tuple[float, float] | None:
    """(predict_step, host_share) from one pass over the parts; None for a model whose shape is unknown."""
    seconds = _seconds(cell, hw, k, ds_config)
    if seconds is None:
        return None
    total, slope = combine(seconds)
    return total, sum(slope[n] * seconds[n] for n in HOST_PARTS) / total


def _params(cell: Any) -> float:
    s = shape_of(cell.model)
    return float(s.params) if s else 1e9


def setup_features(cell: Any) -> dict[str, float]:
    return {
        "setup_log": 1.0,
        "setup_size": math.log(_params(cell) / 1e9),
        "setup_zero3": float(cell.zero_stage == 3),
        "setup_offload": float(cell.offload != "none"),
        "setup_qlora": float(cell.peft == "qlora"),
        "setup_multi_gpu": float(_ranks(cell) > 1),
    }


def spawned(cell: Any) -> bool:
    """zerobench forks a single-GPU cell from a server that has imported already; several ranks start
    fresh interpreters."""
    return _ranks(cell) > 1


def start_features(cell: Any, spawn: bool | None = None) -> dict[str, float]:
    return {
        "start_log": 1.0,
        "start_spawn": float(spawned(cell) if spawn is None else spawn),
        "start_compile": float(_compiled(cell)),
        "start_zero3": float(cell.zero_stage == 3),
        "start_offload": float(cell.offload != "none"),
    }


def _dot(feats: dict[str, float], k: Any) -> float:
    return sum(v * getattr(k, name) for name, v in feats.items())


def predict_setup(cell: Any, hw: Hardware | None = None, k: Any = FITTED_TIME) -> float:
    """Predicted seconds of the worker's setup (model build, engine init)."""
    return math.exp(_dot(setup_features(cell), k))


def predict_start(cell: Any, hw: Hardware | None = None, k: Any = FITTED_TIME, spawn: bool | None = None) -> float:
    """Predicted seconds of the wall time beside setup and the steps' own time (start, first-step extra,
    teardown)."""
    return math.exp(_dot(start_features(cell, spawn), k))


def steps_of(cell: Any, step: float, warm: int | None = None, meas: int | None = None) -> int:
    """The warm-up and measured steps the cell runs at `step` seconds a step: a fixed phase its count; an
    adaptive one (bench.records.adaptive) the steps its Schedule takes over steady steps (the first twice as long:
    it compiles) before it ends, the fewest it can end on (steps of 0 s never converge: the caps); `warm`, `meas`:
    the warm-up and measured steps an unsteady cell needs before it would end, where no cap ends it first. Not
    the caps themselves (50 steps on the 7b matrix, whose 38 ok records in results/7b*.jsonl ran 6-50, median
    12): answer mode orders its cells by this cost, and learns what unsteady cells run beyond the fewest from the
    walls it measures."""
    a = cell.adaptive
    if a is None:
        return cell.warmup_steps + cell.measured_steps
    at_least = {"min_warmup": max(a.min_warmup, warm or 0), "min_steps": max(a.min_steps, meas or 0)}
    schedule = Schedule(cell.warmup_steps, cell.measured_steps, dataclasses.replace(a, **at_least))
    while not schedule.done and len(schedule.times) <= cell.warmup_steps + cell.measured_steps:
        schedule.observe(step * (2 if not schedule.times else 1))
    return len(schedule.times)


def predict_wall(
    cell: Any, hw: Hardware | None = None, k: Any = FITTED_TIME, step: float | None = None
) -> float | None:
    """Predicted wall seconds of the cell: start, setup, then warm-up and measured steps (steps_of; a
    micro_batch: auto cell: its search's first probe). step: its predicted step, where the caller has it."""
    step = predict_step(cell, hw, k) if step is None else step
    if step is None:
        return None
    return predict_start(cell, hw, k) + predict_setup(cell, hw, k) + steps_of(cell, step) * step


def run_seconds(cells: Sequence[Any], hw: Hardware | None = None, gpus: int = 1, k: Any = FITTED_TIME):
    """Predicted time of a run of `cells` (those zerobench would run): (GPU-seconds, i.e. the run one cell
    after another on one GPU's worth of time; elapsed seconds on `gpus` GPUs with cells side by side;
    cells whose model shape is unknown). Side by side is the GPU-seconds spread over the GPUs, but never
    less than the longest cell."""
    walls, unknown = [], 0
    for cell in cells:
        w = predict_wall(cell, hw, k)
        if w is None:
            unknown += 1
        else:
            walls.append((w, _ranks(cell)))
    total = sum(w * g for w, g in walls)
    longest = max((w for w, _ in walls), default=0.0)
    return total, max(total / max(gpus, 1), longest), unknown


def _hms(s: float) -> str:
    h, rem = divmod(int(round(s)), 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


def run_time_line(cells: Sequence[Any], hw: Hardware | None = None, gpus: int = 1) -> str:
    """One line for a plan: the predicted GPU time of its runnable cells, on one GPU and on `gpus` (adaptive steps
    counted at a steady cell's fewest, steps_of: an unsteady cell runs more, so it says so)."""
    total, packed, unknown = run_seconds(cells, hw, gpus)
    fewest = ", adaptive steps at a steady cell's fewest" if any(getattr(c, "adaptive", None) for c in cells) else ""
    line = f"predicted GPU time ({len(cells) - unknown} cells, step-time model{fewest}): {_hms(total)} on 1 GPU"
    if gpus > 1:
        line += f", {_hms(packed)} on {gpus} GPUs side by side"
    return line + (f"; {unknown} cells of unknown shape not counted" if unknown else "")
