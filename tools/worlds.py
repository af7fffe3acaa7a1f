"""The measured world's table: what the records show of the step-time model's misses, per cell family and GPU model,
for tools.answer_sim's `--errors measured` world.

    python -m tools.worlds FILE... [--out tools/measured_world.json]

Made from results files (gzipped ones too), every ok record with a median step time on an H200 or an H100:

- `step`: held-out residuals, ln(measured tokens/s over the step-time model's prediction for the typical host,
  bench.estimate.steptime), one per cell and machine (a cell measured more than once on a machine: the mean of its
  records). Held out: an H200 record of a run the constants were fitted on (FITTED_RUNS) is predicted by constants
  fitted on the other results files (bench.estimate.checks.timecheck.cross_validate_time); any other record by the
  fitted constants, which never saw it (an H100 record: no H100 record was ever fitted on).
- `own`: per family, [deviation, its noise's variance] of each cell from the fit of a level and its knobs' main
  effects to its family's cells measured on the same machine, of the same model (`_own`): a cell's own miss, beyond
  what the knobs it shares with its neighbours explain, which `own` draws with the noise taken out.
- `knobs`: per PEFT mode and knob (`knobs_of`: an axis the family leaves free, micro-batch and accumulation as one),
  [half the difference, half its noise's variance] of each pair of cells of one family measured on one machine, of
  one model, that differ in that knob alone (`_knobs`): how far one value of a knob moves a cell from another, which
  `knob` draws with the noise and the cells' own misses taken out.
- `fixed`: ln(the record's wall time less its steps' time, over the predicted start and setup
  (bench.estimate.steptime.predict_start + predict_setup, the fitted constants, as the simulator predicts them)):
  what a cell costs beside its steps, as the records show it.
- `flags`: one entry per ok record: 1 where it was flagged (bench.records.quality.flags: host-bound or unstable).
- `template`: the first ok record of the GPU's files, its bulky lists left out (the simulator's records are made from
  it: the machine the search plans for).

Each keyed by family (`family`): PEFT mode, offload and the optimizer's kind, the split on which the model's misses
differ most (a paged optimizer's state pages over PCIe in a full fine-tune, not under LoRA: docs/answer-mode.md);
the step-time band's groups (bench.estimate.band.group_of) pool those. The simulator reads a family's step
residuals as its mean (`center`: the structural miss, on as few as one cell) and the spread of cells about their
family's mean (`deviations`); fixed costs and flags as a pool (`pool`). Where a family has too few entries on a GPU
(none for a mean; fewer than MIN_FAMILY for a spread or a pool) it takes a coarser family's: PEFT mode and offload,
then PEFT mode, then the GPU's whole table. Each GPU draws from its own records only.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import math
import os
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.estimate.checks.timecheck import TimeCase, cross_validate_time, evaluate_time, fitted, time_cases
from bench.estimate.steptime import predict_setup, predict_start
from bench.matrix.axes import AXES, OPTIMIZERS
from bench.records import quality
from bench.records.status import Status
from bench.records.store import read

__all__ = [
    "GPUS", "MIN_FAMILY", "TABLE", "center", "deviations", "derive", "family", "gpu_of", "knob", "knobs_of", "load",
    "own", "pool",
]  # fmt: skip

TABLE = Path(__file__).with_name("measured_world.json")
GPUS = ("H200", "H100")
MIN_FAMILY = 3
DROPPED = ("steps", "step_times_s", "losses", "telemetry", "log_tail", "log", "traceback", "warnings")


def optimizer_kind(name: str) -> str:
    """adam (adamw, fusedadam, cpuadam), 8-bit, paged, paged 8-bit, 1-bit, lamb: what moves the optimizer's step."""
    spec = OPTIMIZERS.get(name)
    if spec is None:
        return name
    kind = "1-bit" if spec.onebit else "8-bit" if spec.state_bits == 8 else "lamb" if "lamb" in name else "adam"
    return f"paged {kind}" if spec.paged else kind


def family(cell) -> tuple[str, str, str]:
    """(PEFT mode, offload, optimizer kind) of a cell (a bench.matrix.cells.Cell or a record's cell dict)."""
    get = cell.get if isinstance(cell, dict) else lambda k: getattr(cell, k, None)
    return (str(get("peft") or "none"), str(get("offload") or "none"), optimizer_kind(str(get("optimizer"))))


FAMILY_AXES = ("peft", "offload")
"""Axes a cell's family holds. A user's DeepSpeed file is a knob like the others: two cells of one ZeRO stage with and
without one (its bucket sizes) differ by the file's settings, which a fit without it would count as their own."""


def knobs_of(cell) -> dict[str, object]:
    """A cell's knobs: every axis but its family's, micro-batch and accumulation as one ("batch": the pair, as a
    matrix with a fixed batch moves both at once). The optimizer is one: its kind is the family's, the name within
    it (adamw, fusedadam) a knob."""
    out = {a.name: getattr(cell, a.name, None) for a in AXES if a.name not in FAMILY_AXES}
    out["batch"] = (out.pop("micro_batch"), out.pop("grad_accum"))
    return out


def _key(fam: tuple[str, ...]) -> str:
    return "/".join(fam)


def gpu_of(name: str | None) -> str | None:
    return next((g for g in GPUS if g in (name or "")), None)


def _levels(table: dict, fam: tuple[str, str, str]):
    """(depth, {family key: entries}) from the family itself (depth 3) to the GPU's whole table (depth 0)."""
    for depth in (3, 2, 1, 0):
        yield depth, {k: xs for k, xs in table.items() if tuple(k.split("/"))[:depth] == fam[:depth]}


def pool(table: dict, fam: tuple[str, str, str]) -> list:
    """The entries a family draws from: its own, else the first coarser family's with MIN_FAMILY (module docstring).
    `table`: one GPU's section of one kind (step, fixed or flags), keyed by `_key(family)`."""
    for depth, got in _levels(table, fam):
        flat = [x for xs in got.values() for x in xs]
        if len(flat) >= MIN_FAMILY or depth == 0:
            return flat
    raise AssertionError("unreachable")


def center(table: dict, fam: tuple[str, str, str]) -> tuple[float, int]:
    """The family's mean residual and how many it rests on; a family the GPU's records never ran: the mean of the
    family means of the first coarser family that has some, resting on none (0)."""
    for depth, got in _levels(table, fam):
        if got:
            means = [statistics.fmean(xs) for xs in got.values()]
            return statistics.fmean(means), len(got[_key(fam)]) if depth == 3 else 0
    raise ValueError("an empty table")


def deviations(table: dict, fam: tuple[str, str, str]) -> list[float]:
    """How far a cell lies from its family's mean: each residual of a family of two or more less that family's mean
    (times sqrt(n / (n - 1)), the spread about the true mean), from the family itself, else the first coarser family
    with MIN_FAMILY of them, else all of the GPU's."""
    for depth, got in _levels(table, fam):
        devs = [
            (x - statistics.fmean(xs)) * math.sqrt(len(xs) / (len(xs) - 1)) for xs in got.values() if len(xs) > 1
            for x in xs
        ]  # fmt: skip
        if len(devs) >= MIN_FAMILY or depth == 0:
            return devs
    raise AssertionError("unreachable")


def load(path: Path = TABLE) -> dict:
    return json.loads(path.read_text())


# -- derivation ----------------------------------------------------------------------------------------------


def _held_out(paths: list[str], gpu: str) -> list:
    """The TimeRows of every record of `gpu`, each predicted by constants that were not fitted on it."""
    cs = time_cases(paths, gpu)
    mine, others = fitted(cs)
    rows = cross_validate_time(mine) + evaluate_time(others)
    seen, out = set(), []
    for r in rows:  # a record kept in two files (a results file and the original it was cut from) counts once
        k = (r.case.run, r.case.cell.hash, r.case.machine, r.case.step_s, r.case.wall_s)
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def _fixed(c: TimeCase) -> float | None:
    """ln(the wall beside the steps over its prediction), where the record has both."""
    if not c.wall_s or not c.steps:
        return None
    beside = c.wall_s - c.steps * c.step_s
    typical = replace(c.hw, host_time=None)
    pred = predict_start(c.cell, typical) + predict_setup(c.cell, typical)
    return math.log(beside / pred) if beside > 0 else None


def _flags(paths: list[str], gpu: str) -> tuple[dict, dict | None]:
    """Per family whether each of the GPU's ok measurements was flagged (1) or not (0), and its first ok record
    (trimmed)."""
    out: dict = collections.defaultdict(list)
    template = None
    for path in paths:
        for r in read(path):
            raw = r.to_dict()
            if raw.get("status") != Status.OK.value or gpu_of((raw.get("provenance") or {}).get("gpu_name")) != gpu:
                continue
            if r.metrics is None or not r.metrics.tokens_per_s or r.variant or quality.kind(r) != "gpu":
                continue
            if r.worker and r.worker.fault_injected:
                continue
            out[_key(family(raw["cell"]))].append(int(bool(quality.flags(r))))
            template = template or {k: v for k, v in raw.items() if k not in DROPPED}
    return dict(out), template


def derive(paths: list[str]) -> dict:
    """The table (module docstring) from these results files."""
    gpus = {}
    for gpu in GPUS:
        rows = _held_out(paths, gpu)
        if not rows:
            continue
        step: dict = collections.defaultdict(list)
        fixed: dict = collections.defaultdict(list)
        alike: dict = collections.defaultdict(list)  # (family, machine, model): [(residual, noise variance, knobs)]
        for (fam, machine, _), rs in sorted(_by_cell(rows).items()):
            x = statistics.fmean(math.log(r.typical / r.case.step_s) for r in rs)
            step[fam].append(round(x, 4))
            noise = statistics.fmean(r.case.noise**2 for r in rs) / len(rs)  # the mean of len(rs) measurements'
            c = rs[0].case.cell
            alike[(fam, machine, (c.model, c.seq_len, c.gpus, c.nodes))].append((x, noise, knobs_of(c)))
            got = [f for r in rs if (f := _fixed(r.case)) is not None]
            if got:
                fixed[fam].append(round(statistics.fmean(got), 4))
        flags, template = _flags(paths, gpu)
        gpus[gpu] = {
            "step": dict(step), "own": _own(alike), "knobs": _knobs(alike), "fixed": dict(fixed), "flags": flags,
            "template": template,
        }  # fmt: skip
    return {"made_from": sorted(os.path.basename(p) for p in paths), "min_family": MIN_FAMILY, "gpus": gpus}


def _main_effects(knobs: list[dict]) -> np.ndarray:
    """The design of a level and one effect per value of each knob that varies (its first value the reference)."""
    cols = [np.ones(len(knobs))]
    for axis in knobs[0]:
        values = sorted({repr(k[axis]) for k in knobs})
        cols += [np.array([float(repr(k[axis]) == v) for k in knobs]) for v in values[1:]]
    return np.array(cols).T


def _own(alike: dict) -> dict:
    """Per family, [residual, its noise's variance] of each cell after a level and its knobs' main effects fitted
    to its family's cells on its machine, of its model (least squares; groups with a residual degree of freedom left;
    times sqrt(n / df), the spread about the truth): a cell's own miss where neither the machine, the model nor a
    knob it shares explains it, with the measurement's noise still in it (`own` takes that out)."""
    out: dict = collections.defaultdict(list)
    for (fam, _, _), xs in sorted(alike.items(), key=lambda kv: repr(kv[0])):
        X = _main_effects([k for *_, k in xs])
        y = np.array([x[0] for x in xs])
        beta, _, rank, _ = np.linalg.lstsq(X, y, rcond=None)
        df = len(xs) - rank
        if df > 0:
            k = math.sqrt(len(xs) / df)
            out[fam] += [[round(float(r) * k, 4), round(x[1], 6)] for r, x in zip(y - X @ beta, xs)]
    return dict(out)


def _knobs(alike: dict) -> dict:
    """Per PEFT mode and knob, [half the difference, half its noise's variance] of every pair of cells of one family,
    machine and model that differ in that knob alone: a draw of one value's effect less another's, over sqrt(2). Every
    two values pair, not each against a reference as the answer's effects pair them (bench.judge.effects.knob_pairs):
    each half-difference is one draw of how far a knob moves a cell."""
    out: dict = collections.defaultdict(lambda: collections.defaultdict(list))
    for (fam, _, _), xs in sorted(alike.items(), key=lambda kv: repr(kv[0])):
        for i, (x1, v1, k1) in enumerate(xs):
            for x2, v2, k2 in xs[i + 1 :]:
                differ = [a for a in k1 if k1[a] != k2[a]]
                if len(differ) == 1:
                    d = (x1 - x2) / math.sqrt(2)
                    out[fam.split("/")[0]][differ[0]].append([round(d, 4), round((v1 + v2) / 2, 6)])
    return {peft: dict(axes) for peft, axes in out.items()}


def own(table: dict, fam: tuple[str, str, str]) -> list[float]:
    """A family's own misses, the measurements' noise taken out (`_own`'s entries: the family's own, else the first
    coarser family's with MIN_FAMILY, else the GPU's whole table): each deviation d, whose noise has variance v, as
    sign(d) sqrt(max(d^2 - v, 0)), since d^2 - v estimates the miss's own square (d^2's mean is that plus v). A
    deviation within its noise says nothing of the cell beyond it (0); a record's far miss keeps its size, tails
    and all. The simulated measurement adds its own noise."""
    return [math.copysign(math.sqrt(max(d * d - v, 0.0)), d) for d, v in pool(table, fam)] or [0.0]


def knob(table: dict, peft: str, axis: str, own_var: float) -> list[float]:
    """How far one value of a knob moves a cell of this PEFT mode: `_knobs`' entries of that mode and knob, else of
    that knob in any mode with MIN_FAMILY of them, else every knob's of the GPU; each half-difference e, whose noise
    has variance w and whose two cells' own misses variance 2 own_var, as sign(e) sqrt(max(e^2 - w - own_var, 0))
    (as `own`). Symmetric: a draw's sign is the draw's own."""
    mode = table.get(peft, {}).get(axis, [])
    anywhere = [e for axes in table.values() for e in axes.get(axis, [])]
    entries = next(
        (xs for xs in (mode, anywhere) if len(xs) >= MIN_FAMILY),
        [e for axes in table.values() for xs in axes.values() for e in xs],
    )
    return [math.copysign(math.sqrt(max(e * e - w - own_var, 0.0)), e) for e, w in entries] or [0.0]


def _by_cell(rows: list) -> dict:
    out: dict = collections.defaultdict(list)
    for r in rows:
        out[(_key(family(r.case.cell)), r.case.machine, r.case.cell.hash)].append(r)
    return out


def summary(table: dict) -> str:
    lines = []
    for gpu, t in table["gpus"].items():
        n = sum(len(v) for v in t["step"].values())
        flagged, total = (sum(sum(v) for v in t["flags"].values()), sum(len(v) for v in t["flags"].values()))
        lines.append(f"{gpu}: {n} cells' held-out residuals in {len(t['step'])} families; {flagged} of {total} flagged")
        for fam, xs in sorted(t["step"].items()):
            lines.append(f"  {fam}: {len(xs)}, median {statistics.median(xs):+.3f}, {min(xs):+.3f} to {max(xs):+.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.worlds", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="results files (.jsonl, .jsonl.gz); globs are expanded")
    ap.add_argument("--out", default=str(TABLE))
    a = ap.parse_args(argv)
    paths = sorted({p for f in a.files for p in (glob.glob(f) or [f])})
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        ap.error(f"no such results file: {', '.join(missing)}")
    table = derive(paths)
    Path(a.out).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(summary(table))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
