"""HTML report: one self-contained file (inline CSS, JS and SVG) that opens offline.

Strings from results reach the page only through Jinja2 with autoescaping on, or through `svg`,
which escapes its own text; the only markup marked safe is what this package writes. A Content
Security Policy in the page backs that up: nothing may be fetched, and no script runs but ours.
"""
from __future__ import annotations

import base64
import hashlib
import math

import jinja2
import numpy as np
from markupsafe import Markup, escape

from . import fmt, svg
from .analysis import ZERO_SCALING_NOTE, Analysis, analyse
from .assets import CSS, JS
from .template import TEMPLATE

__all__ = ["render", "render_analysis", "MAX_SCATTER_POINTS", "MAX_COMPUTE_ROWS"]

MAX_SCATTER_POINTS = 3000  # beyond this an SVG scatter is a blur and a slow page; the frontier is always kept
MAX_COMPUTE_ROWS = 50
MAX_REASONS = 50  # distinct failure reasons grouped at the top; errors with log tails are often all distinct

# Our one script is allowed by its hash, not by 'unsafe-inline': a script that slipped past escaping
# still would not run. default-src 'none' forbids every fetch (fonts, images, frames, connections).
_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src 'sha256-{base64.b64encode(hashlib.sha256(JS.encode()).digest()).decode()}'")

_SOURCES = {"nvml": "NVML", "torch_reserved": "allocator", "host_rss": "host RSS"}
_EXTRA = [("seq_len", "seq len"), ("micro_batch", "micro batch"), ("grad_accum", "grad accum"), ("gpus", "GPUs")]
_NOISE = 0.02  # relative changes below this are run-to-run noise, not a regression


def _value(axis: str, v) -> str:
    if axis == "grad_ckpt":
        return "on" if v in (True, "True") else "off"
    return str(v)


def _name(s) -> Markup:
    """A cell name that wraps after its commas, not inside a key=value (escaped first, then <wbr> added)."""
    return Markup(str(escape(s)).replace(",", ",<wbr>"))


def _text(x) -> str:
    return "" if fmt.missing(x) else str(x)


def _clip(text: str, lines: int = 3, chars: int = 300) -> str:
    """The head of a long reason (a traceback, a log tail): the rest folds into <details>."""
    head = "\n".join(str(text).splitlines()[:lines])[:chars]
    return head if head != text else text


def _rel(x, ref):
    return None if fmt.missing(x) or fmt.missing(ref) or not ref else x / ref


def _tone(x, sign: int) -> str:
    if fmt.missing(x) or abs(x) < _NOISE:
        return ""
    return "good" if x * sign > 0 else "bad"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters.update(num=fmt.num, gib=fmt.gib, pct=fmt.pct, ms=fmt.ms, change=fmt.change, ratio=fmt.ratio,
                       tflops=fmt.tflops, sv=fmt.sort_value, name=_name, text=_text)
    env.globals.update(csp=_CSP, css=Markup(CSS), js=Markup(JS), sources=_SOURCES, noise=fmt.pct(_NOISE, 0),
                       value=_value, tone=_tone, rel=_rel, clip=_clip, max_reasons=MAX_REASONS)
    return env


_TEMPLATE = _env().from_string(TEMPLATE)


def _widths(values, top: float) -> list[str]:
    """Bar widths in percent of `top`, as fixed-precision strings (the page must not depend on float repr)."""
    return ["0" if fmt.missing(v) or not top else f"{100 * v / top:.1f}" for v in values]


# -- one function per section: Analysis -> the template variables of that section ---------------------

def _cells_table(a: Analysis) -> dict:
    cells, compute = a.cells, a.compute_metric
    extra = [(c, h) for c, h in _EXTRA if c in cells and cells[c].nunique(dropna=False) > 1]
    cols = ["cell_name", "cell_hash", "status", "reason", "model", "pareto", "tokens_per_s", "step_time_median_s",
            "peak_memory_bytes", "peak_memory_source", "loss_final", "wall_s"] + [c for c, _ in extra]
    cols += [compute] if compute else []
    return {"rows": cells[cols].to_dict("records"), "extra_cols": extra, "compute": compute,
            "compute_header": {"mfu": "MFU", "tflops_per_gpu": "TFLOP/s per GPU"}.get(compute, "MFU"),
            "compute_fmt": fmt.pct if compute == "mfu" else fmt.tflops,
            "mixed_sources": cells["peak_memory_source"].nunique() > 1}


def _fits(a: Analysis) -> dict:
    ran = a.cells[a.cells["status"] != "skipped"]
    n_oom, n_other = len(a.did_not_fit), len(ran) - len(a.ok) - len(a.did_not_fit)
    parts = [f"{n_oom} ran out of memory"] + ([f"{n_other} failed otherwise"] if n_other else [])
    use = (a.ok["peak_memory_bytes"] / a.ok["capacity_bytes"]).max()
    if not fmt.missing(use):
        parts.append(f"the largest ok peak uses {fmt.pct(use, 0)}")
    where = f"Against {a.capacity_label}" if a.capacity_label else "Capacity unknown"
    return {"fits": {"ok": len(a.ok), "ran": len(ran), "text": f"{where}: " + ", ".join(parts) + "."}}


def _scatter(a: Analysis) -> dict:
    pts = a.ok[a.ok["tokens_per_s"].notna() & a.ok["peak_memory_bytes"].notna()]
    out = {"scatter": "", "scatter_note": "",
           "frontier": a.frontier[["cell_name", "peak_memory_bytes", "tokens_per_s"]].to_dict("records")}
    if pts.empty:
        return out
    note = f"{len(pts)} ok cells, {int(pts['pareto'].sum())} on the frontier. Hover a point for its cell."
    if pts["peak_memory_source"].nunique() > 1:
        note += (" These results mix memory figures (GPU VRAM and host RSS of CPU runs), which do not compare: "
                 "each kind has its own frontier.")
    if len(pts) > MAX_SCATTER_POINTS:
        # Every k-th cell in input order plus the whole frontier: deterministic, and the shape survives.
        k = math.ceil(len(pts) / MAX_SCATTER_POINTS)
        pts = pts[pts["pareto"].to_numpy() | (np.arange(len(pts)) % k == 0)]
        note += f" Showing {len(pts)} of them (every {k}th, and all of the frontier)."
    points = [{"x": m / 2**30, "y": t, "frontier": bool(f), "group": src,
               "label": f"{n}\n{fmt.num(t)} tokens/s, {fmt.gib(m)} GiB {_SOURCES.get(src, '')}"}
              for n, t, m, f, src in zip(pts["cell_name"], pts["tokens_per_s"], pts["peak_memory_bytes"], pts["pareto"],
                                         pts["peak_memory_source"])]
    chart = svg.scatter(points, x_label=f"{a.peak_label} (GiB)", y_label="throughput (tokens/s)",
                        aria="throughput against peak memory, one point per ok cell")
    return out | {"scatter": Markup(chart), "scatter_note": note}


def _loss(a: Analysis) -> dict:
    c = a.loss_cells
    if c.empty:
        return {"loss_chart": "", "loss_legend": [], "loss_note": ""}
    series = [(n, [float("nan") if v is None else v for v in ls]) for n, ls in zip(c["cell_name"], c["losses"])]
    # The y range of the ok curves: a diverged curve runs off the top instead of flattening the rest.
    ok = [v for ls in c.loc[c["status"] == "ok", "losses"] for v in ls if not fmt.missing(v)]
    warm = c["warmup_steps"].dropna().unique()
    chart = svg.lines(series, x_label="step", y_label="training loss", aria="training loss per step",
                      shade_until=float(warm[0]) if len(warm) == 1 else None, shade_label="warmup (not timed)",
                      y_domain=(min(ok), max(ok)) if ok else None, clip_id="loss-plot")
    legend = [{"cell_name": n, "color": svg.PALETTE[i % len(svg.PALETTE)], "loss_final": lf, "status": s}
              for i, (n, lf, s) in enumerate(zip(c["cell_name"], c["loss_final"], c["status"]))]
    n_with = int(a.cells["losses"].map(lambda v: isinstance(v, list) and len(v) > 0).sum())
    note = ("Every step's loss, warmup included. Cells share the seed and data, so the curves should overlap; "
            "a config that changes the numerics shows as a curve apart.")
    if n_with > len(c):
        note += (f" {len(c)} of {n_with} cells with a loss curve are drawn: diverged cells first, then the "
                 "Pareto frontier, then the fastest.")
    return {"loss_chart": Markup(chart), "loss_legend": legend, "loss_note": note}


def _memory(a: Analysis) -> dict:
    cols = [c for c, _, _ in a.memory_columns]
    ran = a.cells[a.cells["status"] != "skipped"]
    ran = ran[ran[cols].notna().any(axis=1)] if cols else ran.iloc[:0]
    if ran.empty:
        return {"memory_rows": [], "bar_cols": [], "memory_note": ""}
    bars = [(c, h) for c, h, bar in a.memory_columns if bar]
    if bars:
        note = ("NVML counts everything the process holds on the GPU (CUDA context, NCCL buffers, allocator cache); "
                "the allocator figures are what PyTorch's caching allocator reserved and handed out. "
                "The gap between them is memory no tensor accounts for.")
    else:
        bars = [(c, h) for c, h, _ in a.memory_columns if c == "host_rss_peak_bytes"]
        note = ("These results carry no GPU memory figures (CPU run: no NVML, no CUDA allocator), so peak host RSS "
                "stands in.")
    if a.memory_phases:
        note += " Setup is model build and engine init; steps are the timed training steps."
    top = float(ran[[c for c, _ in bars]].max().max()) if bars else 0.0
    rows = ran[["cell_name", "status"] + cols + list(a.memory_phases[:2] if a.memory_phases else [])].to_dict("records")
    widths = [_widths(ran[c].tolist(), top) for c, _ in bars]
    for i, r in enumerate(rows):
        r["_bars"] = [w[i] for w in widths]
    return {"memory_rows": rows, "bar_cols": bars, "memory_note": note}


def _compute(a: Analysis) -> dict:
    metric = a.compute_metric
    if metric is None:
        return {"compute_rows": [], "compute_note": ""}
    c = a.ok[a.ok[metric].notna()].sort_values(metric, ascending=False, kind="stable")
    shown = c.head(MAX_COMPUTE_ROWS)
    rows = shown[["cell_name", "mfu", "hfu", "tflops_per_gpu"]].to_dict("records")
    for r, w in zip(rows, _widths(shown[metric].tolist(), float(c[metric].max()))):
        r["_bar"] = w
    if metric == "mfu":
        note = ("MFU: model FLOPs per second over the GPU's dense peak for the precision. HFU also counts the "
                "forward pass that gradient checkpointing recomputes.")
    else:
        note = ("No MFU: the peak FLOP/s of this device is not known (CPU runs, or a GPU missing from the "
                "peak table), so achieved TFLOP/s per device is shown instead.")
    if len(c) > len(shown):
        note += f" Top {len(shown)} of {len(c)} cells; all are in the cells table."
    return {"compute_rows": rows, "compute_note": note}


def _failures(a: Analysis) -> dict:
    cols = ["cell_name", "cell_hash", "status", "reason", "phase_at_end", "exit_code"]
    return {"failures": a.failures[cols].to_dict("records") if len(a.failures) else [],
            "failure_statuses": [s for s in a.counts if s != "ok"]}


def _zero(a: Analysis) -> dict:
    return {"zero_rows": a.zero_scaling, "zero_figures": a.zero_figures, "zero_note": ZERO_SCALING_NOTE}


def _baseline(a: Analysis) -> dict:
    return {"baseline_rows": a.baseline.to_dict("records") if a.baseline is not None else []}


def render_analysis(a: Analysis) -> str:
    if a.cells.empty:
        return _TEMPLATE.render(a=a, n_cells=0, nav=[])
    ctx = {}
    for section in (_cells_table, _fits, _scatter, _loss, _memory, _compute, _failures, _baseline, _zero):
        ctx |= section(a)
    nav = [("summary", "Summary", True), ("tradeoff", "Throughput vs memory", bool(ctx["scatter"])),
           ("cells", "Cells", True), ("ablations", "Ablations", bool(a.ablations)),
           ("zero", "ZeRO vs paper", bool(a.zero_scaling)),
           ("memory", "Peak memory", bool(ctx["memory_rows"])), ("loss", "Loss", bool(ctx["loss_chart"])),
           ("compute", "MFU", True), ("failures", "Failed and skipped", True),
           ("baseline", "Baseline", a.baseline is not None), ("environment", "Environment", True)]
    return _TEMPLATE.render(a=a, n_cells=len(a.cells), nav=[(i, t) for i, t, shown in nav if shown], **ctx)


def render(df, title: str = "zerobench report", baseline=None) -> str:
    """The HTML report of a results DataFrame (`bench.results.load()`), optionally against a baseline one."""
    return render_analysis(analyse(df, title=title, baseline=baseline))
