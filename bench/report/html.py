"""HTML report: one self-contained file (inline CSS, JS and SVG) that opens offline.

The page is templates/report.html.j2 with templates/report.css and report.js inlined (package data,
read with importlib.resources). Strings from results reach the page only through Jinja2 with
autoescaping on, or through `figures.svg`, which escapes its own text; the only markup marked safe is
what this package writes. A Content Security Policy in the page backs that up: nothing may be
fetched, and no script runs but ours.
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources

import jinja2
from markupsafe import Markup, escape

from ..judge.effects import NOT_SETTLED, Effect, effects_note
from . import charts as charts_
from . import figures, fmt
from .analysis import (
    ANSWER_NOTE,
    BLOCKS_NOTE,
    COMPARE_RULE,
    LOSS_PARITY_NOTE,
    NOT_RUN,
    SECTION_NOTE,
    ZERO_SCALING_NOTE,
    Analysis,
    Section,
    analyse,
    knobs_aside,
    measured_first,
    random_weights,
    records,
    replay_note,
)
from .charts import Chart, tradeoff_name

__all__ = ["render", "render_analysis", "MAX_COMPUTE_ROWS"]

MAX_COMPUTE_ROWS = 50
MAX_REASONS = 50  # distinct failure reasons grouped at the top; errors with log tails are often all distinct
MAX_NOT_RUN_ROWS = 1000
"""Cells that did not run (skipped, implied_oom, unmeasured) listed one row each at most: past this they are
counted by status and rule instead (50,000 skipped rows made a 62 MB page)."""


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("templates", name).read_text(encoding="utf-8")


_CSS, _JS = _asset("report.css"), _asset("report.js")
# Our one script is allowed by its hash, not by 'unsafe-inline': a script that slipped past escaping
# still would not run. default-src 'none' forbids every fetch (fonts, images, frames, connections).
_CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(_JS.encode()).digest()).decode()}'"
)

_EXTRA = [
    ("seq_len", "seq len"),
    ("micro_batch", "micro batch"),
    ("grad_accum", "grad accum"),
    ("gpus", "GPUs"),
    ("nodes", "nodes"),
]
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


def _reason(text) -> Markup:
    """A reason: where it is long (a traceback, a log tail), its head, the rest folded into <details>."""
    head = _clip(text)
    if head != text:
        return Markup('<details><summary class="reason">{}…</summary>\n    <p class="reason">{}</p></details>').format(
            head, text
        )
    return Markup('<p class="reason">{}</p>').format(text)


def _rel(x, ref):
    return None if fmt.missing(x) or fmt.missing(ref) or not ref else x / ref


def _tone(x, sign: int) -> str:
    if fmt.missing(x) or abs(x) < _NOISE:
        return ""
    return "good" if x * sign > 0 else "bad"


def _effect(e: Effect) -> str:
    return fmt.effect(e.ratio, e.ci, e.ci_conf)


def _shows_why(e: Effect) -> bool:
    """Say why where the interval excludes x1 and yet no change is called: it reaches inside the minimum effect."""
    return e.verdict == NOT_SETTLED


def _verdict_tone(e: Effect) -> str:
    return {"faster": "good", "slower": "bad"}.get(e.verdict or "", "")


def _env() -> jinja2.Environment:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters.update(
        num=fmt.num,
        gib=fmt.gib,
        pct=fmt.pct,
        ms=fmt.ms,
        change=fmt.change,
        ratio=fmt.ratio,
        effect=_effect,
        tflops=fmt.tflops,
        sv=fmt.sort_value,
        name=_name,
        text=_text,
    )
    env.globals.update(
        csp=_CSP,
        css=Markup(_CSS),
        js=Markup(_JS),
        sources=fmt.MEMORY_SOURCES,
        noise=fmt.pct(_NOISE, 0),
        value=_value,
        tone=_tone,
        rel=_rel,
        reason=_reason,
        shows_why=_shows_why,
        verdict_tone=_verdict_tone,
        max_reasons=MAX_REASONS,
    )
    return env


_TEMPLATE = _env().from_string(_asset("report.html.j2"))


def _widths(values, top: float) -> list[str]:
    """Bar widths in percent of `top`, as fixed-precision strings (the page must not depend on float repr)."""
    return ["0" if fmt.missing(v) or not top else f"{100 * v / top:.1f}" for v in values]


# -- one function per section: Analysis -> the template variables of that section ---------------------


def _listed(cells, a: Analysis):
    """The rows a table lists, and a note on the cells left out: every cell, unless more than MAX_NOT_RUN_ROWS
    did not run; then those are counted (by status, and the skipped by rule), not listed."""
    not_run = cells["status"].isin(NOT_RUN)
    n = int(not_run.sum())
    if n <= MAX_NOT_RUN_ROWS:
        return cells, ""
    by_status = ", ".join(f"{k:,} {s}" for s, k in cells.loc[not_run, "status"].value_counts().items())
    rules = a.cells.loc[a.cells["status"] == "skipped", "skip_rule"].value_counts() if "skip_rule" in a.cells else []
    by_rule = "; skipped by rule: " + ", ".join(f"{r} {k:,}" for r, k in rules.items()) if len(rules) else ""
    note = (
        f"{n:,} cells that did not run ({by_status}) are counted here, not listed: more than {MAX_NOT_RUN_ROWS:,}"
        f"{by_rule}. Failed and skipped groups them by reason; the results file has each one's record."
    )
    return cells[~not_run], note


def _cells_table(a: Analysis) -> dict:
    cells, compute = measured_first(a.cells), a.compute_metric
    cells, left_out = _listed(cells, a)
    extra = [(c, h) for c, h in _EXTRA if c in cells and cells[c].nunique(dropna=False) > 1]
    cols = [
        "cell_name",
        "cell_hash",
        "status",
        "reason",
        "model",
        "pareto",
        "tokens_per_s",
        "step_time_median_s",
        "peak_memory_bytes",
        "peak_memory_source",
        "loss_final",
        "wall_s",
        "repeats",
        "tokens_per_s_ci_low",
        "tokens_per_s_ci_high",
    ] + [c for c, _ in extra]
    cols += [compute] if compute else []
    cols += ["replay_source"] if "replay_source" in cells else []
    compute_fmt = fmt.pct if compute == "mfu" else fmt.tflops
    mixed = cells["peak_memory_source"].nunique() > 1
    return {
        "cells_rows": _cells_rows(records(cells, cols), extra, compute, compute_fmt, mixed),
        "extra_cols": extra,
        "compute": compute,
        "compute_header": {"mfu": "MFU", "tflops_per_gpu": "TFLOP/s per GPU"}.get(compute, "MFU"),
        "mixed_sources": mixed,
        "cells_left_out": left_out,
    }


def _pill(status: str, title: str | None = None) -> str:
    """A status as the tables show it (the template's `pill` macro, for the rows written here)."""
    status = escape(status)
    tip = f' title="{escape(title)}"' if title else ""
    return f'<span class="st st-{status}"{tip}>{status}</span>'


def _num_td(value, text: str) -> str:
    return f'<td class="n" data-v="{fmt.sort_value(value)}">{text}</td>'


def _cells_rows(rows: list[dict], extra, compute, compute_fmt, mixed: bool) -> Markup:
    """The All-cells table's rows, written here rather than in the template: Jinja's per-value escaping
    over 10k rows x 12 columns cost seconds. Text is escaped; numbers come from fmt (digits only)."""
    out = []
    for r in rows:
        status = escape(r["status"])
        tag = '<span class="tag">frontier</span>' if r["pareto"] else ""
        if isinstance(r.get("replay_source"), str):  # served by the replay executor: nothing ran anew
            tag += f'<span class="tag" title="replayed from {escape(r["replay_source"])}">replay</span>'
        parts = [
            f'\n<tr data-status="{status}"><td class="cell">{_name(r["cell_name"])} '
            f'<span class="hash">#{escape(r["cell_hash"])}</span>{tag}</td>\n'
            f"<td>{_pill(r['status'], r['reason'])}</td>"
            f'<td class="mono nowrap">{escape(_text(r["model"]))}</td>'
        ]
        parts += [_num_td(r[c], fmt.num(r[c])) for c, _ in extra]
        tps = fmt.num(r["tokens_per_s"])
        if r["repeats"] > 1:
            tps += (
                f'<br><span class="muted" title="median of {r["repeats"]} repeats and its 95% interval, never '
                'narrower than the noise">'
                f"{fmt.num(r['tokens_per_s_ci_low'])}–{fmt.num(r['tokens_per_s_ci_high'])}, 95%, "
                f"n={r['repeats']}</span>"
            )
        parts.append("\n" + _num_td(r["tokens_per_s"], tps))
        parts.append(_num_td(r["step_time_median_s"], fmt.ms(r["step_time_median_s"])))
        parts.append(_num_td(r["peak_memory_bytes"], fmt.gib(r["peak_memory_bytes"])))
        if mixed:
            parts.append(f'<td class="muted">{escape(fmt.MEMORY_SOURCES.get(r["peak_memory_source"], ""))}</td>')
        parts.append(_num_td(r[compute], compute_fmt(r[compute])) if compute else "<td></td>")
        parts.append(_num_td(r["loss_final"], fmt.num(r["loss_final"], 3)))
        parts.append(_num_td(r["wall_s"], fmt.num(r["wall_s"], 1)) + "</tr>")
        out.append("".join(parts))
    return Markup("".join(out))


def _fits(s: Section) -> dict:
    ran = s.cells[~s.cells["status"].isin(NOT_RUN)]
    n_oom, n_other = len(s.did_not_fit), len(ran) - len(s.ok) - len(s.did_not_fit)
    parts = [f"{n_oom} ran out of memory"] + ([f"{n_other} failed otherwise"] if n_other else [])
    if len(s.implied):
        parts.append(f"{len(s.implied)} implied out of memory without running (implied_oom)")
    use = (s.ok["peak_memory_bytes"] / s.ok["capacity_bytes"]).max()
    if not fmt.missing(use):
        parts.append(f"the largest ok peak uses {fmt.pct(use, 0)}")
    where = f"Against {s.capacity_label}" if s.capacity_label else "Capacity unknown"
    return {"fits": {"ok": len(s.ok), "ran": len(ran), "text": f"{where}: " + ", ".join(parts) + "."}}


def _scatter(s: Section, chart: Chart | None) -> dict:
    out = {
        "scatter": "",
        "scatter_note": "",
        "frontier": s.frontier[["cell_name", "peak_memory_bytes", "tokens_per_s"]].to_dict("records"),
    }
    if chart is None:
        return out
    return out | {"scatter": Markup(figures.svg(chart)), "scatter_note": chart.caption + " Hover a point for its cell."}


def _loss(a: Analysis, chart: Chart | None) -> dict:
    if chart is None:
        return {"loss_chart": "", "loss_legend": [], "loss_note": ""}
    c = a.loss_cells
    legend = [
        {"cell_name": n, "color": s.color, "loss_final": lf, "status": st}
        for s, n, lf, st in zip(chart.series, c["cell_name"], c["loss_final"], c["status"])
    ]
    n_with = int(a.cells["losses"].map(lambda v: isinstance(v, list) and len(v) > 0).sum())
    note = (
        "Every step's loss, warmup included. Cells share the seed and data, so the curves should overlap; "
        "a config that changes the numerics shows as a curve apart."
    )
    if n_with > len(c):
        note += (
            f" {len(c)} of {n_with} cells with a loss curve are drawn: diverged cells first, then the "
            "Pareto frontier, then the fastest."
        )
    return {"loss_chart": Markup(figures.svg(chart)), "loss_legend": legend, "loss_note": note}


def _memory(a: Analysis) -> dict:
    cols = [c for c, _, _ in a.memory_columns]
    ran = a.cells[~a.cells["status"].isin(NOT_RUN)]
    ran = ran[ran[cols].notna().any(axis=1)] if cols else ran.iloc[:0]
    if ran.empty:
        return {"memory_rows": [], "bar_cols": [], "memory_note": ""}
    bars = [(c, h) for c, h, bar in a.memory_columns if bar]
    if bars:
        note = (
            "NVML counts everything the process holds on the GPU (CUDA context, NCCL buffers, allocator cache); "
            "the allocator figures are what PyTorch's caching allocator reserved and handed out. "
            "The gap between them is memory no tensor accounts for."
        )
    else:
        bars = [(c, h) for c, h, _ in a.memory_columns if c == "host_rss_peak_bytes"]
        note = (
            "These results carry no GPU memory figures (CPU run: no NVML, no CUDA allocator), so peak host RSS "
            "stands in."
        )
    if a.memory_phases:
        note += " Setup is model build and engine init; steps are the timed training steps."
    top = float(ran[[c for c, _ in bars]].max().max()) if bars else 0.0
    phases = list(a.memory_phases[:2]) if a.memory_phases else []
    rows = records(ran, ["cell_name", "status"] + cols + phases)
    widths = list(zip(*(_widths(ran[c].tolist(), top) for c, _ in bars))) or [()] * len(rows)
    return {"memory_rows": _memory_rows(rows, cols, phases, widths), "bar_cols": bars, "memory_note": note}


def _memory_rows(rows: list[dict], cols: list[str], phases: list[str], widths: list[tuple[str, ...]]) -> Markup:
    """The memory table's rows, written here as the cells table's are (one row per cell that ran)."""
    out = []
    for r, ws in zip(rows, widths):
        parts = [f'\n<tr><td class="cell">{_name(r["cell_name"])}</td><td>{_pill(r["status"])}</td>']
        parts += [_num_td(r[c], fmt.gib(r[c])) for c in cols]
        if phases:
            setup, steps = r[phases[0]], r[phases[1]]
            parts.append(_num_td(steps, f"{fmt.gib(setup)} → {fmt.gib(steps)}"))
        parts.append('\n<td><div class="bars">')
        parts += [f'<div class="bar s{i}" style="width:{w}%"></div>' for i, w in enumerate(ws)]
        parts.append("</div></td></tr>")
        out.append("".join(parts))
    return Markup("".join(out))


def _compute(s: Section) -> dict:
    metric = s.compute_metric
    if metric is None:
        return {"compute_rows": [], "compute_note": ""}
    c = s.ok[s.ok[metric].notna()].sort_values(metric, ascending=False, kind="stable")
    shown = c.head(MAX_COMPUTE_ROWS)
    rows = shown[["cell_name", "mfu", "hfu", "tflops_per_gpu"]].to_dict("records")
    for r, w in zip(rows, _widths(shown[metric].tolist(), float(c[metric].max()))):
        r["_bar"] = w
    if metric == "mfu":
        note = (
            "MFU: model FLOPs per second over the GPU's dense peak for the precision. HFU also counts the "
            "forward pass that gradient checkpointing recomputes."
        )
    else:
        note = (
            "No MFU: the peak FLOP/s of this device is not known (CPU runs, or a GPU missing from the "
            "peak table), so achieved TFLOP/s per device is shown instead."
        )
    if len(c) > len(shown):
        note += f" Top {len(shown)} of {len(c)} cells; all are in the cells table."
    return {"compute_rows": rows, "compute_note": note}


def _failures(a: Analysis) -> dict:
    cols = ["cell_name", "cell_hash", "status", "reason", "phase_at_end", "exit_code"]
    listed, left_out = _listed(a.failures, a) if len(a.failures) else (a.failures, "")
    return {
        "failures": _failure_rows(records(listed, cols)) if len(a.failures) else "",
        "failure_statuses": [s for s in a.counts if s != "ok"],
        "failures_left_out": left_out,
    }


def _failure_rows(rows: list[dict]) -> Markup:
    """The failed-cells table's rows, written here as the cells table's are."""
    out = []
    for r in rows:
        status = escape(r["status"])
        out.append(
            f'\n<tr data-status="{status}">\n  <td class="cell">{_name(r["cell_name"])} '
            f'<span class="hash">#{escape(r["cell_hash"])}</span></td><td>{_pill(r["status"])}</td>'
            f"\n  <td>{escape(_text(r['phase_at_end']))}</td>{_num_td(r['exit_code'], fmt.num(r['exit_code']))}"
            f"<td>{_reason(r['reason'])}</td></tr>"
        )
    return Markup("".join(out))


def _zero(a: Analysis) -> dict:
    return {"zero_rows": a.zero_scaling, "zero_figures": a.zero_figures, "zero_note": ZERO_SCALING_NOTE}


def _parity(a: Analysis) -> dict:
    rows = sorted(a.loss_parity, key=lambda r: not r["flag"])
    return {
        "parity_rows": rows,
        "parity_flagged": sum(r["flag"] for r in rows),
        "parity_note": LOSS_PARITY_NOTE.format(tol=COMPARE_RULE.loss_final_tolerance),
    }


def _baseline(a: Analysis) -> dict:
    return {"baseline_rows": a.baseline.to_dict("records") if a.baseline is not None else []}


def _model(a: Analysis, s: Section, charts: dict[str, Chart]) -> dict:
    """One section's template variables: with several sections, its ids carry its slug and its parts are
    headed one level down, under the section's own heading."""
    several = len(a.sections) > 1
    prefix = f"{s.slug}-" if several else ""
    ids = {k: prefix + k for k in ("answer", "summary", "tradeoff", "ablations", "compute")}
    out = {"s": s, "id": s.slug, "ids": ids, "h": "h3" if several else "h2", "h4": "h4" if several else "h3",
           "knobs_aside": knobs_aside(s), "random_weights": random_weights(s)}  # fmt: skip
    return out | _fits(s) | _scatter(s, charts.get(tradeoff_name(a, s))) | _compute(s)


def _nav(a: Analysis, ctx: dict) -> list[tuple[str, str]]:
    several = len(a.sections) > 1
    if several:
        head = [(m["id"], m["s"].label) for m in ctx["models"]]
    else:
        m = ctx["models"][0]
        head = (
            [("summary", "Summary"), ("tradeoff", "Throughput vs memory")] if m["scatter"] else [("summary", "Summary")]
        )
        head += [("ablations", "Ablations")] if m["s"].ablations else []
        head += [("compute", "MFU")]
    nav = [
        ("blocks", "Blocks", bool(a.blocks)),
        ("cells", "Cells", True),
        ("zero", "ZeRO vs paper", bool(a.zero_scaling)),
        ("parity", "Loss parity", bool(a.loss_parity)),
        ("memory", "Peak memory", bool(ctx["memory_rows"])),
        ("loss", "Loss", bool(ctx["loss_chart"])),
        ("failures", "Failed and skipped", True),
        ("notes", "Notes", bool(a.notes)),
        ("baseline", "Baseline", a.baseline is not None),
        ("environment", "Environment", True),
    ]
    return head + [(i, t) for i, t, shown in nav if shown]


def render_analysis(a: Analysis, charts: dict[str, Chart] | None = None) -> str:
    """charts: `charts.build(a)`, when the caller has it already (the Markdown report draws the same ones)."""
    if a.cells.empty:
        return _TEMPLATE.render(a=a, n_cells=0, nav=[])
    charts = charts_.build(a) if charts is None else charts
    ctx = {
        "models": [_model(a, s, charts) for s in a.sections],
        "several": len(a.sections) > 1,
        "section_note": SECTION_NOTE,
        "replay_note": replay_note(a),
        "effects_note": effects_note(),
        "blocks_note": BLOCKS_NOTE,
        "answer_note": ANSWER_NOTE,
    }
    ctx |= _loss(a, charts.get("loss"))
    for section in (_cells_table, _memory, _failures, _baseline, _zero, _parity):
        ctx |= section(a)
    return _TEMPLATE.render(a=a, n_cells=len(a.cells), nav=_nav(a, ctx), **ctx)


def render(df, title: str = "zerobench report", baseline=None) -> str:
    """The HTML report of a results DataFrame (`bench.judge.results.load()`), optionally against a baseline one."""
    return render_analysis(analyse(df, title=title, baseline=baseline))
