"""Step times -> throughput, model FLOPs, MFU and HFU.

Definitions (per trained token, forward + backward):
- Dense weights W (every parameter except the input embedding, which is a lookup): a trained weight
  costs 6 FLOPs per token (2 forward, 2 input-gradient, 2 weight-gradient); a frozen weight (LoRA and
  QLoRA base) costs 4 (no weight gradient).
- Causal attention scores and values: 6 * layers * hidden * seq_len (half of the 12*L*d*T of the
  PaLM appendix, since a causal mask skips half the matrix).
- MFU counts those model FLOPs only. HFU adds what the hardware does again under gradient
  checkpointing: one more forward (2 per weight, plus 2 * L * d * T attention).
- Peak: the dense tensor-core figure of the GPU's datasheet for the precision (TF32 is not enabled
  for fp32 by the harness, so fp32 uses the plain FP32 figure).
"""

from __future__ import annotations

import statistics

__all__ = ["flops_per_token", "summarize", "peak_tflops"]

# Dense (no sparsity) TFLOP/s by GPU name substring and precision.
PEAK_TFLOPS = {
    "H200": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "fp32": 51.2},
    "H100": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9},
    "GH200": {"bf16": 989.4, "fp16": 989.4, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "L40S": {"bf16": 362.05, "fp16": 362.05, "fp32": 91.6},
    "A10G": {"bf16": 70.0, "fp16": 70.0, "fp32": 31.2},
}


def peak_tflops(gpu_name: str | None, precision: str) -> float | None:
    if not gpu_name:
        return None
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in gpu_name:
            return PEAK_TFLOPS[key][precision]
    return None


def flops_per_token(
    *,
    params_total: int,
    params_trainable: int,
    params_embedding: int,
    layers: int,
    hidden: int,
    seq_len: int,
    grad_ckpt: bool,
) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) per token."""
    dense = params_total - params_embedding
    trained = min(params_trainable, dense)
    frozen = dense - trained
    attn = 6 * layers * hidden * seq_len
    model = 6 * trained + 4 * frozen + attn
    hardware = model + (2 * dense + 2 * layers * hidden * seq_len if grad_ckpt else 0)
    return float(model), float(hardware)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(
    step_times: list[float],
    *,
    tokens_per_step: int,
    samples_per_step: int,
    model_flops_tok: float,
    hw_flops_tok: float,
    gpus: int,
    peak: float | None,
) -> dict:
    med = statistics.median(step_times)
    tok_s = tokens_per_step / med
    out = {
        "step_time_median_s": med,
        "step_time_p90_s": _pct(step_times, 0.9),
        "step_time_mean_s": statistics.fmean(step_times),
        "tokens_per_s": tok_s,
        "samples_per_s": samples_per_step / med,
        "tflops_per_gpu": model_flops_tok * tok_s / gpus / 1e12,
        "hw_tflops_per_gpu": hw_flops_tok * tok_s / gpus / 1e12,
        "mfu": None,
        "hfu": None,
    }
    if peak:
        out["mfu"] = out["tflops_per_gpu"] / peak
        out["hfu"] = out["hw_tflops_per_gpu"] / peak
    return out
