"""The memory model's fitted constants: the few numbers not read off code, each named here with what it is,
each fitted on the measurement that shows it (bench.estimate.check.fit). Their values, and the records they
were fitted on, are the "memory" section of fit.json (bench.estimate.fitdata), written by
`zerobench estimate --check RESULTS --refit` (bench.estimate.check.refit); tests/estimate/test_estimate.py holds them
to that fit. `zerobench estimate --check` also refits them leaving each results file, machine and GPU model
out in turn, to show how well they carry to measurements they were not fitted on.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..matrix.problems import InputError
from .fitdata import FIT_FILE, section

__all__ = ["Constants", "Fit", "FITTED", "FITTED_RUNS", "FIT", "FIT_NAMES", "NEUTRAL", "SECTION", "load"]

SECTION = "memory"


@dataclass(frozen=True, slots=True, kw_only=True)
class Constants:
    cuda_context: float
    """NVML's per-process figure above the allocator's reservation on one GPU, bytes: the CUDA context and
    the kernels it loaded (torch, cuBLAS, DeepSpeed's ops)."""
    nccl: float
    """More of it with more than one GPU, bytes: NCCL's communicator buffers."""
    activation_scale: float
    """Measured activations over the tensor-by-tensor count (what the count misses: autograd's small
    tensors, the attention mask, RoPE's tables)."""
    frag_shared: float
    """Reserved-but-free bytes per byte of the smaller of the optimizer step's gradient copies (fp32, and
    the flattened 16-bit partition) and the activations: neither fits the blocks the other left, so the
    allocator's reservation holds both (1.0 if it held all of the smaller)."""
    frag_activations: float
    """With gradient checkpointing: reserved-but-free bytes per square root of the activations' bytes
    times a GiB (the recompute in backward interleaves with the gradients in blocks the loss left)."""
    frag_buckets: float
    """Reserved-but-free bytes per byte of gradients passing through DeepSpeed's reduce buckets (at most the
    buckets' size)."""
    frag_loss: float
    """Reserved-but-free bytes per byte of the loss's fp32 logits (tokens x vocab x 4; none with Liger's
    fused or in-place cross-entropy): blocks of that size that nothing else in the step fits."""
    host_process: float
    """RSS of one rank's interpreter with torch, DeepSpeed and transformers imported and the model built,
    bytes."""
    host_launcher: float
    """torchrun and its children beside the ranks (multi-GPU cells), bytes."""
    host_compile_workers: float
    """torch.compile's (inductor's) compile worker processes, bytes."""


FIT_NAMES = tuple(f.name for f in fields(Constants))

NEUTRAL = Constants(**{n: 0.0 for n in FIT_NAMES} | {"activation_scale": 1.0})
"""Nothing fitted: no context, no fragmentation, no host overhead, the activations as counted. A fit
starts from it (bench.estimate.check.fit), and a constant no given record shows stays at it."""


@dataclass(frozen=True)
class Fit:
    """The fitted constants with where they came from (fit.json's "memory" section)."""

    constants: Constants
    runs: tuple[str, ...] = ()
    """The runs (record run ids) whose records they were fitted on."""
    files: tuple[str, ...] = ()
    """The results files those records were read from (base names)."""
    gpus: dict[str, int] | None = None
    """Records fitted on, per GPU model (the GPU's name): a model absent here is one they never saw."""
    machines: dict[str, int] | None = None
    """Records fitted on, per machine (its first GPU's UUID, else its run id)."""
    command: str = ""
    """The command that wrote them."""


def load(data: dict[str, Any] | None = None) -> Fit:
    """The fit a "memory" section holds (fit.json's when not given); NEUTRAL constants, fitted on nothing,
    where there is none yet. A section without one of the constants is an InputError naming it."""
    data = section(SECTION) if data is None else data
    if not data:
        return Fit(NEUTRAL)
    values = data.get("constants") or {}
    missing = [n for n in FIT_NAMES if n not in values]
    if missing:
        raise InputError(
            f"bench/estimate/{FIT_FILE}: section {SECTION!r} has no {', '.join(missing)} under 'constants'; "
            "rewrite it with `zerobench estimate --check results --refit`"
        )
    return Fit(
        Constants(**{n: float(values[n]) for n in FIT_NAMES}),
        tuple(data.get("runs", ())),
        tuple(data.get("files", ())),
        dict(data.get("gpus", {})),
        dict(data.get("machines", {})),
        data.get("command", ""),
    )


FIT = load()
FITTED = FIT.constants
FITTED_RUNS: tuple[str, ...] = FIT.runs
"""The runs whose records FITTED was fitted on: the memory check counts the records of any other run as held
out."""
