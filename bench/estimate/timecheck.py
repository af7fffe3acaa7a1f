"""The step-time model against measurement: each ok H200 record's step time and fixed cost predicted from
its cell and its GPU alone, the constants fitted on the records (`fit_time`), and refitted leaving each
results file out to show how well they carry (`cross_validate_time`); that held-out error published as the
band a search reads (`error_band`, checked on files it was not derived from by `band_coverage`). A record
with an injected fault is neither fitted nor checked on (EXCLUDED), and the check says how many."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace

from ..record import parse
from ..store import read
from .band import BAND_COVERAGE, FAMILIAR_FILES
from .check import _cell, _ds_config, _pct, fitted_on
from .model import Hardware
from .shapes import shape_of
from .steptime import (
    FITTED_TIME,
    OVERLAP,
    PARTS,
    SETUP_FEATURES,
    START_FEATURES,
    STEP_NAMES,
    TimeConstants,
    combine,
    predict_setup,
    predict_start,
    predict_step,
    setup_features,
    start_features,
    step_parts,
    traits,
)

__all__ = [
    "TimeCase",
    "band_coverage",
    "cross_validate_time",
    "error_band",
    "fit_time",
    "literals",
    "time_cases",
    "time_summary",
    "time_text",
]

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
    ds_config: dict | None = None
    """The DeepSpeed config it ran with (as zerobench builds it for the cell, else the record's)."""


EXCLUDED = "a fault injected (ZEROBENCH_FAULT): a deliberately slowed or burdened run, not the cell's time"
"""Why an otherwise usable record is neither fitted nor checked on (the one rule, applied to every record)."""


def time_cases(
    paths: Iterable[str | os.PathLike],
    gpu: str = "H200",
    excluded: list[tuple[str, str]] | None = None,
    *,
    unfitted: bool = False,
) -> list[TimeCase]:
    """Every ok record run on one or two GPUs named `gpu` with a median step time, of a known model shape,
    less those EXCLUDED says (appended to `excluded` as (file, cell id) where a list is given); of the files
    in UNFITTED_FILES only with `unfitted` (to score the predictions made before they ran)."""
    out = []
    for path in paths:
        if not unfitted and not fitted_on(path):
            continue
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
            if cell.gpus not in (1, 2) or cell.nodes > 1 or shape_of(cell.model) is None:
                continue
            if rec.worker and rec.worker.fault_injected:
                if excluded is not None:
                    excluded.append((os.path.basename(os.fspath(path)), cell.id))
                continue
            steps = len(raw.get("step_times_s") or []) or cell.warmup_steps + cell.measured_steps
            wall = raw.get("wall_s")
            setup = (raw.get("worker") or {}).get("setup_s")
            start = wall - steps * step - setup if wall and setup else None
            out.append(
                TimeCase(
                    file=os.path.basename(os.fspath(path)),
                    cell=cell,
                    hw=Hardware(
                        gpu_memory_bytes=prov.gpus[0].memory_bytes if prov and prov.gpus else None,
                        gpu_name=name,
                        host_cores=(prov.cpu_count if prov else None) or None,
                    ),
                    step_s=float(step),
                    setup_s=float(setup) if setup else None,
                    start_s=float(start) if start and start > 0 else None,
                    spawn=(raw.get("started_by") or {}).get("mode") != "fork",
                    wall_s=float(wall) if wall else None,
                    steps=steps,
                    ds_config=_ds_config(cell, rec.ds_config),
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


# The step's fit: least squares of the log step time (a record's error counts as its ratio, whatever its
# size); a ridge of STEP_RIDGE pulls every factor toward 0 (a factor no fitting record shows stays at the plain
# case) or toward its FACTOR_PRIOR, and one of PRIOR_WEIGHT pulls each part's intercept, weakly, toward its
# PRIOR: the order its physics gives (a part no fitting record has stays there).
STEP_RIDGE = 0.03
PRIOR_WEIGHT = 0.01
PRIOR = {
    "compute": 0.9,  # 40% of the peak
    "activations": -1.5,  # each element read or written once at the H200's 4.8 TB/s
    "adapter": 0.0,
    "dequant": -5.0,
    "params": -3.7,  # a fused Adam at a fifth of the GPU's memory bandwidth
    "host": 0.0,  # one second per billion parameters at 16 cores
    "pcie": -3.9,  # 50 GB/s
    "nvme": -0.7,  # 2 GB/s
    "tensors": -4.6,  # 0.1 ms per tensor
    "launch": -3.2,  # 0.4 ms per layer and pass: some 40 kernels at 10 us of host time each
    "wrappers": -2.3,  # 0.1 ms per adapted linear and pass: ten kernels and the Python around them
    "gather": -3.5,
    "layers": -2.3,  # 1 ms per layer
}


# Priors on factors beyond the plain case, where the maker publishes the ratio: torch's AdamW on the host
# against DeepSpeed's CPU Adam, "5X-7X faster than the standard PyTorch implementation" (DeepSpeed's
# ZeRO-Offload tutorial); Liger's kernels "increase multi-GPU training throughput by 20%" (Liger-Kernel's
# README).
FACTOR_PRIOR = {"host_torch_adam": math.log(6.0), "compute_liger": -math.log(1.2)}


def _design(cs: Sequence[TimeCase]):
    """The parts' bases (records x parts) and each part's features mapped onto the constants (parts x
    records x constants)."""
    import numpy as np

    index = {n: i for i, n in enumerate(STEP_NAMES)}
    parts = [step_parts(c.cell, c.hw, c.ds_config) for c in cs]
    bases = np.array([[p[part][0] for part in PARTS] for p in parts])
    xs = np.zeros((len(PARTS), len(cs), len(STEP_NAMES)))
    for i, (part, names) in enumerate(PARTS.items()):
        for j, n in enumerate(names):
            xs[i, :, index[n]] = [p[part][1][j] for p in parts]
    return bases, xs


def _levenberg_marquardt(bases, xs, y, th, prior, reg, p: float, iters: int = 100):
    """Minimise the loss above from th, with the parts combined at overlap p (bench.estimate.steptime.combine)."""
    import numpy as np

    def parts_of(t):
        return bases * np.exp(np.clip(np.einsum("pnk,k->np", xs, t), -40, 40))

    def loss(t):
        r = np.log(combine(dict(zip(PARTS, parts_of(t).T)), p)[0]) - y
        return (r * r).sum() + (reg * (t - prior) ** 2).sum()

    cur, lam = loss(th), 1e-2
    for _ in range(iters):
        secs = parts_of(th)
        total, slope = combine(dict(zip(PARTS, secs.T)), p)
        r = np.log(total) - y
        share = np.stack([slope[part] * secs[:, i] / total for i, part in enumerate(PARTS)], 1)
        jac = np.einsum("np,pnk->nk", share, xs)
        grad = jac.T @ r + reg * (th - prior)
        hess = jac.T @ jac + np.diag(reg)
        while lam < 1e8:
            new_th = th + np.linalg.solve(hess + lam * np.diag(np.diag(hess) + 1e-9), -grad)
            new = loss(new_th)
            if new < cur:
                th, cur, gain, lam = new_th, new, cur - new, max(lam / 3, 1e-7)
                break
            lam *= 4
        else:
            break
        if gain < 1e-8 * max(cur, 1.0):
            break
    return th


def _fit_parts(cs: Sequence[TimeCase]) -> dict[str, float]:
    """The step's constants: Levenberg-Marquardt in log space (a sum of exponentials is not linear there),
    first with the parts summed, then from there with the overlap (the smooth maximum has flat directions
    a fit from the priors can stall in)."""
    import numpy as np

    bases, xs = _design(cs)
    y = np.log([c.step_s for c in cs])
    intercepts = [STEP_NAMES.index(f"{part}_one") for part in PARTS]
    prior = np.zeros(len(STEP_NAMES))
    prior[intercepts] = [PRIOR[part] for part in PARTS]
    for n, v in FACTOR_PRIOR.items():
        prior[STEP_NAMES.index(n)] = v
    reg = np.full(len(STEP_NAMES), STEP_RIDGE)
    reg[intercepts] = PRIOR_WEIGHT
    th = prior.copy()
    for p in (1.0, OVERLAP):
        th = _levenberg_marquardt(bases, xs, y, th, prior, reg, p)
    return {n: round(float(v), 3) for n, v in zip(STEP_NAMES, th)}


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
            predict_step(c.cell, c.hw, k, c.ds_config),
            predict_setup(c.cell, c.hw, k),
            predict_start(c.cell, c.hw, k, spawn=c.spawn),
        )
        for c in cs
    ]


def cross_validate_time(cs: Sequence[TimeCase]) -> list[TimeRow]:
    """Each results file's records predicted with the constants fitted on the other files (none from a single
    file: nothing is left to fit on)."""
    out = []
    for f in sorted({c.file for c in cs}):
        if all(c.file == f for c in cs):
            break
        k = fit_time([c for c in cs if c.file != f])
        out += evaluate_time([c for c in cs if c.file == f], k)
    return out


# -- the error band (bench.estimate.band) ------------------------------------------------------------------
def trait_files(cs: Sequence[TimeCase]) -> dict[str, int]:
    """Results files each trait (bench.estimate.steptime.traits) appears in."""
    return _count_files([(c.file, traits(c.cell, c.ds_config)) for c in cs])


def _count_files(pairs: Sequence[tuple[str, frozenset[str]]], skip: str | None = None) -> dict[str, int]:
    files: dict[str, set[str]] = {}
    for f, ts in pairs:
        if f != skip:
            for t in ts:
                files.setdefault(t, set()).add(f)
    return {t: len(f) for t, f in sorted(files.items())}


def _held_out_groups(cs: Sequence[TimeCase], cv: Sequence[TimeRow]) -> list[str]:
    """Each cross-validated row's band group as its fold saw it: traits counted over the other files."""
    pairs = [(c.file, traits(c.cell, c.ds_config)) for c in cs]
    by_file = {f: _count_files(pairs, skip=f) for f in {r.case.file for r in cv}}
    mine = [traits(r.case.cell, r.case.ds_config) for r in cv]
    return [
        "familiar" if all(by_file[r.case.file].get(t, 0) >= FAMILIAR_FILES for t in ts) else "unfamiliar"
        for r, ts in zip(cv, mine)
    ]


def _band_stats(logs: Sequence[float]) -> dict[str, float]:
    """log(measured / predicted) of a group's held-out records -> the band's numbers."""
    a = [abs(x) for x in logs]
    q = (1 - BAND_COVERAGE) / 2
    return {
        "n": len(logs),
        "median": round(_pct(a, 0.5), 4),
        "p95": round(_pct(a, 0.95), 4),
        "low": round(_pct(list(logs), q), 4),
        "high": round(_pct(list(logs), 1 - q), 4),
    }


def _log_misses(cv: Sequence[TimeRow]) -> list[float]:
    return [math.log(r.case.step_s / r.step) for r in cv]


def error_band(cs: Sequence[TimeCase], cv: Sequence[TimeRow]) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """STEP_BAND and TRAIT_FILES from the cross-validated rows `cv` of the cases `cs`: per group, the held-out
    errors; a group no held-out record fell in takes the widest of the others."""
    groups, logs = _held_out_groups(cs, cv), _log_misses(cv)
    band = {g: _band_stats([x for x, h in zip(logs, groups) if h == g]) for g in ("familiar", "unfamiliar")}
    wide = max((b for b in band.values() if b["n"]), key=lambda b: b["high"] - b["low"])
    return {g: b if b["n"] else {**wide, "n": 0} for g, b in band.items()}, trait_files(cs)


def band_coverage(cs: Sequence[TimeCase], cv: Sequence[TimeRow]) -> dict[str, tuple[int, int]]:
    """How the band carries to records it was not derived from: each file's held-out errors against the band
    derived from the other files' held-out errors. Per group and "all": (records inside, records)."""
    groups, logs = _held_out_groups(cs, cv), _log_misses(cv)
    files = [r.case.file for r in cv]
    out: dict[str, list[int]] = {}
    for f in sorted(set(files)):
        others = [(x, g) for x, g, ff in zip(logs, groups, files) if ff != f]
        band = {g: _band_stats([x for x, h in others if h == g]) for g in ("familiar", "unfamiliar")}
        for x, g, ff in zip(logs, groups, files):
            if ff == f:
                b = band[g] if band[g]["n"] else max(band.values(), key=lambda b: b["high"] - b["low"])
                for key in (g, "all"):
                    hit = out.setdefault(key, [0, 0])
                    hit[0] += b["low"] <= x <= b["high"]
                    hit[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def literals(cs: Sequence[TimeCase]) -> str:
    """The step-time model's literals (steptime's _FIT, STEP_BAND, TRAIT_FILES) fitted on `cs`, as Python."""
    k = fit_time(cs)
    band, files = error_band(cs, cross_validate_time(cs))
    fit = "".join(f'    "{f.name}": {getattr(k, f.name)!r},\n' for f in fields(k))
    bands = "".join(f'    "{g}": {b!r},\n'.replace("'", '"') for g, b in band.items())
    traits_ = "".join(f'    "{t}": {n},\n' for t, n in files.items())
    return (
        f"_FIT: dict[str, float] = {{\n{fit}}}\n"
        f"STEP_BAND: dict[str, dict[str, float]] = {{\n{bands}}}\n"
        f"TRAIT_FILES: dict[str, int] = {{\n{traits_}}}\n"
    )


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


def _band_lines(cs: Sequence[TimeCase], cv: Sequence[TimeRow]) -> list[str]:
    band, _ = error_band(cs, cv)
    cover = band_coverage(cs, cv)
    lines = ["", f"Step-time band (bench/estimate/band.py, {BAND_COVERAGE:.0%} of held-out records inside):"]
    for g, b in band.items():
        inside, n = cover.get(g, (0, 0))
        lines.append(
            f"  {g}: {b['n']} records, measured/predicted {math.exp(b['low']):.2f}-{math.exp(b['high']):.2f}, "
            f"|log error| median {b['median']:.3f}, p95 {b['p95']:.3f}; on files it was not derived from: "
            f"{inside}/{n} inside"
        )
    inside, n = cover["all"]
    return lines + [f"  all: {inside}/{n} ({inside / n:.1%}) inside the band derived from the other files"]


def time_text(
    rows: Sequence[TimeRow], cv: Sequence[TimeRow], cs: Sequence[TimeCase] = (), excluded: Sequence = ()
) -> str:
    """The step-time model's check: per quantity, in-sample and cross-validated errors, then per category;
    the error band where the cases `cs` are given; the records left out and why."""
    from .check import text_table

    lines = ["", f"Time records left out: {len(excluded)} ({EXCLUDED})"] if excluded else []
    for which, title in TITLES.items():
        lines += ["", title]
        lines.append(_summary_line("in-sample", time_summary(rows, which)))
        lines.append(_summary_line("cross-validated (leave one results file out)", time_summary(cv, which)))
        lines += ["", text_table(category_rows(rows, cv, which))]
        if which == "step" and cs and cv:  # one results file: no held-out rows to draw a band from
            lines += _band_lines(cs, cv)
    return "\n".join(lines)
