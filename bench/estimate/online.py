"""A model's prediction corrected by what a run has measured so far: the prior model (the step-time or the
memory model) gives each cell a base value; this fits, on the log scale, an offset for the machine, one
additive effect per axis value and an offset per block to the measured cells' residuals (log measured - log
base), as a Bayesian linear model with a Gaussian prior on each. It answers, for any cell of the matrix, the
log value and its standard deviation: where nothing was measured, the base with the prior's width; where cells
like it were measured, what they showed.

Blocks: measurements come in blocks, one run part on one machine (bench.record.Record.block), and a machine
is faster or slower as a whole. Each block but the reference has an offset whose prior is what the anchors
say of it (cells measured in that block and another: bench.blocks.offsets, given through `anchor`): tied
blocks start from the anchors' estimate and its uncertainty, an untied one from a wide prior, so its cells
still teach the knobs' effects (their differences within the block) without setting the level. A prediction
is on the reference block's scale unless a block is asked for.

Why additive on the log scale: a knob multiplies throughput (and, roughly, memory) by a factor that holds
across the rest of the settings to first order; what does not (interactions) is the misfit term, which the
fit estimates from its own residuals. numpy only (the orchestrator never imports torch).

`posterior(items)` gives the joint mean and covariance of a set of unmeasured cells' values, for rules that
judge several cells at once.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Online"]


@dataclass
class _Row:
    features: Mapping[str, object]
    base: float
    log: float
    noise_var: float  # the measurement's variance (a mean of n: over n)
    block: Hashable


@dataclass
class Online:
    """prior_sd: how far (log) the base may be off for one axis value's effect; offset_sd: for the machine as
    a whole (a GPU the base model never saw, a CPU); noise_sd: one measurement's spread (log) around the
    cell's true value, where observe() is not told its own; misfit_sd: the least interaction left after the
    additive effects."""

    prior_sd: float
    offset_sd: float
    noise_sd: float
    misfit_sd: float = 0.0
    _names: list[tuple[str, object]] = field(default_factory=list)
    _fit: tuple | None = None
    _rows: list[_Row] = field(default_factory=list)
    _anchored: dict[Hashable, tuple[float, float]] = field(default_factory=dict)  # block -> anchors' (mean, var)
    _blocks: list[Hashable] = field(default_factory=list)  # in the order first seen

    def observe(
        self,
        features: Mapping[str, object],
        base_log: float,
        measured_log: float,
        n: int = 1,
        *,
        block: Hashable = None,
        noise_sd: float | None = None,
    ) -> None:
        """One measurement (the mean of n) of a cell against its base, in a block, with its noise (default
        noise_sd). Each measurement is a row of its own: a cell measured again counts again."""
        sd = self.noise_sd if noise_sd is None else noise_sd
        self._rows.append(_Row(features, base_log, measured_log, sd**2 / n, block))
        for k, v in features.items():
            if (k, v) not in self._names:
                self._names.append((k, v))
        if block not in self._blocks:
            self._blocks.append(block)
        self._fit = None

    def anchor(self, offsets: Mapping[Hashable, tuple[float, float]]) -> None:
        """Each block's offset from the reference block as the anchors estimate it: (mean, variance). The
        reference block is the one given (0, 0); a block not given keeps the wide prior offset_sd."""
        self._anchored = dict(offsets)
        self._fit = None

    @property
    def ref(self) -> Hashable:
        """The reference block: the one the anchors fix at 0, else the first observed."""
        fixed = [b for b, (m, v) in self._anchored.items() if m == 0 and v == 0]
        return fixed[0] if fixed else (self._blocks[0] if self._blocks else None)

    def _free(self) -> list[Hashable]:
        ref = self.ref
        return [b for b in self._blocks if b != ref]

    def _x(self, features: Mapping[str, object], block: Hashable = None) -> np.ndarray:
        x = [1.0] + [1.0 if features.get(k) == v else 0.0 for k, v in self._names]
        return np.array(x + [1.0 if b == block else 0.0 for b in self._free()])

    def _shift(self, block: Hashable) -> float:
        """The anchors' estimate of a block's offset, which its parameter is measured from."""
        return self._anchored.get(block, (0.0, 0.0))[0] if block != self.ref else 0.0

    def _prior(self) -> np.ndarray:
        p = 1 + len(self._names)
        blocks = [self._anchored.get(b, (0.0, self.offset_sd**2))[1] for b in self._free()]
        return np.array(
            [1 / self.offset_sd**2] + [1 / self.prior_sd**2] * (p - 1) + [1 / max(v, 1e-12) for v in blocks]
        )

    def _solve(self) -> tuple:
        if self._fit is None:
            prior = self._prior()
            if not self._rows:
                self._fit = (np.zeros(len(prior)), np.diag(1 / prior), self.misfit_sd)
                return self._fit
            rows = self._rows
            X = np.array([self._x(r.features, r.block) for r in rows])
            y = np.array([r.log - r.base - self._shift(r.block) for r in rows])
            noise = np.array([r.noise_var for r in rows])
            mean, _ = self._gls(X, y, noise + self.misfit_sd**2, prior)
            misfit = self._misfit(X, y, mean, noise)
            mean, cov = self._gls(X, y, noise + misfit**2, prior)
            self._fit = (mean, cov, misfit)
        return self._fit

    @staticmethod
    def _gls(X: np.ndarray, y: np.ndarray, var: np.ndarray, prior: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        A = X.T @ (X / var[:, None]) + np.diag(prior)
        cov = np.linalg.inv(A)
        return cov @ (X.T @ (y / var)), cov

    def _misfit(self, X: np.ndarray, y: np.ndarray, mean: np.ndarray, noise: np.ndarray) -> float:
        """The interaction the additive effects leave: the residuals' spread beyond the measurement noise,
        counted only once there are more cells than effects (else the fit explains everything)."""
        n, p = X.shape
        if n <= p:
            return self.misfit_sd
        rss = float(((y - X @ mean) ** 2).sum()) / (n - p)
        return max(self.misfit_sd, math.sqrt(max(0.0, rss - float(noise.mean()))))

    def predict(self, features: Mapping[str, object], base_log: float, block: Hashable = None) -> tuple[float, float]:
        """The cell's true log value on the reference block's scale (or on `block`'s): mean and standard deviation
        (the effects' uncertainty and the misfit; not a future measurement's noise)."""
        mean, cov, misfit = self._solve()
        x = self._x(features, block)
        return base_log + self._shift(block) + float(x @ mean), math.sqrt(float(x @ cov @ x) + misfit**2)

    def posterior(self, items: Sequence[tuple[Mapping[str, object], float]]) -> tuple[np.ndarray, np.ndarray]:
        """The joint mean and covariance of these cells' true log values, (features, base_log) each, on the
        reference block's scale: shared effects make them covary; the misfit is each cell's own."""
        mean, cov, misfit = self._solve()
        if not items:
            return np.zeros(0), np.zeros((0, 0))
        X = np.array([self._x(f) for f, _ in items])
        return np.array([b for _, b in items]) + X @ mean, X @ cov @ X.T + misfit**2 * np.eye(len(items))

    def offsets(self) -> dict[Hashable, tuple[float, float]]:
        """Each block's offset from the reference block (ln), as fitted: (mean, sd); the reference's is (0, 0)."""
        mean, cov, _ = self._solve()
        p = 1 + len(self._names)
        out = {self.ref: (0.0, 0.0)} if self._blocks else {}
        for i, b in enumerate(self._free(), start=p):
            out[b] = (self._shift(b) + float(mean[i]), math.sqrt(float(cov[i, i])))
        return out

    @property
    def misfit(self) -> float:
        return self._solve()[2]

    @property
    def cells(self) -> int:
        return len(self._rows)

    def effects(self) -> Sequence[tuple[tuple[str, object], float]]:
        """The fitted effect per (axis, value), log scale, after the offset."""
        mean = self._solve()[0]
        return list(zip(self._names, mean[1 : 1 + len(self._names)].tolist()))
