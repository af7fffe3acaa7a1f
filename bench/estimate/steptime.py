"""Time a cell takes, predicted before it runs, from the cell and the hardware alone: seconds per optimizer
step (the record's `metrics.step_time_median_s`) and the cell's wall time (the record's `wall_s`: the fixed
cost of start-up and setup, then the warm-up and measured steps).

The step is a sum of four parts (PARTS): compute (tokens x FLOPs per token over the GPU's peak, divided
by a fitted efficiency), the per-parameter work (the optimizer step; on the host under offload, CPU Adam),
ZeRO-3's gathers (parameter bytes per micro-batch) and fixed per-layer launch costs. Each part is its base
times fitted factors, one per thing that changes it: precision, PEFT mode, ZeRO stage, offload, optimizer,
GPU count, engine, compile, kernels. They are fitted by least squares of the log step time on the
committed H200 records (bench.estimate.timecheck.fit_time); the literals below are that fit, and
tests/test_steptime.py holds them to it. Setup and the rest of the wall time are log-linear in model size
and stage. The functions are pure (cell, hardware -> seconds), so a search can rank cells by them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from ..axes import optimizer_offloaded, params_offloaded
from .model import Hardware
from .shapes import Shape, adapted, shape_of, trainable_params

__all__ = [
    "FITTED_TIME",
    "TIME_NAMES",
    "TimeConstants",
    "compute_seconds",
    "flops_per_token",
    "peak_flops",
    "predict_setup",
    "predict_start",
    "predict_step",
    "predict_wall",
    "run_seconds",
    "run_time_line",
    "step_parts",
    "setup_features",
    "start_features",
]

# Dense 16-bit tensor-core peaks (FLOP/s) by GPU name; the efficiencies are fitted against these.
PEAKS = (("H200", 989.4e12), ("H100", 989.4e12), ("A100", 312e12), ("L40S", 362e12), ("A10", 125e12))
DEFAULT_PEAK = 989.4e12


# The step's four parts. Each is a base (seconds or a count read off the cell's shape) times the exponential
# of a fitted log factor per feature the cell has ("one" always): the names below are part_feature.
PARTS = {
    "compute": (
        "one",
        "fp16",
        "fp32",
        "lora",
        "qlora",
        "hf_trainer",
        "compiled",
        "liger",
        "grad_ckpt",
        "zero3",
        "multi_gpu",
        "log_tokens",
    ),
    "params": (
        "one",
        "offload",
        "fp16",
        "multi_gpu",
        "zero12",
        "torch_adam",
        "paged",
        "bit8",
        "nvme",
        "offload_params",
    ),
    "gather": ("one", "offload_params", "nvme", "multi_gpu", "qlora", "fp16"),
    "layers": ("one", "adapted", "hf_trainer", "zero3", "multi_gpu", "offload"),
}
PART_DOCS = {
    "compute": "the matmuls: compute seconds at the GPU's peak over the efficiency (log 1/efficiency for a "
    "full bf16 fine-tune with hf kernels, eager, one GPU, at 8192 tokens per micro-batch, plus a log factor "
    "per feature; log_tokens is the slope over log(tokens per micro-batch / 8192))",
    "params": "the per-parameter work of a step (the optimizer step, gradient copies and reduction; on the "
    "host with offload): seconds per billion trainable parameters, log",
    "gather": "ZeRO-3's parameter gathers in forward and backward: seconds per billion parameters per micro-batch, log",
    "layers": "fixed launch and hook costs per layer per micro-batch (PEFT's wrappers, ZeRO-3's hooks, "
    "the engine): seconds per 100 layers, log",
}


def _time_fields() -> list[tuple[str, type, Any]]:
    return [
        (f"{part}_{feat}", float, dataclasses.field(default=0.0)) for part, feats in PARTS.items() for feat in feats
    ]


SETUP_FEATURES = ("setup_log", "setup_size", "setup_zero3", "setup_offload", "setup_qlora", "setup_multi_gpu")
START_FEATURES = ("start_log", "start_spawn", "start_compile", "start_zero3", "start_offload")
_SETUP_FIELDS = [(n, float, dataclasses.field(default=0.0)) for n in SETUP_FEATURES + START_FEATURES]

TimeConstants = dataclasses.make_dataclass("TimeConstants", _time_fields() + _SETUP_FIELDS, frozen=True, slots=True)
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
STEP_NAMES = TIME_NAMES[: TIME_NAMES.index("setup_log")]
# The values fitted on the committed H200 records (tests/test_steptime.py holds them to the fit).
_FIT: dict[str, float] = {
    "compute_one": 0.283,
    "compute_fp16": -0.902,
    "compute_fp32": 2.45,
    "compute_lora": -0.505,
    "compute_qlora": 0.088,
    "compute_hf_trainer": -0.225,
    "compute_compiled": -0.127,
    "compute_liger": -0.379,
    "compute_grad_ckpt": 0.245,
    "compute_zero3": 0.49,
    "compute_multi_gpu": -0.965,
    "compute_log_tokens": 0.291,
    "params_one": -3.411,
    "params_offload": 2.743,
    "params_fp16": 1.091,
    "params_multi_gpu": -0.181,
    "params_zero12": 0.027,
    "params_torch_adam": 0.776,
    "params_paged": 0.415,
    "params_bit8": -0.272,
    "params_nvme": 3.593,
    "params_offload_params": -0.027,
    "gather_one": -3.568,
    "gather_offload_params": -0.272,
    "gather_nvme": 0.004,
    "gather_multi_gpu": -0.106,
    "gather_qlora": 0.097,
    "gather_fp16": -0.091,
    "layers_one": -0.942,
    "layers_adapted": 0.945,
    "layers_hf_trainer": 0.215,
    "layers_zero3": 1.075,
    "layers_multi_gpu": 0.697,
    "layers_offload": 0.389,
    "setup_log": 0.147,
    "setup_size": 0.21,
    "setup_zero3": 1.1,
    "setup_offload": 1.569,
    "setup_qlora": 0.806,
    "setup_multi_gpu": 0.147,
    "start_log": 0.268,
    "start_spawn": 2.625,
    "start_compile": 2.902,
    "start_zero3": 0.62,
    "start_offload": 0.424,
}
SETUP_NAMES = TIME_NAMES[TIME_NAMES.index("setup_log") :]

FITTED_TIME = TimeConstants(**_FIT)


def peak_flops(hw: Hardware | None) -> float:
    name = (hw.gpu_name if hw else None) or ""
    return next((p for key, p in PEAKS if key in name), DEFAULT_PEAK)


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
    """Seconds of one step's matmuls at the GPU's peak; None for a model whose shape is unknown."""
    s = shape_of(cell.model)
    if s is None:
        return None
    return tokens_per_step(cell) * flops_per_token(cell, s) / peak_flops(hw)


def _compiled(cell: Any) -> bool:
    return bool(getattr(cell, "compile", False))


def _flags(cell: Any) -> dict[str, float]:
    return {
        "one": True,
        "fp16": cell.precision == "fp16",
        "fp32": cell.precision == "fp32",
        "lora": cell.peft == "lora",
        "qlora": cell.peft == "qlora",
        "adapted": adapted(cell),
        "hf_trainer": cell.engine == "hf_trainer",
        "compiled": _compiled(cell),
        "liger": getattr(cell, "kernels", "hf") == "liger",
        "grad_ckpt": bool(cell.grad_ckpt),
        "zero12": cell.zero_stage in (1, 2),
        "zero3": cell.zero_stage == 3,
        "multi_gpu": cell.gpus > 1,
        "offload": optimizer_offloaded(cell.offload),
        "offload_params": params_offloaded(cell.offload),
        "nvme": cell.offload == "nvme",
        "torch_adam": cell.optimizer == "adamw",
        "paged": "paged" in cell.optimizer,
        "bit8": "8bit" in cell.optimizer,
        "log_tokens": math.log(cell.micro_batch * cell.seq_len / 8192),
    }


def step_parts(cell: Any, hw: Hardware | None = None) -> dict[str, tuple[float, tuple[float, ...]]] | None:
    """Each part's base and the cell's 0/1 value of each of its features (PARTS); None for a model whose
    shape is unknown."""
    s = shape_of(cell.model)
    if s is None:
        return None
    flags = _flags(cell)
    bases = {
        "compute": compute_seconds(cell, hw),
        "params": trainable_params(cell, s) / 1e9,
        "gather": (cell.zero_stage == 3) * s.params / 1e9 * cell.grad_accum,
        "layers": s.layers / 100 * cell.grad_accum,
    }
    return {part: (bases[part], tuple(float(flags[f]) for f in feats)) for part, feats in PARTS.items()}


def _part_seconds(base: float, x: tuple[float, ...], part: str, k: Any) -> float:
    return base * math.exp(sum(v * getattr(k, f"{part}_{f}") for v, f in zip(x, PARTS[part])))


def predict_step(cell: Any, hw: Hardware | None = None, k: Any = FITTED_TIME) -> float | None:
    """Predicted seconds per optimizer step: the sum of the parts; None for a model whose shape is unknown."""
    parts = step_parts(cell, hw)
    if parts is None:
        return None
    return sum(_part_seconds(base, x, part, k) for part, (base, x) in parts.items())


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
        "setup_multi_gpu": float(cell.gpus > 1),
    }


def spawned(cell: Any) -> bool:
    """zerobench forks a single-GPU cell from a server that has imported already; several ranks start
    fresh interpreters."""
    return cell.gpus > 1


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


def steps_of(cell: Any) -> int:
    return cell.warmup_steps + cell.measured_steps


def predict_wall(cell: Any, hw: Hardware | None = None, k: Any = FITTED_TIME) -> float | None:
    """Predicted wall seconds of the cell: start, setup, then warm-up and measured steps."""
    step = predict_step(cell, hw, k)
    return None if step is None else predict_start(cell, hw, k) + predict_setup(cell, hw, k) + steps_of(cell) * step


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
            walls.append((w, cell.gpus))
    total = sum(w * g for w, g in walls)
    longest = max((w for w, _ in walls), default=0.0)
    return total, max(total / max(gpus, 1), longest), unknown


def _hms(s: float) -> str:
    h, rem = divmod(int(round(s)), 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


def run_time_line(cells: Sequence[Any], hw: Hardware | None = None, gpus: int = 1) -> str:
    """One line for a plan: the predicted GPU time of its runnable cells, on one GPU and on `gpus`."""
    total, packed, unknown = run_seconds(cells, hw, gpus)
    line = f"predicted GPU time ({len(cells) - unknown} cells, step-time model): {_hms(total)} on 1 GPU"
    if gpus > 1:
        line += f", {_hms(packed)} on {gpus} GPUs side by side"
    return line + (f"; {unknown} cells of unknown shape not counted" if unknown else "")
