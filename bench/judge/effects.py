"""One knob's effect with its interval: pairs of cells that differ only in the knob -> a ratio, an interval at a
stated confidence, the number of pairs behind it and a verdict. `analysis` (the report) and answer mode find
the pairs; this module summarises them, by the one rule of bench.stats.

Throughput (tokens/s), per pair i the log ratio d_i = ln(value cell / reference cell), both cells measured in
one block (one run part on one machine, bench.judge.blocks: pairs across machines are not formed), each cell's
figure the mean of its measurements' logs there, each weighted by its noise's precision (bench.stats.log_mean):
- 1 pair: d with the variance bench.stats.log_diff gives: the larger of what the two cells' measurements'
  noise allows (bench.records.quality.noise_sd each: measured on the committed runs; a host-bound or unstable
  measurement carries about three times a clean one's) and what their repeats' own spread shows. A pair of
  single runs is so never narrower than the noise of two measurements.
- 2+ pairs: the geometric mean over pairs, exp(mean d_i), with a t-interval on the d_i (n - 1 degrees of
  freedom; bench.stats.log_mean_ci). The spread between pairs holds the noise as well as any change of the
  effect from one context to another: the interval is for the effect averaged over these contexts. Its
  standard error is never below what the pairs' own measurement noise allows (the mean of their variances).

The verdict follows from the interval (bench.stats.beyond): "faster" or "slower" only when the whole interval
lies beyond compare's minimum effect (5%: above x1.05, below x1/1.05); "no significant difference" when it
covers x1; "not settled" when it excludes x1 but reaches inside the minimum effect (a change, perhaps too
small to count). The same rule judges cells against a group's fastest (`against`) in answer mode's console and
in the reports: a cell not surely slower by the minimum effect is not told apart from it.

Peak memory repeats to within a small tolerance (bench.matrix.spec.CompareSettings: NVML 2%, allocator 1%,
host RSS 10%), so a pair carries no interval of its own: 2+ pairs get the t-interval over pairs, one pair
none; "more" or "less" needs the interval (where there is one) to exclude 1 and the change to pass the
tolerance of the figure (bench.stats.judge_bound, repeats widening it as in compare).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .. import stats
from ..matrix.axes import AXES, AXIS
from ..matrix.spec import CompareSettings
from . import blocks

__all__ = [
    "NOTE",
    "Side",
    "Effect",
    "throughput",
    "from_gaps",
    "versus",
    "features",
    "knob_pairs",
    "knob_effect",
    "against",
    "memory",
    "CONF",
    "FASTER",
    "SLOWER",
    "MORE",
    "LESS",
    "NO_DIFFERENCE",
    "NOT_SETTLED",
]

CONF = 0.95
FASTER, SLOWER, MORE, LESS = "faster", "slower", "more", "less"
NO_DIFFERENCE = "no significant difference"
NOT_SETTLED = stats.NOT_SETTLED
# The report judges an effect by the rule `zerobench compare` uses, with its default thresholds.
RULE = CompareSettings()
MEMORY_TOLERANCE = {
    "nvml": RULE.nvml_tolerance,
    "torch_reserved": RULE.memory_tolerance,
    "host_rss": RULE.host_rss_tolerance,
}


NOTE = (
    "Each row: cells that differ only in that knob, in pairs (the value's cell against the reference value's, all "
    "else equal, both measured in one block: one run part on one machine), and how many pairs. The ratio is the "
    "geometric mean over pairs with its interval at the confidence shown: with 2 or more pairs a t-interval on the "
    "log ratios (the spread between pairs, never below the cells' own measurement noise); with one pair the two "
    "cells' noise (measured on the committed runs; about three times wider for a host-bound or unstable "
    "measurement), or their repeats' spread where wider. The verdict follows from the interval: faster or slower "
    "only when all of it lies beyond {min_effect:.0%} (compare's minimum effect); no significant difference when it "
    "covers ×1; not settled when it excludes ×1 but reaches inside {min_effect:.0%}. Peak memory: more or less "
    "beyond its tolerance (NVML {nvml:.0%}, allocator {alloc:.0%}, host RSS {rss:.0%}). Loss: the median "
    "difference at the last step both cells of a pair ran."
)


def effects_note() -> str:
    """NOTE with compare's thresholds filled in."""
    return NOTE.format(
        min_effect=RULE.min_effect,
        nvml=RULE.nvml_tolerance,
        alloc=RULE.memory_tolerance,
        rss=RULE.host_rss_tolerance,
    )


class Side(NamedTuple):
    """One cell of a pair, as far as its figure goes (a tuple: a 10k-row report makes some 10^5 of them)."""

    value: float
    """The cell's figure: the median over its repeats in the pair's block, or its one run's."""
    repeats: Sequence[float] = ()
    """The repeats' figures, when it ran 2+ times (else empty: value is one measurement)."""
    sds: Sequence[float] = ()
    """tokens/s: each measurement's noise on the log scale (bench.records.quality.noise_sd), one per repeat (one for a
    single run); empty: no floor (the repeats' spread alone)."""

    def logs(self) -> list[float]:
        return [math.log(x) for x in (self.repeats or (self.value,))]


@dataclass(frozen=True, kw_only=True)
class Effect:
    """A knob value against the reference value (or a cell against a group's fastest), over the pairs that ran ok
    on both sides."""

    n: int
    """Pairs behind it."""
    ratio: float | None = None
    """Value over reference: the geometric mean over pairs (one pair: its ratio)."""
    ci: tuple[float, float] | None = None
    ci_conf: float | None = None
    """The confidence the interval has."""
    verdict: str | None = None
    method: str = ""
    """How the interval was made, in a few words (the module docstring has the whole)."""
    why: str = ""
    """Why the verdict: where the interval lies."""
    ratios: list[float] = field(default_factory=list)
    """Each pair's ratio, in pair order."""


def _ratios(pairs: list[tuple[Side, Side]]) -> list[float]:
    return [v.value / r.value for r, v in pairs]


def _covers_one(ci: tuple[float, float] | None) -> bool:
    return ci is not None and ci[0] <= 1 <= ci[1]


def _judged(ci: tuple[float, float]) -> tuple[str, str]:
    """The verdict of a ratio's interval, and why (bench.stats.beyond with compare's minimum effect)."""
    side = stats.beyond(ci[0], ci[1], RULE.min_effect)
    if abs(side) == 2:
        return (FASTER if side > 0 else SLOWER), f"the interval lies beyond the {RULE.min_effect:.0%} minimum effect"
    if side == 0:
        return NO_DIFFERENCE, "the interval covers ×1"
    way = "faster" if side > 0 else "slower"
    return NOT_SETTLED, f"{way}, but the interval reaches inside the {RULE.min_effect:.0%} minimum effect"


def _sds(s: Side) -> list[float]:
    n = len(s.repeats) or 1
    return list(s.sds) * n if len(s.sds) == 1 else list(s.sds) if len(s.sds) == n else [0.0] * n


def versus(d: float, var: float, *, n: int = 1, method: str = "") -> Effect:
    """One comparison on the log scale (d = ln(value / reference), its variance) as an Effect: the ratio, its
    interval at CONF and the verdict that follows from it."""
    ratio, lo, hi = stats.interval(d, var, CONF)
    verdict, why = _judged((lo, hi))
    return Effect(n=n, ratio=ratio, ci=(lo, hi), ci_conf=CONF, verdict=verdict, why=why, method=method, ratios=[ratio])


def throughput(pairs: list[tuple[Side, Side]]) -> Effect:
    """tokens/s of the value cell over the reference cell's, per pair (reference, value)."""
    diffs = [stats.log_diff(r.logs(), _sds(r), v.logs(), _sds(v)) for r, v in pairs]
    how = "with repeats" if any(r.repeats or v.repeats for r, v in pairs) else "one run each"
    return from_gaps(diffs, f"1 pair: the two cells' noise, {how}")


def from_gaps(diffs: list[tuple[float, float]], one: str = "1 pair") -> Effect:
    """An effect from its pairs' log ratios and their variances (bench.stats.log_diff each): one pair's
    interval from its own variance (`one` says how it was made), 2+ pairs' the t-interval over pairs."""
    if not diffs:
        return Effect(n=0)
    if len(diffs) == 1:
        return versus(*diffs[0], method=one)
    est, lo, hi = stats.log_mean_ci([d for d, _ in diffs], CONF, floor_var=sum(v for _, v in diffs) / len(diffs))
    verdict, why = _judged((lo, hi))
    return Effect(
        n=len(diffs),
        ratio=est,
        ci=(lo, hi),
        ci_conf=CONF,
        verdict=verdict,
        why=why,
        ratios=[math.exp(d) for d, _ in diffs],
        method=f"t-interval over {len(diffs)} pairs",
    )


# -- answer mode's knob effects and fastest cells, as its console and the reports both judge them ----------


def features(values: Mapping[str, object]) -> dict:
    """A cell's axis values (bench.judge.results.axis_values: as the results frame has them), None for an axis that
    means nothing for it (LoRA's rank without LoRA) or that it lacks."""
    v = {a.name: None if _missing(values.get(a.name)) else values.get(a.name) for a in AXES}
    return {k: x if AXIS[k].applies is None or AXIS[k].applies(v) else None for k, x in v.items()}


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and x != x)


def knob_pairs(feats: Sequence[Mapping[str, object]]) -> list[tuple[str, object, object, list[tuple[int, int]]]]:
    """Per ablated axis and value other than its reference (the axis's default where present, else its first
    value in the axis table's order): the pairs (reference cell's index, value cell's index) of cells that
    differ in that axis alone. An axis that means nothing for some cells (LoRA's rank beside peft: none) is
    left out of what a pair must share: a LoRA cell and a full fine-tune pair on everything else. Micro-batches
    pair at the same batch too: two cells whose micro-batch and accumulation differ but whose product (the
    sequences per optimizer step) is the same (batch.size held)."""
    partial = {k for f in feats for k, v in f.items() if v is None}
    out = []
    for ax in AXES:
        present = {f[ax.name] for f in feats if f[ax.name] is not None}
        if len(present) < 2 or not ax.ablate:
            continue
        values = sorted(present, key=lambda v: (ax.values.index(v) if v in ax.values else len(ax.values), str(v)))
        ref = ax.default if ax.default in present else values[0]
        index: dict = {}
        for i, f in enumerate(feats):
            key = tuple((k, v) for k, v in f.items() if k != ax.name and k not in partial)
            index.setdefault(key, {})[f[ax.name]] = i
            if ax.name == "micro_batch" and isinstance(f.get("grad_accum"), int) and isinstance(f[ax.name], int):
                batch = (("batch", f[ax.name] * f["grad_accum"]),) + tuple(kv for kv in key if kv[0] != "grad_accum")
                index.setdefault(batch, {})[f[ax.name]] = i
        for value in values:
            if value != ref:
                out.append(
                    (ax.name, value, ref, [(d[ref], d[value]) for d in index.values() if ref in d and value in d])
                )
    return out


def knob_effect(pairs: Sequence[tuple[blocks.Sample, blocks.Sample]], cross: float) -> Effect:
    """tokens/s of the value cell over the reference cell's, per pair (reference's measurements by block, the
    value's): only pairs measured in one block count, each from the blocks both ran in (bench.judge.blocks.gap)."""
    none = blocks.Offsets(ref=None)
    gaps = [blocks.gap(v, r, none, cross) for r, v in pairs if set(r) & set(v)]
    return from_gaps([(g.d, g.var) for g in gaps], "1 pair: the two cells' noise, in one block")


def against(other: blocks.Sample, lead: blocks.Sample, offs: blocks.Offsets, cross: float,
            part: Mapping[str, int]) -> Effect | None:  # fmt: skip
    """A measured cell against its group's fastest by the one rule: in the blocks both ran in, else through the
    anchors (bench.judge.blocks.gap); None where no block or anchor ties them (bench.judge.blocks.parts)."""
    if not {part[b] for b in other} & {part[b] for b in lead}:
        return None
    g = blocks.gap(other, lead, offs, cross)
    return versus(g.d, g.var, method="in one block" if g.shared else "through anchors")


def memory(pairs: list[tuple[Side, Side]], source: str | None) -> Effect:
    """Peak memory of the value cell over the reference cell's; `source` names the figure
    (results' peak_memory_source) and so its tolerance."""
    if not pairs:
        return Effect(n=0)
    tol = MEMORY_TOLERANCE.get(source or "", RULE.nvml_tolerance)
    ratios = _ratios(pairs)
    if len(pairs) >= 2:
        est, lo, hi = stats.log_mean_ci([math.log(x) for x in ratios], CONF)
        ci = (lo, hi)
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
