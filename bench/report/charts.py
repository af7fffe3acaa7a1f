"""What each chart shows, decided once from the Analysis: series, colours, axes, scales, labels, tooltips.

Both reports draw these descriptions with the one renderer in `figures` (a PNG beside the Markdown,
an inline SVG in the HTML page), so the rules below are the only place a chart's content is decided.
No matplotlib here: a Chart is plain data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from . import fmt
from .analysis import Analysis, Section

__all__ = [
    "Axis",
    "Series",
    "Shade",
    "Chart",
    "build",
    "tradeoff",
    "tradeoff_name",
    "loss",
    "PALETTE",
    "MAX_SCATTER_POINTS",
]

# Tableau 10 plus two: distinct for the at most 12 overlaid loss curves.
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    "#1f3b73",
    "#8cd17d",
)
FRONTIER = "#d9480f"
MAX_SCATTER_POINTS = 3000  # beyond this a scatter is a blur and the page slow; the frontier is always kept
LOG_SPAN = 30  # y goes logarithmic beyond this max/min ratio (offload cells can be 10-100x slower)


@dataclass(frozen=True, kw_only=True)
class Axis:
    label: str
    lo: float
    hi: float
    log: bool = False
    integer: bool = False
    """Ticks on whole numbers only (training steps)."""


@dataclass(frozen=True, kw_only=True)
class Series:
    kind: Literal["points", "line"]
    x: tuple[float, ...]
    y: tuple[float, ...]
    """NaN leaves a gap in a line; a lone finite value between gaps is drawn as a dot."""
    color: str
    label: str | None = None
    """The legend entry; None keeps the series out of the legend."""
    tips: tuple[str, ...] = ()
    """Hover text in the HTML page: one per point for "points", one for the whole series for "line"."""
    css: str = ""
    """Class of the series' elements in the SVG (the page's styles and tests find them by it)."""
    size: float = 4.0
    """Point diameter, or line width, in points."""
    alpha: float = 1.0
    edge: str | None = None
    """Outline colour of points."""
    dashed: bool = False
    numbers: tuple[int, ...] = ()
    """A number drawn beside each point (the frontier's, as the Markdown and HTML tables number it)."""


@dataclass(frozen=True, kw_only=True)
class Shade:
    """A shaded x range with a label at its top left (the warmup steps)."""

    lo: float
    hi: float
    label: str


@dataclass(frozen=True, kw_only=True)
class Chart:
    name: str
    """Its file suffix (`<report>.<name>.png`) and the prefix of its ids in the HTML page."""
    title: str
    aria: str
    """The chart in words, for screen readers."""
    x: Axis
    y: Axis
    series: tuple[Series, ...]
    legend: Literal["above", "below"]
    """Above the plot (a few entries), or below it (one per curve; the HTML page lists those itself)."""
    height: float
    """Of the figure in inches (7.2 wide), without the room a legend below takes."""
    shade: Shade | None = None
    caption: str = ""
    """What is drawn, in words (how many points of how many)."""


def _range(lo: float, hi: float, *, pad: float, near_zero: bool) -> tuple[float, float]:
    """Linear axis limits: `pad` of the span on each side, from zero when the data comes near it anyway
    (else cells whose memory differs by a few percent would sit on one vertical line)."""
    if near_zero and lo >= 0 and lo < 0.4 * hi:
        lo = 0.0
    span = hi - lo
    if span <= 0:  # one value: centre it
        half = abs(hi) * 0.1 or 1.0
        return lo - half, hi + half
    lo = lo if lo == 0.0 else max(lo - span * pad, 0.0) if lo >= 0 else lo - span * pad  # no negative memory
    return lo, hi + span * pad


def _log_range(lo: float, hi: float, *, pad: float) -> tuple[float, float]:
    """Log axis limits: `pad` of the span in decades on each side."""
    a, b = math.log10(lo), math.log10(hi)
    span = (b - a) or 1.0
    return 10 ** (a - span * pad), 10 ** (b + span * pad)


def _gib(bytes_) -> tuple[float, ...]:
    return tuple(bytes_ / 2**30)


def _tip(row: dict, number: int | None = None) -> str:
    where = f"frontier #{number}: " if number else ""
    source = fmt.MEMORY_SOURCES.get(row["peak_memory_source"], "")
    return (
        f"{where}{row['cell_name']}\n{fmt.num(row['tokens_per_s'])} tokens/s, "
        f"{fmt.gib(row['peak_memory_bytes'])} GiB {source}"
    ).rstrip()


def tradeoff(s: Section, name: str = "tradeoff") -> Chart | None:
    """Throughput against peak memory of one section (one model at one sequence length), one point per
    ok cell, the Pareto frontier joined per memory source. `name` tells the section's chart apart."""
    pts, caption = _tradeoff_points(s)
    if pts.empty:
        return None
    gib, tps = pts["peak_memory_bytes"] / 2**30, pts["tokens_per_s"]
    log_y = tps.max() / tps.min() > LOG_SPAN
    x_lo, x_hi = _range(gib.min(), gib.max(), pad=0.04, near_zero=True)
    y_lo, y_hi = (
        _log_range(tps.min(), tps.max(), pad=0.04) if log_y else _range(tps.min(), tps.max(), pad=0.04, near_zero=True)
    )
    return Chart(
        name=name,
        # The section on a line above: on the title's own line it would run under the legend.
        title=("" if name == "tradeoff" else f"{s.label}\n") + "Throughput vs peak memory",
        series=_tradeoff_series(s, pts),
        x=Axis(label=f"{s.peak_label} (GiB)", lo=x_lo, hi=x_hi),
        y=Axis(label="throughput (tokens/s" + (", log scale)" if log_y else ")"), lo=y_lo, hi=y_hi, log=log_y),
        aria="throughput against peak memory, one point per ok cell, the Pareto frontier numbered",
        legend="above",
        height=4.2,
        caption=caption,
    )


def _tradeoff_points(s: Section):
    """The ok cells with a peak memory and a throughput, thinned past MAX_SCATTER_POINTS, and the caption
    that says how many are drawn (empty points: nothing to draw)."""
    cols = ["cell_name", "tokens_per_s", "peak_memory_bytes", "peak_memory_source", "pareto"]
    pts = s.ok.loc[s.ok["peak_memory_bytes"].notna() & (s.ok["tokens_per_s"] > 0), cols]
    if pts.empty:
        return pts, ""
    caption = f"{len(pts)} ok cells, {int(pts['pareto'].sum())} on the frontier."
    if pts["peak_memory_source"].nunique() > 1:
        caption += (
            " These results mix memory figures (GPU VRAM and host RSS of CPU runs), which do not compare: "
            "each kind has its own frontier."
        )
    if len(pts) > MAX_SCATTER_POINTS:
        # Every k-th cell in input order plus the whole frontier: deterministic, and the shape survives.
        k = math.ceil(len(pts) / MAX_SCATTER_POINTS)
        pts = pts[pts["pareto"].to_numpy() | (np.arange(len(pts)) % k == 0)]
        caption += f" Showing {len(pts)} of them (every {k}th, and all of the frontier)."
    return pts, caption


def _tradeoff_series(s: Section, pts) -> tuple[Series, ...]:
    """The points off the frontier, a dashed line along each kind of memory figure's frontier, and the
    frontier's points numbered."""
    rest = pts[~pts["pareto"]]
    series = (
        [
            Series(
                kind="points",
                x=_gib(rest["peak_memory_bytes"]),
                y=tuple(rest["tokens_per_s"]),
                color=PALETTE[0],
                alpha=0.55,
                size=4.5,
                label="ok cell",
                css="pt",
                tips=tuple(_tip(r) for r in rest.to_dict("records")),
            )
        ]
        if len(rest)
        else []
    )
    # Numbered in the order of s.frontier, as the Markdown and HTML frontier tables are.
    front = s.frontier.assign(_n=np.arange(1, len(s.frontier) + 1))
    front = front[front.index.isin(pts.index)]
    for _, g in front.groupby("peak_memory_source", sort=False):  # one frontier per kind of memory figure
        if len(g) > 1:
            series.append(
                Series(
                    kind="line",
                    x=_gib(g["peak_memory_bytes"]),
                    y=tuple(g["tokens_per_s"]),
                    color=FRONTIER,
                    size=1.3,
                    dashed=True,
                )
            )
    series.append(
        Series(
            kind="points",
            x=_gib(front["peak_memory_bytes"]),
            y=tuple(front["tokens_per_s"]),
            color=FRONTIER,
            size=6.5,
            edge="white",
            label="Pareto frontier",
            css="pt frontier",
            numbers=tuple(front["_n"]),
            tips=tuple(_tip(r, r["_n"]) for r in front.to_dict("records")),
        )
    )
    return tuple(series)


def loss(a: Analysis) -> Chart | None:
    """Every step's loss of `a.loss_cells`, one colour each; the y range is the ok curves' own, so a
    diverged curve runs off the top instead of flattening the rest."""
    c = a.loss_cells
    if c.empty:
        return None
    series = []
    for i, (name, losses, status) in enumerate(zip(c["cell_name"], c["losses"], c["status"])):
        ys = tuple(math.nan if fmt.missing(v) else float(v) for v in losses)
        series.append(
            Series(
                kind="line",
                x=tuple(float(s) for s in range(1, len(ys) + 1)),
                y=ys,
                color=PALETTE[i % len(PALETTE)],
                size=1.6,
                css="series",
                tips=(str(name),),
                label=str(name) if status == "ok" else f"{name} ({status})",
            )
        )
    n = max(len(s.y) for s in series)
    ok = [v for ls in c.loc[c["status"] == "ok", "losses"] for v in ls if not fmt.missing(v) and math.isfinite(v)]
    ok = ok or [v for s in series for v in s.y if math.isfinite(v)] or [0.0]
    pad = (max(ok) - min(ok)) * 0.05 or 0.1
    warm = c["warmup_steps"].dropna().unique()
    shade = (
        Shade(lo=0.5, hi=float(warm[0]) + 0.5, label="warmup (not timed)") if len(warm) == 1 and warm[0] > 0 else None
    )
    return Chart(
        name="loss",
        title="Loss curves",
        aria="training loss per step, one line per cell",
        x=Axis(label="step", lo=0.5, hi=max(n, 2) + 0.5, integer=True),
        y=Axis(label="training loss", lo=min(ok) - pad, hi=max(ok) + pad),
        series=tuple(series),
        legend="below",
        height=3.6,
        shade=shade,
    )


def tradeoff_name(a: Analysis, section: Section) -> str:
    """The section's chart name (chart ids, PNG file names): tradeoff with one section, else tradeoff-<slug>."""
    return "tradeoff" if len(a.sections) == 1 else f"tradeoff-{section.slug}"


def build(a: Analysis) -> dict[str, Chart]:
    """The charts these results have data for, by name, in report order: each section's throughput
    against memory, then the loss curves."""
    if a.cells.empty:
        return {}
    charts = [tradeoff(s, tradeoff_name(a, s)) for s in a.sections] + [loss(a)]
    return {c.name: c for c in charts if c is not None}
