"""Measurements of tokens/s across blocks. A block is one run part on one machine (bench.records.record.Record.block):
within a block two cells compare directly; between blocks a machine is faster or slower as a whole, so two
cells measured in different blocks compare only through *anchors*, cells measured in both blocks.

- `offsets`: each block's speed relative to a reference block (the one with the most measurements), with
  its covariance: a least-squares fit over the anchors alone (each anchor's own value free, so a cell
  measured in one block only says nothing of the offsets), every anchor measurement off by its noise and by
  the cell's deviation from its block's offset (bench.records.quality.CROSS). A block no anchor ties to the others
  keeps the prior, bench.records.quality.UNTIED_SD: it is never compared raw.
- `level`: a cell's ln tokens/s on the reference block's scale, over every block it was measured in.
- `gap`: ln(a / b) of two cells: from the blocks both were measured in where there are any (the same-block
  pairs effects are made of), else through the offsets, the two cells' deviations added.

A cell's measurements in one block give its mean ln tokens/s there (each weighted by its noise's precision,
bench.records.quality.noise_sd) with the larger of two variances: what their noise allows, and what their own spread
shows (from two measurements up): bench.stats.log_mean and log_diff, the one rule's. No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .. import stats
from ..records.quality import UNTIED_SD

__all__ = [
    "Obs", "Sample", "Offsets", "Gap", "mean_var", "offsets", "level", "joint", "gap", "components", "parts", "leading",
]  # fmt: skip


class Obs(NamedTuple):
    """One measurement: ln tokens/s and its noise (bench.records.quality.noise_sd)."""

    log: float
    sd: float


Sample = Mapping[str, Sequence[Obs]]
"""One cell's measurements by block."""


def mean_var(obs: Sequence[Obs]) -> tuple[float, float]:
    """The mean of the logs and its variance (bench.stats.log_mean: the noise's, or the logs' own if wider)."""
    return stats.log_mean([o.log for o in obs], [o.sd for o in obs])


@dataclass(frozen=True)
class Offsets:
    """Each block's ln speed relative to the reference block (0 for it), with the covariance, and how many
    anchor cells each block shares with others."""

    ref: str | None
    blocks: tuple[str, ...] = ()
    mean: dict[str, float] = field(default_factory=dict)
    cov: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    anchors: dict[str, int] = field(default_factory=dict)
    tied: frozenset[str] = frozenset()
    """The blocks anchors tie to the reference block (it included), directly or through others."""

    def var(self, a: str, b: str | None = None) -> float:
        """The variance of offset(a) - offset(b) (b None: of offset(a))."""
        i = self.blocks.index(a) if a in self.blocks else None
        j = self.blocks.index(b) if b in self.blocks else None
        if i is None or (b is not None and j is None):
            return UNTIED_SD**2 * (1 if b is None else 2)
        if j is None:
            return float(self.cov[i, i])
        return float(self.cov[i, i] + self.cov[j, j] - 2 * self.cov[i, j])

    def sd(self, block: str) -> float:
        return math.sqrt(max(0.0, self.var(block)))


def components(samples: Mapping[object, Sample]) -> list[set[str]]:
    """The blocks in groups tied by anchors (a cell measured in two blocks ties them), largest first."""
    parent: dict[str, str] = {}

    def root(b: str) -> str:
        while parent.setdefault(b, b) != b:
            b = parent[b]
        return b

    for s in samples.values():
        bs = [b for b, obs in s.items() if obs]
        for b in bs[1:]:
            parent[root(b)] = root(bs[0])
        for b in bs:
            root(b)
    out: dict[str, set[str]] = {}
    for b in parent:
        out.setdefault(root(b), set()).add(b)
    return sorted(out.values(), key=lambda c: (-len(c), min(c)))


def parts(samples: Mapping[object, Sample], ref: str | None) -> dict[str, int]:
    """Each block's set of blocks tied by anchors (`components`), numbered: the reference block's first, then
    the others, largest first."""
    comps = sorted(components(samples), key=lambda k: ref not in k)
    return {b: i for i, k in enumerate(comps) for b in k}


def leading(group: Sequence[Sample], offs: Offsets, cross: float, part: Mapping[str, int]) -> int | None:
    """The index of a group's fastest measured cell: the highest level (on the reference scale) among the cells
    measured in the first set of tied blocks that has any (the reference block's first): levels compare only
    within a set the anchors tie."""
    first = min((part[b] for s in group for b in s if s[b]), default=None)
    pick = [i for i, s in enumerate(group) if any(part[b] == first for b in s if s[b])]
    return max(pick, key=lambda i: level(group[i], offs, cross)[0], default=None)


def offsets(samples: Mapping[object, Sample], cross: float, order: Sequence[str] = ()) -> Offsets:
    """Every block's offset from the anchors (see the module's docstring). `order`: the blocks in the order they
    ran, which breaks ties in choosing the reference (the block with the most measurements, the earliest)."""
    count: dict[str, int] = {}
    for s in samples.values():
        for b, obs in s.items():
            count[b] = count.get(b, 0) + len(obs)
    if not count:
        return Offsets(ref=None)
    rank = {b: i for i, b in enumerate(order)}
    blocks = tuple(sorted(count, key=lambda b: (rank.get(b, len(rank)), b)))
    ref = max(blocks, key=lambda b: (count[b], -blocks.index(b)))
    anchors = {k: {b: obs for b, obs in s.items() if obs} for k, s in samples.items()}
    anchors = {k: s for k, s in anchors.items() if len(s) >= 2}
    free = [b for b in blocks if b != ref]
    cells = list(anchors)
    p = len(free) + len(cells)
    A, v = np.zeros((p, p)), np.zeros(p)
    A[range(len(free)), range(len(free))] = 1 / UNTIED_SD**2
    for j, k in enumerate(cells, start=len(free)):
        for b, obs in anchors[k].items():
            y, var = mean_var(obs)
            x = np.zeros(p)
            x[j] = 1.0
            if b != ref:
                x[free.index(b)] = 1.0
            w = 1 / (var + cross**2)
            A += w * np.outer(x, x)
            v += w * y * x
    cov = np.linalg.inv(A)
    est = cov @ v
    full = np.zeros((len(blocks), len(blocks)))
    idx = [blocks.index(b) for b in free]
    full[np.ix_(idx, idx)] = cov[: len(free), : len(free)]
    mean = {b: (float(est[free.index(b)]) if b != ref else 0.0) for b in blocks}
    shared = {b: sum(1 for s in anchors.values() if b in s) for b in blocks}
    tied = next((c for c in components(samples) if ref in c), {ref})
    return Offsets(ref, blocks, mean, full, shared, frozenset(tied))


def _weights(s: Sample, offs: Offsets, cross: float) -> dict[str, tuple[float, float, float]]:
    """Per block of the cell: (mean on the reference scale, its measurement variance, weight)."""
    out = {}
    for b, obs in s.items():
        if obs:
            m, var = mean_var(obs)
            dev = 0.0 if b == offs.ref else cross**2
            out[b] = (m - offs.mean.get(b, 0.0), var + dev, 1 / (var + dev + offs.var(b)))
    total = sum(w for *_, w in out.values())
    return {b: (m, var, w / total) for b, (m, var, w) in out.items()}


def level(s: Sample, offs: Offsets, cross: float) -> tuple[float, float]:
    """The cell's ln tokens/s on the reference block's scale and its variance (the offsets' included)."""
    ws = _weights(s, offs, cross)
    if not ws:
        return math.nan, math.inf
    mean = math.fsum(w * m for m, _, w in ws.values())
    var = math.fsum(w * w * v for _, v, w in ws.values()) + _offset_var({b: w for b, (_, _, w) in ws.items()}, offs)
    return mean, var


def _offset_var(weights: Mapping[str, float], offs: Offsets) -> float:
    """The variance of sum_b weights[b] * offset(b)."""
    idx = [(offs.blocks.index(b), w) for b, w in weights.items() if b in offs.blocks]
    out = sum(wi * wj * offs.cov[i, j] for i, wi in idx for j, wj in idx)
    return float(out) + sum(w * w * UNTIED_SD**2 for b, w in weights.items() if b not in offs.blocks)


def joint(cells: Sequence[Sample], offs: Offsets, cross: float) -> tuple[np.ndarray, np.ndarray]:
    """The levels of several measured cells on the reference block's scale (`level` each) and their covariance:
    cells measured in the same blocks share those blocks' offset uncertainty."""
    ws = [_weights(s, offs, cross) for s in cells]
    mean = np.array([math.fsum(w * m for m, _, w in x.values()) for x in ws])
    idx = {b: i for i, b in enumerate(offs.blocks)}
    W = np.zeros((len(cells), len(offs.blocks)))
    own = np.zeros(len(cells))
    for i, x in enumerate(ws):
        for b, (_, v, w) in x.items():
            own[i] += w * w * v
            if b in idx:
                W[i, idx[b]] = w
            else:
                own[i] += w * w * UNTIED_SD**2
    return mean, W @ offs.cov @ W.T + np.diag(own)


class Gap(NamedTuple):
    """ln(a / b) and its variance; `shared`: the blocks both cells were measured in (empty: through anchors)."""

    d: float
    var: float
    shared: tuple[str, ...]


def within(a: Sequence[Obs], b: Sequence[Obs]) -> tuple[float, float]:
    """ln(a / b) of two cells measured in one block, and its variance (bench.stats.log_diff: the noise's, or the
    two cells' pooled spread if wider)."""
    return stats.log_diff([o.log for o in b], [o.sd for o in b], [o.log for o in a], [o.sd for o in a])


def gap(a: Sample, b: Sample, offs: Offsets, cross: float) -> Gap:
    """ln(a / b): from the blocks both cells were measured in (inverse-variance weighted), else through the
    offsets, each cell deviating from its block's offset by `cross`."""
    shared = tuple(k for k in a if a[k] and b.get(k))
    if shared:
        parts = [within(a[k], b[k]) for k in shared]
        w = [1 / v for _, v in parts]
        return Gap(sum(wi * d for wi, (d, _) in zip(w, parts)) / sum(w), 1 / sum(w), shared)
    wa, wb = _weights(a, offs, cross), _weights(b, offs, cross)
    d = math.fsum(w * m for m, _, w in wa.values()) - math.fsum(w * m for m, _, w in wb.values())
    var = math.fsum(w * w * (v - (0.0 if k == offs.ref else cross**2)) for k, (_, v, w) in wa.items())
    var += math.fsum(w * w * (v - (0.0 if k == offs.ref else cross**2)) for k, (_, v, w) in wb.items())
    diff = {k: w for k, (_, _, w) in wa.items()}
    for k, (_, _, w) in wb.items():
        diff[k] = diff.get(k, 0.0) - w
    return Gap(d, var + _offset_var(diff, offs) + 2 * cross**2, ())
