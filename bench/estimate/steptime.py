"""Time a cell takes, predicted before it runs, from the cell and the hardware alone: seconds per optimizer
step (the record's `metrics.step_time_median_s`) and the cell's wall time (the record's `wall_s`: the fixed
cost of start-up and setup, then the warm-up and measured steps).

The step is compute (tokens x FLOPs per token over the GPU's peak) divided by a fitted efficiency, and the
efficiency is a product of fitted factors, one per thing that costs time beside the matmuls: precision,
PEFT mode, ZeRO stage 3's gathers, CPU/NVMe offload and CPU Adam, more than one GPU, the engine, compile,
kernels, and the tokens per step (small steps leave the GPU idle between kernels). In log space the model
is linear in these factors, so they are fitted by least squares on the committed H200 records
(`fit_time`); the literals below are that fit, and tests/test_steptime.py holds them to it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
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
    "predict_overhead",
    "predict_step",
    "predict_wall",
    "run_seconds",
    "run_time_line",
    "step_features",
    "overhead_features",
]

# Dense 16-bit tensor-core peaks (FLOP/s) by GPU name; the efficiencies are fitted against these.
PEAKS = (("H200", 989.4e12), ("H100", 989.4e12), ("A100", 312e12), ("L40S", 362e12), ("A10", 125e12))
DEFAULT_PEAK = 989.4e12


@dataclass(frozen=True, slots=True)
class TimeConstants:
    log_eff: float = -1.3170
    """log of the efficiency of a full bf16 fine-tune on one GPU at 8192 tokens per step (model FLOPs
    achieved over the peak; negative: below the peak)."""
    fp16: float = 0.4313
    """log step-time factor of fp16 over bf16 (loss scaling, the fp16 optimizer's copies)."""
    fp32: float = 2.0236
    """... of fp32 (no 16-bit tensor cores: TF32 or plain fp32 matmuls)."""
    lora: float = 0.3673
    """... of LoRA over its FLOPs (the adapters' small matmuls, PEFT's wrappers)."""
    qlora: float = 0.7618
    """... of QLoRA (dequantizing the 4-bit weights for every matmul)."""
    zero3: float = 0.8583
    """... of ZeRO-3 (gathering each layer's parameters in forward and backward)."""
    offload_optimizer: float = 0.8275
    """... of the optimizer on the host (its states copied each step, the CPU step)."""
    offload_params: float = 0.6216
    """... more with parameters on the host too."""
    nvme: float = 1.7879
    """... more with state swapped to NVMe."""
    multi_gpu: float = 0.2338
    """... of more than one GPU (gradient all-reduce / reduce-scatter)."""
    hf_trainer: float = 0.3619
    """... of the HF Trainer engine over DeepSpeed's own loop."""
    compiled: float = 0.5981
    """... of torch.compile."""
    liger: float = 0.2909
    """... of Liger's kernels."""
    zero12: float = 0.1487
    """... of ZeRO-1/2 (partitioned optimizer step, reduce-scatter of gradients)."""
    grad_ckpt: float = -0.2100
    """... of checkpointing beyond its recompute FLOPs."""
    optimizer_8bit: float = 0.0069
    """... of an 8-bit optimizer (bitsandbytes' quantized states)."""
    paged: float = 0.1013
    """... of a paged optimizer."""
    torch_adam: float = 0.2874
    """... of torch's own AdamW (foreach, not fused)."""
    size: float = -0.4912
    """Slope of log step time over log(parameters / 1e9), beyond the FLOPs' own proportionality."""
    tokens: float = -0.5430
    """Slope of log step time over log(tokens per step / 8192), beyond the FLOPs' own proportionality
    (negative: small steps are less efficient)."""
    setup_log: float = 1.3144
    """log seconds of a 1B cell's fixed cost on one GPU (start-up, import, model build, engine init,
    the first step's extra time)."""
    setup_size: float = 0.2038
    """Slope of the fixed cost's log over log(parameters / 1e9)."""
    setup_zero3: float = 0.6706
    setup_offload: float = 1.1416
    setup_multi_gpu: float = 1.8307
    setup_compile: float = 2.7336


TIME_NAMES = tuple(f.name for f in fields(TimeConstants))
STEP_NAMES = TIME_NAMES[: TIME_NAMES.index("setup_log")]
SETUP_NAMES = TIME_NAMES[TIME_NAMES.index("setup_log") :]

FITTED_TIME = TimeConstants()


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


def step_features(cell: Any) -> dict[str, float]:
    """The cell's value of each step-time factor (1/0 indicators, and the tokens' log)."""
    return {
        "log_eff": -1.0,
        "fp16": float(cell.precision == "fp16"),
        "fp32": float(cell.precision == "fp32"),
        "lora": float(cell.peft == "lora"),
        "qlora": float(cell.peft == "qlora"),
        "zero3": float(cell.zero_stage == 3),
        "offload_optimizer": float(optimizer_offloaded(cell.offload)),
        "offload_params": float(params_offloaded(cell.offload)),
        "nvme": float(cell.offload == "nvme"),
        "multi_gpu": float(cell.gpus > 1),
        "hf_trainer": float(cell.engine == "hf_trainer"),
        "compiled": float(_compiled(cell)),
        "liger": float(getattr(cell, "kernels", "hf") == "liger"),
        "zero12": float(cell.zero_stage in (1, 2)),
        "grad_ckpt": float(bool(cell.grad_ckpt)),
        "optimizer_8bit": float("8bit" in cell.optimizer),
        "paged": float("paged" in cell.optimizer),
        "torch_adam": float(cell.optimizer in ("adamw", "torch_adamw")),
        "size": math.log(_params(cell) / 1e9),
        "tokens": math.log(tokens_per_step(cell) / 8192),
    }


def _params(cell: Any) -> float:
    s = shape_of(cell.model)
    return float(s.params) if s else 1e9


def overhead_features(cell: Any) -> dict[str, float]:
    return {
        "setup_log": 1.0,
        "setup_size": math.log(_params(cell) / 1e9),
        "setup_zero3": float(cell.zero_stage == 3),
        "setup_offload": float(cell.offload != "none"),
        "setup_multi_gpu": float(cell.gpus > 1),
        "setup_compile": float(_compiled(cell)),
    }


def _dot(feats: dict[str, float], k: TimeConstants) -> float:
    return sum(v * getattr(k, name) for name, v in feats.items())


def predict_step(cell: Any, hw: Hardware | None = None, k: TimeConstants = FITTED_TIME) -> float | None:
    """Predicted seconds per optimizer step; None for a model whose shape is unknown."""
    c = compute_seconds(cell, hw)
    return None if c is None else c * math.exp(_dot(step_features(cell), k))


def predict_overhead(cell: Any, hw: Hardware | None = None, k: TimeConstants = FITTED_TIME) -> float:
    """Predicted seconds of the cell's wall time outside its steps' own time (start-up, setup, the
    first steps' extra)."""
    return math.exp(_dot(overhead_features(cell), k))


def steps_of(cell: Any) -> int:
    return cell.warmup_steps + cell.measured_steps


def predict_wall(cell: Any, hw: Hardware | None = None, k: TimeConstants = FITTED_TIME) -> float | None:
    """Predicted wall seconds of the cell: the fixed cost, then warm-up and measured steps."""
    step = predict_step(cell, hw, k)
    return None if step is None else predict_overhead(cell, hw, k) + steps_of(cell) * step


def solve(rows: Sequence[dict[str, float]], y: Sequence[float], names: Sequence[str], ridge: float) -> dict:
    """Least squares of y on the rows' features, with a small ridge toward 0 on every factor but the first
    (so a factor no fitting record shows stays at 0, the plain case)."""
    import numpy as np

    a = np.array([[r[n] for n in names] for r in rows], dtype=float)
    b = np.array(y, dtype=float)
    reg = np.sqrt(ridge) * np.eye(len(names))
    reg[0, 0] = 0.0
    sol = np.linalg.lstsq(np.vstack([a, reg]), np.concatenate([b, np.zeros(len(names))]), rcond=None)[0]
    return {n: round(float(v), 4) for n, v in zip(names, sol)}


def run_seconds(cells: Sequence[Any], hw: Hardware | None = None, gpus: int = 1, k: TimeConstants = FITTED_TIME):
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
