"""The memory/speed frontier a plan is predicted to have, before anything runs: per group of cells (a model
and a PEFT mode by default), the cells no other cell of the group is predicted to beat on both peak GPU
memory (the memory model) and tokens/s (the step-time model). Predictions, not measurements: each point
carries the step-time model's band (bench.estimate.band), and the lines say so."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...matrix.axes import AUTO
from ..band import BAND_COVERAGE, step_time_band
from ..model import Hardware, predict

__all__ = ["GROUP_BY", "TIE", "Point", "frontier", "frontier_lines", "pareto", "points"]

GROUP_BY = ("model", "peft")
"""The cell fields a frontier is drawn per (one frontier per model and PEFT mode)."""
TIE = 0.01
"""Predicted tokens/s within this share of a cell with less memory are a tie, which the cell with less memory
wins (far inside the step-time model's band)."""
GiB = 2**30


@dataclass(frozen=True)
class Point:
    cell: Any
    gpu_bytes: float
    """The memory model's peak per GPU (NVML's per-process figure)."""
    tokens_per_s: float
    """Tokens a step trains (every GPU's) over the predicted step time."""
    slow: float
    fast: float
    """tokens/s at the ends of the step-time band (BAND_COVERAGE of held-out records inside)."""


def points(items: Iterable[tuple[Any, dict | None, float | None]], hw: Hardware | None = None) -> list[Point]:
    """(cell, its DeepSpeed config, its predicted GPU bytes if known) -> points; cells either model cannot
    read, and micro_batch: auto cells (a search, not a point), are left out."""
    out = []
    for cell, ds_config, gpu_bytes in items:
        if cell.micro_batch == AUTO:
            continue
        gpu_bytes = gpu_bytes or _gpu_bytes(cell, ds_config, hw)
        band = step_time_band(cell, hw, ds_config) if gpu_bytes else None
        if band is None:
            continue
        tokens = cell.micro_batch * cell.grad_accum * cell.seq_len * cell.gpus
        low, pred, high = band
        out.append(Point(cell, float(gpu_bytes), tokens / pred, tokens / high, tokens / low))
    return out


def _gpu_bytes(cell: Any, ds_config: dict | None, hw: Hardware | None) -> float | None:
    """The memory model's peak, where the plan had no GPU to judge the cell against."""
    try:
        return predict(cell, ds_config, hw).gpu_bytes
    except ValueError:
        return None


def pareto(ps: Sequence[Point], tie: float = TIE) -> list[Point]:
    """The points no other beats on both memory (less) and tokens/s (more by more than `tie`), by memory."""
    out: list[Point] = []
    for p in sorted(ps, key=lambda p: (p.gpu_bytes, -p.tokens_per_s)):
        if not out or p.tokens_per_s > out[-1].tokens_per_s * (1 + tie):
            out.append(p)
    return out


def frontier(ps: Sequence[Point], group_by: Sequence[str] = GROUP_BY) -> dict[tuple, tuple[list[Point], int]]:
    """Per group (the values of `group_by`): its frontier and how many cells the group has."""
    groups: dict[tuple, list[Point]] = {}
    for p in ps:
        groups.setdefault(tuple(getattr(p.cell, f) for f in group_by), []).append(p)
    return {key: (pareto(g), len(g)) for key, g in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0])))}


def _spread(front: list[Point], n: int) -> list[Point]:
    """n points of a frontier, its two ends among them, evenly spaced between."""
    if len(front) <= n:
        return front
    return [front[round(i * (len(front) - 1) / (n - 1))] for i in range(n)]


def _rate(p: Point) -> str:
    return f"{p.tokens_per_s:8,.0f} tokens/s ({p.slow:,.0f}-{p.fast:,.0f})"


def frontier_lines(
    items: Iterable[tuple[Any, dict | None, float | None]],
    hw: Hardware | None = None,
    group_by: Sequence[str] = GROUP_BY,
    per_group: int = 4,
) -> list[str]:
    """A few lines per group: the predicted frontier's cells from least memory to most tokens/s."""
    fronts = frontier(points(items, hw), group_by)
    if not fronts:
        return []
    lines = [
        f"predicted memory/speed frontier, per {' and '.join(group_by)} (predictions of the memory and step-time "
        f"models, nothing measured; tokens/s with the step-time model's {BAND_COVERAGE:.0%} band):"
    ]
    for key, (front, n) in fronts.items():
        shown = _spread(front, per_group)
        more = f", {len(shown)} shown" if len(shown) < len(front) else ""
        label = ", ".join(f"{f}={v}" for f, v in zip(group_by, key))
        lines.append(f"  {label}: {len(front)} of {n} cells on the frontier{more}")
        lines += [f"    {p.gpu_bytes / GiB:6.1f} GiB  {_rate(p)}  {p.cell.id}" for p in shown]
    return lines
