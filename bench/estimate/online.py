"""A model's prediction corrected by what a run has measured so far: the prior model (the step-time or the
memory model) gives each cell a base value; this fits, on the log scale, an offset for the machine plus one
additive effect per axis value to the measured cells' residuals (log measured - log base), as a Bayesian
linear model with a Gaussian prior on each effect. It answers, for any cell of the matrix, the log value
and its standard deviation: where nothing was measured, the base with the prior's width; where cells like it
were measured, what they showed.

Why additive on the log scale: a knob multiplies throughput (and, roughly, memory) by a factor that holds
across the rest of the settings to first order; what does not (interactions) is the misfit term, which
the fit estimates from its own residuals. numpy only (the orchestrator never imports torch).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Online"]


@dataclass
class Online:
    """prior_sd: how far (log) the base may be off for one axis value's effect; offset_sd: for the machine as
    a whole (a GPU the base model never saw, a CPU); noise_sd: one measurement's spread (log) around the
    cell's true value; misfit_sd: the least interaction left after the additive effects."""

    prior_sd: float
    offset_sd: float
    noise_sd: float
    misfit_sd: float = 0.0
    _names: list[tuple[str, object]] = field(default_factory=list)
    _fit: tuple | None = None
    _rows: list[tuple[Mapping[str, object], float, float, float]] = field(default_factory=list)

    def observe(self, features: Mapping[str, object], base_log: float, measured_log: float, n: int = 1) -> None:
        """One cell's measurement (the mean of n) against its base."""
        self._rows.append((features, base_log, measured_log, n))
        for k, v in features.items():
            if (k, v) not in self._names:
                self._names.append((k, v))
        self._fit = None

    def _x(self, features: Mapping[str, object]) -> np.ndarray:
        return np.array([1.0] + [1.0 if features.get(k) == v else 0.0 for k, v in self._names])

    def _solve(self) -> tuple:
        if self._fit is None:
            p = 1 + len(self._names)
            prior = np.array([1 / self.offset_sd**2] + [1 / self.prior_sd**2] * (p - 1))
            if not self._rows:
                self._fit = (np.zeros(p), np.diag(1 / prior), self.misfit_sd)
                return self._fit
            X = np.array([self._x(f) for f, *_ in self._rows])
            y = np.array([m - b for _, b, m, _ in self._rows])
            var = np.array([self.noise_sd**2 / n + self.misfit_sd**2 for *_, n in self._rows])
            A = X.T @ (X / var[:, None]) + np.diag(prior)
            cov = np.linalg.inv(A)
            mean = cov @ (X.T @ (y / var))
            self._fit = (mean, cov, self._misfit(X, y, mean))
        return self._fit

    def _misfit(self, X: np.ndarray, y: np.ndarray, mean: np.ndarray) -> float:
        """The interaction the additive effects leave: the residuals' spread beyond the measurement noise,
        counted only once there are more cells than effects (else the fit explains everything)."""
        n, p = X.shape
        if n <= p:
            return self.misfit_sd
        rss = float(((y - X @ mean) ** 2).sum()) / (n - p)
        noise = float(np.mean([self.noise_sd**2 / r[3] for r in self._rows]))
        return max(self.misfit_sd, math.sqrt(max(0.0, rss - noise)))

    def predict(self, features: Mapping[str, object], base_log: float) -> tuple[float, float]:
        """The cell's true log value: mean and standard deviation (the effects' uncertainty and the misfit;
        not a future measurement's noise)."""
        mean, cov, misfit = self._solve()
        x = self._x(features)
        return base_log + float(x @ mean), math.sqrt(float(x @ cov @ x) + misfit**2)

    @property
    def misfit(self) -> float:
        return self._solve()[2]

    @property
    def cells(self) -> int:
        return len(self._rows)

    def effects(self) -> Sequence[tuple[tuple[str, object], float]]:
        """The fitted effect per (axis, value), log scale, after the offset."""
        mean = self._solve()[0]
        return list(zip(self._names, mean[1:].tolist()))
