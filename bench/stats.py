"""Statistics for comparisons: medians with distribution-free intervals, the Mann-Whitney U test and
the decision whether a change counts. Pure Python (no scipy, no numpy needed), deterministic: a report
is a pure function of its results, so nothing here draws random numbers (no bootstrap).

The unit of noise between runs is the process-level repeat (`repeats: N`): each repeat is its own
process, model build, allocator and clock history, so repeats vary the way two runs of a benchmark
vary. A repeat's per-step times are not independent samples of that noise (steps of one process share
its placement, its allocator state and its clocks; their spread is the within-run jitter, several times
smaller than the spread between runs), so steps give each repeat its figure (the
median step time) and a within-run interval, and only repeats enter the tests.

The one rule for a noisy figure (tokens/s, step time), wherever two are compared (`zerobench compare`, the
reports' knob effects and fastest cells, answer mode's console): on the log scale, the difference of the two
sides' mean logs, with a variance that is the larger of what the measurements' noise allows (each
measurement's noise, measured on the committed runs: bench.records.quality) and what their own spread shows (the
pooled sample variance, from one degree of freedom up); the interval is normal at the confidence it states
(`interval`). The verdict follows from that interval alone (`beyond`): a change is called only when the whole
interval lies beyond the minimum effect (above 1 + min_effect, or below 1 / (1 + min_effect)); an interval
that covers 1 is "no significant difference"; one that excludes 1 but reaches inside the minimum effect is
"not settled" (a change, perhaps too small to count: more repeats would tell). So no interval is narrower
than the noise allows for its number of measurements (one measurement a side: the noise of two), and words
and numbers never disagree. The
Mann-Whitney p-value is still computed where both sides have repeats, as information; it decides nothing.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "log_mean",
    "log_diff",
    "interval",
    "beyond",
    "median",
    "median_ci",
    "mann_whitney",
    "ratio_ci",
    "t_quantile",
    "normal_quantile",
    "log_mean_ci",
    "Judgement",
    "judge_noisy",
    "judge_bound",
    "finite",
    "REGRESSION",
    "IMPROVEMENT",
    "NO_CHANGE",
    "NO_DATA",
    "NOT_SETTLED",
]

REGRESSION, IMPROVEMENT, NO_CHANGE, NO_DATA = "regression", "improvement", "no significant change", "no data"
NOT_SETTLED = "not settled"
"""A noisy figure whose interval excludes no change but reaches inside the minimum effect (bench.stats.beyond)."""

# Beyond this many ways to split the pooled values, the exact tie-aware test gives way to the normal
# approximation (with tie and continuity corrections): 10 against 10 repeats is 184,756 splits.
_EXACT_SPLITS = 200_000


def finite(xs) -> list[float]:
    """The finite numbers of xs (None, NaN and inf left out), as floats, in order."""
    out = []
    for x in xs if xs is not None else ():
        try:
            v = float(x)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            out.append(v)
    return out


def median(xs: Sequence[float]) -> float | None:
    xs = sorted(finite(xs))
    n = len(xs)
    if not n:
        return None
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def log_mean(logs: Sequence[float], sds: Sequence[float]) -> tuple[float, float]:
    """The mean of one side's logs, each weighted by its noise's precision (1 / sd^2: a flagged measurement, three
    times a clean one's noise, counts a ninth as much), and its variance: the larger of the noise's (1 / the sum of
    the weights; equal noise: sum of sd^2 over n^2) and the logs' own (their weighted sample variance over n, from
    two values up). Equal noise: the plain mean."""
    mean, floor, ss = _weighted(logs, sds)
    n = len(logs)
    return mean, max(floor, ss / (n - 1) / n if n > 1 else 0.0)


def _weighted(logs: Sequence[float], sds: Sequence[float]) -> tuple[float, float, float]:
    """(the precision-weighted mean, the noise's variance of it, the sum of squared deviations with the weights
    scaled to average 1). Equal noise, or noise not known for every value (a missing, zero or infinite sd): equal
    weights, the plain formulas."""
    n = len(logs)
    known = len(sds) == n and all(0 < s < math.inf for s in sds)
    if not known or len(set(sds)) <= 1:
        mean = math.fsum(logs) / n
        return mean, math.fsum(s * s for s in sds) / n**2, math.fsum((x - mean) ** 2 for x in logs)
    w = [1.0 / (s * s) for s in sds]
    total = math.fsum(w)
    mean = math.fsum(wi * x for wi, x in zip(w, logs)) / total
    return mean, 1.0 / total, math.fsum(wi * (x - mean) ** 2 for wi, x in zip(w, logs)) * n / total


def log_diff(
    ref: Sequence[float], ref_sds: Sequence[float], cur: Sequence[float], cur_sds: Sequence[float]
) -> tuple[float, float]:
    """mean(cur) - mean(ref) on the log scale (each side's mean weighted as log_mean weights it) and its variance:
    the larger of the noise's (each side's, as log_mean) and the two sides' pooled sample variance times
    (1/n1 + 1/n2), from one degree of freedom."""
    n1, n2 = len(ref), len(cur)
    (m1, f1, ss1), (m2, f2, ss2) = _weighted(ref, ref_sds), _weighted(cur, cur_sds)
    dof = n1 + n2 - 2
    spread = (ss1 + ss2) / dof * (1 / n1 + 1 / n2) if dof > 0 else 0.0
    return m2 - m1, max(f1 + f2, spread)


def interval(d: float, var: float, conf: float) -> tuple[float, float, float]:
    """A log difference d with variance var as a ratio and its interval at `conf`: (exp d, low, high)."""
    half = normal_quantile(conf) * math.sqrt(max(var, 0.0))
    return math.exp(d), math.exp(d - half), math.exp(d + half)


def beyond(low: float, high: float, min_effect: float) -> int:
    """Where the interval [low, high] of a ratio lies: 2 entirely above 1 + min_effect (a change that counts),
    -2 entirely below 1 / (1 + min_effect); 0 when it covers 1 (no significant difference); 1 or -1 when it
    excludes 1 but reaches inside the minimum effect (not settled: a change, perhaps one too small to count)."""
    if low > 1 + min_effect:
        return 2
    if high < 1 / (1 + min_effect):
        return -2
    if low <= 1 <= high:
        return 0
    return 1 if low > 1 else -1


def _binom_cdf(k: int, n: int) -> float:
    """P(Bin(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(0, k + 1)) / 2**n if k >= 0 else 0.0


def median_ci(xs: Sequence[float], conf: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """Distribution-free interval for the median from order statistics: (low, high, achieved confidence).

    [x_(k), x_(n-k+1)] covers the median with probability 1 - 2 P(Bin(n, 1/2) <= k-1), whatever the
    distribution (continuous). The widest k that reaches `conf` is taken; with too few values for
    `conf` (n < 6 for 95%) the interval is the full range with the confidence it has (n=3: 75%)."""
    xs = sorted(finite(xs))
    n = len(xs)
    if n < 2:
        return (xs[0], xs[0], None) if n else (None, None, None)
    k = 1
    while k + 1 <= n - k and 1 - 2 * _binom_cdf(k, n) >= conf:
        k += 1
    return xs[k - 1], xs[n - k], 1 - 2 * _binom_cdf(k - 1, n)


@lru_cache(maxsize=None)
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) orderings give each U = 0..m*n (no ties)."""
    if m == 0 or n == 0:
        return (1,)
    a, b = _u_counts(m - 1, n), _u_counts(m, n - 1)
    out = [0] * (m * n + 1)
    for u, c in enumerate(a):  # the largest value is one of x's: it beats all n y's
        out[u + n] += c
    for u, c in enumerate(b):
        out[u] += c
    return tuple(out)


def _u(x: Sequence[float], y: Sequence[float]) -> float:
    """Mann-Whitney U of x: pairs where x beats y, ties counting one half."""
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)


def mann_whitney(x: Sequence[float], y: Sequence[float], alternative: str = "greater") -> float | None:
    """p-value of the Mann-Whitney U test that x tends to be larger than y ("greater"), smaller
    ("less") or either ("two-sided"). Exact for small samples (ties included, by enumerating the
    splits of the pooled values), else the normal approximation. None with an empty side."""
    x, y = finite(x), finite(y)
    m, n = len(x), len(y)
    if not m or not n:
        return None
    u = _u(x, y)
    pooled = x + y
    if len(set(pooled)) == len(pooled) and m * n <= 2500:
        counts = _u_counts(m, n)
        total = math.comb(m + n, m)
        ge = sum(counts[int(math.ceil(u)) :]) / total
        le = sum(counts[: int(math.floor(u)) + 1]) / total
    elif math.comb(m + n, m) <= _EXACT_SPLITS:
        us = []
        for idx in itertools.combinations(range(m + n), m):
            chosen = set(idx)
            us.append(_u([pooled[i] for i in idx], [pooled[i] for i in range(m + n) if i not in chosen]))
        ge = sum(1 for v in us if v >= u - 1e-9) / len(us)
        le = sum(1 for v in us if v <= u + 1e-9) / len(us)
    else:
        mu = m * n / 2
        ties = {}
        for v in pooled:
            ties[v] = ties.get(v, 0) + 1
        t = sum(c**3 - c for c in ties.values())
        sd = math.sqrt(m * n / 12 * ((m + n + 1) - t / ((m + n) * (m + n - 1))))
        if sd == 0:
            return 1.0
        ge = 0.5 * math.erfc(((u - 0.5) - mu) / sd / math.sqrt(2))
        le = 0.5 * math.erfc((mu - (u + 0.5)) / sd / math.sqrt(2))
    if alternative == "greater":
        return min(1.0, ge)
    if alternative == "less":
        return min(1.0, le)
    return min(1.0, 2 * min(ge, le))


def ratio_ci(
    base: Sequence[float], cur: Sequence[float], conf: float = 0.90
) -> tuple[float | None, float | None, float | None, float | None]:
    """Ratio cur/base as a shift of logs: (Hodges-Lehmann estimate, low, high, achieved confidence).

    The interval is the set of ratios the two-sided Mann-Whitney test does not reject (Moses' interval,
    from order statistics of the pairwise log differences): distribution-free and consistent with the
    test. With few repeats the widest interval has the confidence it has (3 against 3: 90%)."""
    b, c = [v for v in finite(base) if v > 0], [v for v in finite(cur) if v > 0]
    m, n = len(b), len(c)
    if not m or not n:
        return None, None, None, None
    d = sorted(math.log(y) - math.log(x) for x in b for y in c)
    est = math.exp(median(d))
    if m < 2 or n < 2:
        return est, None, None, None
    counts = _u_counts(m, n)
    total = math.comb(m + n, m)
    cdf = list(itertools.accumulate(counts))
    k = 1  # [d_(k), d_(mn-k+1)] with confidence 1 - 2 P(U <= k-1)
    while k + 1 <= m * n - k and 1 - 2 * cdf[k] / total >= conf:
        k += 1
    achieved = 1 - 2 * cdf[k - 1] / total
    return est, math.exp(d[k - 1]), math.exp(d[m * n - k]), achieved


def _t_central(x: float, df: int) -> float:
    """P(|T| <= x) for Student's t with integer df: the closed forms of Abramowitz and Stegun 26.7.3-4
    (a finite series in cos(theta), theta = atan(x / sqrt(df))), exact to rounding."""
    theta = math.atan(x / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    term = total = 1.0
    if df % 2:
        if df == 1:
            return 2 * theta / math.pi
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def normal_quantile(conf: float) -> float:
    """The two-sided normal quantile: z with P(|Z| <= z) = conf (1.96 for 0.95)."""
    return statistics.NormalDist().inv_cdf((1 + conf) / 2)


@lru_cache(maxsize=None)
def t_quantile(conf: float, df: int) -> float:
    """The two-sided Student t quantile: x with P(|T| <= x) = conf for `df` degrees of freedom (12.71 for
    0.95 and df 1, 2.78 for df 4); the normal's beyond 1000 degrees of freedom, where they agree to 1e-3."""
    if df < 1:
        raise ValueError(f"t_quantile needs df >= 1, got {df}")
    if df > 1000:
        return normal_quantile(conf)
    # Newton's method from the normal quantile, which lies below: P(|T| <= x) is concave in x > 0, so every
    # step stays below the root and climbs to it (a few steps; a bisection took 60, each O(df)).
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    x = normal_quantile(conf)
    for _ in range(100):
        density = 2 * math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))  # of |T| at x
        step = (conf - _t_central(x, df)) / density
        x += step
        if step <= 1e-13 * x:
            break
    return x


def log_mean_ci(
    logs: Sequence[float], conf: float = 0.95, *, floor_var: float = 0.0
) -> tuple[float, float, float] | None:
    """Geometric mean of exp(logs) with a t-interval: (estimate, low, high), from two values up; None with fewer.

    The standard error of the mean log is sqrt(max(s^2, floor_var) / n), s^2 the sample variance of the
    logs: `floor_var` is noise every value is known to carry (each one's own measurement variance), so
    values that agree by chance do not make an interval narrower than their measurements allow. The t
    quantile has n - 1 degrees of freedom either way (with the floor, conservative)."""
    xs = finite(logs)
    n = len(xs)
    if n < 2:
        return None
    mean = math.fsum(xs) / n
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)  # statistics.variance is exact, and slow
    se = math.sqrt(max(var, floor_var) / n)
    half = t_quantile(conf, n - 1) * se
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """What a comparison of one figure concluded, and on what grounds."""

    verdict: str
    """regression, improvement, no significant change, or no data."""
    base: float | None = None
    """The baseline's median."""
    cur: float | None = None
    ratio: float | None = None
    """cur / base (for losses: the difference cur - base, see `difference`)."""
    p: float | None = None
    """One-sided Mann-Whitney p in the direction of the change, as information (None with one value on a side)."""
    ci: tuple[float, float] | None = None
    ci_conf: float | None = None
    n: tuple[int, int] = (0, 0)
    rule: str = ""
    """Which rule decided: "interval" (a noisy figure) or "bound"."""
    why: str = ""


def judge_noisy(
    base: Sequence[float],
    cur: Sequence[float],
    *,
    higher_is_better: bool,
    conf: float,
    min_effect: float,
    base_sd: float | Sequence[float],
    cur_sd: float | Sequence[float],
    offset: tuple[float, float] = (0.0, 0.0),
) -> Judgement:
    """A noisy figure (tokens/s, step time) by the one rule (the module's docstring): the ratio of the sides'
    geometric means with its interval at `conf`, called changed only when the interval lies beyond the minimum
    effect. base_sd, cur_sd: each value's noise on the log scale (one figure: the same for every value).
    offset: a difference between the sides' machines, (ln, its variance) as log_diff gives one
    (bench.judge.blocks), taken out of the ratio and added to its uncertainty."""
    pairs = [(x, s) for x, s in zip(base, _each(base_sd, base)) if _positive(x)]
    cpairs = [(x, s) for x, s in zip(cur, _each(cur_sd, cur)) if _positive(x)]
    n = (len(pairs), len(cpairs))
    if not pairs or not cpairs:
        if finite(base) and not pairs:
            return Judgement(verdict=NO_DATA, n=n, why="the baseline's figure is 0: no ratio")
        none = "either side" if not pairs and not cpairs else "the baseline side" if not pairs else "the current side"
        return Judgement(verdict=NO_DATA, n=n, why=f"no figure on {none}")
    b, c = [x for x, _ in pairs], [x for x, _ in cpairs]
    d, var = log_diff([math.log(x) for x in b], [s for _, s in pairs], [math.log(x) for x in c], [s for _, s in cpairs])
    shift, shift_var = offset
    ratio, lo, hi = interval(d - shift, var + shift_var, conf)
    side = beyond(lo, hi, min_effect)
    worse = side < 0 if higher_is_better else side > 0
    verdict = {0: NO_CHANGE, 1: NOT_SETTLED, 2: REGRESSION if worse else IMPROVEMENT}[abs(side)]
    shown = f"the {conf:.0%} interval [{lo:.3f}, {hi:.3f}]"
    if abs(side) == 2:
        why = f"{shown} lies beyond the {min_effect:.0%} minimum effect"
    elif side == 0:
        why = f"{shown} covers ×1"
    else:
        why = f"{shown} excludes ×1 but reaches inside the {min_effect:.0%} minimum effect"
    p = mann_whitney(c, b, "less" if ratio < 1 else "greater") if min(n) >= 2 else None
    return Judgement(
        verdict=verdict,
        base=median(b),
        cur=median(c),
        ratio=ratio,
        p=p,
        ci=(lo, hi),
        ci_conf=conf,
        n=n,
        rule="interval",
        why=why,
    )


def _each(sd: float | Sequence[float], values: Sequence[float]) -> list[float]:
    return [float(sd)] * len(values) if isinstance(sd, (int, float)) else list(sd)


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _spread(xs: list[float]) -> float:
    """Relative range of one side's repeats (0 for a single value or a zero median)."""
    m = median(xs)
    return (max(xs) - min(xs)) / abs(m) if len(xs) > 1 and m else 0.0


def judge_bound(
    base: Sequence[float],
    cur: Sequence[float],
    *,
    tolerance: float,
    relative: bool = True,
    both_ways: bool = False,
) -> Judgement:
    """A figure that should repeat exactly (allocator bytes, first loss) or nearly (NVML peaks, final
    loss): a change beyond `tolerance` counts. Higher is worse; with both_ways any change beyond the
    bound is a regression (the first loss: another model, data or init). The bound widens to what the
    repeats themselves show (their spread), so a figure that turns out noisy is not held to a bound
    its own repeats break. relative: tolerance is a fraction of the baseline; else absolute units."""
    b, c = finite(base), finite(cur)
    n = (len(b), len(c))
    if not b or not c:
        return Judgement(
            verdict=NO_DATA, n=n, why="no figure on " + ("the baseline side" if not b else "the current side")
        )
    mb, mc = median(b), median(c)
    if relative:
        if mb == 0:
            return Judgement(verdict=NO_DATA, base=mb, cur=mc, n=n, why="the baseline's figure is 0: no ratio")
        change = mc / mb - 1
        bound = max(tolerance, _spread(b), _spread(c))
    else:
        change = mc - mb
        bound = max(tolerance, *(max(x) - min(x) for x in (b, c)))
    if abs(change) <= bound:
        verdict = NO_CHANGE
    elif change > 0 or both_ways:
        verdict = REGRESSION
    else:
        verdict = IMPROVEMENT
    shown = f"{change:+.2%}" if relative else f"{change:+.4g}"
    bshown = f"{bound:.2%}" if relative else f"{bound:.4g}"
    return Judgement(
        verdict=verdict,
        base=mb,
        cur=mc,
        ratio=mc / mb if relative else change,
        n=n,
        rule="bound",
        why=f"{shown} against a bound of ±{bshown}",
    )
