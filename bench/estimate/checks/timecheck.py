"""The step-time model against measurement: each ok record's step time and fixed cost predicted from
its cell, its GPU's rates and its host's time where the run measured it (bench.estimate.steptime.host_time_of), the
constants fitted on the records (`fit_time`), and refitted leaving each results file (or machine) out to
show how well they carry (`cross_validate_time`); that held-out error published as the band a search reads
(`error_band`, checked on files it was not derived from by `band_coverage`). A record with an injected fault
is neither fitted nor checked on (EXCLUDED), and the check says how many."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace

from ...host.rates import Rates, datasheet
from ...matrix.shapes import shape_of
from ...records.quality import noise_sd
from ...records.record import Record
from ...records.status import Status
from ...records.store import read_records
from ..band import BAND_COVERAGE, FAMILIAR_FILES, band_group, bands_for, group_of
from ..check import _cell, _ds_config, _pct
from ..fitdata import write_section
from ..model import Hardware
from ..steptime import (
    FITTED_RUNS,
    FITTED_TIME,
    HOST_PARTS,
    OVERLAP,
    PARTS,
    REF_OPS_S,
    SETUP_FEATURES,
    START_FEATURES,
    STEP_NAMES,
    TimeConstants,
    combine,
    host_share,
    host_time_of,
    pageable_ratio,
    predict_setup,
    predict_start,
    predict_step,
    rates_of,
    setup_features,
    start_features,
    step_parts,
    traits,
)

__all__ = [
    "TimeCase",
    "TimeCheck",
    "calibrated_levels",
    "fitted",
    "time_check",
    "band_coverage",
    "cross_validate_time",
    "error_band",
    "shipped_band",
    "fit_time",
    "host_exponent",
    "fit_section",
    "refit",
    "machine_offsets",
    "measured_on",
    "ops_reference",
    "time_cases",
    "time_summary",
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
    run: str = ""
    """The run that made it (its run id)."""
    machine: str = ""
    """The machine it ran on: its first GPU's uuid (else its run id)."""
    ops_s: float | None = None
    """Its run's op prebuild seconds where the prebuild compiled the ops that time the host
    (bench.estimate.steptime.host_time_of), else None: its host's time is this over a reference
    (ops_reference; its hardware's host_time, REF_OPS_S's)."""
    noise: float = 0.0
    """The measurement's own spread within its block, log scale (bench.records.quality.noise_sd: flagged or not)."""


EXCLUDED = "a fault injected (ZEROBENCH_FAULT): a deliberately slowed or burdened run, not the cell's time"
"""Why an otherwise usable record is neither fitted nor checked on (the one rule, applied to every record)."""


def time_cases(
    paths: Iterable[str | os.PathLike],
    gpu: str | None = None,
    excluded: list[tuple[str, str]] | None = None,
    rates: Rates | None = None,
) -> list[TimeCase]:
    """Every ok record run on one or two GPUs (whose name contains `gpu`, where given) with a median step time,
    of a known model shape, less those EXCLUDED says (appended to `excluded` as (file, cell id) where a list is
    given). Whether the constants were fitted on a record is its run's (fitted, FITTED_RUNS). `rates` (a probe of
    another machine of the same GPU model) stand in for the rates of a record of that GPU model that carries none."""
    out = []
    for path in paths:
        for rec in read_records(path, warn=False):
            if rec.status is not Status.OK:
                continue
            prov = rec.provenance
            name = (prov.gpu_name if prov else None) or ""
            step = rec.metrics.step_time_median_s if rec.metrics else None
            if not name or (gpu and gpu not in name) or not step:
                continue
            cell = _as_ran(_cell(rec.cell), rec)
            if cell.gpus not in (1, 2) or cell.nodes > 1 or shape_of(cell.model) is None:
                continue
            if rec.worker and rec.worker.fault_injected:
                if excluded is not None:
                    excluded.append((os.path.basename(os.fspath(path)), cell.id))
                continue
            out.append(_case(os.path.basename(os.fspath(path)), rec, cell, float(step), rates))
    return out


def _case(file: str, rec: Record, cell, step: float, rates: Rates | None = None) -> TimeCase:
    prov = rec.provenance
    own = Rates.from_dict(rec.machine.rates) if rec.machine else None
    if own is None and rates is not None and prov and prov.gpu_name == rates.device:
        own = rates
    ops_s = host_time_of(rec.fixed_costs, ref=1.0)  # the prebuild's seconds, where it timed the host
    steps = len(rec.step_times_s or []) or cell.warmup_steps + cell.measured_steps
    wall = rec.wall_s
    setup = rec.worker.setup_s if rec.worker else None
    start = wall - steps * step - setup if wall and setup else None
    return TimeCase(
        file=file,
        cell=cell,
        hw=Hardware(
            gpu_memory_bytes=prov.gpus[0].memory_bytes if prov and prov.gpus else None,
            gpu_name=(prov.gpu_name if prov else None) or "",
            host_cores=(prov.cpu_count if prov else None) or None,
            host_time=ops_s / REF_OPS_S if ops_s else None,
            rates=own,
        ),
        step_s=step,
        setup_s=float(setup) if setup else None,
        start_s=float(start) if start and start > 0 else None,
        spawn=(rec.started_by.mode if rec.started_by else None) != "fork",
        wall_s=float(wall) if wall else None,
        steps=steps,
        ds_config=_ds_config(cell, rec.ds_config),
        run=rec.run_id or "",
        machine=(prov.gpus[0].uuid if prov and prov.gpus else None) or rec.run_id or "",
        ops_s=ops_s,
        noise=noise_sd(rec),
    )


def ops_reference(cs: Sequence[TimeCase]) -> float | None:
    """The typical host's op prebuild seconds: the median over the runs of `cs` that timed their host
    (REF_OPS_S over the fitted runs); None where none did."""
    by_run = {c.run: c.ops_s for c in cs if c.ops_s}
    return round(statistics.median(by_run.values()), 2) if by_run else None


def measured_on(cs: Sequence[TimeCase], ref: float | None) -> list[TimeCase]:
    """The cases with their hosts' times against the reference `ref` (None: every host unmeasured)."""
    return [replace(c, hw=replace(c.hw, host_time=c.ops_s / ref if c.ops_s and ref else None)) for c in cs]


def fitted(cs: Sequence[TimeCase], runs: Sequence[str] = FITTED_RUNS) -> tuple[list[TimeCase], list[TimeCase]]:
    """(the cases of the runs the constants were fitted on, the others: held out from the fit)."""
    return [c for c in cs if c.run in runs], [c for c in cs if c.run not in runs]


def _as_ran(cell, rec):
    """The cell as its record ran it: a QLoRA cell of the DeepSpeed loop whose record does not say it trained
    in training mode ran in eval mode (from_pretrained's mode, before the worker set train()), where
    transformers skips gradient checkpointing (results/README.md, "QLoRA in training mode")."""
    stale = cell.peft == "qlora" and cell.engine == "deepspeed" and rec.worker and rec.worker.train_mode is None
    return replace(cell, grad_ckpt=False) if stale and cell.grad_ckpt else cell


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
    "compute": 0.9,  # 40% of the matmul rate
    "activations": 2.0,  # the elementwise kernels at an eighth of the memory bandwidth
    "adapter": 1.4,
    "dequant": 1.0,
    "params": 1.0,  # a fused Adam at a third of the memory bandwidth
    "host": 0.0,  # the reference CPU Adam rate
    "pcie": 0.2,  # 80% of the link's rate
    "nvme": 0.0,  # the reference NVMe rate
    "paged": 0.0,  # the link's rate: managed memory migrates in large chunks
    "hooks": -4.6,  # 0.1 ms per tensor
    "tensors": -4.6,  # 0.1 ms per tensor
    "launch": -3.2,  # 0.4 ms per layer and pass: some 40 kernels at 10 us of host time each
    "wrappers": -2.3,  # 0.1 ms per adapted linear and pass: ten kernels and the Python around them
    "gather": 3.0,
    "layers": -2.3,  # 1 ms per layer
}

# The machines the records ran on differ in their hosts, not in their GPUs: the same cell runs at the same
# speed on every machine of a GPU model while the GPU's work is the longer, and up to twice as slow where the
# host's is (docs/step-time.md). The fit gives each machine (its
# first GPU's uuid) an offset on the parts its host runs (HOST_PARTS), pulled toward 0 by MACHINE_RIDGE
# (about the ratio of a record's residual variance to the machines' spread), so no cell factor takes up a
# machine's host. Where a run measured its host's time (steptime.host_time_of) the host's parts take it, and
# the offset is what that measurement leaves; a prediction has no offset (the host's time where it is
# measured, else the typical host's).
MACHINE_RIDGE = 3.0

# Priors on factors beyond the plain case, where the maker publishes the ratio: torch's AdamW on the host
# against DeepSpeed's CPU Adam, "5X-7X faster than the standard PyTorch implementation" (DeepSpeed's
# ZeRO-Offload tutorial); Liger's kernels "increase multi-GPU training throughput by 20%" (Liger-Kernel's
# README).
FACTOR_PRIOR = {"host_torch_adam": math.log(6.0), "compute_liger": -math.log(1.2)}


def _design(cs: Sequence[TimeCase], machines: Sequence[str] = (), free: bool = False):
    """The parts' bases (records x parts; the host's parts at the host's time where measured) and each part's
    features mapped onto the constants, then onto one offset per machine of `machines` on the parts its host
    runs (HOST_PARTS), then (free) onto log(host time), whose factor frees the host time's exponent: parts x
    records x (constants + machines + free)."""
    import numpy as np

    index = {n: i for i, n in enumerate(STEP_NAMES)}
    parts = [step_parts(c.cell, c.hw, c.ds_config) for c in cs]
    bases = np.array([[p[part][0] for part in PARTS] for p in parts])
    xs = np.zeros((len(PARTS), len(cs), len(STEP_NAMES) + len(machines) + free))
    for i, (part, names) in enumerate(PARTS.items()):
        for j, n in enumerate(names):
            xs[i, :, index[n]] = [p[part][1][j] for p in parts]
        if part in HOST_PARTS:
            for r, c in enumerate(cs):
                if c.machine in machines:
                    xs[i, r, len(STEP_NAMES) + machines.index(c.machine)] = 1.0
                if free:
                    xs[i, r, -1] = math.log(c.hw.host_time or 1.0)
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


def _fit_parts(cs: Sequence[TimeCase], free: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """The step's constants and each machine's host offset: Levenberg-Marquardt in log space (a sum of
    exponentials is not linear there), first with the parts summed, then from there with the overlap (the
    smooth maximum has flat directions a fit from the priors can stall in). The offsets (MACHINE_RIDGE pulls
    them toward 0, the host's measured time or the typical host's) are fitted beside the constants, and a
    prediction leaves them out: it does not know its machine beyond its host's time. free: the host time's
    exponent fitted too (offset "exponent"), from a prior of 0 (the host's time tells nothing)."""
    import numpy as np

    machines = sorted({c.machine for c in cs})
    bases, xs = _design(cs, machines, free)
    y = np.log([c.step_s for c in cs])
    intercepts = [STEP_NAMES.index(f"{part}_one") for part in PARTS]
    prior = np.zeros(xs.shape[2])
    prior[intercepts] = [PRIOR[part] for part in PARTS]
    for n, v in FACTOR_PRIOR.items():
        prior[STEP_NAMES.index(n)] = v
    reg = np.full(xs.shape[2], STEP_RIDGE)
    reg[intercepts] = PRIOR_WEIGHT
    reg[len(STEP_NAMES) : len(STEP_NAMES) + len(machines)] = MACHINE_RIDGE
    if free:  # the bases hold the host's time to the power 1: a factor of -1 undoes it
        prior[-1], reg[-1] = -1.0, STEP_RIDGE
    th = prior.copy()
    for p in (1.0, OVERLAP):
        th = _levenberg_marquardt(bases, xs, y, th, prior, reg, p)
    offsets = {m: round(float(v), 3) for m, v in zip(machines, th[len(STEP_NAMES) :])}
    if free:
        offsets["exponent"] = round(1.0 + float(th[-1]), 3)
    return {n: round(float(v), 3) for n, v in zip(STEP_NAMES, th)}, offsets


def machine_offsets(cs: Sequence[TimeCase]) -> dict[str, float]:
    """Each machine's host offset as the fit on `cs` found it: log of its host parts' time over what its
    measured host time (else the typical host's) says (HOST_PARTS)."""
    return _fit_parts(cs)[1]


def host_exponent(cs: Sequence[TimeCase]) -> float:
    """The exponent of the host's time on the host's parts, fitted with the rest on `cs` from a prior of 0
    (the model holds it at 1: the physics)."""
    return _fit_parts(cs, free=True)[1]["exponent"]


def fit_time(cs: Sequence[TimeCase], base: TimeConstants = FITTED_TIME) -> TimeConstants:
    """The step's parts fitted on the records' median step times, the fixed cost by least squares of its
    log on the setup factors."""
    k = _fit_parts(cs)[0]
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
    share: float = 0.0
    """The predicted step's host share (bench.estimate.steptime.host_share)."""
    typical: float = 0.0
    """The step predicted for the typical host: as if its host's time were not measured (= step where not)."""
    typical_share: float = 0.0
    """That prediction's host share."""

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
    return [_row(c, k) for c in cs]


def _row(c: TimeCase, k: TimeConstants) -> TimeRow:
    typical = replace(c.hw, host_time=None)
    return TimeRow(
        c,
        predict_step(c.cell, c.hw, k, c.ds_config),
        predict_setup(c.cell, c.hw, k),
        predict_start(c.cell, c.hw, k, spawn=c.spawn),
        host_share(c.cell, c.hw, k, c.ds_config),
        predict_step(c.cell, typical, k, c.ds_config),
        host_share(c.cell, typical, k, c.ds_config),
    )


def cross_validate_time(cs: Sequence[TimeCase], by: str = "file") -> list[TimeRow]:
    """Each results file's records (by="machine": each machine's) predicted with the constants fitted on the
    others, each host's time against the others' reference (ops_reference); none where there are no others."""
    out = []
    for key in sorted({getattr(c, by) for c in cs}):
        train = [c for c in cs if getattr(c, by) != key]
        if train:
            ref = ops_reference(train)
            test = measured_on([c for c in cs if getattr(c, by) == key], ref)
            out += evaluate_time(test, fit_time(measured_on(train, ref)))
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


def _held_out_groups(cs: Sequence[TimeCase], cv: Sequence[TimeRow], host: bool = True) -> list[str]:
    """Each cross-validated row's band group as its fold saw it: traits counted over the other files, the
    host share by the fold's constants (host: at its host's time where measured, else the typical host's)."""
    pairs = [(c.file, traits(c.cell, c.ds_config)) for c in cs]
    by_file = {f: _count_files(pairs, skip=f) for f in {r.case.file for r in cv}}
    mine = [traits(r.case.cell, r.case.ds_config) for r in cv]
    return [
        group_of(
            all(by_file[r.case.file].get(t, 0) >= FAMILIAR_FILES for t in ts), r.share if host else r.typical_share
        )
        for r, ts in zip(cv, mine)
    ]


LEVELS = tuple(round(0.95 + 0.005 * i, 3) for i in range(11))
"""The central levels a band's percentiles may be taken at (calibrated_levels picks one): 95% to all."""
FAMILIAR = ("gpu-bound", "mixed", "host-bound")
BANDS = {"familiar": FAMILIAR, **{g: (g,) for g in FAMILIAR}, "unfamiliar": ("unfamiliar",)}
"""Each band of STEP_BAND and the groups (bench.estimate.band.group_of) whose records it holds: "familiar"
holds the familiar groups together (answer mode's prior width)."""


@dataclass(frozen=True)
class Miss:
    """A held-out record's log(measured / predicted), its results file and its band group."""

    file: str
    group: str
    log: float
    measured: bool = False
    """The prediction took its host's time, measured before its run's cells (STEP_BAND_HOST's record)."""


def misses(cs: Sequence[TimeCase], cv: Sequence[TimeRow], host: bool = True) -> list[Miss]:
    """The cross-validated rows `cv` of the cases `cs` as the band reads them: host, each predicted at its
    host's time where its run measured it (STEP_BAND_HOST); else each for the typical host (STEP_BAND)."""
    groups = _held_out_groups(cs, cv, host)
    return [
        Miss(
            r.case.file,
            g,
            math.log(r.case.step_s / (r.step if host else r.typical)),
            host and bool(r.case.hw.host_time),
        )
        for r, g in zip(cv, groups)
    ]


def _band_stats(logs: Sequence[float], level: float) -> dict[str, float]:
    """log(measured / predicted) of a band's held-out records -> its numbers, its edges the percentiles
    that hold `level` of them."""
    a = [abs(x) for x in logs]
    q = (1 - level) / 2
    return {
        "n": len(logs),
        "median": round(_pct(a, 0.5), 4),
        "p95": round(_pct(a, 0.95), 4),
        "low": round(_pct(list(logs), q), 4),
        "high": round(_pct(list(logs), 1 - q), 4),
        "level": level,
    }


def _logs(ms: Sequence[Miss], band: str) -> list[float]:
    return [m.log for m in ms if m.group in BANDS[band]]


def _held_out_pairs(ms: Sequence[Miss], band: str) -> list[tuple[list[float], list[float]]]:
    """Per file with records in the band: (its logs, the other files' logs, sorted)."""
    by_file: dict[str, list[float]] = {}
    for m in ms:
        if m.group in BANDS[band]:
            by_file.setdefault(m.file, []).append(m.log)
    return [
        (mine, sorted(x for g, logs in by_file.items() if g != f for x in logs)) for f, mine in sorted(by_file.items())
    ]


def _hits(pairs: Sequence[tuple[list[float], list[float]]], level: float) -> tuple[int, int]:
    """(records inside the band at `level` derived from the other files' records; records), over
    _held_out_pairs."""
    inside = n = 0
    q = (1 - level) / 2
    for mine, other in pairs:
        if other:
            low, high = _pct(other, q), _pct(other, 1 - q)
            inside, n = inside + sum(low <= x <= high for x in mine), n + len(mine)
    return inside, n


def calibrated_levels(ms: Sequence[Miss]) -> dict[str, float]:
    """Per band, the lowest of LEVELS at which, derived from the other files, it holds BAND_COVERAGE of each
    file's held-out records (all files together): the nominal 95% percentiles of one set of errors hold fewer
    than 95% of another's (a new machine, a new region of cells). Where no level does, all of them (its
    edges the largest errors seen)."""
    out = {}
    for band in BANDS:
        pairs = _held_out_pairs(ms, band)
        hits = ((level, *_hits(pairs, level)) for level in LEVELS)
        out[band] = next((level for level, i, n in hits if n and i >= BAND_COVERAGE * n), LEVELS[-1])
    return out


def _bands(ms: Sequence[Miss], levels: dict[str, float]) -> dict[str, dict[str, float]]:
    """Each band at its level; one no record fell in takes the widest of the others (none without records)."""
    band = {b: _band_stats(_logs(ms, b), levels[b]) for b in BANDS}
    wide = max((b for b in band.values() if b["n"]), key=lambda b: b["high"] - b["low"], default=None)
    return {} if wide is None else {g: b if b["n"] else {**wide, "n": 0} for g, b in band.items()}


Bands = dict[str, dict[str, float]]


def error_band(cs: Sequence[TimeCase], cv: Sequence[TimeRow]) -> tuple[Bands, Bands, dict[str, int]]:
    """STEP_BAND, STEP_BAND_HOST and TRAIT_FILES from the cross-validated rows `cv` of the cases `cs`: per
    band, the held-out errors (for the typical host; at the host's time where measured) and its edges at its
    calibrated level (calibrated_levels)."""
    typical, host = misses(cs, cv, host=False), misses(cs, cv)
    return _bands(typical, calibrated_levels(typical)), _bands(host, calibrated_levels(host)), trait_files(cs)


def _judged(cs: Sequence[TimeCase], cv: Sequence[TimeRow]) -> Iterable[tuple[Miss, str, bool]]:
    """Each held-out record, as the model publishes it (at its host's time where measured), against each band
    that holds its group (and "all": its group's), derived from the other files' held-out errors at the
    levels calibrated on those files alone: STEP_BAND_HOST's where its host's time was measured, else
    STEP_BAND's. (miss, band, inside)."""
    typical, host = misses(cs, cv, host=False), misses(cs, cv)
    for f in sorted({m.file for m in host}):
        derived = {}
        for measured, ms in ((False, typical), (True, host)):
            others = [m for m in ms if m.file != f]
            derived[measured] = _bands(others, calibrated_levels(others))
        for m in (m for m in host if m.file == f and derived[m.measured]):
            for key in (*(b for b, groups in BANDS.items() if m.group in groups), "all"):
                edges = derived[m.measured][m.group if key == "all" else key]
                yield m, key, edges["low"] <= m.log <= edges["high"]


HOSTS = {True: "host measured", False: "host not measured"}
"""How band_coverage names the records whose host's time was measured (judged against STEP_BAND_HOST's
band) and the others (STEP_BAND's)."""


def band_coverage(cs: Sequence[TimeCase], cv: Sequence[TimeRow]) -> dict[str, tuple[int, int]]:
    """How the band carries to records it was neither derived nor calibrated on (_judged): per band and "all"
    (each record against its group's band), and each of those for the records whose host's time was measured
    or not ("all, host measured"; HOSTS): (records inside, records)."""
    out: dict[str, list[int]] = {}
    for m, key, inside in _judged(cs, cv):
        for k in (key, f"{key}, {HOSTS[m.measured]}"):
            hit = out.setdefault(k, [0, 0])
            hit[0] += inside
            hit[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def fit_section(cs: Sequence[TimeCase], cv: Sequence[TimeRow] | None = None) -> dict:
    """The step-time model's fit on `cs`, as fit.json's "step_time" section holds it (the one generator of it:
    `zerobench estimate --check --refit` writes what this returns): the constants, the typical host's op
    prebuild (REF_OPS_S), the error band for the typical host and at the host's time (leave one results file
    out), the files each trait appears in, and the runs, files and GPUs it was fitted on, with where each
    record's rates came from. cv: cross_validate_time(cs), where the caller has it."""
    ref = ops_reference(cs)
    k = fit_time(measured_on(cs, ref))
    typical, host, files = error_band(cs, cross_validate_time(cs) if cv is None else cv)
    return {
        "constants": {f.name: getattr(k, f.name) for f in fields(k)},
        "ref_ops_s": ref or REF_OPS_S,  # no run timed its host: the reference stays
        "ref_host_overhead_s": _probed(cs, lambda r: r.host_overhead_s),
        "ref_cpu_adam": _probed(cs, lambda r: r.cpu_adam),
        "ref_pageable": _probed(cs, pageable_ratio),
        "band": typical,
        "band_host": host,
        "trait_files": files,
        "runs": sorted({c.run for c in cs}),
        "files": sorted({c.file for c in cs}),
        "gpus": sorted({c.hw.gpu_name or "" for c in cs}),
        "records": len(cs),
        "rates": sorted({_rates_source(c.hw) for c in cs}),
    }


def _probed(cs: Sequence[TimeCase], figure: Callable[[Rates], float | None]) -> float | None:
    """The median of a figure of the probe's rates on the machines of `cs` (one per machine); None where no
    machine's probe gave it."""
    probes = (c for c in cs if c.hw.rates is not None and c.hw.rates.source == "probe")
    by_machine = {c.machine: v for c in probes if (v := figure(c.hw.rates))}
    return statistics.median(by_machine.values()) if by_machine else None


def _rates_source(hw: Hardware) -> str:
    """Where a case's rates came from: its machine's probe, else its GPU's data sheet (the H200's where none is
    known)."""
    probed = hw.rates is not None and hw.rates.source == "probe"
    sheet = datasheet(hw.gpu_name)
    if probed and sheet is None:
        return "probe"
    return f"datasheet ({rates_of(hw).device})" + ("; probe: host figures" if probed else "")


def refit(paths: Iterable[str | os.PathLike], command: str, gpu: str | None = None) -> dict:
    """Fit the step-time model on every usable record of these results files and write fit.json's "step_time"
    section (with the command that wrote it); the section written."""
    section = {"command": command, **fit_section(time_cases(paths, gpu))}
    write_section("step_time", section)
    return section


@dataclass(frozen=True)
class TimeCheck:
    """The step-time model against records, each figure in-sample or held out."""

    cases: list[TimeCase]
    """The records of the runs the constants were fitted on (FITTED_RUNS)."""
    rows: list[TimeRow]
    """In-sample: those records predicted by the fitted constants."""
    cv: list[TimeRow]
    """Held out: each of their results files predicted by constants fitted on the other files."""
    unfitted: list[TimeRow]
    """Held out: records of runs no constant was fitted on, predicted by the fitted constants."""
    excluded: list[tuple[str, str]]
    """(file, cell id) of the records left out (EXCLUDED)."""
    by_machine: list[TimeRow] = field(default_factory=list)
    """Held out: each machine's records predicted by constants fitted on the other machines' (a machine's
    host is new to them, its results files too)."""

    @property
    def held_out(self) -> list[TimeRow]:
        return self.cv + self.unfitted


def time_check(
    paths: Iterable[str | os.PathLike],
    gpu: str | None = None,
    k: TimeConstants = FITTED_TIME,
    held_out: Iterable[str | os.PathLike] = (),
    rates: Rates | None = None,
) -> TimeCheck:
    """The step-time model's check over these results files (bench.cli's estimate --check, tools.docs): the
    records of the runs the constants were fitted on, in-sample and cross-validated; the others, and every
    record of the `held_out` files (another GPU's, say), predicted by the constants `k`."""
    excluded: list[tuple[str, str]] = []
    paths = [os.fspath(p) for p in paths]
    cs, others = fitted(time_cases(paths, gpu, excluded, rates))
    others += time_cases([p for p in map(os.fspath, held_out) if p not in paths], gpu, excluded, rates)
    return TimeCheck(
        cs,
        evaluate_time(cs, k),
        cross_validate_time(cs),
        evaluate_time(others, k),
        excluded,
        cross_validate_time(cs, by="machine"),
    )


def time_summary(rows: Sequence[TimeRow], which: str = "step") -> dict:
    errs = [abs(e) for r in rows if (e := r.error(which)) is not None]
    return {"n": len(errs), "median": _pct(errs, 0.5), "p95": _pct(errs, 0.95), "max": max(errs, default=math.nan)}


def shipped_band(r: TimeRow) -> dict[str, float]:
    """The band the module ships for a record's cell on its hardware (STEP_BAND, or STEP_BAND_HOST where its
    host's time was measured); empty where the fit has none."""
    return bands_for(r.case.hw).get(band_group(r.case.cell, r.case.ds_config, hw=r.case.hw), {})
