"""What drives the "unstable" flag (bench.records.quality.UNSTABLE_TAIL) in a records file: one slow step, a
trend, or spread across the measured steps; and whether the flag tells the noisier repeats apart there.

    python -m tools.step_spread FILE [FILE ...]

Per file, over its ok GPU measurements (a record's measured steps: step_times_s after steps.warmup):
- flagged: p90 step over the median step above UNSTABLE_TAIL (the flag's own figure, from the metrics);
- by one step: flagged records whose p90 with their slowest step left out is at or under UNSTABLE_TAIL;
- first step: flagged records whose first measured step is over UNSTABLE_TAIL above the median (warm-up left);
- trend: flagged records whose step times have a rank correlation with their index of 0.5 or more in size;
- spread: the median over records of the steps' robust spread (1.4826 x median absolute deviation / median);
- repeats: cells measured more than once in a block, each measurement's deviation from its cell's mean
  ln(tokens/s) as in tools.noise, pooled for flagged and clean measurements: what the flag is for.

    python -m tools.step_spread --candidates 'results/*.jsonl'

splits the repeats of the files matching the pattern (tools.noise's samples) by each candidate figure, as
tools.noise fits UNSTABLE_TAIL: the record's p90 tail, the same with the slowest step left out, the steps' robust
spread, the median's interval half-width (steps.half_width); each with its boundary, the two sides' spreads and
the log-likelihood it gains over no split (the larger, the better the figure tells the noisier repeats apart).
"""

from __future__ import annotations

import collections
import glob
import math
import statistics
import sys

from bench.records import quality
from bench.records.status import Status
from bench.records.store import read
from tools.noise import _loglik, split

__all__ = ["pct", "rank_corr", "measured", "describe", "figures", "candidates"]


def pct(xs: list[float], q: float) -> float:
    """The q-quantile as bench.worker.metrics computes the record's p90 (linear between order statistics)."""
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def rank_corr(xs: list[float]) -> float:
    """Spearman's rank correlation of xs with their index (no ties expected in step times)."""
    n = len(xs)
    if n < 3:
        return 0.0
    rank = {i: r for r, i in enumerate(sorted(range(n), key=lambda i: xs[i]))}
    return 1 - 6 * sum((rank[i] - i) ** 2 for i in range(n)) / (n * (n * n - 1))


def measured(path: str) -> list:
    """(record, its measured step times) for the ok GPU measurements of a file."""
    out = []
    for r in read(path):
        m = r.metrics
        if r.status is not Status.OK or m is None or not m.tokens_per_s or quality.kind(r) != "gpu" or r.variant:
            continue
        times = list(r.step_times_s or [])
        out.append((r, times[r.steps.warmup :] if r.steps else times))
    return out


def _tail(m) -> float:
    return m.step_time_p90_s / m.step_time_median_s - 1 if m.step_time_p90_s and m.step_time_median_s else 0.0


def _repeats(rows: list) -> dict[bool, list[float]]:
    by_cell = collections.defaultdict(list)
    for r, _ in rows:
        by_cell[(r.block, r.cell_hash)].append(
            (math.log(r.metrics.tokens_per_s), _tail(r.metrics) > quality.UNSTABLE_TAIL)
        )
    out: dict[bool, list[float]] = {True: [], False: []}
    for ms in by_cell.values():
        if len(ms) >= 2:
            mean = sum(x for x, _ in ms) / len(ms)
            for x, flagged in ms:
                out[flagged].append((x - mean) ** 2 * len(ms) / (len(ms) - 1))
    return out


def describe(path: str) -> str:
    rows = measured(path)
    t = quality.UNSTABLE_TAIL
    flagged = [(r, s) for r, s in rows if _tail(r.metrics) > t and len(s) >= 2]
    clean = [(r, s) for r, s in rows if _tail(r.metrics) <= t and len(s) >= 2]

    def one_step(s):
        rest = sorted(s)[:-1]
        return pct(rest, 0.9) / statistics.median(rest) - 1 <= t

    def mad(s):
        med = statistics.median(s)
        return 1.4826 * statistics.median(abs(x - med) for x in s) / med

    def n_range(group):
        ns = sorted(len(s) for _, s in group)
        return f"{ns[0]}-{ns[-1]} (median {statistics.median(ns):g})" if ns else "-"

    rep = _repeats(rows)
    sd = {k: (math.sqrt(sum(v) / len(v)), len(v)) if v else (float("nan"), 0) for k, v in rep.items()}
    lines = [
        f"{path}: {len(rows)} ok GPU measurements, {len(flagged)} flagged unstable "
        f"(p90 step > {t:.2%} over the median)",
        f"  by one step: {sum(one_step(s) for _, s in flagged)}; first measured step slow: "
        f"{sum(s[0] > statistics.median(s) * (1 + t) for _, s in flagged)}; "
        f"trend (|rank corr| >= 0.5): {sum(abs(rank_corr(s)) >= 0.5 for _, s in flagged)}",
        f"  measured steps: flagged {n_range(flagged)}, clean {n_range(clean)}",
        f"  robust step spread (median of records): flagged "
        f"{statistics.median(mad(s) for _, s in flagged) if flagged else float('nan'):.1%}, clean "
        f"{statistics.median(mad(s) for _, s in clean) if clean else float('nan'):.1%}",
        f"  repeats, spread of ln(tokens/s): flagged {sd[True][0]:.4f} ({sd[True][1]}), "
        f"clean {sd[False][0]:.4f} ({sd[False][1]})",
    ]
    return "\n".join(lines)


def figures(r, steps: list[float]) -> dict[str, float | None]:
    """The candidate figures of one measurement (see the module's docstring)."""
    med = statistics.median(steps)
    rest = sorted(steps)[:-1]
    return {
        "p90 tail": _tail(r.metrics),
        "p90 tail, slowest step left out": pct(rest, 0.9) / statistics.median(rest) - 1 if len(rest) >= 2 else None,
        "robust spread (1.4826 MAD)": 1.4826 * statistics.median(abs(x - med) for x in steps) / med,
        "median's half-width": r.steps.half_width if r.steps else None,
    }


def candidates(pattern: str) -> str:
    by_cell = collections.defaultdict(list)
    for path in sorted(glob.glob(pattern)):
        for r, s in measured(path):
            if len(s) >= 2 and "slow=" not in str((r.worker.fault_injected if r.worker else None) or ""):
                by_cell[(r.block, r.cell_hash)].append((math.log(r.metrics.tokens_per_s), figures(r, s)))
    samples = []
    for ms in by_cell.values():
        if len(ms) >= 2:
            mean = sum(x for x, _ in ms) / len(ms)
            samples += [(f, (x - mean) ** 2 * len(ms) / (len(ms) - 1)) for x, f in ms]
    lines = [f"{pattern}: {len(samples)} repeats"]
    for name in samples[0][0] if samples else ():
        xs = [(-f[name], d) for f, d in samples if f[name] is not None]
        sp = split(xs, flag_below=True)
        cut = sp["boundary"]
        below, above = [d for f, d in xs if f < cut], [d for f, d in xs if f >= cut]
        gain = _loglik(below) + _loglik(above) - _loglik([d for _, d in xs])
        lines.append(
            f"  {name}: flagged above {-sp['boundary']:.4f}: {sp['flagged'][0]} spread {sp['flagged'][1]:.4f}, "
            f"clean {sp['clean'][0]} spread {sp['clean'][1]:.4f}; log-likelihood gained {gain:.1f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--candidates"]:
        print(candidates(args[1] if len(args) > 1 else "results/*.jsonl"))
    else:
        for p in args or ["results/7b-answer-h200.jsonl"]:
            print(describe(p))
