"""Inline SVG charts for the HTML report, written by hand.

Why not matplotlib here: inline SVG needs no files or fonts (it takes the page's typography and
colours from its CSS), carries a tooltip per point (<title>), stays small, and is byte-identical for
the same input: coordinates have fixed precision and nothing is numbered by a counter or a clock.
Every string that reaches the SVG goes through `_e` (HTML/XML escaping).
"""
from __future__ import annotations

import math
from html import escape

__all__ = ["scatter", "lines", "PALETTE"]

# Tableau 10 plus two: distinct for the at most 12 overlaid loss curves.
PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac", "#1f3b73", "#8cd17d"]
WIDTH, HEIGHT = 760, 380
LEFT, RIGHT, TOP, BOTTOM = 76, 20, 14, 52


def _e(s) -> str:
    return escape(str(s), quote=True)


def _f(x: float) -> str:
    return f"{x:.1f}"


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def tick_label(v: float) -> str:
    """Compact axis labels: 0.5, 12, 1.5k, 20k, 1.2M."""
    v = round(v, 9)
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:g}"


class Scale:
    """Data -> pixels along one axis, with 'nice' ticks (1, 2, 2.5, 5 x 10^k, or decades when log)."""

    def __init__(self, lo: float, hi: float, p0: float, p1: float, *, log: bool = False, from_zero: bool = False,
                 n: int = 5, pad: float = 0.0):
        """pad: widen the data range by this fraction of it on each side first, so no point sits on the frame."""
        self.log, self.p0, self.p1 = log, p0, p1
        if log:
            lo_e, hi_e = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
            hi_e = max(hi_e, lo_e + 1)
            self.lo, self.hi = 10.0**lo_e, 10.0**hi_e
            mults = (1, 2, 5) if hi_e - lo_e <= 2 else (1,)
            self.ticks = [m * 10.0**e for e in range(lo_e, hi_e + 1) for m in mults if m * 10.0**e <= self.hi]
            return
        if from_zero:
            lo = min(0.0, lo)
        span = hi - lo
        if not from_zero:
            lo = max(lo - span * pad, 0.0) if lo >= 0 else lo - span * pad  # no negative memory or throughput
        hi += span * pad
        if hi - lo <= 0:  # one value: centre it
            half = abs(hi) * 0.1 or 1.0
            lo, hi = lo - half, hi + half
        raw = (hi - lo) / n
        mag = 10.0 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
        self.lo, self.hi = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
        self.ticks = [self.lo + i * step for i in range(int(round((self.hi - self.lo) / step)) + 1)]

    def __call__(self, v: float) -> float:
        if self.log:
            t = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            t = (v - self.lo) / (self.hi - self.lo)
        return self.p0 + t * (self.p1 - self.p0)


def _frame(x: Scale, y: Scale, x_label: str, y_label: str, aria: str, height: int, top: int = TOP) -> list[str]:
    out = [f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" role="img" '
           f'aria-label="{_e(aria)}" xmlns="http://www.w3.org/2000/svg">']
    bottom = height - BOTTOM
    for t in y.ticks:
        py = _f(y(t))
        out.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{py}" y2="{py}"/>'
                   f'<text class="tick" x="{LEFT - 8}" y="{py}" text-anchor="end" dominant-baseline="middle">'
                   f'{_e(tick_label(t))}</text>')
    for t in x.ticks:
        px = _f(x(t))
        out.append(f'<line class="grid" x1="{px}" x2="{px}" y1="{top}" y2="{bottom}"/>'
                   f'<text class="tick" x="{px}" y="{bottom + 18}" text-anchor="middle">{_e(tick_label(t))}</text>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{bottom}" y2="{bottom}"/>'
               f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{top}" y2="{bottom}"/>')
    out.append(f'<text class="label" x="{_f((LEFT + WIDTH - RIGHT) / 2)}" y="{height - 10}" text-anchor="middle">'
               f'{_e(x_label)}</text>')
    cy = _f((top + bottom) / 2)
    out.append(f'<text class="label" x="16" y="{cy}" text-anchor="middle" transform="rotate(-90 16 {cy})">'
               f'{_e(y_label)}</text>')
    return out


def scatter(points: list[dict], *, x_label: str, y_label: str, aria: str) -> str:
    """Points {x, y, label, frontier, group}; frontier points are highlighted, joined per group by a dashed line.

    y goes logarithmic when it spans more than 30x (offload cells can be 10-100x slower), so the
    fast cells are not squashed against the top.
    """
    pts = [p for p in points if _finite(p["x"]) and _finite(p["y"]) and p["y"] > 0]
    if not pts:
        return ""
    xs, ys = [p["x"] for p in pts], [p["y"] for p in pts]
    log_y = max(ys) / min(ys) > 30
    height, top = HEIGHT + 20, TOP + 24  # room above the plot for the legend
    # A scatter needs no zero baseline; keep it only when the data comes near it anyway, else cells
    # whose memory differs by a few percent would sit on one vertical line.
    x = Scale(min(xs), max(xs), LEFT, WIDTH - RIGHT, from_zero=min(xs) < 0.4 * max(xs), pad=0.04)
    y = Scale(min(ys), max(ys), height - BOTTOM, top, log=log_y, from_zero=not log_y and min(ys) < 0.4 * max(ys),
              pad=0.04)
    out = _frame(x, y, x_label, y_label + (", log scale" if log_y else ""), aria, height, top)
    for group in sorted({p.get("group", "") for p in pts if p["frontier"]}):
        front = sorted((p for p in pts if p["frontier"] and p.get("group", "") == group),
                       key=lambda p: (p["x"], -p["y"]))
        if len(front) > 1:
            path = " ".join(f"{_f(x(p['x']))},{_f(y(p['y']))}" for p in front)
            out.append(f'<polyline class="frontier-line" points="{path}"/>')
    for p in sorted(pts, key=lambda p: p["frontier"]):  # frontier drawn last, on top
        cls = "pt frontier" if p["frontier"] else "pt"
        out.append(f'<circle class="{cls}" cx="{_f(x(p["x"]))}" cy="{_f(y(p["y"]))}" r="{5 if p["frontier"] else 4}">'
                   f'<title>{_e(p["label"])}</title></circle>')
    ly = TOP + 4
    out.append(f'<g class="legend"><circle class="pt" cx="{LEFT + 6}" cy="{ly}" r="4"/>'
               f'<text x="{LEFT + 16}" y="{ly}" dominant-baseline="middle">ok cell (hover for its name)</text>'
               f'<circle class="pt frontier" cx="{LEFT + 206}" cy="{ly}" r="5"/>'
               f'<text x="{LEFT + 216}" y="{ly}" dominant-baseline="middle">Pareto frontier</text></g>')
    out.append("</svg>")
    return "\n".join(out)


def lines(series: list[tuple[str, list]], *, x_label: str, y_label: str, aria: str, shade_until: float | None = None,
          shade_label: str = "", y_domain: tuple[float, float] | None = None, clip_id: str = "lines-plot") -> str:
    """Overlaid lines (label, ys) over x = 1..n, coloured by PALETTE in order; gaps where a value is not finite.

    y_domain: the y range to show (default: all values); lines leaving it are clipped at the frame,
    so one diverging run does not flatten every other curve. clip_id must be unique in the page.
    """
    ys = [v for _, vals in series for v in vals if _finite(v)]
    if not ys:
        return ""
    n = max(len(vals) for _, vals in series)
    height = HEIGHT
    lo, hi = y_domain or (min(ys), max(ys))
    x = Scale(1, max(n, 2), LEFT, WIDTH - RIGHT)
    y = Scale(lo, hi, height - BOTTOM, TOP, pad=0.03)
    out = _frame(x, y, x_label, y_label, aria, height)
    out.append(f'<clipPath id="{_e(clip_id)}"><rect x="{LEFT}" y="{TOP}" width="{WIDTH - RIGHT - LEFT}" '
               f'height="{height - BOTTOM - TOP}"/></clipPath>')
    if shade_until and shade_until >= 1:
        right = x(min(shade_until + 0.5, x.hi))
        out.append(f'<rect class="shade" x="{LEFT}" y="{TOP}" width="{_f(right - LEFT)}" '
                   f'height="{height - BOTTOM - TOP}"/>'
                   f'<text class="shade-label" x="{LEFT + 6}" y="{TOP + 14}">{_e(shade_label)}</text>')
    for i, (label, vals) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        segments, cur = [], []
        for step, v in enumerate(vals, start=1):
            if _finite(v):
                cur.append(f"{_f(x(step))},{_f(y(v))}")
            elif cur:
                segments.append(cur)
                cur = []
        if cur:
            segments.append(cur)
        out.append(f'<g class="series" stroke="{color}" clip-path="url(#{_e(clip_id)})"><title>{_e(label)}</title>')
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
            else:
                out.append(f'<polyline points="{" ".join(seg)}"/>')
        out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)
