"""The memory model's fitted constants: the few numbers not read off code, each named, each fitted on
the measurement that shows it (bench.estimate.check.fit), here with the values fitted on every committed
H200 record (results/*.jsonl): `zerobench estimate --check results --refit` prints them, and
tests/test_estimate.py holds these to that fit. `zerobench estimate --check` also refits
them leaving each results file out in turn, to show how well they carry to measurements they were not
fitted on.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["Constants", "FITTED", "FIT_NAMES", "UNFITTED_FILES"]

GiB = 2**30


@dataclass(frozen=True, slots=True)
class Constants:
    cuda_context: float = 1.668 * GiB
    """NVML's per-process figure above the allocator's reservation on one GPU: the CUDA context and the
    kernels it loaded (torch, cuBLAS, DeepSpeed's ops)."""
    nccl: float = 0.094 * GiB
    """More of it with more than one GPU: NCCL's communicator buffers."""
    activation_scale: float = 1.000
    """Measured activations over the tensor-by-tensor count (what the count misses: autograd's small
    tensors, the attention mask, RoPE's tables)."""
    frag_shared: float = 0.740
    """Reserved-but-free bytes per byte of the smaller of the optimizer step's gradient copies (fp32, and
    the flattened 16-bit partition) and the activations: neither fits the blocks the other left, so the
    allocator's reservation holds both (1.0 if it held all of the smaller)."""
    frag_activations: float = 0.518
    """With gradient checkpointing: reserved-but-free bytes per square root of the activations' bytes
    times a GiB (the recompute in backward interleaves with the gradients in blocks the loss left)."""
    frag_buckets: float = 1.126
    """Reserved-but-free bytes per byte of gradients passing through DeepSpeed's reduce buckets (at most the
    buckets' size)."""
    frag_loss: float = 0.470
    """Reserved-but-free bytes per byte of the loss's fp32 logits (tokens x vocab x 4; none with Liger's
    fused or in-place cross-entropy): blocks of that size that nothing else in the step fits."""
    host_process: float = 1.792 * GiB
    """RSS of one rank's interpreter with torch, DeepSpeed and transformers imported and the model built."""
    host_launcher: float = 1.215 * GiB
    """torchrun and its children beside the ranks (multi-GPU cells)."""
    host_compile_workers: float = 7.853 * GiB
    """torch.compile's (inductor's) compile worker processes."""


FIT_NAMES = tuple(f.name for f in fields(Constants))

FITTED = Constants()

UNFITTED_FILES = ("timecheck-h200.jsonl", "timecheck-h200-7b.jsonl", "7b-answer-h200.jsonl")
"""Committed results files these constants were not fitted on: held-out checks, predicted before they ran
(reports/*-predicted.txt). The memory check counts them as held out only (and scores those predictions); a
refit takes them in and empties this. (The step-time model names the runs it was fitted on itself:
bench.estimate.steptime.FITTED_RUNS.)"""
