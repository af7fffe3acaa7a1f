"""The models held out by machine and by GPU model: how the memory and step-time models carry to a machine, or
a GPU model, whose records they were not fitted on. Records of a GPU model the constants never saw are the
strongest check: nothing of that GPU (its CUDA context, its allocator's blocks, its speed) was in the fit.

Each record's held-out prediction: where the constants were fitted on its run, constants refitted without
its group (its machine's or its GPU model's records; none where the fit had no other group); else the
constants as given. `zerobench estimate --check` prints these tables for the constants the model ships
(fit.json) and, with `--held-out RESULTS`, for constants fitted on the --check files alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .. import check as mcheck
from . import timecheck

__all__ = [
    "BY",
    "Group",
    "STRONGEST",
    "band_hits",
    "grouped",
    "memory_groups",
    "memory_table",
    "seen_in",
    "summary_line",
    "time_fit_rows",
    "time_groups",
    "time_table",
]

BY = {"gpu": "GPU model", "machine": "machine"}
"""The groupings, each a Case/TimeCase attribute (TimeCase's GPU model is its hardware's) and its name."""
STRONGEST = (
    "A GPU model with no record fitted on is the strongest check: nothing of that GPU was in the fit. A machine "
    "the fit never saw (told apart by its first GPU's UUID) is a new host and a new card, of a GPU model it may "
    "have seen."
)


@dataclass(frozen=True)
class Group:
    """One machine's or GPU model's held-out rows."""

    by: str
    """"gpu" or "machine" (BY)."""
    key: str
    gpu: str
    """Its GPU model (for a GPU model, itself)."""
    fitted: int
    """Records of it the constants were fitted on (0: a group they never saw)."""
    rows: list
    """Its held-out rows (check.Row or timecheck.TimeRow)."""
    records: int = 0
    """Its records given (held out or not)."""


UNKNOWN_GPU = "unknown GPU"


def _key(case, by: str) -> str:
    if by == "gpu":
        return case.hw.gpu_name or UNKNOWN_GPU
    return getattr(case, by) or "unknown"


def grouped(cases: Sequence, rows: Sequence, seen: Mapping[str, Mapping[str, int]]) -> dict[str, list[Group]]:
    """Per grouping (BY), the groups of `cases` (their records) with their rows among `rows` (held out);
    `seen[by]`: records the constants were fitted on per group."""
    out = {}
    for by in BY:
        out[by] = []
        for key in sorted({_key(c, by) for c in cases}):
            mine = [c for c in cases if _key(c, by) == key]
            gpu = mine[0].hw.gpu_name or UNKNOWN_GPU
            rs = [r for r in rows if _key(r.case, by) == key]
            out[by].append(Group(by, key, gpu, seen.get(by, {}).get(key, 0), rs, len(mine)))
    return out


def memory_groups(
    fitted: Sequence[mcheck.Case],
    others: Sequence[mcheck.Case],
    seen: Mapping[str, Mapping[str, int]],
    k: mcheck.Constants = mcheck.FITTED,
    margin: float = mcheck.DEFAULT_MARGIN,
) -> dict[str, list[Group]]:
    """Per grouping (BY), each group's held-out memory rows: `fitted` (the cases of the runs `k` was fitted on)
    refitted without their group, `others` predicted by `k`; `seen[by]`: records `k` was fitted on per group."""
    held = mcheck.evaluate(others, k, margin)
    rows = {by: [*mcheck.leave_out(fitted, by, margin), *held] for by in BY}
    out = {}
    for by in BY:
        out[by] = grouped([*fitted, *others], rows[by], seen)[by]
    return out


def seen_in(cases: Sequence) -> dict[str, dict[str, int]]:
    """Records per group (per BY) of these cases: what constants fitted on them saw."""
    return {by: dict(Counter(_key(c, by) for c in cases)) for by in BY}


def _fitted_col(g: Group, complete: bool = True) -> str:
    """How many of its records the constants were fitted on; `complete`: counted over every record they were
    fitted on (else over the records given only, and a group with none may still have been seen)."""
    if g.fitted:
        return f"{g.fitted} record{'s' if g.fitted > 1 else ''}"
    return "none: never seen" if complete else "none of these"


def memory_table(groups: Sequence[Group]) -> list[list[str]]:
    by = groups[0].by if groups else "gpu"
    head = [BY[by], *(["GPU model"] if by == "machine" else []), "fitted on", "records", "held out"]
    out = [[*head, "median |error|", "p95 |error|", "max |error|", "false fits", "false prunes"]]
    for g in groups:
        s = mcheck.summarize(g.rows)
        err = [f"{s[q]:.1%}" if s["n"] else "-" for q in ("median_abs_error", "p95_abs_error", "max_abs_error")]
        out.append(
            [
                g.key,
                *([g.gpu] if by == "machine" else []),
                _fitted_col(g),
                str(g.records),
                str(s["n"]),
                *err,
                f"{s['false_fits']} of {s['oom_records']} OOM",
                str(s["false_prunes"]),
            ]
        )
    return out


# -- step time ----------------------------------------------------------------------------------------------
def time_fit_rows(train: Sequence, test: Sequence) -> list:
    """`test` predicted by step-time constants fitted on `train` alone, each host's time against train's
    reference (as timecheck's leave-one-out does)."""
    if not train or not test:
        return []
    ref = timecheck.ops_reference(train)
    k = timecheck.fit_time(timecheck.measured_on(train, ref))
    return timecheck.evaluate_time(timecheck.measured_on(test, ref), k)


def _time_leave_out(cs: Sequence, by: str) -> list:
    out = []
    for key in sorted({_key(c, by) for c in cs}):
        out += time_fit_rows([c for c in cs if _key(c, by) != key], [c for c in cs if _key(c, by) == key])
    return out


def time_groups(check: timecheck.TimeCheck, seen: Mapping[str, Mapping[str, int]] | None = None) -> dict:
    """Per grouping (BY), each group's held-out step-time rows: the records of fitted runs refitted without
    their machine (the check's leave-one-machine-out) or GPU model, the others as the check predicted them;
    `seen` by default the check's fitted records per group."""
    seen = seen_in(check.cases) if seen is None else seen
    cases = [*check.cases, *(r.case for r in check.unfitted)]
    out = {}
    for by in BY:
        fitted = check.by_machine if by == "machine" else _time_leave_out(check.cases, by)
        out[by] = grouped(cases, [*fitted, *check.unfitted], seen)[by]
    return out


def band_hits(rows: Sequence) -> tuple[int, int, float]:
    """(records inside the step-time band the model ships for their host and group (timecheck.shipped_band, as the
    per-GPU table reads it), records with a band, the bands' median width high/low) around each row's prediction."""
    inside, widths = 0, []
    for r in rows:
        b = timecheck.shipped_band(r)
        if not b:
            continue
        inside += b["low"] <= math.log(r.case.step_s / r.step) <= b["high"]
        widths.append(math.exp(b["high"] - b["low"]))
    return inside, len(widths), mcheck._pct(widths, 0.5)


def time_table(groups: Sequence[Group], complete: bool = True) -> list[list[str]]:
    """The groups' step-time rows; `complete` as _fitted_col's."""
    by = groups[0].by if groups else "gpu"
    head = [BY[by], *(["GPU model"] if by == "machine" else []), "fitted on", "records", "held out"]
    out = [[*head, "median |error|", "p95 |error|", "max |error|", "inside the band", "band width (median)"]]
    for g in groups:
        s = timecheck.time_summary(g.rows)
        inside, n, width = band_hits(g.rows)
        out.append(
            [
                g.key,
                *([g.gpu] if by == "machine" else []),
                _fitted_col(g, complete),
                str(g.records),
                str(s["n"]),
                *(f"{s[q]:.1%}" if s["n"] else "-" for q in ("median", "p95", "max")),
                f"{inside}/{n} ({inside / n:.0%})" if n else "-",
                f"x{width:.2f}" if n else "-",
            ]
        )
    return out


def summary_line(label: str, rows: Sequence) -> str:
    """The step-time held-out rows' errors and band, on one line."""
    s = timecheck.time_summary(rows)
    inside, n, width = band_hits(rows)
    band = f"; {inside}/{n} ({inside / n:.1%}) inside the shipped band, median width x{width:.2f}" if n else ""
    return f"{label}: {s['n']} records, median step time |error| {s['median']:.1%}, p95 {s['p95']:.1%}{band}"
