"""A model's prediction corrected by what a run has measured so far: the prior model (the step-time or the
memory model) gives each cell a base value; this fits, on the log scale, an offset for the machine, one
additive effect per axis value (and, with pair_sd, one per pair of axis values: two knobs whose effects do not
multiply) and an offset per block to the measured cells' residuals (log measured - log base), as a Bayesian
linear model with a Gaussian prior on each. It answers, for any cell of the matrix, the log value and its
standard deviation: where nothing was measured, the base with the prior's width; where cells like it were
measured, what they showed.

Blocks: measurements come in blocks, one run part on one machine (bench.records.record.Record.block), and a machine
is faster or slower as a whole. Each block but the reference has an offset whose prior is what the anchors
say of it (cells measured in that block and another: bench.judge.blocks.offsets, given through `anchor`): tied
blocks start from the anchors' estimate and its uncertainty, an untied one from a wide prior, so its cells
still teach the knobs' effects (their differences within the block) without setting the level. A prediction
is on the reference block's scale unless a block is asked for.

Why additive on the log scale: a knob multiplies throughput (and, roughly, memory) by a factor that holds across the
rest of the settings to first order; two knobs that do not (ZeRO-3 at a small micro-batch) are a pair effect, shared by
every cell with both values, so measuring one such cell teaches its neighbours. What is left, each cell's own, is the
misfit. With `learn_misfit` the misfit is estimated from the measured cells' residuals: the value that makes them
likeliest under the model (its effects integrated out), with a weak prior around `misfit_sd` (MISFIT_WIDTH), so it
shrinks where the cells follow the effects (never below `misfit_floor`) and grows where they do not; without, the
residuals' spread beyond the noise, never below misfit_sd. numpy only (the orchestrator never imports torch).

Host speed: a machine's host (CPU, launch, Python) is faster or slower than the typical one the base model
was fitted on, and it moves a cell by how much of its step waits on the host (its host share: 0 where the
GPU's work hides the host, 1 where the step is all host). With host_sd, each block has a host term with that
prior width, entering a cell's value times its share (features[SHARE]): one offset per block cannot move a
host-bound cell and a GPU-bound one apart, and two machines whose hosts differ do exactly that (the same
LoRA cells 17-26% apart, the GPU-bound ones level).

`declare(features)` gives every axis value (and pair) of the cells a parameter before anything is measured, so
a cell with a value no measured cell has carries that value's prior width, shared with the other cells that
have it. `posterior(items)` gives the joint mean and covariance of a set of unmeasured cells' values and
`draws(items, n, rng)` draws from it, for rules that judge several cells at once.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["MISFIT_WIDTH", "SHARE", "Online"]

MISFIT_WIDTH = 1.0
"""The learned misfit's prior: log-normal around misfit_sd with this sd (a factor e either way at one sd)."""
SHARE = "~host_share"
"""The features key of a cell's host share (0 to 1): a number, not an axis value (host_sd)."""
_GRID = np.exp(np.linspace(-4.0, 3.0, 36))  # multiples of misfit_sd the likelihood is evaluated at


@dataclass
class _Row:
    features: Mapping[str, object]
    base: float
    log: float
    noise_var: float  # the measurement's variance (a mean of n: over n)
    block: Hashable
    cell: Hashable = None  # the cell measured: its measurements share its misfit (None: a cell of its own)


@dataclass
class Online:
    """prior_sd: how far (log) the base may be off for one axis value's effect; offset_sd: for the machine as
    a whole (a GPU the base model never saw, a CPU); noise_sd: one measurement's spread (log) around the
    cell's true value, where observe() is not told its own; misfit_sd: the least interaction left after the
    effects (learn_misfit: the prior guess of it); pair_sd: how far one pair of axis values may be off (0: no
    pair effects); host_sd: how far a block's host may be from the typical host's, the term a cell takes times its
    host share (0: no host terms); misfit_floor: the least misfit learn_misfit may learn; family_axes and
    family_pair_sd: a pair with a value of one of these axes (what a cell family is: PEFT mode, offload) may be
    off by family_pair_sd instead: a knob's effect differs from one family to another far more than from one
    knob's value to another's."""

    prior_sd: float
    offset_sd: float
    noise_sd: float
    misfit_sd: float = 0.0
    pair_sd: float = 0.0
    learn_misfit: bool = False
    host_sd: float = 0.0
    misfit_floor: float = 0.0
    family_axes: tuple[str, ...] = ()
    family_pair_sd: float = 0.0
    _terms: list[tuple] = field(default_factory=list)  # (axis, value) or a pair of them, in column order
    _index: dict[tuple, int] = field(default_factory=dict)  # term -> its column (the intercept is column 0)
    _codes: dict[int, tuple] = field(default_factory=dict)  # id(features) -> (features, columns)
    _fit: tuple | None = None
    _rows: list[_Row] = field(default_factory=list)
    _anchored: dict[Hashable, tuple[float, float]] = field(default_factory=dict)  # block -> anchors' (mean, var)
    _blocks: list[Hashable] = field(default_factory=list)  # in the order first seen

    # -- the parameters ---------------------------------------------------------------------------------------

    def _wanted(self, features: Mapping[str, object]) -> list[tuple]:
        mains = sorted(((k, v) for k, v in features.items() if v is not None and k != SHARE), key=lambda kv: kv[0])
        pairs = list(itertools.combinations(mains, 2)) if self.pair_sd > 0 else []
        return mains + pairs

    def declare(self, cells: Sequence[Mapping[str, object]]) -> None:
        """Give every axis value (and pair) these cells have a parameter, before anything is measured."""
        for f in cells:
            self._columns(f, add=True)

    def _columns(self, features: Mapping[str, object], add: bool = False) -> np.ndarray:
        """The columns of a cell's terms (the ones with a parameter; add: give the others one)."""
        hit = self._codes.get(id(features))
        if hit is not None and hit[0] is features:
            return hit[1]
        cols = []
        for t in self._wanted(features):
            if t not in self._index and add:
                self._index[t] = len(self._terms) + 1
                self._terms.append(t)
                self._codes.clear()  # an earlier cell's columns may now be short
                self._fit = None
            if t in self._index:
                cols.append(self._index[t])
        out = np.array([0] + cols, dtype=np.intp)
        self._codes[id(features)] = (features, out)
        return out

    def _design(self, items: Sequence[Mapping[str, object]], blocks: Sequence[Hashable] = ()) -> np.ndarray:
        """The cells' rows of the design matrix: the machine, their terms and each one's block if given (0/1),
        then its block's host term (the reference block's if none is given or the block is new) times its share."""
        free = {b: i for i, b in enumerate(self._free(), start=1 + len(self._terms))}
        hosts = {b: i for i, b in enumerate(self._hosts(), start=1 + len(self._terms) + len(free))}
        cols = [self._columns(f) for f in items]
        X = np.zeros((len(items), 1 + len(self._terms) + len(free) + len(hosts)))
        if cols:
            X[np.repeat(np.arange(len(cols)), [len(c) for c in cols]), np.concatenate(cols)] = 1.0
        for i, b in enumerate(blocks):
            if b in free:
                X[i, free[b]] = 1.0
        if hosts:
            at = [hosts.get(b, hosts[self.ref]) for b in blocks] if blocks else [hosts[self.ref]] * len(items)
            X[np.arange(len(items)), at] = [float(f.get(SHARE) or 0.0) for f in items]
        return X

    # -- what was measured ------------------------------------------------------------------------------------

    def observe(
        self,
        features: Mapping[str, object],
        base_log: float,
        measured_log: float,
        n: int = 1,
        *,
        block: Hashable = None,
        noise_sd: float | None = None,
        cell: Hashable = None,
    ) -> None:
        """One measurement (the mean of n) of a cell against its base, in a block, with its noise (default
        noise_sd). Each measurement is a row of its own; the measurements of one `cell` (a key) share its misfit,
        so measuring a cell again narrows its noise, not what the effects leave of it (None: no other row shares
        it)."""
        sd = self.noise_sd if noise_sd is None else noise_sd
        self._columns(features, add=True)
        self._rows.append(_Row(features, base_log, measured_log, sd**2 / n, block, cell))
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

    def _hosts(self) -> list[Hashable]:
        """The blocks with a host term: the reference (even before anything is measured), then the others."""
        return [self.ref, *self._free()] if self.host_sd > 0 else []

    def _shift(self, block: Hashable) -> float:
        """The anchors' estimate of a block's offset, which its parameter is measured from."""
        return self._anchored.get(block, (0.0, 0.0))[0] if block != self.ref else 0.0

    def _term_sd(self, t: tuple) -> float:
        if not isinstance(t[0], tuple):
            return self.prior_sd
        family = self.family_pair_sd and (t[0][0] in self.family_axes or t[1][0] in self.family_axes)
        return self.family_pair_sd if family else self.pair_sd

    def _prior_var(self) -> np.ndarray:
        """Each parameter's prior variance: the machine, each term (an axis value, a pair), each block, each
        block's host."""
        terms = [self._term_sd(t) ** 2 for t in self._terms]
        blocks = [max(self._anchored.get(b, (0.0, self.offset_sd**2))[1], 1e-12) for b in self._free()]
        return np.array([self.offset_sd**2] + terms + blocks + [self.host_sd**2] * len(self._hosts()))

    # -- the fit, in the measurements' space (a few rows, many parameters) ---------------------------------------

    def _solve(self) -> tuple:
        """(design of the rows, prior variances, Cholesky factor of the rows' covariance, its inverse times the
        residuals, the misfit). The parameters' posterior follows from them (_theta): with n rows and p
        parameters this costs n^3 and n^2 p rather than p^3."""
        if self._fit is None:
            v = self._prior_var()
            rows = self._rows
            X = self._design([r.features for r in rows], [r.block for r in rows])
            y = np.array([r.log - r.base - self._shift(r.block) for r in rows])
            noise = np.array([r.noise_var for r in rows])
            G = (X * v) @ X.T + np.diag(noise)
            S = self._same()
            misfit = (
                _learned(G, y, S, self.misfit_sd, self.misfit_floor) if self.learn_misfit and rows else self.misfit_sd
            )
            L, alpha = _factor(G + misfit**2 * S, y)
            if rows and not self.learn_misfit:
                misfit = self._misfit(X, y, (v * X).T @ alpha, noise)
                L, alpha = _factor(G + misfit**2 * S, y)
            self._fit = (X, v, L, alpha, misfit)
        return self._fit

    def _same(self) -> np.ndarray:
        """Which rows share a misfit: 1 where two rows measure the same cell (and on the diagonal)."""
        out = np.eye(len(self._rows))
        for rows in self._rows_of().values():
            out[np.ix_(rows, rows)] = 1.0
        return out

    def _misfit(self, X: np.ndarray, y: np.ndarray, mean: np.ndarray, noise: np.ndarray) -> float:
        """The interaction the effects leave: the residuals' spread beyond the measurement noise, counted only
        once there are more cells measured than parameters (else the fit explains everything; a cell's repeats
        say nothing of it); never below misfit_sd."""
        p = X.shape[1]
        n = len({r.cell if r.cell is not None else ("row", i) for i, r in enumerate(self._rows)})
        if n <= p:
            return self.misfit_sd
        rss = float(((y - X @ mean) ** 2).sum()) / (len(y) - p)
        return max(self.misfit_sd, math.sqrt(max(0.0, rss - float(noise.mean()))))

    def _cross(self, Xm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For cells' design rows: their prior covariance with the measurements (m x n), and that times the
        measurements' covariance's inverse root (W = L^-1 K_nm, n x m)."""
        X, v, L, _, _ = self._solve()
        K = (Xm * v) @ X.T
        W = np.linalg.solve(L, K.T) if len(L) else np.zeros((0, len(Xm)))
        return K, W

    # -- what it says of a cell -------------------------------------------------------------------------------

    def _items(self, items: Sequence[tuple[Mapping[str, object], float]], block: Hashable = None) -> np.ndarray:
        return self._design([f for f, _ in items], [block] * len(items) if block is not None else ())

    def marginals(
        self, items: Sequence[tuple[Mapping[str, object], float]], block: Hashable = None, cells: Sequence = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each cell's true log value on the reference block's scale (or on `block`'s): mean and standard deviation
        (the effects' uncertainty and the misfit; not a future measurement's noise). cells: per item, the key it
        was observed under, as draws() takes it: a measured cell's misfit is the one its own rows share."""
        if not items:
            return np.zeros(0), np.zeros(0)
        X, v, L, alpha, misfit = self._solve()
        Xm = self._items(items, block)
        K = (Xm * v) @ X.T
        rows = self._rows_of()
        for i, key in enumerate(cells):
            if key in rows:  # its truth shares its misfit with its own rows
                K[i, rows[key]] += misfit**2
        W = np.linalg.solve(L, K.T) if len(L) else np.zeros((0, len(Xm)))
        base = np.array([b for _, b in items]) + self._shift(block)
        var = (Xm * Xm) @ v - (W * W).sum(axis=0) + misfit**2
        return base + K @ alpha, np.sqrt(np.maximum(var, 0.0))

    def predict(self, features: Mapping[str, object], base_log: float, block: Hashable = None) -> tuple[float, float]:
        """One cell's marginals()."""
        m, sd = self.marginals([(features, base_log)], block)
        return float(m[0]), float(sd[0])

    def posterior(self, items: Sequence[tuple[Mapping[str, object], float]]) -> tuple[np.ndarray, np.ndarray]:
        """The joint mean and covariance of these cells' true log values, (features, base_log) each, on the
        reference block's scale: shared effects make them covary; the misfit is each cell's own, drawn afresh
        (cells not measured)."""
        if not items:
            return np.zeros(0), np.zeros((0, 0))
        _, v, _, alpha, misfit = self._solve()
        Xm = self._items(items)
        K, W = self._cross(Xm)
        cov = (Xm * v) @ Xm.T - W.T @ W + misfit**2 * np.eye(len(items))
        return np.array([b for _, b in items]) + K @ alpha, cov

    def draws(
        self,
        items: Sequence[tuple[Mapping[str, object], float]],
        n: int,
        rng: np.random.Generator,
        cells: Sequence[Hashable] = (),
    ) -> np.ndarray:
        """n draws (rows) of these cells' true log values from the joint posterior: the parameters they have drawn
        together (cells that share a value share its draw), the misfit per cell, drawn afresh for a cell not
        measured. cells: per item, the key it was observed under (None or absent: not measured; items under one key
        share one draw of the misfit, bench.execute.answer.collapse's classes); a measured cell's
        misfit is drawn given the parameters' draw and its own measurements (_misfit_given), so its value is its
        measurements pulled towards what the model says of it, by as much as its noise against the misfit."""
        if not items:
            return np.zeros((n, 0))
        X, v, L, alpha, misfit = self._solve()
        Xm = self._items(items)
        rows = {key: js for key, js in self._rows_of().items() if key in set(cells)}
        taken = np.concatenate([js for js in rows.values()]) if rows else np.zeros(0, dtype=np.intp)
        used = np.flatnonzero(Xm.any(axis=0) | X[taken].any(axis=0))
        W = np.linalg.solve(L, X[:, used] * v[used]) if len(L) else np.zeros((0, len(used)))
        mean = v[used] * (X[:, used].T @ alpha) if len(alpha) else np.zeros(len(used))
        cov = np.diag(v[used]) - W.T @ W
        root = np.linalg.cholesky(cov + 1e-12 * np.eye(len(used)))
        theta = mean + rng.standard_normal((n, len(used))) @ root.T
        base = np.array([b for _, b in items])
        own = misfit * rng.standard_normal((n, len(items)))
        shared: dict = {}  # items under one key share its misfit's draw (bench.execute.answer.collapse's classes)
        for i, key in enumerate(cells):
            if key in rows and key not in shared:
                shared[key] = self._misfit_given(rows[key], theta, X[:, used], misfit, rng)
            if key is not None:
                own[:, i] = shared.setdefault(key, own[:, i])
        return base + theta @ Xm[:, used].T + own

    def _rows_of(self) -> dict[Hashable, np.ndarray]:
        """The rows of each measured cell (by its key)."""
        at: dict = {}
        for j, r in enumerate(self._rows):
            if r.cell is not None:
                at.setdefault(r.cell, []).append(j)
        return {k: np.array(js, dtype=np.intp) for k, js in at.items()}

    def _misfit_given(
        self, js: np.ndarray, theta: np.ndarray, X: np.ndarray, misfit: float, rng: np.random.Generator
    ) -> np.ndarray:
        """Per draw of the parameters (theta, over X's columns), a draw of one measured cell's misfit given its rows
        js: each row is the parameters' sum plus the misfit plus its noise, so given the parameters the misfit is
        normal, its precision the prior's plus each row's."""
        noise = np.array([self._rows[j].noise_var for j in js])
        y = np.array([self._rows[j].log - self._rows[j].base - self._shift(self._rows[j].block) for j in js])
        var = 1.0 / (1.0 / max(misfit * misfit, 1e-12) + (1.0 / noise).sum())
        mean = var * ((y[None, :] - theta @ X[js].T) / noise[None, :]).sum(axis=1)
        return mean + math.sqrt(var) * rng.standard_normal(len(theta))

    def _theta(self, cols: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The posterior mean and variance of these parameters."""
        X, v, L, alpha, _ = self._solve()
        cols = np.asarray(cols, dtype=np.intp)
        mean = v[cols] * (X[:, cols].T @ alpha) if len(alpha) else np.zeros(len(cols))
        W = np.linalg.solve(L, X[:, cols] * v[cols]) if len(L) else np.zeros((0, len(cols)))
        return mean, v[cols] - (W * W).sum(axis=0)

    def offsets(self) -> dict[Hashable, tuple[float, float]]:
        """Each block's offset from the reference block (ln), as fitted: (mean, sd); the reference's is (0, 0)."""
        free = self._free()
        out = {self.ref: (0.0, 0.0)} if self._blocks else {}
        if free:
            mean, var = self._theta(range(1 + len(self._terms), 1 + len(self._terms) + len(free)))
            for b, m, s in zip(free, mean, var):
                out[b] = (self._shift(b) + float(m), math.sqrt(max(float(s), 0.0)))
        return out

    @property
    def misfit(self) -> float:
        return self._solve()[4]

    def effects(self) -> Sequence[tuple[tuple[str, object], float]]:
        """The fitted effect per (axis, value), log scale, after the offset (pairs left out)."""
        mains = [(t, i) for t, i in self._index.items() if not isinstance(t[0], tuple)]
        mean, _ = self._theta([i for _, i in mains])
        return [(t, float(m)) for (t, _), m in zip(mains, mean)]


def _factor(C: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    L = np.linalg.cholesky(C) if len(y) else np.zeros((0, 0))
    alpha = np.linalg.solve(L.T, np.linalg.solve(L, y)) if len(y) else np.zeros(0)
    return L, alpha


def _learned(G: np.ndarray, y: np.ndarray, S: np.ndarray, misfit_sd: float, misfit_floor: float) -> float:
    """The misfit that makes the residuals likeliest, the effects integrated out (y ~ N(0, X V X' + noise +
    misfit^2 S), S: which rows measure one cell), times its log-normal prior around misfit_sd: the most
    probable value on a grid, or misfit_floor where that is less."""

    def score(k: int) -> float:
        m = misfit_sd * _GRID[k]
        try:
            L = np.linalg.cholesky(G + m * m * S)
        except np.linalg.LinAlgError:
            return -math.inf
        z = np.linalg.solve(L, y)
        return -float(np.log(np.diag(L)).sum()) - 0.5 * float(z @ z) - 0.5 * (math.log(_GRID[k]) / MISFIT_WIDTH) ** 2

    # The score is unimodal in the misfit: narrow the bracket on the grid until it is two steps wide.
    lo, hi, seen = 0, len(_GRID) - 1, {}
    while hi - lo > 2:
        a, b = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        for k in (a, b):
            seen.setdefault(k, score(k))
        lo, hi = (lo, b) if seen[a] >= seen[b] else (a, hi)
    best = max(range(lo, hi + 1), key=lambda k: seen.setdefault(k, score(k)))
    return max(misfit_floor, float(misfit_sd * _GRID[best]))  # unimodal: the likeliest above the floor
