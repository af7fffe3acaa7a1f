"""Answer mode against synthetic truths at a matrix's full scale: how often it names the wrong leader or the
wrong sign of an effect, and how much cell time it takes to settle.

    python -m tools.answer_sim matrices/7b.yaml --trials 50 [--seed 0] [--jobs 2] [--settle 0.05]
        [--errors measured|model] [--gpu H200|H100] [--calls 1|2] [--first-call S] [--cap S]

Each trial draws a truth for every runnable cell of the matrix (as planned on the machine of `--gpu`: the H200
of results/7b-answer-h200.jsonl, or the H100 of the ok record tools.worlds' table keeps) and runs answer mode
against it through the replay path: `zerobench run --answer` in this process, its replay executor serving
synthetic records made from the truth (SimRecording, a bench.execute.executors.replay.Recording). The search sees the
models' prior on that machine, as a real answer there would. Like a real answer on lent machines, the search runs
in two calls on two machines: the first with --budget FIRST_CALL_S, then, unless that settled it, `--resume` on a
second machine (a new block, tied by anchors) until it is settled or CAP_S of cell time is spent (`--calls 1`:
the first call alone, on one machine). Nothing here ran on a GPU: every figure it prints is a simulation's.

`--errors measured` (the default): the truth is what the records show (tools.worlds' table, tools/measured_world.json,
made from the committed results files and the H200 and H100 answers' records, per GPU model):

- a cell's speed on the first machine: the step-time model's prediction missed by its family's held-out residual
  (the family: PEFT mode, offload, optimizer kind; the residual: ln measured over a prediction by constants not
  fitted on that record), bootstrapped (World._measured_miss): the family's mean residual, moved by how well its
  records pin it; plus one effect per knob value, drawn once per trial for each PEFT mode and offload (the same for
  every cell of them that holds the value) from the half-differences of cells one knob apart on one machine
  (tools.worlds.knob); plus a cell's own miss, drawn from what is left of cells of one family, machine and model
  after their knobs' main effects (tools.worlds.own); each less its measurements' noise (the simulated
  measurement adds noise of its own, and the machines' offsets are drawn apart), tails and all. The first
  machine's offset is in the residuals; the second's host differs from it by the difference of two of
  HOST_OFFSETS;
- a measurement is flagged with its family's share of flagged records on that GPU;
- a cell's start and setup: the prediction times a draw of its family's ln(measured over predicted).

The rest as in the model's world below: a cell's deviation per machine (CROSS_OWN), a measurement's noise and the
steps it runs (flagged or not), memory, failures.

`--errors model` (the world the search's widths were set on), all on the log scale, with the magnitudes taken from
committed records:

- a cell's speed on the typical host: the step-time model's prediction (bench.estimate.steptime), missed by an
  effect per axis value (sd MAIN, drawn once per trial and shared by every cell with that value), an effect per
  pair of axis values (sd PAIR) and the cell's own (sd OWN). MAIN, PAIR and OWN are the split that makes the
  held-out residuals of the committed 7B H200 records likeliest (each record predicted by constants fitted
  without its file; a host term per machine taken out): 0.05, 0.01 per pair (about 0.05 over a cell's 28
  pairs) and below 0.01 (OWN is taken at 0.02, the noise's size, not below it);
- machines: each call's machine has a host offset drawn from HOST_OFFSETS (the per-machine host offsets the
  step-time fit finds on the committed files, bench.estimate.checks.timecheck.machine_offsets: 24 H200 machines,
  -0.39 to +0.13), which moves a cell by its host share (bench.estimate.steptime.host_share): the 7b answer's
  two machines, 0.45 apart, ran its LoRA cells 17-26% apart; and each cell deviates per machine by CROSS_OWN
  (0.02, as OWN is taken: of bench.records.quality.CROSS, 0.039 between blocks, the committed records leave
  nothing beyond the noise once a host term per pair of blocks is fitted, tools.noise's cross_hosted);
- a measurement: the cell's speed on its machine with the within-block noise of bench.records.quality.NOISE (0.026
  clean, 0.072 flagged); it is flagged (host-bound, unstable) with the chance FLAG_RATE gives at its host share
  on that machine (the share of committed H200 measurements flagged, by predicted host share: 7%, 32%, 53%
  and 91% in quarters), and then runs more steps (the adaptive rule does not converge);
- wall time: the step-time model's start and setup (off by SETUP_SD, its held-out setup error) plus warm-up
  and measured steps as the 7B records ran them: clean, the first step and the steps its warm-up window settles
  over, then its fewest measured steps (4 + 6 on the matrix's schedule, 3 + 4 on rung 0's short look); flagged,
  6 + 12 or the cap (halved on rung 0); either within the schedule's time cap as bench.records.adaptive ends it
  (bench.estimate.steptime.steps_of, which also gives the search its predicted cost). A clean short look keeps
  a clean measurement's noise (on the committed records it lands sd 0.004 from the full schedule's median:
  tools.noise);
- memory: the memory model's prediction off by MEMORY_SD (its held-out p95 12.5%); a cell whose true peak
  passes the GPU's memory ends cuda_oom in warm-up (the 7b answer's five did so in 3-6 s);
- failures with signatures: two per trial, as the 7b answer's records had them once rules covered the rest: one
  optimizer that diverges ("loss became nan at step N", the 1-bit optimizers), and one optimizer the HF
  Trainer does not build ("asked for X, but the Trainer built AdamW").

Scored, per trial: a wrong leader (a group where some cell that runs beats the answer's fastest by more than
the minimum effect in truth, on the answer's reference machine), each effect called faster or slower whose
true ratio over the same pairs lies on the other side of 1, and the cell time spent until the search stopped, also
by the role each attempt was asked for (leader, contender, frontier, effect, anchor; "again" for a cell attempted
before, the status for an attempt that did not end ok), printed as a mean per trial; and the lead chance the trial's
answer states (its last call's `settled:` line), summed over the trials beside the wrong leaders found: a rule whose
chances hold expects about that many (a check of the chance itself, not only of the answers); and, per group, how
far each unmeasured cell's truth lies from its corrected step-time prediction, in the prediction's sd, at the trial's
end: the pooled tails against a normal's, beside how far one trial's cells moved together (the width the search
stops on, checked cell by cell).

Left out: anything the models and these magnitudes do not hold (a cell that hangs or times out, a machine
that slows down during a run, throttling, noise that is not normal, a third machine), the one-off
preparation (op builds, QLoRA checkpoints: not cell time), and interactions of three or more settings.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import os
import re
import statistics
import sys
import tempfile
import types
import zlib
from pathlib import Path

import numpy as np

from bench.cli.run_options import chance_level
from bench.estimate import predict
from bench.estimate.steptime import predict_setup, predict_start, step_and_share, steps_of
from bench.execute import answer
from bench.execute.executors.replay import Recording, Replayed
from bench.execute.plan import Planned, arrange, hardware, plan
from bench.execute.run import run
from bench.execute.settings import RunSettings
from bench.judge import effects, results
from bench.records import quality
from bench.records.record import machine_of, parse
from bench.records.status import Status
from bench.records.store import Store
from tools import worlds

TEMPLATE = "results/7b-answer-h200.jsonl"
MAIN, PAIR, OWN = 0.05, 0.01, 0.02
CROSS_OWN = 0.02
HOST_OFFSETS = (
    -0.394, -0.084, -0.075, -0.047, -0.035, -0.023, -0.021, -0.010, -0.006, -0.000, 0.001, 0.003,
    0.004, 0.015, 0.017, 0.032, 0.034, 0.053, 0.057, 0.057, 0.094, 0.099, 0.101, 0.133,
)  # fmt: skip
FLAG_RATE = ((0.25, 0.07), (0.5, 0.32), (0.75, 0.53), (1.01, 0.91))
SETUP_SD = 0.2
MEMORY_MAIN, MEMORY_PAIR, MEMORY_OWN = 0.01, 0.006, 0.01
FIRST_CALL_S = 330.0
CAP_S = 3600.0
SETTLE = answer.Settings().settle
ERRORS = ("measured", "model")


_DRAWN: dict[tuple, float] = {}


def _draw(seed: int, *key) -> float:
    """A standard normal fixed by the trial's seed and the key: the same whatever order cells are asked in."""
    k = (seed, *key)
    if k not in _DRAWN:
        _DRAWN[k] = float(np.random.default_rng([seed, zlib.crc32(repr(key).encode())]).standard_normal())
    return _DRAWN[k]


@dataclasses.dataclass
class Machine:
    name: str
    host: float  # log host time over the typical host's
    provenance: dict
    id: str


class World:
    """One trial's truth. errors: "measured" draws the step-time model's misses, the fixed costs and the flags from
    the records (tools.worlds' table, for the GPU `gpu`); "model" from the model's own prediction moved by effects."""

    def __init__(
        self, seed: int, hw, template: dict, optimizers: list[str], errors: str = "measured", table=None, cells=()
    ):
        self.seed, self.hw, self.errors = seed, hw, errors
        self.table = table  # the GPU's section of tools.worlds' table (measured)
        if errors == "measured" and not cells:
            raise ValueError(
                "the measured world needs the matrix's runnable cells (its knob effects are drawn on them)"
            )
        # Each knob's values among each family's cells of the matrix (`cells`): a knob's effects
        # are drawn about their mean over them, since only a value's effect against another's is what the records
        # show (a family's level is its own residual's).
        self.knob_values: dict[tuple, list[str]] = collections.defaultdict(list)
        for c in cells:
            for axis, value in worlds.knobs_of(c).items():
                held = self.knob_values[(worlds.family(c), axis)]
                if repr(value) not in held:
                    held.append(repr(value))
        rng = np.random.default_rng(seed)
        offsets = [HOST_OFFSETS[i] for i in rng.choice(len(HOST_OFFSETS), size=2, replace=False)]
        if errors == "measured":  # the first machine's own offset is in the residuals: the second differs by two's
            offsets = [0.0, offsets[1] - offsets[0]]
        self.machines = [self._machine(k, host, template) for k, host in enumerate(offsets)]
        picked = [str(o) for o in rng.choice(optimizers, size=min(2, len(optimizers)), replace=False)]
        self.diverges, self.rejected = (picked + [None, None])[:2]  # a matrix of fewer optimizers: fewer failures
        self._base: dict[str, tuple] = {}
        self._shift: dict[tuple, float] = {}
        self._knobs: dict[tuple, float] = {}  # (PEFT mode and offload, knob, value) -> its effect
        self._owns: dict[tuple, list[float]] = {}  # family -> its own misses

    @staticmethod
    def _machine(k: int, host: float, template: dict) -> Machine:
        prov = json.loads(json.dumps(template["provenance"]))
        prov["gpus"][0]["uuid"] = f"GPU-sim{k}{zlib.crc32(repr(host).encode()) % 10**8:08d}-0000-0000-0000-000000000000"
        prov["host"] = f"sim{k}"
        return Machine(f"machine {k + 1}", host, prov, machine_of(prov).id)

    def base(self, cell) -> tuple:
        """(log tokens/s on the typical host, host share, log peak bytes, start + setup s) of a cell."""
        if cell.hash not in self._base:
            log, share, mem, fixed, terms = _model(cell, self.hw)
            if self.errors == "measured":
                miss, fixed = self._measured_miss(cell), fixed * math.exp(self._pick("fixed", cell))
            else:
                miss = sum(MAIN * _draw(self.seed, "main", t) for t in terms)
                miss += sum(PAIR * _draw(self.seed, "pair", a, b) for i, a in enumerate(terms) for b in terms[i + 1 :])
                miss += OWN * _draw(self.seed, "own", cell.hash)
                fixed *= math.exp(SETUP_SD * _draw(self.seed, "setup", cell.hash))
            peak = mem + MEMORY_OWN * _draw(self.seed, "memory", cell.hash)
            peak += sum(MEMORY_MAIN * _draw(self.seed, "memory", t) for t in terms)
            peak += sum(
                MEMORY_PAIR * _draw(self.seed, "memory", a, b) for i, a in enumerate(terms) for b in terms[i + 1 :]
            )
            self._base[cell.hash] = (log + miss, share, peak, fixed)
        return self._base[cell.hash]

    def _pick(self, kind: str, cell, *key) -> float:
        """One entry of the cell's family's pool of `kind` (tools.worlds.pool), picked by the seed and the key."""
        got = worlds.pool(self.table[kind], worlds.family(cell))
        return got[_index(self.seed, len(got), kind, cell.hash, *key)]

    def _measured_miss(self, cell) -> float:
        """The cell's held-out residual, bootstrapped: its family's mean residual (the structural miss) moved by the
        mean of as many draws of the family's spread as the mean rests on (at least one: how well the records pin
        it; once per family and trial), plus each of its knob values' effect (tools.worlds.knob: once per trial, PEFT
        mode and offload, a random sign), plus a draw of its own miss (tools.worlds.own), the measurements' noise
        taken out of both, tails and all."""
        table, fam = self.table["step"], worlds.family(cell)
        devs = worlds.deviations(table, fam)
        if fam not in self._shift:
            mean, n = worlds.center(table, fam)
            again = [devs[_index(self.seed, len(devs), "shift", fam, k)] for k in range(max(n, 1))]
            self._shift[fam] = mean + statistics.fmean(again)
        mine = self._own(fam)
        knobs = sum(
            self._knob(fam[:2], axis, repr(value)) - statistics.fmean(
                self._knob(fam[:2], axis, v) for v in self.knob_values.get((fam, axis)) or [repr(value)]
            )
            for axis, value in worlds.knobs_of(cell).items()
        )  # fmt: skip
        return self._shift[fam] + knobs + mine[_index(self.seed, len(mine), "step", cell.hash)]

    def _own(self, fam: tuple) -> list[float]:
        """A family's own misses (tools.worlds.own; asked for every cell, worked out once)."""
        if fam not in self._owns:
            self._owns[fam] = worlds.own(self.table["own"], fam)
        return self._owns[fam]

    def _knob(self, where: tuple[str, str], axis: str, value: str) -> float:
        """One knob value's effect for a PEFT mode and offload (`where`; tools.worlds.knob, less the own misses of
        that mode and offload's cells), a random sign: the same for every family of them."""
        key = (where, axis, value)
        if key not in self._knobs:
            own = self._own((*where, ""))  # no optimizer kind: the mode and offload's pool (tools.worlds.pool)
            got = worlds.knob(self.table.get("knobs", {}), where[0], axis, statistics.fmean(x * x for x in own))
            sign = 1.0 if _draw(self.seed, "knob sign", where, axis, value) > 0 else -1.0
            self._knobs[key] = sign * got[_index(self.seed, len(got), "knob", where, axis, value)]
        return self._knobs[key]

    def speed(self, cell, m: Machine) -> float:
        """True log tokens/s of the cell on machine m."""
        log, share, _, _ = self.base(cell)
        return log - share * m.host + CROSS_OWN * _draw(self.seed, "cross", cell.hash, m.name)

    def fate(self, cell) -> tuple[str, str, str] | None:
        """(status, phase, reason) of a cell that does not run ok, else None."""
        if math.exp(self.base(cell)[2]) > self.hw.gpu_memory_bytes:
            return (
                "cuda_oom",
                "warmup",
                "CUDA out of memory in phase warmup: CUDA out of memory. Tried to allocate 2.1 GiB",
            )
        if cell.optimizer == self.diverges:
            return "diverged", "measured", f"loss became nan at step {3 + zlib.crc32(cell.hash.encode()) % 7}"
        if cell.optimizer == self.rejected and cell.engine == "hf_trainer":
            return (
                "error",
                "measured",
                (
                    f"RuntimeError in phase measured: optimizer '{cell.optimizer}' asked for {cell.optimizer}, but the "
                    "Trainer built AdamW: refusing to report this cell under a name it did not run"
                ),
            )
        return None

    def flag_rate(self, cell, m: Machine) -> float:
        """The chance a measurement of the cell on machine m is flagged: its family's share of flagged records
        (measured), else by its host share on that host (FLAG_RATE)."""
        if self.errors == "measured":
            got = worlds.pool(self.table["flags"], worlds.family(cell))
            return min(max(statistics.fmean(got), 0.001), 0.999)
        share = self.base(cell)[1]
        here = share * math.exp(m.host) / (1 - share + share * math.exp(m.host))  # the share on this host
        return next(rate for top, rate in FLAG_RATE if here < top)


def _index(seed: int, n: int, *key) -> int:
    """An index below n fixed by the trial's seed and the key (as _draw)."""
    return int(np.random.default_rng([seed, zlib.crc32(repr(key).encode())]).integers(n))


_MODELS: dict[str, tuple] = {}


def _model(cell, hw) -> tuple:
    """What the models say of a cell, the same in every trial: (log tokens/s, host share, log peak bytes, start
    and setup seconds, its axis values)."""
    if cell.hash not in _MODELS:
        from bench.matrix import dsconfig

        step, share = step_and_share(cell, hw)
        feats = {k: v for k, v in effects.features(results.axis_values(cell.to_dict())).items() if v is not None}
        _MODELS[cell.hash] = (
            math.log(cell.tokens_per_step / step),
            share,
            math.log(predict(cell, dsconfig.build(cell), hw).gpu_bytes),
            predict_start(cell, hw) + predict_setup(cell, hw),
            sorted(feats.items(), key=repr),
        )
    return _MODELS[cell.hash]


class SimRecording(Recording):
    """Synthetic records served as a replay: each attempt's end drawn from the World on the current machine."""

    def __init__(self, world: World, template: dict, failed: dict, oom: dict):
        self.world, self.paths, self.ends, self.served, self.where = world, [], None, {}, {}
        self.first, self._ok, self._failed, self._oom = template, template, failed, oom
        self.machine = world.machines[0]
        self.run_id = ""
        self.attempts = 0

    def restrict(self, p):
        return p

    def here(self, run_id: str) -> str:
        self.run_id = run_id
        return f"{run_id}@{self.machine.id}"

    def serve(self, attempt) -> Replayed:
        self.attempts += 1
        cell, ran = attempt.cell, attempt.job.cell  # the matrix's cell, and the rung's schedule it runs
        w, m = self.world, self.machine
        fate = w.fate(cell)
        k = self.served[cell.hash] = self.served.get(cell.hash, 0) + 1
        fixed = w.base(cell)[3]
        if fate is not None:
            status, phase, reason = fate
            rec = json.loads(json.dumps(self._oom if status == "cuda_oom" else self._failed))
            step = cell.tokens_per_step / math.exp(w.speed(cell, m))
            rec |= {"status": status, "phase_at_end": phase, "reason": reason}
            rec["wall_s"] = fixed + (1 if status == "cuda_oom" else 4 + 4) * step
        else:
            rec = self._measured(cell, ran, k)
        rec |= {"run_id": self.run_id, "attempt": k, "cell": cell.to_dict(), "cell_hash": cell.hash}
        rec |= {"cell_name": cell.name, "cell_id": cell.id, "provenance": m.provenance}
        rec.pop("machine", None)
        return Replayed(rec, f"synthetic truth {w.seed}")

    def _measured(self, cell, ran, k: int) -> dict:
        w, m = self.world, self.machine
        flagged = _draw(w.seed, "flag", cell.hash, m.name, self.attempts) < _probit(w.flag_rate(cell, m))
        noise = quality.NOISE["gpu_flagged" if flagged else "gpu"]
        log = w.speed(cell, m) + noise * _draw(w.seed, "noise", cell.hash, m.name, self.attempts)
        tps = math.exp(log)
        step = cell.tokens_per_step / tps
        steps = steps_of(ran, step, 6, 12 if k % 2 else ran.measured_steps) if flagged else steps_of(ran, step)
        rec = json.loads(json.dumps(self._ok))
        rec["metrics"] |= {
            "tokens_per_s": tps, "step_time_median_s": step, "step_time_mean_s": step,
            "step_time_p90_s": step * (1.08 if flagged else 1.02),
            "gpu_util_mean_pct": 70.0 if flagged else 95.0, "samples_per_s": tps / cell.seq_len,
        }  # fmt: skip
        peak = math.exp(w.base(cell)[2])
        rec["memory"] = {"nvml_proc_peak_bytes": int(peak), "host_rss_peak_bytes": rec["memory"]["host_rss_peak_bytes"]}
        rec["wall_s"] = w.base(cell)[3] + steps * step
        for k_ in ("steps", "step_times_s", "losses", "telemetry", "log_tail"):
            rec.pop(k_, None)
        return rec


def _probit(p: float) -> float:
    """The standard normal's p-quantile (a draw below it happens with chance p)."""
    return statistics.NormalDist().inv_cdf(p)


# -- one trial ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Trial:
    seed: int
    wrong_leaders: list[str]
    effects: int  # effects called faster or slower
    wrong_effects: list[str]
    spent_s: float
    settled: bool
    calls: int
    roles: dict[str, float] = dataclasses.field(default_factory=dict)  # cell seconds by why it was measured (`_roles`)
    chance: float | None = None  # the lead chance its answer states (printed to 0.1%; None: it printed none)
    misses: dict[str, tuple[int, int, int, float]] = dataclasses.field(default_factory=dict)  # per group (`_misses`)
    attempts: dict[str, int] = dataclasses.field(default_factory=dict)  # attempts by role, as `roles`


def _templates(gpu: str = "H200") -> tuple[dict, dict, dict]:
    """The records the simulated ones are made from (ok, error, cuda_oom): the H200's from TEMPLATE; another GPU's ok
    one from tools.worlds' table, its failures the H200's on its machine."""
    recs = [json.loads(line) for line in open(TEMPLATE)]
    first = {st: next(r for r in recs if r["status"] == st) for st in ("ok", "error", "cuda_oom")}
    if gpu != "H200":
        first["ok"] = worlds.load()["gpus"][gpu]["template"]
        for st in ("error", "cuda_oom"):
            first[st] = first[st] | {"provenance": first["ok"]["provenance"]}
    return first["ok"], first["error"], first["cuda_oom"]


def _platform(template: dict):
    """The machine a record was made on, as a replay of it plans for
    (bench.execute.executors.replay.Recording.platform)."""
    return Recording.platform(types.SimpleNamespace(first=template))


def _call(
    matrix: str,
    path: Path,
    sim: SimRecording,
    budget: float,
    resume: bool,
    settle: float,
    collapse: bool = False,
    asked: dict | None = None,
) -> list[str]:
    lines: list[str] = []
    ask = answer.Settings(budget_s=budget, settle=settle, collapse=collapse, **(asked or {}))
    s = RunSettings(matrix=matrix, results=str(path), answer=ask, progress=False, resume=resume)
    run(s, printer=lines.append, recording=sim)
    return lines


STATED = re.compile(r"settled: the chance that one of .* beats its group's fastest by more than \d+% is ([\d.]+)%")
"""The lead chance in the answer a call prints (bench.execute.answer.text._settled)."""


def _stated(printed: list[str]) -> float | None:
    """The lead chance the last call's answer states (None: it printed none)."""
    found = [m[1] for line in printed if (m := STATED.search(line))]
    return float(found[-1]) / 100 if found else None


def _settled(path: Path, printed: list[str]) -> bool:
    """Whether the last call settled the answer: its verdict line reads `settled:` (both chances below the level, every
    measured cell tied; else `not settled:`), and it left no cell that could still change the answer. Its unmeasured
    cells alone do not say: a measured cell that may still beat its leader (bench.execute.answer.settle.rivals) keeps
    the chance up with no unmeasured cell needed."""
    found = [line for line in printed if STATED.search(line)]
    if not found or not found[-1].startswith("  settled: "):  # the console's verdict (else "  not settled: ")
        return False
    recs = [r.to_dict() for r in Store(path).records()]
    last = [r for r in recs if r["run_id"] == recs[-1]["run_id"] and r["status"] == Status.UNMEASURED.value]
    return not any((r.get("answer") or {}).get("needed") for r in last)


def trial(
    matrix: str,
    seed: int,
    workdir: Path,
    first_s: float = FIRST_CALL_S,
    cap_s: float = CAP_S,
    settle: float = SETTLE,
    errors: str = "measured",
    gpu: str = "H200",
    calls: int = 2,
    machines: int = 2,
    collapse: bool = False,
    asked: dict | None = None,
    score: bool = True,
) -> Trial:
    """One synthetic truth on `gpu` (its misses drawn as `errors` says), answered in up to `calls` calls on
    `machines` machines (one: every call on the first; at the `--settle` level; `collapse`: answer mode's
    Settings.collapse; `asked`: other answer mode Settings by name), and scored against the truth (`score` False:
    not, for a caller that asks only whether it settled and what it spent: scoring builds a second Search)."""
    ok, failed, oom = _templates(gpu)
    platform = _platform(ok)
    hw = hardware(platform)
    items = _runnable(matrix, platform, hw)
    optimizers = sorted({it.cell.optimizer for it in items} - {"adamw", "fusedadam"})
    table = worlds.load()["gpus"][gpu] if errors == "measured" else None
    world = World(seed, hw, ok, optimizers, errors, table, [it.cell for it in items])
    sim = SimRecording(world, ok, failed, oom)
    path = workdir / f"trial-{seed}.jsonl"
    printed = _call(matrix, path, sim, first_s, resume=False, settle=settle, collapse=collapse, asked=asked)
    made = 1
    if calls > 1 and not _settled(path, printed):
        sim.machine = world.machines[min(machines, 2) - 1]
        printed = _call(matrix, path, sim, cap_s, resume=True, settle=settle, collapse=collapse, asked=asked)
        made = 2
    recs = [r.to_dict() for r in Store(path).records()]
    ended = [r for r in recs if r["status"] not in ("started", "unmeasured", "skipped")]
    spent = sum(r.get("wall_s") or 0.0 for r in ended)
    (roles, attempts), stated = _roles(ended), _stated(printed)
    wrong, called, wrong_fx, misses = [], 0, [], {}
    if score:
        s = _search(items, hw, recs)
        (wrong, called, wrong_fx), misses = _score(s, world, recs), _misses(s, world)
    return Trial(seed, wrong, called, wrong_fx, spent, _settled(path, printed), made, roles, stated, misses, attempts)


def _roles(ended: list[dict]) -> tuple[dict[str, float], dict[str, int]]:
    """Cell seconds and attempts by the role each attempt was asked for (bench.execute.answer.Request.role; an effect's
    pair for the screen, Settings.screen, as "screen"), an
    attempt of a cell attempted before as "<role> again" and one that did not end ok as "<role> <status>"."""
    out: collections.Counter = collections.Counter()
    n: collections.Counter = collections.Counter()
    seen: set[str] = set()
    for r in ended:
        note = r.get("answer") or {}
        role = "screen" if note.get("why", "").startswith("a screen's pair") else note.get("role", "none")
        role += " again" if r["cell_hash"] in seen else ""
        role += "" if r["status"] == "ok" else f" {r['status']}"
        seen.add(r["cell_hash"])
        out[role] += r.get("wall_s") or 0.0
        n[role] += 1
    return dict(out), dict(n)


def _reference(s: answer.Search, world: World) -> Machine:
    """The machine of the answer's reference block, whose scale the answer's figures are on."""
    machine = {m.id: m for m in world.machines}
    return machine.get((s.offsets.ref or "@").split("@")[1], world.machines[0])


def _misses(s: answer.Search, world: World) -> dict[str, tuple[int, int, int, float]]:
    """How far the truth lies from the corrected step-time prediction of each unmeasured cell that runs, at the
    trial's end, z = (truth - prediction) / its sd, per group: (cells, z past 2, z past 3, the mean z). The cells of
    one trial share effects, so their z move together: the mean per trial says how much."""
    ref = _reference(s, world)
    out = {}
    for g in s.groups():
        cells = [c for c in s.candidates if c.group == g and not c.obs and c.base_tps is not None]
        cells = [c for c in cells if world.fate(c.cell) is None]
        if cells:
            mean, sd = s.tps.marginals([(c.model, c.base_tps) for c in cells])
            z = (np.array([world.speed(c.cell, ref) for c in cells]) - mean) / sd
            out[answer.group_name(s.settings, g)] = (len(z), int((z > 2).sum()), int((z > 3).sum()), float(z.mean()))
    return out


def _runnable(matrix: str, platform, hw) -> list[Planned]:
    items, _, free = arrange(answer_plan(matrix, platform).items, hw, 0.1, True, "early")
    return [it for it in items if it.skip is None and id(it) not in free]


def answer_plan(matrix: str, platform):
    """The plan answer mode runs (bench.execute.run: micro-batches expanded where it searches them)."""
    from bench.execute.run import answer_items

    return answer_items(plan(matrix, platform=platform), platform)


def _search(items: list[Planned], hw, recs: list[dict]) -> answer.Search:
    s = answer.Search(items, hw, answer.Settings(), True)
    for r in recs:
        if r["status"] not in ("started", "unmeasured", "skipped", "implied_oom"):
            s.observe(parse(r), (r.get("answer") or {}).get("rung"))
    return s


def _score(s: answer.Search, world: World, recs: list[dict]) -> tuple[list[str], int, list[str]]:
    """The groups whose fastest cell is wrong in truth, the effects called, those called the wrong way."""
    machine = {m.id: m for m in world.machines}
    ref = _reference(s, world)
    tol = math.log(1 + s.settings.speed_tolerance)
    wrong = []
    for g in s.groups():
        runs = [c for c in s.candidates if c.group == g and world.fate(c.cell) is None]
        if not runs:
            continue
        best = max(world.speed(c.cell, ref) for c in runs)
        lead = s.leader(g)
        if lead is None or best - world.speed(lead.cell, ref) > tol:
            wrong.append(answer.group_name(s.settings, g))
    called, wrong_fx = 0, []
    for (axis, value, _, pairs, _), (_, _, _, e) in zip(s.effect_pairs(), s.effects()):
        if e.verdict not in (effects.FASTER, effects.SLOWER):
            continue
        called += 1
        true = []
        for a, b in pairs:
            m = machine[sorted(set(a.obs) & set(b.obs))[0].split("@")[1]]
            true.append(world.speed(b.cell, m) - world.speed(a.cell, m))
        if (statistics.fmean(true) > 0) != (e.verdict == effects.FASTER):
            wrong_fx.append(f"{axis}={value}")
    return wrong, called, wrong_fx


# -- many trials ---------------------------------------------------------------------------------------------


def _one(args: tuple) -> Trial:
    matrix, seed, first_s, cap_s, settle, errors, gpu, calls, machines, collapse, asked = args
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None  # every record is fsynced: memory is faster
    with tempfile.TemporaryDirectory(prefix="answer-sim-", dir=shm) as d:
        return trial(matrix, seed, Path(d), first_s, cap_s, settle, errors, gpu, calls, machines, collapse, asked)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.answer_sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("matrix")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="trials side by side (processes)")
    ap.add_argument("--first-call", type=float, default=FIRST_CALL_S, help="the first call's --budget, seconds")
    ap.add_argument("--cap", type=float, default=CAP_S, help="cell seconds after which a trial counts as not settled")
    ap.add_argument("--settle", default=f"{SETTLE:.0%}", help="answer mode's --settle level (default %(default)s)")
    ap.add_argument(
        "--errors",
        choices=ERRORS,
        default="measured",
        help="the truth's misses: drawn from the records (measured), or from the model's own effects",
    )
    ap.add_argument(
        "--gpu",
        choices=worlds.GPUS,
        default="H200",
        help="the GPU the machines have: the search's prior is the models' on it, the world its records'",
    )
    ap.add_argument(
        "--calls",
        type=int,
        choices=(1, 2),
        default=2,
        help="calls per trial: 1 ends a trial when the first call's budget is spent",
    )
    ap.add_argument(
        "--machines",
        type=int,
        choices=(1, 2),
        default=2,
        help="machines the calls run on: 1 puts the second call on the first's machine (a new block all the same)",
    )
    ap.add_argument(
        "--collapse", action="store_true", help="answer mode's Settings.collapse (bench.execute.answer.collapse)"
    )
    ap.add_argument("--screen", type=int, default=0, help="answer mode's Settings.screen: pairs per knob value, first")
    ap.add_argument(
        "--no-frontier",
        action="store_true",
        help="answer mode's Settings.frontier off: the stopping rule asks only who leads",
    )
    a = ap.parse_args(argv)
    if not a.matrix:
        ap.error("MATRIX is needed")
    if a.trials < 0 or a.jobs < 1:
        ap.error(f"--trials takes 0 or more (got {a.trials}), --jobs 1 or more (got {a.jobs})")
    try:
        settle = chance_level(a.settle)
    except ValueError as e:
        ap.error(str(e))
    asked = {"screen": a.screen} | ({"frontier": False} if a.no_frontier else {})
    jobs = [
        (a.matrix, a.seed + k, a.first_call, a.cap, settle, a.errors, a.gpu, a.calls, a.machines, a.collapse, asked)
        for k in range(a.trials)
    ]
    if a.jobs > 1:  # one BLAS thread per process: 16 processes of 16 threads each on 16 cores hardly moved
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")
    done: list[Trial] = []
    with contextlib.ExitStack() as stack:
        if a.jobs > 1:
            import multiprocessing

            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(a.jobs))
            trials = pool.imap(_one, jobs)
        else:
            trials = map(_one, jobs)
        for t in trials:  # each as it ends: a 50-trial run takes an hour, and says where it is
            done.append(t)
            print(f"trial {t.seed}: {t.spent_s / 60:.1f} min in {t.calls} call(s), settled {t.settled}; wrong leader "
                  f"{t.wrong_leaders or 'none'} (lead chance {_pct(t.chance)}); {t.effects} effects called, wrong "
                  f"{t.wrong_effects or 'none'}",
                  flush=True)  # fmt: skip
    print(by_role(done))
    print(calibration(done))
    print(misses(done))
    print(summary(done))
    return 0


def by_role(done: list[Trial]) -> str:
    """Where the cell time went: seconds per trial by role (`_roles`), the mean over the trials, largest first, each
    with its attempts per trial and seconds per attempt."""
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for t in done:
        total.update(t.roles)
        count.update(t.attempts)
    k = max(len(done), 1)
    parts = [
        f"{role} {s / k:.0f}" + (f" ({count[role] / k:.1f} x {s / count[role]:.1f} s)" if count[role] else "")
        for role, s in total.most_common()
    ]
    return "cell seconds per trial by role (mean; attempts x seconds each): " + ", ".join(parts)


def _pct(p: float | None) -> str:
    return "not stated" if p is None else f"{p:.1%}"


def calibration(done: list[Trial]) -> str:
    """The lead chances the trials' answers state, summed: the wrong leaders a rule whose chances hold would expect over
    these trials, beside the count the truths found (a pair the answer names as a tie is outside the chance, and counts
    as a wrong leader where the truth puts the other one ahead by more than the minimum effect)."""
    stated = [t for t in done if t.chance is not None]
    wrong = sum(bool(t.wrong_leaders) for t in stated)
    return (
        f"lead chance the answers state, summed over {len(stated)} trial(s): {sum(t.chance for t in stated):.2f} "
        f"(wrong leaders the truths found in them: {wrong})"
    )


def misses(done: list[Trial]) -> str:
    """The step-time predictions' tails against a normal's, pooled per group over the trials' unmeasured cells
    (`_misses`), and the spread of each trial's mean z: one trial whose shared effects were drawn far out moves
    all its cells at once, and weighs in the pooled tail as one event, not as hundreds."""
    parts = []
    for g in sorted({g for t in done for g in t.misses}):
        got = [(t.seed, t.misses[g]) for t in done if g in t.misses]
        n, two, three = (sum(m[k] for _, m in got) for k in range(3))
        means = [m[3] for _, m in got]
        far = max(got, key=lambda x: abs(x[1][3]))
        parts.append(
            f"{g}: {n} cells, {two / n:.1%} past 2, {three / n:.2%} past 3; a trial's mean z sd "
            f"{statistics.pstdev(means):.2f}, farthest {far[1][3]:+.2f} (trial {far[0]})"
        )
    normal = statistics.NormalDist()
    return (
        "the unmeasured cells at each trial's end, z = (truth - corrected prediction) / its sd (a normal's tail: "
        f"{1 - normal.cdf(2):.1%} past 2, {1 - normal.cdf(3):.2%} past 3): " + ("; ".join(parts) or "none")
    )


def summary(done: list[Trial]) -> str:
    """The last line: wrong leaders, wrong effect signs, cell time to settle (median, p90), trials not settled."""
    if not done:
        return "answer_sim: no trial ran (--trials 0)"
    minutes = sorted(t.spent_s / 60 for t in done)
    p90 = minutes[min(len(minutes) - 1, math.ceil(0.9 * len(minutes)) - 1)]
    return (
        f"answer_sim: wrong leader in {sum(bool(t.wrong_leaders) for t in done)} of {len(done)}; wrong effect sign in "
        f"{sum(len(t.wrong_effects) for t in done)} of {sum(t.effects for t in done)}; cell time to settle median "
        f"{statistics.median(minutes):.1f} min, p90 {p90:.1f} min; not settled in "
        f"{sum(not t.settled for t in done)} of {len(done)}"
    )


if __name__ == "__main__":
    sys.exit(main())
