"""The ZeRO paper's model states (parameters, gradients, optimizer state) per GPU: a floor under the
measured peak, shown beside it in reports (the memory model, bench.estimate.model, adds activations,
DeepSpeed's buffers and fragmentation).

ZeRO paper (Rajbhandari et al. 2020, sec. 5), with Psi parameters, N GPUs and K bytes of optimizer
state per parameter (mixed-precision Adam: fp32 master copy, momentum, variance = 12):
    stage 0: (2 + 2 + K) Psi      stage 1: 2 Psi + 2 Psi + K Psi / N
    stage 2: 2 Psi + (2 + K) Psi / N      stage 3: (2 + 2 + K) Psi / N
Offloading the optimizer moves the K part (and, from stage 2, the fp32 gradients it steps on) to the
host; offloading parameters moves the rest. Frozen parameters (LoRA/QLoRA base) need no gradient or
optimizer state; 4-bit base weights take half a byte each (plus ~0.5 bit/param of constants with
double quantization, ignored here).
"""

from __future__ import annotations

from ..matrix.axes import OPTIMIZERS, Offload, optimizer_offloaded, params_offloaded

__all__ = ["model_states", "zero_ratio"]


def model_states(
    *,
    params: int,
    trainable: int,
    zero_stage: int,
    gpus: int,
    precision: str,
    optimizer: str,
    offload: str = Offload.NONE,
    quantized_4bit: bool = False,
) -> dict[str, float]:
    """Predicted model-state bytes per GPU and on the host."""
    w = 4 if precision == "fp32" else 2  # bytes per parameter / gradient as trained
    # Optimizer-state bytes per trainable parameter (OptimizerSpec.state_bytes, under mixed precision);
    # fp32 training keeps no extra master copy.
    k = (OPTIMIZERS[optimizer].state_bytes if optimizer in OPTIMIZERS else 12) - (4 if precision == "fp32" else 0)
    frozen = params - trainable
    p_bytes = trainable * w + frozen * (0.5 if quantized_4bit else w)
    g_bytes = trainable * w
    o_bytes = trainable * k
    n = max(gpus, 1)
    shard = {0: (1, 1, 1), 1: (1, 1, n), 2: (1, n, n), 3: (n, n, n)}[zero_stage]
    gpu = {"params": p_bytes / shard[0], "grads": g_bytes / shard[1], "optimizer": o_bytes / shard[2]}
    host = {"params": 0.0, "grads": 0.0, "optimizer": 0.0}
    if optimizer_offloaded(offload):
        host["optimizer"], gpu["optimizer"] = gpu["optimizer"], 0.0
    if params_offloaded(offload):
        host["params"], gpu["params"] = gpu["params"], 0.0
    return {
        "gpu_bytes": sum(gpu.values()),
        "host_bytes": sum(host.values()) if offload != Offload.NVME else 0.0,
        **{f"gpu_{k}_bytes": v for k, v in gpu.items()},
    }


def zero_ratio(stage: int, gpus: int, k: int = 12) -> float:
    """Model states per GPU at a ZeRO stage, relative to stage 0 (the paper's prediction)."""
    full = 2 + 2 + k
    per = {0: full, 1: 4 + k / gpus, 2: 2 + (2 + k) / gpus, 3: full / gpus}[stage]
    return per / full
