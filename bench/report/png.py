"""PNG charts for the Markdown report (GitHub shows images, not inline SVG, in PR comments).

Deterministic: matplotlib's default style (not the user's matplotlibrc), its bundled DejaVu font,
no 'Software'/date metadata, and a Figure without pyplot so no global backend state is touched.
Text from results is drawn as plain text: math parsing is off, so a '$' in a name is just a '$'.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from .analysis import Analysis
from .svg import PALETTE

__all__ = ["write_charts"]

_RC = {"text.parse_math": False, "font.family": "DejaVu Sans", "font.size": 9, "axes.spines.top": False,
       "axes.spines.right": False, "axes.grid": True, "grid.color": "#e6e8ec", "axes.axisbelow": True,
       "savefig.dpi": 110}
_META = {"Software": None}


def _save(fig, path: Path) -> None:
    # Written beside and renamed, so a reader never sees half a PNG (reports/*.png.tmp is git-ignored).
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", metadata=_META, bbox_inches="tight")
    os.replace(tmp, path)


def _tradeoff(a: Analysis, path: Path) -> bool:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    ok = a.ok[a.ok["tokens_per_s"].notna() & a.ok["peak_memory_bytes"].notna()]
    if ok.empty:
        return False
    fig = Figure(figsize=(7.2, 4.2))
    ax = fig.add_subplot()
    x, y = ok["peak_memory_bytes"] / 2**30, ok["tokens_per_s"]
    ax.scatter(x, y, s=18, color=PALETTE[0], alpha=0.55, linewidths=0, label="cell")
    f = a.frontier
    for i, (_, g) in enumerate(f.groupby("peak_memory_source", sort=False)):  # one frontier per kind of figure
        ax.plot(g["peak_memory_bytes"] / 2**30, g["tokens_per_s"], linestyle="--", color="#d9480f", linewidth=1.3,
                marker="o", markersize=6, markeredgecolor="white", label="Pareto frontier" if i == 0 else None)
    for i, (px, py) in enumerate(zip(f["peak_memory_bytes"] / 2**30, f["tokens_per_s"]), start=1):
        # numbered as in the Markdown frontier table
        ax.annotate(str(i), (px, py), textcoords="offset points", xytext=(5, 5), fontsize=8, color="#9a3412")
    if y.max() / y.min() > 30:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0, top=y.max() * 1.08)
    ax.set_xlim(left=0, right=x.max() * 1.06)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel(f"{a.peak_label} (GiB)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("Throughput vs peak memory", loc="left", fontweight="bold")
    ax.legend(loc="best", frameon=False)
    _save(fig, path)
    return True


def _loss(a: Analysis, path: Path) -> bool:
    from matplotlib.figure import Figure

    c = a.loss_cells
    if c.empty:
        return False
    fig = Figure(figsize=(7.2, 3.6 + 0.17 * len(c)))
    ax = fig.add_subplot()
    for i, (name, losses, status) in enumerate(zip(c["cell_name"], c["losses"], c["status"])):
        ys = [math.nan if v is None else v for v in losses]
        ax.plot(range(1, len(ys) + 1), ys, color=PALETTE[i % len(PALETTE)], linewidth=1.6,
                label=str(name) if status == "ok" else f"{name} ({status})")
    warm = c["warmup_steps"].dropna().unique()
    if len(warm) == 1 and warm[0] > 0:
        ax.axvspan(0.5, warm[0] + 0.5, color="#f1f3f6", zorder=0, label="warmup (not timed)")
    ok = [v for ls in c.loc[c["status"] == "ok", "losses"] for v in ls if v is not None and math.isfinite(v)]
    if ok:  # a diverged curve runs off the top instead of flattening the rest
        pad = (max(ok) - min(ok)) * 0.05 or 0.1
        ax.set_ylim(min(ok) - pad, max(ok) + pad)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("Loss curves", loc="left", fontweight="bold")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False, fontsize=7.5)
    _save(fig, path)
    return True


def write_charts(a: Analysis, out: Path) -> dict[str, Path]:
    """Write `<out>.tradeoff.png` and `<out>.loss.png` where there is data; returns {chart: path}."""
    import matplotlib as mpl
    import matplotlib.style  # noqa: F401 - not imported by `import matplotlib`

    charts = {}
    if a.cells.empty:
        return charts
    with mpl.style.context("default"), mpl.rc_context(_RC):
        for name, draw in (("tradeoff", _tradeoff), ("loss", _loss)):
            path = out.with_name(f"{out.name}.{name}.png")
            if draw(a, path):
                charts[name] = path
    return charts
