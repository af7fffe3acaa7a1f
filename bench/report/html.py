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
from markupsafe import Markup, escape

from . import fmt, svg
from .analysis import STATUS_ORDER, Analysis
from .assets import CSS, JS

__all__ = ["render", "render_analysis", "MAX_SCATTER_POINTS", "MAX_COMPUTE_ROWS"]

MAX_SCATTER_POINTS = 3000  # beyond this an SVG scatter is a blur and a slow page; the frontier is always kept
MAX_COMPUTE_ROWS = 50
MAX_REASONS = 50  # distinct failure reasons grouped at the top; errors with log tails are often all distinct

_CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src 'sha256-{base64.b64encode(hashlib.sha256(JS.encode()).digest()).decode()}'")

TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ csp }}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{{ a.title }}</title>
<style>{{ css }}</style>
</head>
<body>
{%- macro reason(text) %}{% set head = clip(text) %}{% if head != text %}<details><summary class="reason">{{ head }}…</summary>
<p class="reason">{{ text }}</p></details>{% else %}<p class="reason">{{ text }}</p>{% endif %}{% endmacro %}
<header>
<h1>{{ a.title }}</h1>
<p class="sub">{{ n_cells }} cell{{ "s" if n_cells != 1 }}, {{ a.attempts }} attempt{{ "s" if a.attempts != 1 }}
{%- for s, n in a.counts.items() %} &nbsp;<span class="st st-{{ s }}">{{ n }} {{ s }}</span>{% endfor %}</p>
<nav>{% for id, name in nav %}<a href="#{{ id }}">{{ name }}</a>{% endfor %}</nav>
</header>
<main>
{%- if not n_cells %}
<section><p class="note">No results.</p></section>
{%- else %}
<section id="summary">
<div class="cards">
{%- if a.fastest %}
<div class="card"><div class="k">Fastest ok cell</div>
<div class="v">{{ a.fastest.tokens_per_s|num }} <small>tokens/s</small></div>
<div class="cell">{{ a.fastest.cell_name|name }}</div>
<div class="d">{{ a.fastest.peak_memory_bytes|gib }} GiB {{ a.peak_label }}</div></div>
{%- endif %}
{%- if a.smallest %}
<div class="card"><div class="k">Lowest-memory ok cell</div>
<div class="v">{{ a.smallest.peak_memory_bytes|gib }} <small>GiB</small></div>
<div class="cell">{{ a.smallest.cell_name|name }}</div>
<div class="d">{{ a.smallest.tokens_per_s|num }} tokens/s</div></div>
{%- endif %}
{%- if a.best_mfu %}
<div class="card"><div class="k">Best MFU</div>
<div class="v">{{ a.best_mfu.mfu|pct }}</div>
<div class="cell">{{ a.best_mfu.cell_name|name }}</div>
<div class="d">HFU {{ a.best_mfu.hfu|pct }}, {{ a.best_mfu.tflops_per_gpu|tflops }} TFLOP/s per GPU</div></div>
{%- endif %}
<div class="card"><div class="k">What fits</div>
<div class="v">{{ fits.ok }} <small>ok of {{ fits.ran }} cells that ran</small></div>
<div class="d">{{ fits.text }}</div></div>
</div>
</section>

{%- if scatter %}
<section id="tradeoff">
<h2>Throughput vs peak memory</h2>
<p class="note">Each ok cell once. The Pareto frontier joins the cells that no other cell beats on both
throughput and memory: pick from it for a memory budget.</p>
<figure>{{ scatter }}
<figcaption>{{ scatter_note }}</figcaption></figure>
<div class="table-wrap"><table class="sortable">
<thead><tr><th>frontier cell</th><th class="n">{{ a.peak_label }} (GiB)</th><th class="n">tokens/s</th></tr></thead>
<tbody>{% for r in frontier %}<tr><td class="cell">{{ r.cell_name|name }}</td>
<td class="n" data-v="{{ r.peak_memory_bytes|sv }}">{{ r.peak_memory_bytes|gib }}</td>
<td class="n" data-v="{{ r.tokens_per_s|sv }}">{{ r.tokens_per_s|num }}</td></tr>{% endfor %}</tbody>
</table></div>
</section>
{%- endif %}

<section id="cells">
<h2>All cells</h2>
<p class="note">The last attempt of each cell. Click a header to sort; type to filter (every word must match).
Peak memory is {{ a.peak_label }}.</p>
<div class="controls" data-filter-for="cells-table">
<input type="search" placeholder="filter, e.g. zero=3 lora" aria-label="filter cells">
<select aria-label="status"><option value="">any status</option>
{%- for s in a.counts %}<option value="{{ s }}">{{ s }}</option>{% endfor %}</select>
<span class="count"></span></div>
<div class="table-wrap"><table class="sortable" id="cells-table">
<thead><tr><th>cell</th><th>status</th><th>model</th>
{%- for c, h in extra_cols %}<th class="n">{{ h }}</th>{% endfor %}
<th class="n">tokens/s</th><th class="n">step, median (ms)</th><th class="n">peak memory (GiB)</th>
<th>measured by</th><th class="n">{{ compute_header }}</th><th class="n">final loss</th><th class="n">wall (s)</th>
</tr></thead>
<tbody>
{%- for r in rows %}
<tr data-status="{{ r.status }}"><td class="cell">{{ r.cell_name|name }} <span class="hash">#{{ r.cell_hash }}</span>
{%- if r.pareto %}<span class="tag">frontier</span>{% endif %}</td>
<td><span class="st st-{{ r.status }}" title="{{ r.reason }}">{{ r.status }}</span></td>
<td class="mono nowrap">{{ r.model|text }}</td>
{%- for c, h in extra_cols %}<td class="n" data-v="{{ r[c]|sv }}">{{ r[c]|num }}</td>{% endfor %}
<td class="n" data-v="{{ r.tokens_per_s|sv }}">{{ r.tokens_per_s|num }}</td>
<td class="n" data-v="{{ r.step_time_median_s|sv }}">{{ r.step_time_median_s|ms }}</td>
<td class="n" data-v="{{ r.peak_memory_bytes|sv }}">{{ r.peak_memory_bytes|gib }}</td>
<td class="muted">{{ sources.get(r.peak_memory_source, "") }}</td>
<td class="n" data-v="{{ r[compute]|sv if compute else '' }}">{{ compute_fmt(r[compute]) if compute else "" }}</td>
<td class="n" data-v="{{ r.loss_final|sv }}">{{ r.loss_final|num(3) }}</td>
<td class="n" data-v="{{ r.wall_s|sv }}">{{ r.wall_s|num(1) }}</td></tr>
{%- endfor %}
</tbody></table></div>
</section>

{%- if a.ablations %}
<section id="ablations">
<h2>Ablations: one knob at a time</h2>
<p class="note">For each knob, cells that differ only in it, side by side: throughput and {{ a.peak_label }} per value,
with the ratio to the first value of the row. The summary line is the median ratio over all such groups.</p>
{%- for ab in a.ablations %}
<h3>{{ ab.title }}</h3>
<ul class="effects">{% for e in ab.effects %}<li><b>{{ value(ab.axis, e.value) }}</b> vs {{ value(ab.axis, e.reference) }}:
{% if e.n %}{{ e.tokens_ratio|ratio }} tokens/s, {{ e.memory_ratio|ratio }} peak memory
<span class="muted">(median of {{ e.n }} group{{ "s" if e.n != 1 }})</span>{% else %}<span class="muted">no group where both ran ok</span>{% endif %}</li>
{%- endfor %}</ul>
<div class="table-wrap"><table>
<thead><tr><th>the other settings</th>{% for v in ab.values %}<th class="n">{{ value(ab.axis, v) }}</th>{% endfor %}</tr></thead>
<tbody>
{%- for g in ab.groups %}{% set ref = g.cells[ab.values[0]|string] %}
<tr><td class="cell">{{ g.context }}</td>
{%- for v in ab.values %}{% set c = g.cells[v|string] %}<td class="n ab">
{%- if c is none %}<span class="muted">–</span>
{%- elif c.status == "ok" %}<b>{{ c.tokens_per_s|num }}</b> tok/s{% if ref and ref.status == "ok" and not loop.first %} <span class="r">{{ rel(c.tokens_per_s, ref.tokens_per_s)|ratio }}</span>{% endif %}<br>
{{ c.peak_memory_bytes|gib }} GiB{% if ref and ref.status == "ok" and not loop.first %} <span class="r">{{ rel(c.peak_memory_bytes, ref.peak_memory_bytes)|ratio }}</span>{% endif %}
{%- else %}<span class="st st-{{ c.status }}" title="{{ c.reason }}">{{ c.status }}</span>{% endif %}</td>
{%- endfor %}</tr>
{%- endfor %}
</tbody></table></div>
{%- if ab.n_groups > ab.groups|length %}<p class="note">{{ ab.groups|length }} of {{ ab.n_groups }} groups shown; the summary uses all.</p>{% endif %}
{%- endfor %}
</section>
{%- endif %}

{%- if memory_rows %}
<section id="memory">
<h2>Peak memory per cell</h2>
<p class="note">Peaks in GiB. {{ memory_note }}</p>
<div>{% for col, head in bar_cols %}<span class="key"><span class="bar s{{ loop.index0 }}"></span>{{ head }}</span>{% endfor %}</div>
<div class="table-wrap"><table class="sortable wrap-head">
<thead><tr><th>cell</th><th>status</th>{% for col, head, bar in a.memory_columns %}<th class="n">{{ head }}</th>{% endfor %}
{%- if a.memory_phases %}<th class="n">{{ a.memory_phases[2] }}: setup → steps</th>{% endif %}<th>side by side</th></tr></thead>
<tbody>
{%- for r in memory_rows %}
<tr><td class="cell">{{ r.cell_name|name }}</td><td><span class="st st-{{ r.status }}">{{ r.status }}</span></td>
{%- for col, head, bar in a.memory_columns %}<td class="n" data-v="{{ r[col]|sv }}">{{ r[col]|gib }}</td>{% endfor %}
{%- if a.memory_phases %}<td class="n" data-v="{{ r[a.memory_phases[1]]|sv }}">{{ r[a.memory_phases[0]]|gib }} → {{ r[a.memory_phases[1]]|gib }}</td>{% endif %}
<td><div class="bars">{% for w in r._bars %}<div class="bar s{{ loop.index0 }}" style="width:{{ w }}%"></div>{% endfor %}</div></td></tr>
{%- endfor %}
</tbody></table></div>
</section>
{%- endif %}

{%- if loss_chart %}
<section id="loss">
<h2>Loss curves</h2>
<p class="note">{{ loss_note }}</p>
<figure>{{ loss_chart }}</figure>
<ul class="legend">{% for r in loss_legend %}<li><span class="swatch" style="background:{{ r.color }}"></span>
<span class="cell">{{ r.cell_name|name }}</span>{% if r.loss_final|num(3) %} <span class="muted">final {{ r.loss_final|num(3) }}</span>{% endif %}
{%- if r.status != "ok" %} <span class="st st-{{ r.status }}">{{ r.status }}</span>{% endif %}</li>{% endfor %}</ul>
</section>
{%- endif %}

<section id="compute">
<h2>{{ "Model FLOPs utilisation" if a.compute_metric == "mfu" else "Achieved compute" }}</h2>
{%- if compute_rows %}
<p class="note">{{ compute_note }}</p>
<div class="table-wrap"><table class="sortable">
<thead><tr><th>cell</th>{% if a.compute_metric == "mfu" %}<th class="n">MFU</th><th class="n">HFU</th>{% endif %}
<th class="n">TFLOP/s per GPU</th><th></th></tr></thead>
<tbody>{% for r in compute_rows %}<tr><td class="cell">{{ r.cell_name|name }}</td>
{%- if a.compute_metric == "mfu" %}<td class="n" data-v="{{ r.mfu|sv }}">{{ r.mfu|pct }}</td><td class="n" data-v="{{ r.hfu|sv }}">{{ r.hfu|pct }}</td>{% endif %}
<td class="n" data-v="{{ r.tflops_per_gpu|sv }}">{{ r.tflops_per_gpu|tflops }}</td>
<td><div class="bars"><div class="bar s0" style="width:{{ r._bar }}%"></div></div></td></tr>{% endfor %}</tbody>
</table></div>
{%- else %}<p class="note">No cell ran ok with a throughput figure.</p>{% endif %}
</section>

<section id="failures">
<h2>Failed and skipped cells</h2>
{%- if not failures %}<p class="note">None: every cell ran ok.</p>
{%- else %}
<h3>By reason</h3>
<div class="table-wrap"><table>
<thead><tr><th>status</th><th class="n">cells</th><th>reason</th><th>which</th></tr></thead>
<tbody>{% for g in a.failure_groups[:max_reasons] %}<tr><td><span class="st st-{{ g.status }}">{{ g.status }}</span></td><td class="n">{{ g.n }}</td>
<td>{{ reason(g.reason or "(no reason recorded)") }}</td>
<td class="cell">{% for c in g.cells[:5] %}{{ c|name }}<br>{% endfor %}{% if g.n > 5 %}<span class="muted">and {{ g.n - 5 }} more</span>{% endif %}</td></tr>{% endfor %}</tbody>
</table></div>
{%- if a.failure_groups|length > max_reasons %}<p class="note">The {{ max_reasons }} most common of {{ a.failure_groups|length }} distinct reasons; every cell is below.</p>{% endif %}
<h3>Each cell</h3>
<div class="controls" data-filter-for="failures-table">
<input type="search" placeholder="filter, e.g. fp16" aria-label="filter failed and skipped cells">
<select aria-label="status"><option value="">any status</option>
{%- for s in failure_statuses %}<option value="{{ s }}">{{ s }}</option>{% endfor %}</select>
<span class="count"></span></div>
<div class="table-wrap"><table class="sortable" id="failures-table">
<thead><tr><th>cell</th><th>status</th><th>phase</th><th class="n">exit code</th><th>reason</th></tr></thead>
<tbody>{% for r in failures %}<tr data-status="{{ r.status }}"><td class="cell">{{ r.cell_name|name }} <span class="hash">#{{ r.cell_hash }}</span></td>
<td><span class="st st-{{ r.status }}">{{ r.status }}</span></td><td>{{ r.phase_at_end|text }}</td>
<td class="n" data-v="{{ r.exit_code|sv }}">{{ r.exit_code|num }}</td>
<td>{{ reason(r.reason) }}</td></tr>{% endfor %}</tbody>
</table></div>
{%- endif %}
</section>

{%- if a.baseline is not none %}
<section id="baseline">
<h2>Against the baseline</h2>
<p class="note">Cells matched by cell hash (same configuration). Relative change of this run vs the baseline;
green is better (more tokens/s, less memory), red worse, beyond ±{{ noise }} noise.
{%- if a.baseline_only %} {{ a.baseline_only|length }} baseline cell{{ "s" if a.baseline_only|length != 1 }} not in these results.{% endif %}</p>
{%- if baseline_rows %}
<div class="table-wrap"><table class="sortable">
<thead><tr><th>cell</th><th>baseline</th><th>now</th><th class="n">tokens/s, baseline</th><th class="n">tokens/s, now</th><th class="n">change</th>
<th class="n">peak GiB, baseline</th><th class="n">peak GiB, now</th><th class="n">change</th></tr></thead>
<tbody>{% for r in baseline_rows %}<tr><td class="cell">{{ r.cell_name|name }}</td>
<td><span class="st st-{{ r.status_base }}">{{ r.status_base }}</span></td><td><span class="st st-{{ r.status }}">{{ r.status }}</span></td>
<td class="n" data-v="{{ r.tokens_per_s_base|sv }}">{{ r.tokens_per_s_base|num }}</td>
<td class="n" data-v="{{ r.tokens_per_s|sv }}">{{ r.tokens_per_s|num }}</td>
<td class="n {{ tone(r.tokens_per_s_change, 1) }}" data-v="{{ r.tokens_per_s_change|sv }}">{{ r.tokens_per_s_change|change }}</td>
<td class="n" data-v="{{ r.peak_memory_bytes_base|sv }}">{{ r.peak_memory_bytes_base|gib }}</td>
<td class="n" data-v="{{ r.peak_memory_bytes|sv }}">{{ r.peak_memory_bytes|gib }}</td>
<td class="n {{ tone(r.peak_memory_change, -1) }}" data-v="{{ r.peak_memory_change|sv }}">{{ r.peak_memory_change|change }}</td></tr>{% endfor %}</tbody>
</table></div>
{%- else %}<p class="note">No cell of these results is in the baseline.</p>{% endif %}
</section>
{%- endif %}

<section id="environment">
<h2>Environment and provenance</h2>
<dl class="env">{% for k, v in a.environment %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl>
</section>
{%- endif %}
</main>
<footer>Written by zerobench from the results alone: the same results give the same file.</footer>
<script>{{ js }}</script>
</body>
</html>
"""

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
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=False)
    env.filters.update(num=fmt.num, gib=fmt.gib, pct=fmt.pct, ms=fmt.ms, change=fmt.change, ratio=fmt.ratio,
                       sv=fmt.sort_value, name=_name, text=_text,
                       tflops=fmt.tflops)
    return env


_TEMPLATE = _env().from_string(TEMPLATE)


def _widths(values, top: float) -> list[str]:
    return ["0" if fmt.missing(v) or not top else f"{100 * v / top:.1f}" for v in values]


def _scatter(a: Analysis) -> tuple[str, str]:
    pts = a.ok[a.ok["tokens_per_s"].notna() & a.ok["peak_memory_bytes"].notna()]
    if pts.empty:
        return "", ""
    note = f"{len(pts)} ok cells, {int(pts['pareto'].sum())} on the frontier. Hover a point for its cell."
    if len(pts) > MAX_SCATTER_POINTS:
        # Every k-th cell in input order plus the whole frontier: deterministic, and the shape survives.
        k = math.ceil(len(pts) / MAX_SCATTER_POINTS)
        keep = pts["pareto"].to_numpy() | (pts.reset_index(drop=True).index.to_numpy() % k == 0)
        pts = pts[keep]
        note += f" Showing {len(pts)} of them (every {k}th, and all of the frontier)."
    points = [{"x": m / 2**30, "y": t, "frontier": bool(f),
               "label": f"{n}\n{fmt.num(t)} tokens/s, {fmt.gib(m)} GiB"}
              for n, t, m, f in zip(pts["cell_name"], pts["tokens_per_s"], pts["peak_memory_bytes"], pts["pareto"])]
    chart = svg.scatter(points, x_label=f"{a.peak_label} (GiB)", y_label="throughput (tokens/s)",
                        aria="throughput against peak memory, one point per ok cell")
    return chart, note


def _loss_domain(c) -> tuple[float, float] | None:
    """The y range of the ok curves: a diverged curve runs off the top instead of flattening the rest."""
    ok = [v for ls in c.loc[c["status"] == "ok", "losses"] for v in ls if not fmt.missing(v)]
    return (min(ok), max(ok)) if ok else None


def _loss(a: Analysis) -> tuple[str, list[dict], str]:
    c = a.loss_cells
    if c.empty:
        return "", [], ""
    series = [(n, [float("nan") if v is None else v for v in ls]) for n, ls in zip(c["cell_name"], c["losses"])]
    warm = c["warmup_steps"].dropna().unique()
    shade = float(warm[0]) if len(warm) == 1 else None
    chart = svg.lines(series, x_label="step", y_label="training loss", aria="training loss per step",
                      shade_until=shade, shade_label="warmup (not timed)", y_domain=_loss_domain(c), clip_id="loss-plot")
    legend = [{"cell_name": n, "color": svg.PALETTE[i % len(svg.PALETTE)], "loss_final": lf, "status": s}
              for i, (n, lf, s) in enumerate(zip(c["cell_name"], c["loss_final"], c["status"]))]
    n_with = int(a.cells["losses"].map(lambda v: isinstance(v, list) and len(v) > 0).sum())
    note = ("Every step's loss, warmup included. Cells share the seed and data, so the curves should overlap; "
            "a config that changes the numerics shows as a curve apart.")
    if n_with > len(c):
        note += (f" {len(c)} of {n_with} cells with a loss curve are drawn: diverged cells first, then the "
                 "Pareto frontier, then the fastest.")
    return chart, legend, note


def _memory(a: Analysis) -> tuple[list[dict], list[tuple[str, str]], str]:
    ran = a.cells[(a.cells["status"] != "skipped")]
    cols = [c for c, _, _ in a.memory_columns]
    if ran.empty or not cols:
        return [], [], ""
    ran = ran[ran[cols].notna().any(axis=1)]
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
    phases = list(a.memory_phases[:2]) if a.memory_phases else []
    rows = ran[["cell_name", "status"] + cols + phases].to_dict("records")
    widths = [_widths(ran[c].tolist(), top) for c, _ in bars]
    for i, r in enumerate(rows):
        r["_bars"] = [w[i] for w in widths]
    return rows, bars, note


def _compute(a: Analysis) -> tuple[list[dict], str]:
    metric = a.compute_metric
    if metric is None:
        return [], ""
    c = a.ok[a.ok[metric].notna()].sort_values(metric, ascending=False, kind="stable")
    top = float(c[metric].max()) if len(c) else 0.0
    shown = c.head(MAX_COMPUTE_ROWS)
    rows = shown[["cell_name", "mfu", "hfu", "tflops_per_gpu"]].to_dict("records")
    for r, w in zip(rows, _widths(shown[metric].tolist(), top)):
        r["_bar"] = w
    if metric == "mfu":
        note = ("MFU: model FLOPs per second over the GPU's dense peak for the precision. HFU also counts the "
                "forward pass that gradient checkpointing recomputes.")
    else:
        note = ("No MFU: the peak FLOP/s of this device is not known (CPU runs, or a GPU missing from the "
                "peak table), so achieved TFLOP/s per device is shown instead.")
    if len(c) > len(shown):
        note += f" Top {len(shown)} of {len(c)} cells; all are in the cells table."
    return rows, note


def _fits(a: Analysis) -> dict:
    ran = a.cells[a.cells["status"] != "skipped"]
    n_oom, n_other = len(a.did_not_fit), len(ran) - len(a.ok) - len(a.did_not_fit)
    parts = [f"{n_oom} ran out of memory"] + ([f"{n_other} failed otherwise"] if n_other else [])
    if a.capacity_bytes:
        text = f"Against {a.capacity_label}, {fmt.gib(a.capacity_bytes, 1)} GiB"
        worst = a.ok["peak_memory_bytes"].max()
        if not fmt.missing(worst):
            parts.append(f"the largest ok peak uses {fmt.pct(worst / a.capacity_bytes, 0)}")
    else:
        text = "Capacity unknown"
    return {"ok": len(a.ok), "ran": len(ran), "text": f"{text}: " + ", ".join(parts) + "."}


def render_analysis(a: Analysis) -> str:
    cells = a.cells
    n = len(cells)
    extra = [(c, h) for c, h in _EXTRA if c in cells and cells[c].nunique(dropna=False) > 1] if n else []
    compute = a.compute_metric
    cols = ["cell_name", "cell_hash", "status", "reason", "model", "pareto", "tokens_per_s", "step_time_median_s",
            "peak_memory_bytes", "peak_memory_source", "loss_final", "wall_s"] + [c for c, _ in extra]
    cols += [compute] if compute and compute not in cols else []
    rows = cells[cols].to_dict("records") if n else []
    scatter, scatter_note = _scatter(a) if n else ("", "")
    loss_chart, loss_legend, loss_note = _loss(a) if n else ("", [], "")
    memory_rows, bar_cols, memory_note = _memory(a) if n else ([], [], "")
    compute_rows, compute_note = _compute(a) if n else ([], "")
    failures = a.failures[["cell_name", "cell_hash", "status", "reason", "phase_at_end", "exit_code"]].to_dict(
        "records") if len(a.failures) else []
    baseline_rows = a.baseline.to_dict("records") if a.baseline is not None and len(a.baseline) else []
    nav = [("summary", "Summary"), ("tradeoff", "Throughput vs memory") if scatter else None, ("cells", "Cells"),
           ("ablations", "Ablations") if a.ablations else None, ("memory", "Peak memory") if memory_rows else None,
           ("loss", "Loss") if loss_chart else None, ("compute", "MFU"), ("failures", "Failed and skipped"),
           ("baseline", "Baseline") if a.baseline is not None else None, ("environment", "Environment")]
    return _TEMPLATE.render(
        a=a, n_cells=n, csp=_CSP, css=Markup(CSS), js=Markup(JS), nav=[x for x in nav if x] if n else [],
        fits=_fits(a) if n else {}, rows=rows, extra_cols=extra, sources=_SOURCES, compute=compute,
        compute_header={"mfu": "MFU", "tflops_per_gpu": "TFLOP/s per GPU"}.get(compute, "MFU"),
        compute_fmt=(fmt.pct if compute == "mfu" else fmt.tflops),
        frontier=a.frontier[["cell_name", "peak_memory_bytes", "tokens_per_s"]].to_dict("records") if n else [],
        scatter=Markup(scatter), scatter_note=scatter_note, loss_chart=Markup(loss_chart), loss_legend=loss_legend,
        loss_note=loss_note, memory_rows=memory_rows, bar_cols=bar_cols, memory_note=memory_note,
        compute_rows=compute_rows, compute_note=compute_note, failures=failures,
        failure_statuses=[s for s in STATUS_ORDER if s in a.counts and s != "ok"], baseline_rows=baseline_rows,
        noise=fmt.pct(_NOISE, 0), value=_value, tone=_tone, rel=_rel, clip=_clip, max_reasons=MAX_REASONS,
    )


def render(df, title: str = "zerobench report", baseline=None) -> str:
    """The HTML report of a results DataFrame (`bench.results.load()`), optionally against a baseline one."""
    from .analysis import analyse

    return render_analysis(analyse(df, title=title, baseline=baseline))
