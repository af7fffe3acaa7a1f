"""The memory model's fitted constants: the few numbers not read off code, each named, each fitted on
the measurement that shows it (bench.estimate.check.fit), here with the values fitted on every committed
H200 record (results/*.jsonl): `zerobench estimate --check results --refit` prints them, and
tests/test_estimate.py holds these to that fit. `zerobench estimate --check` also refits
them leaving each results file out in turn, to show how well they carry to measurements they were not
fitted on.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["Constants", "FITTED", "FITTED_RUNS", "FIT_NAMES"]

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

FITTED_RUNS: tuple[str, ...] = (
    "20261130T043402Z-2a5ab9",
    "20261130T043915Z-6c3d1f",
    "20261130T044209Z-17b00c",
    "20261130T045048Z-f02045",
    "20261130T045319Z-7a2874",
    "20261130T064152Z-a12d58",
    "20261130T064516Z-8e7f63",
    "20261130T064658Z-67e056",
    "20261130T065350Z-9e3378",
    "20261130T065531Z-ce3855",
    "20261130T070043Z-b4856a",
    "20261130T070420Z-cb7069",
    "20261130T085424Z-a77a0a",
    "20261130T085906Z-7472a0",
    "20261130T090658Z-a6e535",
    "20261130T091532Z-ab057d",
    "20261130T092111Z-27f91c",
    "20261130T101846Z-040317",
    "20261130T102755Z-07d352",
    "20261130T103325Z-f611de",
    "20261130T105327Z-f4cc44",
    "20261130T235245Z-59afd6",
    "20261201T010318Z-c43491",
    "20261201T024706Z-dcd128",
    "20261201T024957Z-88f38b",
    "20261201T025144Z-e994c1",
    "20261201T025344Z-20f63d",
    "20261201T030815Z-d5014b",
    "20261201T031012Z-77674f",
    "20261201T085240Z-3b1fbc",
    "20261201T085836Z-69b3dd",
    "20261201T085938Z-135011",
    "20261201T090151Z-9568e7",
    "20261201T090220Z-576c30",
    "20261201T090327Z-1a7ed0",
    "20261201T090702Z-32d436",
    "20261201T091033Z-c43994",
    "20261201T222237Z-8af68e",
    "20261201T222711Z-085537",
    "20261201T224041Z-8f5cfa",
    "20261202T072952Z-4b5a27",
    "20261202T074233Z-aed415",
)
"""The runs (record run ids) whose records these constants were fitted on: every committed H200 results file's
but the held-out checks' (timecheck-h200.jsonl, timecheck-h200-7b.jsonl and 7b-answer-h200.jsonl, each
predicted before it ran: reports/*-predicted.txt). The memory check counts the records of any other run as
held out; `zerobench estimate --check RESULTS --refit` fits on every record given and prints its runs."""
