"""The step-time check as `zerobench estimate --check` prints it: summaries, per category, per results file,
per GPU model, and the band's coverage (bench.estimate.checks.timecheck computes them)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ..band import BAND_COVERAGE
from ..steptime import (
    paged_excess,
)
from .timecheck import (
    EXCLUDED,
    TimeCase,
    TimeCheck,
    TimeRow,
    _judged,
    _rates_source,
    band_coverage,
    error_band,
    shipped_band,
    time_summary,
)

__all__ = ["band_width", "category_rows", "file_rows", "gpu_rows", "time_text"]


def _categories(c: TimeCase) -> dict[str, str]:
    cell = c.cell
    return {
        "ZeRO stage": str(cell.zero_stage),
        "offload": cell.offload,
        "LoRA": "yes" if cell.peft == "lora" else "no",
        "QLoRA": "yes" if cell.peft == "qlora" else "no",
        "precision": cell.precision,
        "GPU count": str(cell.gpus),
        "model": cell.model,
    }


def category_rows(check: TimeCheck, which: str) -> list[list[str]]:
    """Per category value: the held-out records, the in-sample and held-out errors."""
    head = ["category", "value", "records", "in-sample median", "in-sample p95", "held-out median", "held-out p95"]
    out, held = [head], check.held_out
    for cat in _categories((*held, *check.rows)[0].case):
        for val in sorted({_categories(r.case)[cat] for r in (*held, *check.rows)}):
            a = time_summary([r for r in check.rows if _categories(r.case)[cat] == val], which)
            b = time_summary([r for r in held if _categories(r.case)[cat] == val], which)
            pct = [f"{s[q]:.1%}" if s["n"] else "-" for s in (a, b) for q in ("median", "p95")]
            out.append([cat, val, str(b["n"]), *pct])
    return out


def file_rows(check: TimeCheck) -> list[list[str]]:
    """Per results file: its held-out step-time errors and how many fall inside the band derived and
    calibrated without it (records of runs no constant was fitted on: inside the shipped band)."""
    inside: dict[str, list[int]] = {}
    for m, key, hit in _judged(check.cases, check.cv):
        if key == "all":
            inside.setdefault(m.file, []).append(hit)
    for r in check.unfitted:
        inside.setdefault(r.case.file, []).append(_in_band(r))
    out = [["results file", "records", "held-out median", "held-out p95", "max", "inside the band"]]
    for f in sorted({r.case.file for r in check.held_out}):
        s = time_summary([r for r in check.held_out if r.case.file == f])
        hits = inside.get(f, [])
        pct = [f"{s[q]:.1%}" for q in ("median", "p95", "max")]
        out.append([f, str(s["n"]), *pct, f"{sum(hits)} of {len(hits)}"])
    return out


def _summary_line(label: str, s: dict) -> str:
    return f"  {label}: {s['n']} records, median |error| {s['median']:.1%}, p95 {s['p95']:.1%}, max {s['max']:.1%}"


TITLES = {
    "step": "Step-time model (bench/estimate/steptime.py), median step time:",
    "setup": "Setup time (the worker's setup_s: model build, engine init):",
    "start": "Start and the rest (wall time less setup and the steps' own time):",
    "wall": "Wall time per cell (start + setup + steps x step time):",
}


def _band_lines(check: TimeCheck) -> list[str]:
    typical, host, _ = error_band(check.cases, check.cv)
    cover = band_coverage(check.cases, check.cv)
    if not cover:
        return []  # one results file: no held-out errors to derive a band from
    lines = [
        "",
        "Step-time band (bench/estimate/band.py; each band's edges are the percentiles of its held-out errors "
        f"at the lowest level at which, derived from the other files, it holds {BAND_COVERAGE:.0%} of each "
        "file's; for the typical host, and at the host's time where its run measured it):",
    ]
    for g in typical:
        inside, n = cover.get(g, (0, 0))
        edges = "; ".join(
            f"{which}: {_edges(b[g])}" for which, b in (("typical host", typical), ("host measured", host))
        )
        lines.append(f"  {g}: {edges}; held out: {inside}/{n} inside")
    for key, what in (("all", "records"), ("all, host measured", "records whose host's time was measured")):
        inside, n = cover.get(key, (0, 0))
        if n:
            lines.append(
                f"  {what}: {inside}/{n} ({inside / n:.1%}) inside the band derived and calibrated without their file"
            )
    if check.unfitted:
        hits = [_in_band(r) for r in check.unfitted]
        lines.append(f"  records of runs no constant was fitted on: {sum(hits)}/{len(hits)} inside the shipped band")
    return lines


def _edges(b: dict[str, float]) -> str:
    return (
        f"{b['n']} records, measured/predicted {math.exp(b['low']):.2f}-{math.exp(b['high']):.2f} (level "
        f"{b['level']:.1%}), |log error| median {b['median']:.3f}, p95 {b['p95']:.3f}"
    )


def _in_band(r: TimeRow) -> bool:
    """A record of a run no constant was fitted on inside the band the module ships for it (shipped_band)."""
    b = shipped_band(r)
    return b["low"] <= math.log(r.case.step_s / r.step) <= b["high"]


def band_width(r: TimeRow) -> float:
    """The shipped band's width for a record's prediction: high over low (x1.35: the high edge 35% above the
    low one)."""
    b = shipped_band(r)
    return math.exp(b["high"] - b["low"])


def gpu_rows(rows: Sequence[TimeRow]) -> list[list[str]]:
    """Per GPU model, records of runs no constant was fitted on (held out): their step-time errors, how many fall
    inside the shipped band, its median width, the errors of those whose paged optimizer state did not fit beside
    the peak (steptime.paged_excess), and where their rates came from."""
    head = ["GPU", "records", "median |error|", "p95 |error|", "max", "inside the band", "band width median"]
    out = [[*head, "paged beyond the GPU: records, max |error|", "rates"]]
    for gpu in sorted({r.case.hw.gpu_name or "" for r in rows}):
        mine = [r for r in rows if (r.case.hw.gpu_name or "") == gpu]
        s, hits = time_summary(mine), [_in_band(r) for r in mine]
        width = statistics.median(band_width(r) for r in mine)
        paged = time_summary([r for r in mine if paged_excess(r.case.cell, r.case.hw, r.case.ds_config)])
        source = ", ".join(sorted({_rates_source(r.case.hw) for r in mine}))
        pct = [f"{s[q]:.1%}" for q in ("median", "p95", "max")]
        inside = f"{sum(hits)} of {len(hits)} ({sum(hits) / len(hits):.0%})"
        page = f"{paged['n']}, {paged['max']:.1%}" if paged["n"] else "-"
        out.append([gpu, str(s["n"]), *pct, inside, f"x{width:.3f}", page, source])
    return out


LABELS = {
    "rows": "in-sample (the runs the constants were fitted on)",
    "cv": "held out (leave one results file out)",
    "by_machine": "held out (leave one machine out)",
    "unfitted": "held out (runs no constant was fitted on: {files})",
}


def time_text(check: TimeCheck) -> str:
    """The step-time model's check: per quantity, its in-sample and held-out errors, then per category; the
    error band; the records left out and why."""
    from ..check import text_table

    lines = ["", f"Time records left out: {len(check.excluded)} ({EXCLUDED})"] if check.excluded else []
    files = ", ".join(sorted({r.case.file for r in check.unfitted}))
    for which, title in TITLES.items():
        if not (time_summary(check.held_out, which)["n"] or time_summary(check.rows, which)["n"]):
            continue  # records without the figure (a worker's setup_s)
        lines += ["", title]
        for key, label in LABELS.items():
            if time_summary(getattr(check, key), which)["n"]:
                lines.append(_summary_line(label.format(files=files), time_summary(getattr(check, key), which)))
        lines += ["", text_table(category_rows(check, which))]
        if which == "step" and check.cases and check.cv:
            lines += _band_lines(check)
        if which == "step" and check.held_out:
            lines += ["", "Per results file, median step time:", "", text_table(file_rows(check))]
        if which == "step" and check.unfitted:
            lines += [
                "",
                "Per GPU model, records of runs no constant was fitted on:",
                "",
                text_table(gpu_rows(check.unfitted)),
            ]
    return "\n".join(lines)
