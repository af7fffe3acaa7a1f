"""Whether a predicted peak fits a capacity, with a stated margin either side of it."""

from __future__ import annotations

__all__ = ["DEFAULT_MARGIN", "Verdict", "short_of", "verdict"]

DEFAULT_MARGIN = 0.10
"""The model's p95 error is under it (reports/memory-model.md): closer than this to the capacity is a guess."""


class Verdict:
    FITS = "fits"
    """Predicted at most (1 - margin) of the capacity."""
    UNCERTAIN = "uncertain"
    """Within the margin of the capacity: run it to know."""
    PRUNE = "won't fit"
    """Predicted above (1 + margin) of the capacity: `zerobench run` skips it."""
    UNKNOWN = "no capacity"
    """No capacity to judge against (no GPU found, none given)."""


def verdict(predicted: float, capacity: float | None, margin: float = DEFAULT_MARGIN) -> str:
    if not capacity:
        return Verdict.UNKNOWN
    if predicted <= capacity * (1 - margin):
        return Verdict.FITS
    if predicted > capacity * (1 + margin):
        return Verdict.PRUNE
    return Verdict.UNCERTAIN


def short_of(pred: dict) -> str:
    """Which memory a pruned prediction runs out of, with the figures: "GPU short: 17.9 of 15.0 GiB"."""
    GiB = 2**30
    sides = (
        ("GPU", "gpu_bytes", "gpu_memory_bytes", "gpu_verdict"),
        ("host", "host_bytes", "host_memory_bytes", "host_verdict"),
    )
    short = [
        f"{name} short: {pred[need] / GiB:.1f} of {pred[have] / GiB:.1f} GiB"
        for name, need, have, v in sides
        if pred.get(v) == Verdict.PRUNE
    ]
    return ", ".join(short)
