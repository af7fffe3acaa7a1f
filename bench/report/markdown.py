"""Markdown report for pull-request comments: GitHub-flavoured tables, PNG charts beside the file.

The same story as the HTML report, short, what a reader came for first: per model the answer (answer mode)
or the best cells, what failed by cause, what fits, the frontier, each knob's effect; then what did not run
and why. Long lists are capped (a PR comment has a size limit); the HTML report has everything.
"""

from __future__ import annotations

from urllib.parse import quote

from ..judge.compare import escape
from ..judge.effects import NOT_SETTLED, Effect, effects_note
from ..matrix.axes import AXIS
from ..records.status import Status
from . import fmt
from .analysis import (
    ANSWER_NOTE,
    BLOCKS_NOTE,
    COMPARE_RULE,
    FRONTIER_NOTE,
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
    replay_note,
)
from .charts import tradeoff_name

__all__ = ["render", "render_analysis", "escape"]

MAX_ROWS = 15  # per list table
MAX_ALL_CELLS = 200  # in the collapsed all-cells table


def _table(header: list[str], align: str, rows: list[list[str]]) -> list[str]:
    """align: one character per column, l or r."""
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if c == "r" else "---" for c in align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def _more(n_total: int, n_shown: int, what: str = "") -> list[str]:
    if n_total <= n_shown:
        return []
    return [f"_…and {n_total - n_shown} more{what}; the HTML report lists them all._", ""]


def _short(s: str, n: int = 300) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _image(alt: str, path: str) -> list[str]:
    return [f"![{escape(alt)}]({quote(path)})", ""]


def _best(s: Section, h: str) -> list[str]:
    lines = [f"{h} Best cells", ""]
    mfu = s.best_mfu is not None  # no MFU column where no cell has one (a CPU, a GPU missing from the peak table)
    rows = []
    for what, r in (("fastest", s.fastest), ("lowest memory", s.smallest), ("best MFU", s.best_mfu)):
        if r:
            row = [what, escape(r["cell_name"]), fmt.num(r["tokens_per_s"]), fmt.gib(r["peak_memory_bytes"])]
            rows.append(row + ([fmt.pct(r.get("mfu"))] if mfu else []))
    if not rows:
        return lines + ["No cell ran ok.", ""]
    head = ["", "cell", "tokens/s", f"{escape(s.peak_label)} (GiB)"] + (["MFU"] if mfu else [])
    return lines + _table(head, "llrrr"[: len(head)], rows)


def _frontier(s: Section, chart: str | None, h: str) -> list[str]:
    f = s.frontier
    if f.empty:
        return []
    lines = [
        f"{h} Memory/speed frontier",
        "",
        f"Pareto frontier ({len(f)} cell{'s' if len(f) != 1 else ''} that nothing beats on both throughput and "
        f"memory; {FRONTIER_NOTE}):",
        "",
    ]
    shown = f.head(MAX_ROWS)
    lines += _table(
        ["#", "cell", "peak (GiB)", "tokens/s"],
        "rlrr",
        [
            [str(i), escape(n), fmt.gib(m), fmt.num(t)]
            for i, (n, m, t) in enumerate(
                zip(shown["cell_name"], shown["peak_memory_bytes"], shown["tokens_per_s"]), start=1
            )
        ],
    )
    lines += _more(len(f), len(shown))
    if chart:
        lines += _image("tokens/s against peak memory, Pareto frontier marked", chart)
    return lines


def _fits(s: Section, h: str) -> list[str]:
    lines = [f"{h} What fits", ""]
    ran = s.cells[~s.cells["status"].isin(NOT_RUN)]
    if ran.empty:
        return lines + ["No cell ran.", ""]
    where = f"in {escape(s.capacity_label)}" if s.capacity_label else "(capacity unknown)"
    implied = (
        f" {len(s.implied)} more did not run: implied out of memory by a cell that needs no more and ran out "
        "(`implied_oom`)."
        if len(s.implied)
        else ""
    )
    other = ran[~ran["status"].isin([Status.OK.value, Status.CUDA_OOM.value, Status.HOST_OOM.value])]
    ended = ", ".join(f"{n} {escape(st)}" for st, n in other["status"].value_counts(sort=True).items())
    lines += [
        f"Of the {len(ran)} cells that ran, **{len(s.ok)}** fit {where} and ran ok; "
        f"**{len(s.did_not_fit)}** ran out of memory"
        + (f"; {len(other)} ended otherwise ({ended}: what failed, above)" if len(other) else "")
        + f".{implied} Memory figure: {escape(s.peak_label)}.",
        "",
    ]
    ok = s.ok.sort_values("peak_memory_bytes", kind="stable")
    shown = ok.head(MAX_ROWS)
    if len(shown):
        lines += _table(
            ["cell", "peak (GiB)", "of capacity", "tokens/s"],
            "lrrr",
            [
                [escape(n), fmt.gib(m), fmt.pct(m / cap, 0) if cap else "", fmt.num(t)]
                for n, m, cap, t in zip(
                    shown["cell_name"], shown["peak_memory_bytes"], shown["capacity_bytes"], shown["tokens_per_s"]
                )
            ],
        )
        lines += _more(len(ok), len(shown), " ok cells")
    oom = s.did_not_fit
    if len(oom):
        lines += ["Did not fit:", ""]
        lines += _table(
            ["cell", "status", "reason"],
            "lll",
            [
                [escape(n), escape(st), escape(_short(r, 160))]
                for n, st, r in zip(oom["cell_name"][:MAX_ROWS], oom["status"], oom["reason"])
            ],
        )
        lines += _more(len(oom), min(len(oom), MAX_ROWS))
    return lines


def _verdict(e: Effect) -> str:
    """The verdict, and why where the interval excludes ×1 and yet no change is called (not settled)."""
    if e.verdict == NOT_SETTLED:
        return f"{e.verdict} ({e.why})"
    return e.verdict or ""


def _ablations(s: Section, h: str, note: bool = True) -> list[str]:
    rows = []
    for ab in s.ablations:
        for e in ab.effects:
            if not e["n"]:
                continue
            t, m = e["tokens"], e["memory"]
            rows.append(
                [
                    escape(ab.title),
                    f"{escape(_v(ab.axis, e['value']))} vs {escape(_v(ab.axis, e['reference']))}",
                    str(e["n"]),
                    fmt.effect(t.ratio, t.ci, t.ci_conf),
                    escape(_verdict(t)),
                    fmt.effect(m.ratio, m.ci, m.ci_conf),
                    escape(m.verdict or ""),
                    fmt.ratio(e.get("trainable_ratio")),
                    _delta(e.get("loss_delta")),
                ]
            )
    if not rows:
        return []
    # A ratio inside the noise is shown, not ranked: the verdict column says whether it is a difference.
    return [
        f"{h} One knob at a time",
        "",
        (effects_note() if note else "Read as the first such table above.") + knobs_aside(s),
        "",
    ] + _table(
        [
            "knob",
            "value",
            "pairs",
            "tokens/s [95%]",
            "verdict",
            "peak memory [95%]",
            "memory",
            "trainable params",
            "loss (same step, random weights)" if random_weights(s) else "loss (same step)",
        ],
        "llrrlrlrr",
        rows,
    )


def _delta(d: float | None) -> str:
    """A difference in final loss (the value's minus the reference's), signed."""
    return "" if d is None else f"{d:+.3f}"


def _zero_scaling(a: Analysis) -> list[str]:
    if not a.zero_scaling:
        return []
    figs = a.zero_figures
    configs = any(r["ds_config"] for r in a.zero_scaling)
    rows = [
        [
            str(r["zero_stage"]),
            f"{r['gpus']}" + (f" ({r['nodes']} nodes)" if r.get("nodes", 1) > 1 else ""),
            str(r["micro_batch"]),
        ]
        + ([r["ds_config"] or "generated"] if configs else [])
        + [f"{fmt.gib(r[c])} (×{r[c + '_ratio']:.3f})" if r[c] is not None else "–" for c, _ in figs]
        + [f"{fmt.gib(r['estimate_bytes'])} (×{r['predicted_ratio']:.3f})"]
        for r in a.zero_scaling
    ]
    return ["## ZeRO stages against the paper", "", ZERO_SCALING_NOTE, ""] + _table(
        ["ZeRO", "GPUs", "micro-batch"]
        + (["DeepSpeed config"] if configs else [])
        + [h for _, h in figs]
        + ["model states, ZeRO paper"],
        "rrr" + ("l" if configs else "") + "r" * (len(figs) + 1),
        rows,
    )


def _loss_parity(a: Analysis) -> list[str]:
    if not a.loss_parity:
        return []
    rows = sorted(a.loss_parity, key=lambda r: not r["flag"])  # flagged first, else input order
    shown = rows[:MAX_ROWS]
    n_flag = sum(r["flag"] for r in rows)
    lines = [
        "## Loss parity",
        "",
        LOSS_PARITY_NOTE.format(tol=COMPARE_RULE.loss_final_tolerance),
        "",
        f"**{n_flag} of {len(rows)} pairs differ beyond the tolerance.**",
        "",
    ]
    lines += _table(
        ["", "cells", "first loss", "final loss", "difference", "tolerance", "note"],
        "llrrrrl",
        [
            [
                "⚠" if r["flag"] else "",
                f"{escape(r['axis'])} {escape(r['values'][0])} → {escape(r['values'][1])}: {escape(r['cell'])}",
                f"{r['loss_first'][0]:.3f} / {r['loss_first'][1]:.3f}",
                f"{r['loss_final'][0]:.3f} / {r['loss_final'][1]:.3f}" + (f" (step {r['step']})" if r["step"] else ""),
                f"{r['difference']:+.4f}",
                f"{r['tolerance']:.3g}",
                escape(r["note"]),
            ]
            for r in shown
        ],
    )
    return lines + _more(len(rows), len(shown), " pairs")


def _knob(e: dict) -> str:
    """An answer effect's knob as the console names it: zero=1 vs zero=0."""
    short = AXIS[e["axis"]].short
    return f"{short}={_v(e['axis'], e['value'])} vs {short}={_v(e['axis'], e['reference'])}"


def _v(axis: str, v) -> str:
    return ("on" if v in (True, "True") else "off") if axis == "grad_ckpt" else str(v)


def _failed(s: Section, h: str) -> list[str]:
    """The cells that ran and did not end ok, by cause: how many, and one example each."""
    if not s.failed:
        return []
    n = sum(g["n"] for g in s.failed)
    lines = [f"{h} What failed", "", f"{n} cell{'s' if n != 1 else ''} that ran did not end ok, by cause:", ""]
    rows = []
    for g in s.failed[:MAX_ROWS]:
        example = escape(g["example"])
        if g["example_reason"] != g["reason"]:  # the cause has words that vary: the example's own
            example += ": " + escape(_short(g["example_reason"], 160))
        rows.append([escape(g["status"]), str(g["n"]), escape(_short(g["reason"], 200) or "(no reason)"), example])
    lines += _table(["status", "cells", "cause", "example"], "lrll", rows)
    return lines + _more(len(s.failed), min(len(s.failed), MAX_ROWS), " causes")


def _not_run(a: Analysis) -> list[str]:
    """The cells that did not run: skipped by a rule or pruned, implied out of memory, left unmeasured."""
    groups = [g for g in a.failure_groups if not g["ran"]]
    if not groups:
        return []
    lines = ["## Not run", ""]
    rows = []
    for g in groups[:MAX_ROWS]:
        why = escape(_short(g["reason"], 200))
        if g.get("wordings", 1) > 1:
            why += f" (one of {g['wordings']} wordings)"
        rule = f"`{g['rule']}`" if g.get("rule") else ""
        rows.append([escape(g["status"]), rule, str(g["n"]), why, escape(g["example"])])
    lines += _table(["status", "rule", "cells", "reason", "example"], "llrll", rows)
    return lines + _more(len(groups), min(len(groups), MAX_ROWS), " reasons")


def _notes(a: Analysis) -> list[str]:
    if not a.notes:
        return []
    lines = ["## Notes", "", "Cells whose measurement is less clean than their status says:", ""]
    shown = a.notes[:MAX_ROWS]
    lines += _table(["cell", "note"], "ll", [[escape(n), escape(_short(w))] for n, w in shown])
    return lines + _more(len(a.notes), len(shown), " notes")


def _baseline(a: Analysis) -> list[str]:
    if a.baseline is None:
        return []
    b = a.baseline
    lines = ["## Against the baseline", ""]
    if b.empty:
        return lines + ["No cell of these results is in the baseline.", ""]
    both = b[(b["status"] == "ok") & (b["status_base"] == "ok")]
    med_t, med_m = both["tokens_per_s_change"].median(), both["peak_memory_change"].median()
    changed = b[b["status"] != b["status_base"]]
    lines += [
        f"{len(b)} cells matched by hash; {len(both)} ok in both: median tokens/s {fmt.change(med_t)}, "
        f"median peak memory {fmt.change(med_m)}. {len(changed)} changed status."
        + (f" {len(a.baseline_only)} baseline cells are not in these results." if a.baseline_only else ""),
        "",
    ]
    # The largest moves first, status changes on top: what a reviewer should look at.
    score = (
        b["tokens_per_s_change"].abs().fillna(0)
        + b["peak_memory_change"].abs().fillna(0)
        + (b["status"] != b["status_base"]) * 10
    )
    top = b.assign(_s=score).sort_values("_s", ascending=False, kind="stable").head(MAX_ROWS)
    lines += _table(
        ["cell", "status", "tokens/s", "change", "peak (GiB)", "change"],
        "llrrrr",
        [
            [
                escape(r["cell_name"]),
                escape(r["status"] if r["status"] == r["status_base"] else f"{r['status_base']} → {r['status']}"),
                fmt.num(r["tokens_per_s"]),
                fmt.change(r["tokens_per_s_change"]),
                fmt.gib(r["peak_memory_bytes"]),
                fmt.change(r["peak_memory_change"]),
            ]
            for r in top.to_dict("records")
        ],
    )
    return lines + _more(len(b), len(top), " matched cells")


def _tokens(t, repeats, lo, hi) -> str:
    """tokens/s; for a cell with repeats, the median and its 95% interval (never narrower than the noise)."""
    if repeats and repeats > 1 and not fmt.missing(lo):
        return f"{fmt.num(t)} [{fmt.num(lo)}–{fmt.num(hi)}, 95%, n={int(repeats)}]"
    return fmt.num(t)


def _all_cells(a: Analysis) -> list[str]:
    c = measured_first(a.cells)
    shown = c.head(MAX_ALL_CELLS)
    lines = [f"<details><summary>All {len(c)} cells</summary>", ""]
    lines += _table(
        ["cell", "status", "tokens/s", "peak (GiB)", "MFU", "final loss"],
        "llrrrr",
        [
            [escape(n), escape(s), _tokens(t, k, lo, hi), fmt.gib(m), fmt.pct(u), fmt.num(lf, 3)]
            for n, s, t, k, lo, hi, m, u, lf in zip(
                shown["cell_name"],
                shown["status"],
                shown["tokens_per_s"],
                shown["repeats"],
                shown["tokens_per_s_ci_low"],
                shown["tokens_per_s_ci_high"],
                shown["peak_memory_bytes"],
                shown["mfu"],
                shown["loss_final"],
            )
        ],
    )
    return lines + _more(len(c), len(shown)) + ["</details>", ""]


def _left(ans: dict) -> str:
    """What answer mode left unmeasured, in a sentence."""
    if not ans["unmeasured"]:
        return "No record says a cell was left unmeasured."
    still = (
        f"; {ans['needed']} of them could still change the answer (the budget ran out or the run was stopped)"
        if ans["needed"]
        else ", none of which could change the answer"
    )
    expected = (
        f" ({ans['expected']} of them expected to repeat an error that cells with their settings ended in)"
        if ans.get("expected")
        else ""
    )
    return (
        f"Left unmeasured: {ans['unmeasured']} cells{expected}{still}. Measuring them all once would add about "
        f"{ans['adds_s'] / 60:.0f} min (predicted)."
    )


def _verdicts(a: Analysis) -> list[str]:
    """Answer mode's verdict first, per section it ran in: settled, or not and why."""
    several = len(a.sections) > 1
    out = []
    for s in a.sections:
        if s.answer is not None:
            verdict, why = s.answer["verdict"]
            where = f" ({escape(s.label)})" if several else ""
            out += [f"**Answer mode{where}: {verdict}**: {escape(why)}.", ""]
    return out


def _answer(s: Section, h: str) -> list[str]:
    """What answer mode settled in this section, and what it cost."""
    ans = s.answer
    if ans is None:
        return []
    lines = [f"{h} What answer mode found: {ans['verdict'][0]}", "", ANSWER_NOTE, ""]
    peak = f"peak (GiB, {s.peak_label})"
    rows = [
        [escape(g["group"]), escape(g["cell_name"]), f"{g['tokens_per_s']:,.0f} [{g['low']:,.0f}, {g['high']:,.0f}]",
         fmt.gib(g.get("peak_memory_bytes")), str(g["repeats"]), escape(", ".join(g["ties"])) or "none",
         escape(", ".join(g["apart"])) or "none"]
        for g in ans["groups"]
    ]  # fmt: skip
    lines += _table(
        ["group", "fastest cell", "tokens/s [95%]", peak, "runs", "not told apart from it", "not compared with it"],
        "llrrrll",
        rows,
    )
    effects_rows = [
        [escape(_knob(e)), f"{e['tokens'].n} ({', '.join(e.get('blocks') or [])})",
         fmt.effect(e["tokens"].ratio, e["tokens"].ci, e["tokens"].ci_conf), escape(e["tokens"].verdict or "")]
        for e in ans["effects"] if e["tokens"].n
    ]  # fmt: skip
    if effects_rows:
        lines += _table(["knob", "pairs in one block (blocks)", "tokens/s", "verdict"], "lrrl", effects_rows)
    cost = ", ".join(f"{role} {sec:.0f} s" for role, sec in sorted(ans["cost_s"].items()))
    lines += [
        f"Measured {ans['measured']} cells ok in {ans['attempts']} attempts, {ans['spent_s']:.0f} s of cell time "
        f"({cost}). " + _left(ans),
        "",
    ]
    return lines


def _blocks(a: Analysis) -> list[str]:
    """Where the measurements were made, when more than one block: each block's run, machine, measurements and its
    speed against the reference block through the anchors."""
    if not a.blocks:
        return []
    rows = []
    for b in a.blocks:
        if b["reference"]:
            speed = "the reference"
        elif b["ratio"] is not None:
            speed = f"{fmt.effect(b['ratio'], (b['low'], b['high']), 0.95)} ({b['anchors']} anchor cell(s))"
        else:
            speed = "not tied: no cell measured in it and a tied block"
        rows.append([b["label"], escape(b["run"]), escape(f"{b['machine']} ({b['host']}, {b['gpu'] or 'CPU'})"),
                     str(b["measurements"]), escape(speed)])  # fmt: skip
    return ["## Blocks", "", BLOCKS_NOTE, ""] + _table(
        ["block", "run", "machine", "ok measurements", "speed"], "lllrl", rows
    )


def _sections(a: Analysis, charts: dict[str, str]) -> list[str]:
    """Each model at each sequence length on its own: its best cells, what fits and its knob effects.
    With one section the headings are the report's own (##); with several, each has its ## heading."""
    several = len(a.sections) > 1
    lines = []
    if several:
        lines += [SECTION_NOTE, ""] + [f"- {escape(s.label)}: {len(s.cells)} cells, {len(s.ok)} ok" for s in a.sections]
        lines += [""]
    h = "###" if several else "##"
    noted = False  # the method note once: a pull-request comment has a size limit
    for s in a.sections:
        if several:
            lines += [f"## {escape(s.label)}", ""]
        knobs = _ablations(s, h, note=not noted)
        noted = noted or bool(knobs)
        if knobs and a.banner:  # CPU or tiny-model figures: folded away, as the banner says
            knobs = ["<details><summary>One knob at a time (figures of the runs the note at the top describes)"
                     "</summary>", "", *knobs[1:], "</details>", ""]  # fmt: skip
        lines += _answer(s, h) if s.answer else _best(s, h)
        lines += _failed(s, h) + _fits(s, h) + _frontier(s, charts.get(tradeoff_name(a, s)), h) + knobs
    return lines


def render_analysis(a: Analysis, charts: dict[str, str] | None = None) -> str:
    """charts: chart name -> path relative to the Markdown file (see `figures.write_png`)."""
    charts = charts or {}
    lines = [f"# {escape(a.title)}", ""]
    n = len(a.cells)
    if not n:
        return "\n".join(lines + ["No results.", ""])
    counts = ", ".join(f"{v} {escape(k)}" for k, v in a.counts.items())
    pruned = (
        f" Of the {a.counts['skipped']} skipped, {a.pruned} were pruned by the memory model (predicted not to fit) "
        f"and {a.counts['skipped'] - a.pruned} ruled out by a rule."
        if a.pruned
        else ""
    )
    ran = f"{a.attempts} attempt{'s' if a.attempts != 1 else ''} ran"
    lines += [f"{n} cells: {counts}; {ran}.{pruned}", ""]
    if a.banner:
        lines += [f"**Not GPU figures**: {escape(a.banner)}", ""]
    if a.replayed:
        lines += [f"**Replay**: {replay_note(a)} ({escape(', '.join(a.replayed))}).", ""]
    lines += _verdicts(a)
    lines += _blocks(a) + _sections(a, charts)
    lines += _zero_scaling(a) + _loss_parity(a)
    lines += _not_run(a) + _notes(a) + _baseline(a)
    if "loss" in charts:
        lines += ["## Loss curves", ""] + _image("training loss per step", charts["loss"])
    lines += _all_cells(a)
    lines += ["## Environment", ""] + [f"- {escape(k)}: {escape(v)}" for k, v in a.environment] + [""]
    return "\n".join(lines)


def render(df, title: str = "zerobench report", *, baseline=None, charts: dict[str, str] | None = None) -> str:
    """The Markdown report of a results DataFrame (`bench.judge.results.load()`), optionally against a baseline."""
    return render_analysis(analyse(df, title=title, baseline=baseline), charts)
