"""One knob's effect with its 95% interval: pairs of cells that differ only in the knob -> a ratio, an
interval, the number of pairs behind it and a verdict. Pure Python over plain values; `analysis` finds
the pairs (`_ablations`), this module summarises them.

Throughput (tokens/s), per pair i the log ratio d_i = ln(value cell / reference cell), each cell's
figure being the median over its ok repeats where it ran several times (repeats combined first):
- 2+ pairs: the ratio is the geometric mean over pairs, exp(mean d_i), with a t-interval on the d_i
  (n - 1 degrees of freedom; bench.stats.log_mean_ci). The pairs ran as separate processes, often in
  separate runs, so the spread between pairs holds the run-to-run noise as well as any change of the
  effect from one context to another: the interval is for the effect averaged over these contexts.
  Its standard error is never taken below what the cells' own measurement noise allows (the mean of
  the pairs' variances below), so pairs that agree by chance do not look surer than they were measured.
- 1 pair: the ratio of the two cells' figures. When both cells have 2+ repeats, the interval is the
  one `zerobench compare` computes (Moses' interval for a shift of logs, bench.stats.ratio_ci), at 95%
  where the repeats can reach it, else at the confidence they reach (3 against 3: 90%). Otherwise each
  cell's own interval enters in quadrature on the log scale: from its repeats, the standard error of
  the mean log tokens/s; from a single run, the distribution-free interval of its median step time over
  the measured steps (the record's `steps.ci_low_s`/`ci_high_s` at `ci_level`, or computed from its
  step times for records that predate them), turned into a standard error with the normal quantile of
  its level. A single run's interval holds the jitter within that run only, not the spread between
  runs (several times larger on the H200, bench/stats.py), so the verdict below also applies
  compare's 15% bound.

The verdict is "faster" or "slower" only when the interval excludes 1 AND `zerobench compare` would not
call the difference noise (DESIGN.md: a report never ranks what compare calls noise): one pair is judged
by compare's own rule (bench.stats.judge_noisy: Mann-Whitney over repeats and the 5% minimum effect, or
with one run a side the 15% bound); several pairs need the geometric mean beyond compare's 5% minimum
effect. Otherwise it is "no significant difference", and the interval is shown either way.

Peak memory repeats to within a small tolerance (bench.matrix.CompareSettings: NVML 2%, allocator 1%,
host RSS 10%), so a pair carries no interval of its own: 2+ pairs get the t-interval over pairs, one pair
none; "more" or "less" needs the interval (where there is one) to exclude 1 and the change to pass the
tolerance of the figure (bench.stats.judge_bound, repeats widening it as in compare).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from . import stats
from .matrix import CompareSettings

__all__ = [
    "NOTE",
    "REPEAT_NOISE",
    "Side",
    "Effect",
    "throughput",
    "memory",
    "CONF",
    "FASTER",
    "SLOWER",
    "MORE",
    "LESS",
    "NO_DIFFERENCE",
]

CONF = 0.95
REPEAT_NOISE = {"gpu": 0.0546, "cpu": 0.1009}
"""The spread (standard deviation of log tokens/s) between repeats of one cell within one run: pooled over
the A/A runs results/compare-h200-a{1,2,3}.jsonl (one H200) and results/ci-cpu-gate/aa*.jsonl (the 2-core CI
machine). tests/test_answer.py recomputes both. Answer mode (bench.execute.answer) takes it as a measurement's noise;
the report's answer section as the least noise of a cell measured once."""
FASTER, SLOWER, MORE, LESS = "faster", "slower", "more", "less"
NO_DIFFERENCE = "no significant difference"
# The report judges an effect by the rule `zerobench compare` uses, with its default thresholds.
RULE = CompareSettings()
MEMORY_TOLERANCE = {
    "nvml": RULE.nvml_tolerance,
    "torch_reserved": RULE.memory_tolerance,
    "host_rss": RULE.host_rss_tolerance,
}


NOTE = (
    "Each row: cells that differ only in that knob, in pairs (the value's cell against the reference value's, all "
    "else equal), and how many pairs. The ratio is the geometric mean over pairs with its 95% interval: with 2 or "
    "more pairs a t-interval on the log ratios (the spread between pairs, never below the cells' own measurement "
    "noise); with one pair the two cells' own intervals combined (over their repeats where both ran several times, "
    "else each run's median step time over its measured steps, which leaves out the spread between runs). The "
    "verdict is zerobench compare's: faster or slower only when the interval excludes ×1 and compare would not "
    "call it noise (at least {min_effect:.0%}; with one run a side, at least {single:.0%}); otherwise no significant "
    "difference. Peak memory: more or less beyond its tolerance (NVML {nvml:.0%}, allocator {alloc:.0%}, host RSS "
    "{rss:.0%}). Loss: the median difference at the last step both cells of a pair ran."
)


def effects_note() -> str:
    """NOTE with compare's thresholds filled in."""
    return NOTE.format(
        min_effect=RULE.min_effect,
        single=RULE.single_run_min_effect,
        nvml=RULE.nvml_tolerance,
        alloc=RULE.memory_tolerance,
        rss=RULE.host_rss_tolerance,
    )


class Side(NamedTuple):
    """One cell of a pair, as far as its figure goes (a tuple: a 10k-row report makes some 10^5 of them)."""

    value: float
    """The cell's figure: the median over its ok repeats, or its one run's."""
    repeats: Sequence[float] = ()
    """The ok repeats' figures, when it ran 2+ times (else empty)."""
    log_se: float | None = None
    """Standard error of ln(value): from the repeats, or from its run's step-time interval; None: unknown."""


@dataclass(frozen=True, kw_only=True)
class Effect:
    """A knob value against the reference value, over the pairs that ran ok on both sides."""

    n: int
    """Pairs behind it."""
    ratio: float | None = None
    """Value over reference: the geometric mean over pairs (one pair: its ratio)."""
    ci: tuple[float, float] | None = None
    ci_conf: float | None = None
    """The confidence the interval has (0.95, or less where one pair's repeats cannot reach it)."""
    verdict: str | None = None
    method: str = ""
    """How the interval was made, in a few words (the module docstring has the whole)."""
    why: str = ""
    """Why the verdict: which test or bound decided."""
    ratios: list[float] = field(default_factory=list)
    """Each pair's ratio, in pair order."""


def _ratios(pairs: list[tuple[Side, Side]]) -> list[float]:
    return [v.value / r.value for r, v in pairs]


def _covers_one(ci: tuple[float, float] | None) -> bool:
    return ci is not None and ci[0] <= 1 <= ci[1]


def _pairs_ci(ratios: list[float], floor_var: float = 0.0) -> tuple[float, tuple[float, float]]:
    est, lo, hi = stats.log_mean_ci([math.log(x) for x in ratios], CONF, floor_var=floor_var)
    return est, (lo, hi)


def _single_ci(ref: Side, cur: Side) -> tuple[tuple[float, float] | None, float | None, str]:
    """One pair's interval: compare's over repeats, else the two cells' own intervals in quadrature."""
    if len(ref.repeats) >= 2 and len(cur.repeats) >= 2:
        _, lo, hi, conf = stats.ratio_ci(ref.repeats, cur.repeats, conf=CONF)
        return ((lo, hi), conf, "1 pair: Moses' interval over repeats") if lo is not None else (None, None, "")
    if ref.log_se is None or cur.log_se is None:
        return None, None, "1 pair: no interval (no step times)"
    ratio = cur.value / ref.value
    half = stats.normal_quantile(CONF) * math.hypot(ref.log_se, cur.log_se)
    how = "with repeats" if ref.repeats or cur.repeats else "within each run"
    return (ratio * math.exp(-half), ratio * math.exp(half)), CONF, f"1 pair: the cells' intervals, {how}"


def throughput(pairs: list[tuple[Side, Side]]) -> Effect:
    """tokens/s of the value cell over the reference cell's, per pair (reference, value)."""
    if not pairs:
        return Effect(n=0)
    ratios = _ratios(pairs)
    if len(pairs) >= 2:
        known = [r.log_se**2 + v.log_se**2 for r, v in pairs if r.log_se is not None and v.log_se is not None]
        est, ci = _pairs_ci(ratios, sum(known) / len(known) if known else 0.0)
        big = abs(est - 1) >= RULE.min_effect
        verdict = (SLOWER if est < 1 else FASTER) if big and not _covers_one(ci) else NO_DIFFERENCE
        if _covers_one(ci):
            why = "the interval covers ×1"
        elif not big:
            why = f"under compare's {RULE.min_effect:.0%} minimum effect"
        else:
            why = f"the interval excludes ×1 and the change is ≥ {RULE.min_effect:.0%}"
        return Effect(
            n=len(pairs),
            ratio=est,
            ci=ci,
            ci_conf=CONF,
            verdict=verdict,
            why=why,
            ratios=ratios,
            method=f"t-interval over {len(pairs)} pairs",
        )
    (ref, cur), ratio = pairs[0], ratios[0]
    ci, conf, method = _single_ci(ref, cur)
    j = stats.judge_noisy(
        ref.repeats or [ref.value],
        cur.repeats or [cur.value],
        higher_is_better=True,
        alpha=RULE.alpha,
        min_effect=RULE.min_effect,
        single_min_effect=RULE.single_run_min_effect,
    )
    called = j.verdict in (stats.IMPROVEMENT, stats.REGRESSION) and not _covers_one(ci)
    verdict = (FASTER if ratio > 1 else SLOWER) if called else NO_DIFFERENCE
    return Effect(n=1, ratio=ratio, ci=ci, ci_conf=conf, verdict=verdict, method=method, why=_why(j, ci), ratios=ratios)


def _why(j: stats.Judgement, ci: tuple[float, float] | None) -> str:
    """What decided one pair's verdict, in a few words."""
    if j.verdict == stats.NO_CHANGE and j.rule == "min effect only":
        return f"one run a side: under compare's {RULE.single_run_min_effect:.0%} bound"
    if j.verdict == stats.NO_CHANGE and j.p is not None and j.p > RULE.alpha:
        return f"compare: p = {j.p:.2g} > {RULE.alpha:g}"
    if j.verdict == stats.NO_CHANGE:
        return f"under compare's {RULE.min_effect:.0%} minimum effect"
    if _covers_one(ci):
        return "the interval covers ×1"
    return f"compare: {j.why}"


def memory(pairs: list[tuple[Side, Side]], source: str | None) -> Effect:
    """Peak memory of the value cell over the reference cell's; `source` names the figure
    (results' peak_memory_source) and so its tolerance."""
    if not pairs:
        return Effect(n=0)
    tol = MEMORY_TOLERANCE.get(source or "", RULE.nvml_tolerance)
    ratios = _ratios(pairs)
    if len(pairs) >= 2:
        est, ci = _pairs_ci(ratios)
        big = abs(est - 1) > tol
        verdict = (LESS if est < 1 else MORE) if big and not _covers_one(ci) else NO_DIFFERENCE
        return Effect(
            n=len(pairs),
            ratio=est,
            ci=ci,
            ci_conf=CONF,
            verdict=verdict,
            ratios=ratios,
            method=f"t-interval over {len(pairs)} pairs",
            why=f"tolerance ±{tol:.0%}",
        )
    (ref, cur), ratio = pairs[0], ratios[0]
    j = stats.judge_bound(ref.repeats or [ref.value], cur.repeats or [cur.value], tolerance=tol)
    verdict = NO_DIFFERENCE if j.verdict == stats.NO_CHANGE else LESS if ratio < 1 else MORE
    return Effect(n=1, ratio=ratio, verdict=verdict, method="1 pair", why=f"compare: {j.why}", ratios=ratios)
