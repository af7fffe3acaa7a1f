"""The step-time model against measurement: each ok H200 record's step time and fixed cost predicted from
its cell and its GPU alone, the constants fitted on the records (`fit_time`), and refitted leaving each
results file out to show how well they carry (`cross_validate_time`)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..record import parse
from ..store import read
from .check import _cell, _pct
from .model import Hardware
from .shapes import shape_of
from .steptime import (
    FITTED_TIME,
    PARTS,
    SETUP_FEATURES,
    START_FEATURES,
    TimeConstants,
    predict_setup,
    predict_start,
    predict_step,
    setup_features,
    start_features,
    step_parts,
)

__all__ = ["TimeCase", "time_cases", "fit_time", "cross_validate_time", "time_summary", "time_text"]

RIDGE = 0.05


@dataclass(frozen=True)
class TimeCase:
    file: str
    cell: object
    hw: Hardware
    step_s: float
    """The record's median step time."""
    setup_s: float | None
    """The worker's setup (model build, engine init)."""
    start_s: float | None
    """Its wall time less setup and its steps' time (steps run x the median): start, first-step extra,
    teardown."""
    spawn: bool
    """Its ranks started as fresh interpreters (not forked from a server that had imported)."""
    wall_s: float | None = None
    """The record's wall time."""
    steps: int = 0
    """Steps it ran (warm-up and measured)."""


def time_cases(paths: Iterable[str | os.PathLike], gpu: str = "H200") -> list[TimeCase]:
    """Every ok record run on one or two GPUs named `gpu` with a median step time, of a known model shape."""
    out = []
    for path in paths:
        for raw in read(path, warn=False):
            if raw.get("status") != "ok":
                continue
            rec = parse(raw)
            prov = rec.provenance
            name = (prov.gpu_name if prov else None) or ""
            step = (raw.get("metrics") or {}).get("step_time_median_s")
            if gpu not in name or not step:
                continue
            cell = _cell(rec.cell)
            if cell.gpus not in (1, 2) or shape_of(cell.model) is None:
                continue
            steps = len(raw.get("step_times_s") or []) or cell.warmup_steps + cell.measured_steps
            wall = raw.get("wall_s")
            setup = (raw.get("worker") or {}).get("setup_s")
            start = wall - steps * step - setup if wall and setup else None
            out.append(
                TimeCase(
                    file=os.path.basename(os.fspath(path)),
                    cell=cell,
                    hw=Hardware(gpu_name=name),
                    step_s=float(step),
                    setup_s=float(setup) if setup else None,
                    start_s=float(start) if start and start > 0 else None,
                    spawn=(raw.get("started_by") or {}).get("mode") != "fork",
                    wall_s=float(wall) if wall else None,
                    steps=steps,
                )
            )
    return out


def solve(rows: Sequence[dict[str, float]], y: Sequence[float], names: Sequence[str], ridge: float) -> dict:
    """Least squares of y on the rows' features, with a small ridge toward 0 on every factor but the first
    (so a factor no fitting record shows stays at 0, the plain case)."""
    import numpy as np

    a = np.array([[r[n] for n in names] for r in rows], dtype=float)
    b = np.array(y, dtype=float)
    reg = np.sqrt(ridge) * np.eye(len(names))
    reg[0, 0] = 0.0
    sol = np.linalg.lstsq(np.vstack([a, reg]), np.concatenate([b, np.zeros(len(names))]), rcond=None)[0]
    return {n: round(float(v), 3) for n, v in zip(names, sol)}


_START = {"compute": 0.7, "params": -2.3, "gather": -2.3, "layers": -3.0}


def _design(cs: Sequence[TimeCase]):
    import numpy as np

    parts = [step_parts(c.cell, c.hw) for c in cs]
    bases = np.array([[p[part][0] for part in PARTS] for p in parts])
    xs = [np.array([p[part][1] for p in parts]) for part in PARTS]
    return bases, xs


def _fit_parts(cs: Sequence[TimeCase], ridge: float = RIDGE, iters: int = 80) -> dict[str, float]:
    """Levenberg-Marquardt on the squared log error of the step time (a sum of exponentials is not linear
    in log space), with a small ridge toward 0 on every factor but each part's intercept."""
    import numpy as np

    bases, xs = _design(cs)
    y = np.log([c.step_s for c in cs])
    sizes = [len(f) for f in PARTS.values()]
    starts = np.cumsum([0, *sizes[:-1]])
    th = np.zeros(sum(sizes))
    th[starts] = list(_START.values())
    reg = np.full(len(th), ridge)
    reg[starts] = 0.0

    def parts_of(t):
        return np.stack([bases[:, i] * np.exp(xs[i] @ t[o : o + n]) for i, (o, n) in enumerate(zip(starts, sizes))], 1)

    def loss(t):
        r = np.log(parts_of(t).sum(1)) - y
        return r @ r + (reg * t**2).sum()

    cur, lam = loss(th), 1e-2
    for _ in range(iters):
        p = parts_of(th)
        total = p.sum(1)
        jac = np.hstack([(p[:, i] / total)[:, None] * xs[i] for i in range(len(sizes))])
        grad = jac.T @ (np.log(total) - y) + reg * th
        hess = jac.T @ jac + np.diag(reg)
        while lam < 1e8:
            step = np.linalg.solve(hess + lam * np.diag(np.diag(hess) + 1e-9), -grad)
            new = loss(th + step)
            if new < cur:
                th, cur, lam = th + step, new, max(lam / 3, 1e-7)
                break
            lam *= 4
        else:
            break
    names = [f"{part}_{f}" for part, feats in PARTS.items() for f in feats]
    return {n: round(float(v), 3) for n, v in zip(names, th)}


def fit_time(cs: Sequence[TimeCase], base: TimeConstants = FITTED_TIME) -> TimeConstants:
    """The step's parts fitted on the records' median step times, the fixed cost by least squares of its
    log on the setup factors."""
    k = _fit_parts(cs)
    setup = [c for c in cs if c.setup_s]
    if setup:
        feats = [setup_features(c.cell) for c in setup]
        k.update(solve(feats, [math.log(c.setup_s) for c in setup], SETUP_FEATURES, RIDGE))
    start = [c for c in cs if c.start_s]
    if start:
        feats = [start_features(c.cell, c.spawn) for c in start]
        k.update(solve(feats, [math.log(c.start_s) for c in start], START_FEATURES, RIDGE))
    return replace(base, **k)


@dataclass(frozen=True)
class TimeRow:
    case: TimeCase
    step: float
    setup: float
    start: float

    @property
    def wall(self) -> float:
        """Predicted wall time for the steps the record ran (adaptive cells stop early)."""
        return self.start + self.setup + self.case.steps * self.step

    @property
    def step_error(self) -> float:
        return self.step / self.case.step_s - 1

    def error(self, which: str) -> float | None:
        measured = getattr(self.case, f"{which}_s")
        return getattr(self, which) / measured - 1 if measured else None


def evaluate_time(cs: Sequence[TimeCase], k: TimeConstants = FITTED_TIME) -> list[TimeRow]:
    return [
        TimeRow(
            c,
            predict_step(c.cell, c.hw, k),
            predict_setup(c.cell, c.hw, k),
            predict_start(c.cell, c.hw, k, spawn=c.spawn),
        )
        for c in cs
    ]


def cross_validate_time(cs: Sequence[TimeCase]) -> list[TimeRow]:
    """Each results file's records predicted with the constants fitted on the other files."""
    out = []
    for f in sorted({c.file for c in cs}):
        k = fit_time([c for c in cs if c.file != f])
        out += evaluate_time([c for c in cs if c.file == f], k)
    return out


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


def time_summary(rows: Sequence[TimeRow], which: str = "step") -> dict:
    errs = [abs(e) for r in rows if (e := r.error(which)) is not None]
    return {"n": len(errs), "median": _pct(errs, 0.5), "p95": _pct(errs, 0.95), "max": max(errs, default=math.nan)}


def category_rows(rows: Sequence[TimeRow], cv: Sequence[TimeRow], which: str) -> list[list[str]]:
    out = [["category", "value", "records", "median |error|", "p95 |error|", "CV median", "CV p95"]]
    for cat in _categories(rows[0].case):
        for val in sorted({_categories(r.case)[cat] for r in rows}):
            a = time_summary([r for r in rows if _categories(r.case)[cat] == val], which)
            b = time_summary([r for r in cv if _categories(r.case)[cat] == val], which)
            out.append(
                [
                    cat,
                    val,
                    str(a["n"]),
                    f"{a['median']:.1%}",
                    f"{a['p95']:.1%}",
                    f"{b['median']:.1%}",
                    f"{b['p95']:.1%}",
                ]
            )
    return out


def _summary_line(label: str, s: dict) -> str:
    return f"  {label}: {s['n']} records, median |error| {s['median']:.1%}, p95 {s['p95']:.1%}, max {s['max']:.1%}"


TITLES = {
    "step": "Step-time model (bench/estimate/steptime.py), median step time:",
    "setup": "Setup time (the worker's setup_s: model build, engine init):",
    "start": "Start and the rest (wall time less setup and the steps' own time):",
    "wall": "Wall time per cell (start + setup + steps x step time):",
}


def time_text(rows: Sequence[TimeRow], cv: Sequence[TimeRow]) -> str:
    """The step-time model's check: per quantity, in-sample and cross-validated errors, then per category."""
    from .check import text_table

    lines = []
    for which, title in TITLES.items():
        lines += ["", title]
        lines.append(_summary_line("in-sample", time_summary(rows, which)))
        lines.append(_summary_line("cross-validated (leave one results file out)", time_summary(cv, which)))
        lines += ["", text_table(category_rows(rows, cv, which))]
    return "\n".join(lines)
