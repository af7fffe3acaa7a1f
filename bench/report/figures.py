"""The one renderer of the report's charts: a `charts.Chart` drawn by matplotlib, saved as a PNG for the
Markdown report (GitHub shows images, not inline SVG, in PR comments) or as an SVG inlined in the HTML page.

Deterministic: matplotlib's default style (not the user's matplotlibrc), its bundled DejaVu font, no
'Software'/date metadata, a fixed svg.hashsalt for the ids it derives from content, and a Figure
without pyplot so no global backend state is touched. Text from results is plain text: math parsing is
off, so a '$' in a name is just a '$'.

The SVG is made fit for the page: no XML prolog or metadata (nothing that names a URL), ids prefixed
with the chart's name so two charts in one page do not collide, text kept as <text> (svg.fonttype
none) and a <title> tooltip per point or line, escaped here; matplotlib escapes the text it writes.
"""

from __future__ import annotations

import io
import math
import re
from contextlib import contextmanager
from html import escape
from pathlib import Path

from ..host.safefile import write_atomic
from .charts import Axis, Chart, Series

__all__ = ["write_png", "svg", "tick_label"]

_RC = {
    "text.parse_math": False,
    "font.family": ["sans-serif"],
    "font.sans-serif": ["DejaVu Sans"],
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e6e8ec",
    "axes.axisbelow": True,
    "savefig.dpi": 110,
    "svg.fonttype": "none",
    "svg.hashsalt": "zerobench",
}
_PNG_META = {"Software": None}
_SVG_META = {"Date": None, "Creator": None, "Format": None, "Type": None}
_WIDTH = 7.2  # inches
_LEGEND_ROW = 0.17  # inches per entry of a legend below the plot
_TIP = "zb-tip-"  # placeholder urls and gids marking what gets a tooltip in the SVG


def tick_label(v: float, _pos=None) -> str:
    """Compact axis labels: 0.5, 12, 1.5k, 20k, 1.2M."""
    v = round(v, 9)
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


def _axis(ax, which: str, axis: Axis) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

    target = ax.xaxis if which == "x" else ax.yaxis
    if axis.log:
        (ax.set_xscale if which == "x" else ax.set_yscale)("log")
        decades = math.log10(axis.hi / axis.lo)
        target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
        target.set_minor_locator(NullLocator())
        target.set_minor_formatter(NullFormatter())
    elif axis.integer:
        target.set_major_locator(MaxNLocator(integer=True))
    target.set_major_formatter(FuncFormatter(tick_label))
    (ax.set_xlim if which == "x" else ax.set_ylim)(axis.lo, axis.hi)
    target.set_label_text(axis.label)


def _lone(ys: tuple[float, ...]) -> list[int]:
    """Indices of finite values with no finite neighbour: a line through them would be invisible."""
    ok = [math.isfinite(v) for v in ys]
    return [i for i, f in enumerate(ok) if f and not (i > 0 and ok[i - 1]) and not (i + 1 < len(ok) and ok[i + 1])]


def _draw(ax, s: Series, z: int, tips: list[tuple[str, str]] | None) -> None:
    """One series; with `tips` (SVG), each point or line is marked for its tooltip, which is appended there."""
    if s.kind == "points":
        coll = ax.scatter(
            s.x,
            s.y,
            s=s.size**2,
            color=s.color,
            alpha=s.alpha,
            label=s.label,
            zorder=z,
            clip_on=False,
            edgecolors=s.edge or "none",
            linewidths=1.0 if s.edge else 0,
        )
        if tips is not None and s.tips:
            coll.set_urls([f"{_TIP}{len(tips) + i}" for i in range(len(s.tips))])
            tips += [(s.css, t) for t in s.tips]
        for i, px, py in zip(s.numbers, s.x, s.y):
            ax.annotate(
                str(i), (px, py), textcoords="offset points", xytext=(5, 5), fontsize=8, color="#9a3412", zorder=z + 1
            )
        return
    lone = _lone(s.y)
    (line,) = ax.plot(
        s.x,
        s.y,
        color=s.color,
        linewidth=s.size,
        linestyle="--" if s.dashed else "-",
        label=s.label,
        zorder=z,
        marker="o" if lone else None,
        markevery=lone or None,
        markersize=s.size * 2,
        markeredgewidth=0,
    )
    if tips is not None and s.tips:
        line.set_gid(f"{_TIP}{len(tips)}")
        tips.append((s.css, s.tips[0]))


def _figure(chart: Chart, *, standalone: bool, tips: list[tuple[str, str]] | None = None):
    """standalone (the PNG): with its title and every legend; in the page the heading and the curve list
    beside the chart say that instead."""
    from matplotlib.figure import Figure

    below = chart.legend == "below"
    entries = sum(1 for s in chart.series if s.label)
    fig = Figure(figsize=(_WIDTH, chart.height + (_LEGEND_ROW * entries if below and standalone else 0)))
    ax = fig.add_subplot()
    if chart.shade:
        ax.axvspan(chart.shade.lo, chart.shade.hi, color="#f1f3f6", zorder=0)
        ax.annotate(
            chart.shade.label,
            (chart.shade.lo, 1),
            xycoords=("data", "axes fraction"),
            xytext=(4, -4),
            textcoords="offset points",
            ha="left",
            va="top",
            fontsize=8,
            color="#5d6677",
        )
    for z, s in enumerate(chart.series, start=2):  # drawn in order: the frontier over the other cells
        _draw(ax, s, z, tips)
    _axis(ax, "x", chart.x)
    _axis(ax, "y", chart.y)
    if standalone:
        ax.set_title(chart.title, loc="left", fontweight="bold")
    if entries and not below:
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=entries, frameon=False, borderaxespad=0.3)
    elif entries and standalone:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False, fontsize=7.5)
    return fig


@contextmanager
def _style():
    import matplotlib as mpl
    import matplotlib.style  # noqa: F401 - not imported by `import matplotlib`

    with mpl.style.context("default"), mpl.rc_context(_RC):
        yield


def write_png(chart: Chart, path: Path) -> Path:
    """The chart with its title and legend, as a PNG at `path`."""
    with _style():
        fig = _figure(chart, standalone=True)
        # Written beside under an unguessable name and renamed, so a reader never sees half a PNG and a
        # link planted in the reports folder is never written through (reports/*.tmp is git-ignored).
        with write_atomic(path, binary=True) as f:
            fig.savefig(f, format="png", metadata=_PNG_META, bbox_inches="tight")
    return path


_ROOT = re.compile(r"<svg\b[^>]*>")
_TAG = re.compile(r"<[^>]+>")  # matplotlib escapes '<' and '>' in text, so this finds tags only
_ANCHOR = re.compile(rf'<a xlink:href="{_TIP}(\d+)" target="_blank">')
_GID = re.compile(rf'<g id="{_TIP}(\d+)">')
_GROUP_ID = re.compile(rf'<g id="(?!{_TIP})[^"]*">')


def svg(chart: Chart) -> str:
    """The chart as an <svg> element for the HTML page: no title (the page has it), a tooltip per point."""
    tips: list[tuple[str, str]] = []
    with _style():
        fig = _figure(chart, standalone=False, tips=tips)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata=_SVG_META, bbox_inches="tight")
    out = buf.getvalue()
    root = _ROOT.search(out)
    w, h = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', root.group(0)).groups()
    # 1 pt = 4/3 CSS px: the chart's 9 pt text reads at the page's 12 px.
    head = (
        f'<svg class="chart" viewBox="0 0 {w} {h}" width="{float(w) * 4 / 3:.0f}" height="{float(h) * 4 / 3:.0f}" '
        f'role="img" aria-label="{escape(chart.aria)}" xmlns="http://www.w3.org/2000/svg">'
    )
    # matplotlib's default <style> (`*{stroke-linejoin...}`) would style the whole page: the CSS scopes it.
    body = re.sub(r"\s*<defs>\s*<style[^<]*</style>\s*</defs>", "", out[root.end() :], count=1)
    # No indentation, and no ids on groups (nothing refers to them): a third smaller.
    body = _GROUP_ID.sub("<g>", re.sub(r"\n\s+", "\n", body))

    def tip(m: re.Match) -> str:
        css, text = tips[int(m.group(1))]
        return f'<g class="{css}"><title>{escape(text)}</title>'

    body = _ANCHOR.sub(tip, body).replace("</a>", "</g>")  # the tooltip anchors are the only links
    body = _GID.sub(tip, body)
    prefix = chart.name + "-"

    def tag(m: re.Match) -> str:
        return (
            m.group(0)
            .replace(' id="', f' id="{prefix}')
            .replace('xlink:href="#', f'href="#{prefix}')
            .replace("url(#", f"url(#{prefix}")
        )

    return head + _TAG.sub(tag, body)
