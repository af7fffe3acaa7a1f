"""A Comparison as Markdown (`zerobench compare`'s output and a pull request's comment): the verdict first,
the machines, the rules, the flagged cells, then every cell (bench.judge.compare judges them)."""

from __future__ import annotations

import math

from .. import stats
from .compare import (
    FIGURES,
    IMPROVEMENT,
    MIN_ANCHORS,
    MISSING,
    NEW,
    NOT_COMPARABLE,
    NOT_RUN,
    NOT_SETTLED,
    REGRESSION,
    UNCHANGED,
    CellComparison,
    Comparison,
    Figure,
    Machines,
    escape,
)

__all__ = [
    "markdown",
]


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "–"
    if unit == "bytes":
        return f"{v / 2**30:.3f} GiB"
    if unit == "s":
        return f"{v:.4g} s"
    return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"


def _change(j: stats.Judgement, f: Figure) -> str:
    if j.ratio is None:
        return "–"
    if f.relative:
        s = f"{j.ratio - 1:+.1%}"
        if j.ci:
            s += f" [{j.ci[0] - 1:+.1%}, {j.ci[1] - 1:+.1%}]"
    else:
        s = f"{j.ratio:+.4f}"
    if j.p is not None:
        s += f", p={j.p:.2g}"
    return s


def _schedules(cmp: Comparison) -> list[str]:
    """The cells whose sides ran other step schedules, by pair of schedules: not comparable, and why."""
    pairs: dict[tuple[str, str], int] = {}
    for c in cmp.cells:
        if c.base and c.cur and c.base.schedule and c.cur.schedule and c.base.schedule != c.cur.schedule:
            key = ("; ".join(c.base.schedule), "; ".join(c.cur.schedule))
            pairs[key] = pairs.get(key, 0) + 1
    if not pairs:
        return []
    return [
        "Step schedules differ, so those cells are not comparable (not regressions): another schedule trains on other "
        "batches (its first loss too); compare runs of one schedule:",
        "",
        "| baseline steps | current steps | cells |",
        "|---|---|---:|",
        *[f"| {escape(b)} | {escape(c)} | {n} |" for (b, c), n in pairs.items()],
        "",
    ]


_MARK = {
    REGRESSION: "🔴", IMPROVEMENT: "🟢", NOT_COMPARABLE: "⚪", NOT_SETTLED: "🟡", UNCHANGED: "", NOT_RUN: "", NEW: "",
    MISSING: "",
}  # fmt: skip

MAX_ROWS = 60

_SHOWN = ("tokens_per_s", "torch_max_allocated_bytes", "nvml_proc_peak_bytes", "host_rss_peak_bytes", "loss_final")
"""The figures the table of all cells shows."""


def _machines_text(m: Machines) -> list[str]:
    """Where the sides ran, in a sentence; across machines, the difference taken out and what it hides."""

    def ids(xs: tuple, blocks: int) -> str:
        return f"{', '.join(x or 'unknown' for x in xs) or 'none'} ({blocks} run part(s) there)"

    sides = f"baseline {ids(m.baseline, m.blocks[0])}, current {ids(m.current, m.blocks[1])}"
    if m.same:
        return [f"Machines: {sides}; compared directly.", ""]
    head = f"**The sides ran on different machines** ({sides}). "
    if m.offset is None:
        few = f"Only {m.anchors} cell(s) ran ok on both, fewer than the {MIN_ANCHORS} needed to tell the machines' "
        return [head + few + "difference from a change of one cell: tokens/s and step time are not compared.", ""]
    z = stats.normal_quantile(0.95) * math.sqrt(m.offset_var)
    return [
        head + f"The current machine runs ×{math.exp(m.offset):.2f} [{math.exp(m.offset - z):.2f}, "
        f"{math.exp(m.offset + z):.2f}] (95%) the baseline's speed, the median over the {m.anchors} cells measured "
        "on both (anchors); each cell's tokens/s and step time are judged against that, so a change common to every "
        "cell cannot be told from the machines' difference.",
        "",
    ]


def markdown(cmp: Comparison) -> str:
    """The comparison as Markdown fit for a pull-request comment: the verdict, the rules, what could not be
    compared and why, the flagged cells, then every cell in a folded table."""
    lines = _heading(cmp) + _rules_text(cmp) + _machines_text(cmp.machines) + _single_repeat_text(cmp)
    lines += _environments_text(cmp) + _schedules(cmp) + _flagged_table(cmp) + _all_cells_table(cmp)
    return "\n".join(lines)


def _heading(cmp: Comparison) -> list[str]:
    """The title, the replay notes and the one-line summary: regressions, counts by verdict, coverage, exit code."""
    counts = cmp.counts()
    n_reg = counts.get(REGRESSION, 0)
    head = (
        f"**{n_reg} regression{'s' if n_reg != 1 else ''}**"
        if n_reg
        else "**Compared too little** (no regression among what was compared)"
        if cmp.too_little
        else "**No regression**"
    )
    return [
        f"## zerobench compare: {escape(cmp.current)} against {escape(cmp.baseline)}",
        "",
        *[f"> **Replay**: {escape(x)}." for x in cmp.replay_lines()],
        *([""] if cmp.replayed else []),
        f"{head} in {len(cmp.cells)} cells ("
        + ", ".join(f"{n} {v}" for v, n in counts.items())
        + f"); {cmp.coverage_line()}. Exit code {cmp.exit_code}.",  # its own words, no input's
        "",
    ]


def _rules_text(cmp: Comparison) -> list[str]:
    """The rules the verdicts follow, with the thresholds in force and where they came from."""
    s = cmp.settings
    return [
        f"Rules (thresholds from {escape(cmp.settings_source)}): tokens/s and step time change when the whole "
        f"{1 - 2 * s.alpha:.0%} interval of their ratio (over process-level repeats, never narrower than the measured "
        f"noise allows) lies beyond ±{s.min_effect:.0%} (one that excludes no change but reaches inside it is *not "
        "settled*: shown, not a regression); "
        f"allocator figures by > {s.memory_tolerance:.0%}, NVML peaks > {s.nvml_tolerance:.0%}, "
        f"host RSS > {s.host_rss_tolerance:.0%}, first loss by > {s.loss_first_tolerance:g} (either way), final "
        f"loss up by > {s.loss_final_tolerance:g} (each bound widened to the spread of the repeats); a cell ok "
        "before and failing now is a regression; another GPU, driver, library version or step schedule is not "
        f"comparable; fewer than {s.min_compared:.0%} of the baseline's cells that ran compared exits 3.",
        "",
    ]


def _single_repeat_text(cmp: Comparison) -> list[str]:
    """A warning when cells have one repeat on a side, so their own noise is unknown; nothing otherwise."""
    single = cmp.single_repeat
    if not single:
        return []
    return [
        f"> **{len(single)} cell(s) have one repeat on a side: their own run-to-run noise cannot be estimated.** "
        "Their tokens/s and step time are judged against the noise measured on the committed runs (wider for a "
        "host-bound or unstable measurement), so smaller real changes go unflagged. Run with `--repeats 3` (or "
        "`repeats: 3` in the matrix) on both sides to test them.",
        "",
    ]


def _environments_text(cmp: Comparison) -> list[str]:
    """The environment settings that differ between the sides, as a table; nothing when none does."""
    envs = {(label, vb, vc) for c in cmp.cells for label, vb, vc in c.environment_diff}
    if not envs:
        return []
    lines = ["Environments differ, so those cells are not comparable (not regressions):", ""]
    lines += ["| | baseline | current |", "|---|---|---|"]
    lines += [f"| {escape(a)} | {escape(b)} | {escape(c)} |" for a, b, c in sorted(envs)]
    return [*lines, ""]


def _flagged_table(cmp: Comparison) -> list[str]:
    """The regressed, unsettled and improved cells with the reasons, up to MAX_ROWS; nothing when there are none."""
    flagged = [c for c in cmp.cells if c.verdict in (REGRESSION, NOT_SETTLED, IMPROVEMENT)]
    if not flagged:
        return []
    lines = ["| | cell | verdict | why |", "|---|---|---|---|"]
    for c in flagged[:MAX_ROWS]:
        lines.append(f"| {_MARK[c.verdict]} | {escape(c.cell_name)} | {c.verdict} | {escape('; '.join(c.reasons))} |")
    return [*lines, ""]


def _all_cells_table(cmp: Comparison) -> list[str]:
    """Every cell (up to 4 x MAX_ROWS) with its statuses, repeats and main figures, folded in a <details>."""
    show = [f for f in FIGURES if f.column in _SHOWN]
    lines = [
        f"<details><summary>All {len(cmp.cells)} cells</summary>",
        "",
        "| cell | status | repeats | " + " | ".join(f"{f.label} (change)" for f in show) + " | verdict |",
        "|---|---|---:|" + "---:|" * len(show) + "---|",
    ]
    lines += [_cell_row(c, show) for c in cmp.cells[: MAX_ROWS * 4]]
    return [*lines, "", "</details>", ""]


def _cell_row(c: CellComparison, show: list[Figure]) -> str:
    """One cell's line of the table of all cells: each shown figure's current value and its change."""
    st = (
        c.cur.status
        if c.base and c.cur and c.base.status == c.cur.status
        else f"{c.base.status if c.base else '–'} → {c.cur.status if c.cur else '–'}"
    )
    reps = f"{c.base.repeats if c.base else 0}/{c.cur.repeats if c.cur else 0}"
    cells = []
    for f in show:
        j = c.figures.get(f.column)
        if j is None or j.verdict == stats.NO_DATA:
            cells.append("–")
        else:
            cells.append(f"{_fmt(j.cur, f.unit)} ({_change(j, f)})")
    return (
        f"| {escape(c.cell_name)} | {escape(st)} | {reps} | "
        + " | ".join(cells)
        + f" | {_MARK[c.verdict]} {c.verdict} |"
    )
