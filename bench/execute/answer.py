"""Answer mode (`zerobench run M --answer`): measure only what settles the answer, then stop.

The answer, per model: (a) the fastest cell that fits in each group (by PEFT mode unless --group-by says
otherwise), (b) the memory/speed frontier, (c) each knob's effect on throughput with a 95% interval. Every
runnable cell starts open. The step-time and memory models give each a prediction; what the run measures
corrects them (bench.estimate.planning.online: an offset for the machine, one per block, and an additive effect per
axis value, fitted to the residuals), so after a few cells the predictions speak for this machine.

Blocks: a measurement belongs to one run part on one machine (bench.records.record.Record.block). Two measured cells
compare directly only within a block; across blocks through anchors, cells measured in both
(bench.judge.blocks). A knob's effect is made of pairs measured in one block. A search that goes on (--resume) in
a new block first measures anchors there: each group's leader and a few other cells measured before (role
"anchor"), so its offset is known; a cell whose comparison no anchor settles is measured again in this
block where the answer needs it. Each measurement carries its noise (bench.records.quality: about three times wider
when it was host-bound or unstable). A cell is measured when it
could still change the answer, in this order: each group's predicted leader; a cell whose throughput
interval reaches the leader's; the leader again on the full schedule, and whichever of two overlapping cells
has fewer measurements (up to MAX_MEASUREMENTS), another short look; a cell not dominated on memory (the
frontier); a pair partner for a knob effect (--pairs per value). A cell is left unmeasured only when its
throughput interval lies below its group leader's AND a measured cell needs no more memory (within the
tolerance) and is surely faster; when it is expected to repeat an error that two attempts of cells sharing its
settings ended in (bench.execute.failures); or when the budget (--budget) is spent. Its record says which.

Successive halving over measured steps: a cell's measurements run the short schedule (rung 0, a short look:
rung_cell, whose median lands within a fraction of one measurement's noise of the full schedule's); only each
group's leader runs again on the matrix's own schedule (rung 1), the answer's own figure. A rung is a repeat
of the same cell: the record keeps the cell's identity and says the schedule it ran (`steps`) and why it was
measured (`answer`).

Pure decisions: no I/O; the session (bench.execute.session) asks `next()` for work and `observe()`s records.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ..estimate import Hardware, predict
from ..estimate.band import band_group, bands_for
from ..estimate.planning.online import SHARE, Online
from ..estimate.steptime import STEP_BAND, predict_wall, step_and_share
from ..judge import blocks, compare, effects, results
from ..judge.blocks import Obs
from ..matrix.axes import AXIS
from ..matrix.cells import Cell
from ..records import quality
from ..records.record import Record
from ..records.status import Status
from .failures import Lessons, shared
from .families import park, wontfit
from .plan import Planned
from .settings import AnswerSettings as Settings
from .settle import Chances, chances

__all__ = ["Settings", "Candidate", "Request", "Search", "rung_cell"]

MEMORY_NOISE = 0.02
"""Log spread of a measured peak between repeats (a run's figures differ by 1-2%)."""
Z = 1.96  # two-sided 95%: the intervals shown
Z1 = 1.645  # one-sided 95%: "could it be faster?"
MAX_MEASUREMENTS = 3  # per cell and block: past this, two cells that still overlap are a tie within the noise
EXTRA_ANCHORS = 2  # anchors a new block measures besides the groups' leaders
# How far the step-time model may miss, on the log scale, once the machine's offset is taken out: one axis value's
# effect, one pair of axis values' (two knobs whose effects do not multiply), and a cell's own (the misfit's prior
# guess; the run learns it from its residuals, never below that guess: docs/answer-mode.md, the joint stopping rule).
# Prior widths set by hand at the size of the step-time model's held-out misses on H200 records; no committed tool
# derives them yet. On a CPU host, which the step-time model does not describe, each is wider by CPU_WIDE.
MAIN_SD = 0.05
PAIR_SD = 0.01
MISFIT_GUESS = 0.02
CPU_WIDE = 4.0
HOST_SD = 0.1
"""How far a machine's host may be from the typical host's (log host seconds), on the step-time model's GPUs: the
spread (sd 0.098) of the per-machine host offsets its fit finds on the committed H200 files
(bench.estimate.checks.timecheck.machine_offsets, 24 machines, -0.39 to +0.13). It moves a cell by its host share."""
# The same for the memory model's peak on a GPU (set by hand, small: its held-out p95 is 12.5% over all records, less
# within one matrix); a CPU host's RSS is far less sure.
MEMORY_SD = {"offset": 0.05, "main": 0.01, "pair": 0.006, "misfit": 0.01}
MEMORY_SD_CPU = {"offset": 1.0, "main": 0.1, "pair": 0.0, "misfit": 0.05}


@dataclass(eq=False)
class Candidate:
    """One runnable cell as the search sees it."""

    planned: Planned
    group: tuple
    base_tps: float | None  # log tokens/s the step-time model predicts
    base_mem: float | None  # log bytes the memory model predicts (GPU peak; host RSS on a CPU host)
    base_cost: float | None  # log wall seconds the step-time model predicts on the full schedule
    # open, measured, failed, implied, expected (to repeat an error: bench.execute.failures), parked (another
    # micro-batch of its configuration is measured instead) or wontfit (out-of-memory ends put it past the memory:
    # bench.execute.families)
    state: str = "open"
    parked_by: Candidate | None = None  # parked: the micro-batch of its configuration measured instead
    obs: dict[str, list[Obs]] = field(default_factory=dict)  # block -> measured log tokens/s and its noise
    flags: list[str] = field(default_factory=list)  # bench.records.quality's flags of its measurements
    mem: float | None = None  # measured log peak (the largest)
    rungs: list[int] = field(default_factory=list)  # the rung of each attempt that ended
    tries: int = 0  # attempts started
    tries_in: collections.Counter = field(default_factory=collections.Counter)  # attempts started per block
    failed_in: set = field(default_factory=set)  # blocks where an attempt failed after it had measured elsewhere
    limit: int = MAX_MEASUREMENTS  # attempts it may have (a replay: as many as it has recorded ends)
    model: dict = field(default_factory=dict)  # the features that tell it from the other candidates (the models')
    short: float = 0.0  # log of rung 0's predicted wall over the full schedule's
    share: float | None = None  # how much of its step waits on the host (bench.estimate.steptime.host_share)
    band: tuple[float, float] | None = None  # its prediction's held-out error band, log step time (bench.estimate.band)
    _features: dict | None = None

    @property
    def logs(self) -> list[float]:
        """Every measured log tokens/s, whatever the block."""
        return [o.log for obs in self.obs.values() for o in obs]

    @property
    def cell(self) -> Cell:
        return self.planned.cell

    @property
    def features(self) -> dict:
        """Its axis values as the results frame has them; None for an axis that means nothing here (LoRA's rank
        without LoRA): bench.judge.effects.features."""
        if self._features is None:
            self._features = effects.features(results.axis_values(self.cell.to_dict()))
        return self._features


@dataclass(frozen=True)
class Request:
    """What to measure next and why."""

    candidate: Candidate
    rung: int
    role: str  # leader, contender, frontier, effect, anchor
    why: str
    group: str = ""  # the candidate's group as key=value
    effect: tuple | None = None  # (axis, value) of the pair it is for


SHORT_LOOK = {"settle_window": 2, "min_steps": 4, "level": 0.875}
"""Rung 0's adaptive rule, where the matrix's asks more: warm-up settled over 2 steps, then at least 4 measured steps
whose range (87.5% for the median) is within the tolerance. On the committed H200 records that flag nothing, such a
look lands within a fraction of one measurement's noise of the matrix's own schedule (tools.noise.short_look)."""


def rung_cell(cell: Cell, rung: int) -> Cell:
    """The cell as rung `rung` runs it: rung 0 a short look (half the measured steps and time cap, twice the
    tolerance, SHORT_LOOK's warm-up window, fewest steps and level), rung 1 the matrix's own schedule."""
    if rung >= 1:
        return cell
    a = cell.adaptive
    fewest = min(a.min_steps, SHORT_LOOK["min_steps"]) if a and a.measured else 3
    measured = min(max(cell.measured_steps // 2, fewest), cell.measured_steps)
    if a is None:
        return dataclasses.replace(cell, measured_steps=measured)
    short = dataclasses.replace(
        a,
        tolerance=min(2 * a.tolerance, 0.10),
        max_seconds=None if a.max_seconds is None else a.max_seconds / 2,
        **{k: min(getattr(a, k), v) for k, v in SHORT_LOOK.items()},
    )
    return dataclasses.replace(cell, adaptive=short, measured_steps=measured)


class Search:
    """The search's state: candidates, what the run measured (by block), and the fitted corrections."""

    def __init__(
        self,
        runnable: Iterable[Planned],
        hw: Hardware,
        settings: Settings,
        cuda: bool,
        ends: dict | None = None,
        here: str | None = None,
        predicted: dict[int, dict | None] | None = None,
    ):
        """ends: for a replay, how many recorded ends each cell hash has (it is measured at most that often).
        predicted: the plan's memory predictions by id(Planned) (bench.execute.plan.arrange), reused.
        here: the block this run's attempts measure in (bench.records.record.Record.block), where the run knows it in
        advance (one machine); None where each record says (a replay, a cluster)."""
        self.s, self.hw, self.cuda, self.here = settings, hw, cuda, here
        kind = "gpu" if cuda else "cpu"
        self.noise, self.cross = quality.NOISE[kind], quality.CROSS[kind]
        # On a GPU the step-time model divides by that GPU's rates (its probe's, else its data sheet's), so every
        # GPU gets one prior: the machine as a whole off by up to the model's held-out band (p95 of |log error|,
        # STEP_BAND), each knob and pair of knobs by MAIN_SD and PAIR_SD, a cell's own misfit learned from the
        # measured cells' residuals, never below its guess (in either model, as tools.answer_sim ran it). On a CPU
        # host, which the model does not describe, only its ranking is trusted: each guess CPU_WIDE-wide, and the
        # residuals may take it lower.
        band = STEP_BAND["familiar"]["p95"] / Z if cuda else 0.7
        wide = 1.0 if cuda else CPU_WIDE
        self.tps = Online(
            prior_sd=MAIN_SD * wide, offset_sd=band if cuda else 3.0, noise_sd=self.noise,
            misfit_sd=MISFIT_GUESS * wide, pair_sd=PAIR_SD * wide, learn_misfit=True,
            host_sd=HOST_SD if cuda else 0.0, misfit_floor=MISFIT_GUESS if cuda else 0.0,
        )  # fmt: skip
        m = MEMORY_SD if cuda else MEMORY_SD_CPU
        self.memory = Online(
            prior_sd=m["main"], offset_sd=m["offset"], noise_sd=MEMORY_NOISE, misfit_sd=m["misfit"],
            pair_sd=m["pair"], learn_misfit=True, misfit_floor=m["misfit"] if cuda else 0.0,
        )  # fmt: skip
        self.cost = Online(prior_sd=0.3, offset_sd=0.5 if cuda else 3.0, noise_sd=0.2)
        self.candidates = [self._candidate(p, (predicted or {}).get(id(p))) for p in runnable]
        for c in self.candidates if ends is not None else ():
            c.limit = min(MAX_MEASUREMENTS, len(ends.get(c.cell.hash, ())))
        self.by_hash = {c.cell.hash: c for c in self.candidates}
        # What tells the cells apart for the models: axis values some candidates have and others not.
        for c, model in zip(self.candidates, _distinct([c.features for c in self.candidates])):
            c.model = model | ({SHARE: c.share} if c.share else {})
        self.tps.declare([c.model for c in self.candidates])
        self.memory.declare([c.model for c in self.candidates])
        # A configuration's micro-batches (micro_batch: auto, bench.execute.families), smallest first.
        self.capacity = (hw.gpu_memory_bytes if cuda else hw.host_memory_bytes) or None
        self.families: dict[str, list[Candidate]] = {}
        for c in sorted(self.candidates, key=lambda c: c.cell.micro_batch):
            if c.planned.family is not None:
                self.families.setdefault(c.planned.family, []).append(c)
        self.wont: dict[str, str] = {}  # cell hash -> the out-of-memory ends that put it past the memory
        self.in_flight: dict[str, int] = {}  # cell hash -> the rung running
        self.spent_s = 0.0
        self.over_budget = False
        self.resumed = False  # --resume: the search goes on from an earlier call's records
        self.started_here = 0  # attempts this call started
        self.order: list[str] = []  # the blocks, in the order their first measurement came
        self._memo: dict = {}  # speeds, offsets and memory intervals, until the next outcome
        self._turn = 0  # whose turn: who leads, the frontier, the effects (next())
        self._knobs: tuple = ((), [])  # the live cells (ids) and their knob pairs (bench.judge.effects.knob_pairs)
        self._pair_failures: collections.Counter = collections.Counter()  # (axis, value) -> attempts that failed
        self._effect_of: dict[str, tuple] = {}  # cell hash -> the (axis, value) its attempt in flight is for
        self._role_of: dict[str, str] = {}  # cell hash -> the role of its attempt in flight
        self.where: dict[str, str] = {}  # block -> the machine, in words
        # Errors teach the search: cells that share a repeated error's failing settings are not measured.
        self.lessons = Lessons(shared(c.features for c in self.candidates))
        park(self)

    def _candidate(self, p: Planned, predicted: dict | None) -> Candidate:
        """The models' predictions for a cell, each made once: its step, its wall on each rung, its memory (the
        plan's, where the plan made one for this machine)."""
        cell, hw = p.cell, self.hw
        step, share = step_and_share(cell, hw) or (None, None)
        mem = self._memory(p, predicted)
        wall = predict_wall(cell, hw, step=step)
        short = predict_wall(rung_cell(cell, 0), hw, step=step) if wall else None
        return Candidate(
            planned=p,
            group=tuple(getattr(cell, g) for g in self.s.group_by),
            base_tps=math.log(cell.tokens_per_step / step) if step else None,
            base_mem=math.log(mem) if mem else None,
            base_cost=math.log(wall) if wall else None,
            short=math.log(short / wall) if short and wall else 0.0,
            share=share,
            band=self._band(p) if step and self.cuda else None,
        )

    def _band(self, p: Planned) -> tuple[float, float] | None:
        """The step-time model's held-out error band for the cell's family on this machine (bench.estimate.band:
        its group's calibrated edges of log(measured / predicted) step time)."""
        b = bands_for(self.hw).get(band_group(p.cell, p.ds_config, hw=self.hw))
        return (b["low"], b["high"]) if b else None

    def _memory(self, p: Planned, predicted: dict | None) -> float | None:
        """Predicted peak bytes where the search measures them: the GPU's, or host RSS on a CPU host."""
        key = "gpu_bytes" if self.cuda else "host_bytes"
        if predicted and predicted.get(key):
            return predicted[key]
        try:
            est = predict(p.cell, p.ds_config, self.hw)
        except ValueError:
            return None
        return est.gpu_bytes if self.cuda else est.host_bytes

    # -- what the run knows of a cell ---------------------------------------------------------------------

    @property
    def offsets(self) -> blocks.Offsets:
        """Each block's offset from the reference block, from the anchors (bench.judge.blocks.offsets)."""
        if "offsets" not in self._memo:
            measured = {c.cell.hash: c.obs for c in self.candidates if c.obs}
            offs = blocks.offsets(measured, self.cross, self.order)
            self.tps.anchor({b: (offs.mean[b], offs.var(b) if b != offs.ref else 0.0) for b in offs.blocks})
            self._memo["offsets"] = offs
        return self._memo["offsets"]

    def speed(self, c: Candidate) -> tuple[float, float]:
        """log tokens/s of the cell on the reference block's scale: (mean, sd), measured where it was (through
        the anchors from another block), else predicted."""
        key = ("speed", id(c))
        if key not in self._memo:
            self._memo[key] = self._speed(c)
        return self._memo[key]

    def _speed(self, c: Candidate) -> tuple[float, float]:
        if c.obs:
            mean, var = blocks.level(c.obs, self.offsets, self.cross)
            return mean, math.sqrt(var)
        if c.base_tps is None:
            return math.inf, math.inf  # unknown: it could lead
        return self._predicted("tps")[id(c)]

    def _predicted(self, which: str) -> dict[int, tuple[float, float]]:
        """Every unmeasured cell's corrected prediction (log tokens/s or log peak), by id: one pass over all."""
        key = ("predicted", which)
        if key not in self._memo:
            self.offsets  # noqa: B018 - the model's block offsets are the anchors'
            model, base = (self.tps, "base_tps") if which == "tps" else (self.memory, "base_mem")
            cells = [c for c in self.candidates if getattr(c, base) is not None]
            means, sds = model.marginals([(c.model, getattr(c, base)) for c in cells])
            self._memo[key] = {id(c): (float(m), float(sd)) for c, m, sd in zip(cells, means, sds)}
        return self._memo[key]

    def posterior(self, cells: list[Candidate]) -> tuple[np.ndarray, np.ndarray]:
        """The joint mean and covariance of these cells' log tokens/s on the reference block's scale: measured
        cells from their measurements and the blocks' offsets (bench.judge.blocks.joint), the others from the corrected
        step-time model (Online.posterior); a measured and a predicted cell are taken as independent."""
        mean, cov = np.zeros(len(cells)), np.zeros((len(cells), len(cells)))
        measured = [i for i, c in enumerate(cells) if c.obs]
        predicted = [i for i, c in enumerate(cells) if not c.obs and c.base_tps is not None]
        if measured:
            m, v = blocks.joint([cells[i].obs for i in measured], self.offsets, self.cross)
            mean[measured], cov[np.ix_(measured, measured)] = m, v
        if predicted:
            self.offsets  # noqa: B018 - the model's block offsets are the anchors'
            m, v = self.tps.posterior([(cells[i].model, cells[i].base_tps) for i in predicted])
            mean[predicted], cov[np.ix_(predicted, predicted)] = m, v
        unknown = [i for i, c in enumerate(cells) if not c.obs and c.base_tps is None]
        mean[unknown], cov[unknown, unknown] = math.inf, math.inf
        return mean, cov

    def gap(self, c: Candidate, m: Candidate) -> tuple[float, float]:
        """log(c / m) and its sd: two measured cells within the blocks both ran in, else through the anchors
        (bench.judge.blocks.gap); a predicted cell's own width beside a measured one's."""
        if c.obs and m.obs:
            g = blocks.gap(c.obs, m.obs, self.offsets, self.cross)
            return g.d, math.sqrt(g.var)
        (mc, sc), (mm, sm) = self.speed(c), self.speed(m)
        return mc - mm, math.hypot(sc, sm)

    def comparable(self, c: Candidate, m: Candidate) -> bool:
        """Whether two measured cells compare at all: one block, or blocks the anchors tie together."""
        part = self._parts()
        return bool({part[b] for b in c.obs} & {part[b] for b in m.obs})

    def _parts(self) -> dict[str, int]:
        """Each block's set of blocks tied by anchors, numbered (bench.judge.blocks.parts)."""
        if "parts" not in self._memo:
            measured = {c.cell.hash: c.obs for c in self.candidates if c.obs}
            self._memo["parts"] = blocks.parts(measured, self.offsets.ref)
        return self._memo["parts"]

    def untied(self) -> list[Candidate]:
        """The measured cells of blocks no anchor ties to the reference block: compared with no cell of it, and left
        out of the chances (bench.execute.settle)."""
        tied = self.offsets.tied
        return [c for c in self.candidates if c.obs and not set(c.obs) & tied]

    def interval(self, c: Candidate) -> tuple[float, float]:
        m, sd = self.speed(c)
        return m - Z * sd, m + Z * sd

    def memory_interval(self, c: Candidate) -> tuple[float, float]:
        key = ("memory", id(c))
        if key not in self._memo:
            self._memo[key] = self._memory_interval(c)
        return self._memo[key]

    def _memory_interval(self, c: Candidate) -> tuple[float, float]:
        if c.mem is not None:
            return c.mem - Z * MEMORY_NOISE, c.mem + Z * MEMORY_NOISE
        if c.base_mem is None:
            return -math.inf, math.inf
        m, sd = self._predicted("memory")[id(c)]
        return m - Z * sd, m + Z * sd

    def cost_s(self, c: Candidate, rung: int) -> float:
        """Predicted wall seconds of one attempt at this rung, corrected by the walls measured so far."""
        if c.base_cost is None:
            return 0.0
        if "cost" not in self._memo:
            self._memo["cost"] = self.cost.predict({}, 0.0)[0]
        log = c.base_cost + self._memo["cost"]
        return math.exp(log + c.short if rung == 0 and self.s.halving else log)

    # -- the run's outcomes -------------------------------------------------------------------------------

    @property
    def spent_at_start(self) -> bool:
        """A resumed call whose budget afforded no attempt: it measured nothing, so it settled nothing either."""
        return self.resumed and self.over_budget and not self.started_here

    def unaffordable(self) -> bool:
        """The budget left pays for no attempt: each cell that may still be measured costs more, even on the short
        schedule, than is left (a resumed call whose earlier ones spent it). Nothing will be measured."""
        if self.s.budget_s is None:
            return False
        left = self.s.budget_s - self.spent_s
        return not any(self.cost_s(c, 0) <= left for c in self.candidates if not self.exhausted(c))

    def started(self, c: Candidate, rung: int, request: Request | None = None) -> None:
        c.tries += 1
        self.started_here += 1
        c.tries_in[self.here] += 1
        if request is not None and request.effect:
            self._effect_of[c.cell.hash] = request.effect
        if request is not None:
            self._role_of[c.cell.hash] = request.role
        self.in_flight[c.cell.hash] = rung
        self._memo.clear()

    def earlier(self, rec: Record) -> None:
        """An attempt an earlier part of the run made (--resume): its outcome, and a try in its block. The budget is
        the whole search's: a cell that is no candidate now (another --gpu-mem put it out of the plan) spent its
        time too."""
        self.observe(rec, rec.answer.rung if rec.answer else None)
        c = self.by_hash.get(rec.cell_hash)
        if c is None:
            self.spent_s += rec.wall_s or 0.0
            return
        c.tries += 1
        c.tries_in[rec.block] += 1

    def observe(self, rec: Record, rung: int | None = None) -> None:
        """An attempt of a candidate ended (or, on --resume, had ended before)."""
        c = self.by_hash.get(rec.cell_hash)
        if c is None:
            return
        self._memo.clear()
        self.in_flight.pop(rec.cell_hash, None)
        self._role_of.pop(rec.cell_hash, None)
        self.spent_s += rec.wall_s or 0.0
        if rec.wall_s and c.base_cost is not None:
            predicted = c.base_cost + (c.short if rung == 0 else 0.0)
            self.cost.observe({}, predicted, math.log(rec.wall_s))
        if rec.status is Status.OK and rec.metrics and rec.metrics.tokens_per_s:
            self._measured(c, rec, rung)
        elif rec.status is Status.INTERRUPTED or rec.status is Status.KILLED:
            # No outcome: it may run again, unless an error learnt while it ran says it would repeat.
            self._effect_of.pop(rec.cell_hash, None)
            self._expect()
            park(self)
            self._memo.clear()
            return
        elif c.state != "measured":
            c.state = "failed"
        else:
            c.failed_in.add(rec.block)  # measured elsewhere, failed here: not an anchor here
        effect = self._effect_of.pop(rec.cell_hash, None)
        if effect and rec.status is not Status.OK:
            self._pair_failures[effect] += 1
        if self.lessons.observe(rec, c.cell.name, c.features):
            self._expect()
        if rec.status is (Status.CUDA_OOM if self.cuda else Status.HOST_OOM) and c.base_mem and self.capacity:
            self.memory.observe(c.model, c.base_mem, math.log(self.capacity))  # it needed at least all there is
            self._memo.clear()
            for w in wontfit(self):
                self.wont[w.cell.hash] = c.cell.name
        park(self)
        self._memo.clear()

    def _expect(self) -> None:
        """Errors teach the search (bench.execute.failures): a cell not yet measured is left while it is expected
        to repeat an error, and open again once a cell that ran says otherwise."""
        for c in self.candidates:
            if c.state in ("open", "parked", "expected") and c.cell.hash not in self.in_flight:
                if self.lessons.expected(c.features):
                    c.state = "expected"
                elif c.state == "expected":
                    c.state = "open"  # families.park parks it again where its family measures another micro-batch

    def _measured(self, c: Candidate, rec: Record, rung: int | None) -> None:
        c.state = "measured"
        block, sd = rec.block, quality.noise_sd(rec)
        if block not in self.order:
            self.order.append(block)
            self.where[block] = _where(rec)
        log = math.log(rec.metrics.tokens_per_s)
        c.obs.setdefault(block, []).append(Obs(log, sd))
        c.flags += [f for f in quality.flags(rec) if f.split(":")[0] not in {x.split(":")[0] for x in c.flags}]
        c.rungs.append(1 if rung is None else rung)
        if c.base_tps is not None:
            self.tps.observe(c.model, c.base_tps, log, block=block, noise_sd=sd, cell=c.cell.hash)
        peak, _ = results.peak_memory(rec)
        if peak:
            c.mem = max(c.mem or -math.inf, math.log(peak))
            if c.base_mem is not None:
                self.memory.observe(c.model, c.base_mem, math.log(peak))

    def implied(self, cell_hash: str) -> None:
        c = self.by_hash.get(cell_hash)
        if c is not None and c.state in ("open", "expected", "parked", "wontfit"):
            c.state = "implied"
            self._memo.clear()

    # -- decisions ----------------------------------------------------------------------------------------

    def exhausted(self, c: Candidate) -> bool:
        """No more attempts for this cell: MAX_MEASUREMENTS in this block (a replay: as many as it has ends)."""
        return c.tries >= c.limit if self.here is None else c.tries_in[self.here] >= MAX_MEASUREMENTS

    def ran_here(self, c: Candidate) -> bool:
        """Measured in the block new attempts measure in (where that is not known in advance: measured at all)."""
        return bool(c.obs.get(self.here)) if self.here is not None else bool(c.obs)

    def leader(self, group: tuple) -> Candidate | None:
        """The group's fastest measured cell: among the blocks the anchors tie to the reference block first (the
        only ones whose levels compare), else among the largest other set of tied blocks that has one."""
        key = ("leader", group)
        if key not in self._memo:
            ok = [c for c in self.candidates if c.group == group and c.obs]
            i = blocks.leading([c.obs for c in ok], self.offsets, self.cross, self._parts())
            self._memo[key] = ok[i] if i is not None else None
        return self._memo[key]

    def could_beat(self, c: Candidate, m: Candidate, by: float | None = None) -> bool:
        """Whether c could be faster than m by more than `by` (default: the smallest effect that matters): the
        one-sided 95% upper bound of log(c/m), both cells' uncertainty counted, above log(1 + by)."""
        d, sd = self.gap(c, m)
        if not math.isfinite(d):
            return True
        return d + Z1 * sd > math.log(1 + (self.s.speed_tolerance if by is None else by))

    def resolution(self, c: Candidate | None = None, m: Candidate | None = None) -> float:
        """The speed difference one measurement of each of two cells tells apart (95%, two-sided), by their
        measurements' noise (unmeasured: a clean measurement's): the frontier is drawn at this resolution, as a
        full run measuring each cell once would draw it."""
        return math.exp(Z * math.hypot(self._noise_of(c), self._noise_of(m))) - 1

    def _noise_of(self, c: Candidate | None) -> float:
        sds = [o.sd for obs in (c.obs.values() if c is not None else ()) for o in obs]
        return max(sds) if sds else self.noise

    def tie(self, m: Candidate, lead: Candidate) -> bool:
        """Two cells measured in one block whose gap even MAX_MEASUREMENTS of each there could not place on either
        side of the speed tolerance (m over the leader by more, or surely not): measuring them again is futile,
        and the answer names both. A gap well inside the tolerance is not a tie: more measurements can show it."""
        shared = sorted(set(m.obs) & set(lead.obs))
        if not shared:
            return False  # measured again in one block, they compare directly
        gap = self.gap(m, lead)[0]
        # The noise left in each shared block, combined over the blocks as gap() combines them.
        left = 1 / sum(1 / (self._left_var(m.obs[b]) + self._left_var(lead.obs[b])) for b in shared)
        return abs(gap - math.log(1 + self.s.speed_tolerance)) < Z1 * math.sqrt(left)

    def _left_var(self, obs: list[Obs]) -> float:
        """The variance of a cell's mean in one block once it has MAX_MEASUREMENTS there, each weighted by its
        noise's precision as the one rule weights them (bench.stats.log_mean): its measurements' noise as they came,
        the ones still to come at a clean measurement's (a flagged one says that run was host-bound or unsteady, not
        that the next will be)."""
        n = max(MAX_MEASUREMENTS, len(obs))
        return 1 / (sum(1 / (o.sd * o.sd) for o in obs) + (n - len(obs)) / self.noise**2)

    def could_lead(self, c: Candidate) -> bool:
        lead = self.leader(c.group)
        return lead is None or lead is c or self.could_beat(c, lead)

    def versus(self, m: Candidate, lead: Candidate) -> effects.Effect | None:
        """m against its group's fastest by the one rule (bench.judge.effects.against): None where no block or anchor
        ties them."""
        return effects.against(m.obs, lead.obs, self.offsets, self.cross, self._parts())

    def ties(self, lead: Candidate) -> tuple[list[Candidate], list[Candidate]]:
        """The measured cells of the leader's group not told apart from it (not surely slower: the 95% interval of
        their ratio to it reaches past 1/(1 + the minimum effect)), and those no block or anchor ties to it."""
        tied, apart = [], []
        for m in self.candidates:
            if m is lead or m.group != lead.group or not m.obs:
                continue
            e = self.versus(m, lead)
            if e is None:
                apart.append(m)
            elif e.verdict != effects.SLOWER:
                tied.append(m)
        return tied, apart

    def dominated(self, c: Candidate) -> Candidate | None:
        """A measured cell that needs no more memory than c (within the memory tolerance) and that c cannot
        beat by more than the frontier's resolution: c adds no point to the frontier that it does not have."""
        mem, slack = self.memory_of(c), math.log(1 + self.s.memory_tolerance)
        for m in self.candidates:
            if m is not c and m.obs and m.mem is not None:
                if m.mem <= mem + slack and not self.could_beat(c, m, by=self.resolution(c, m)):
                    return m
        return None

    def memory_of(self, c: Candidate) -> float:
        """log peak memory: measured, else predicted (the memory model, corrected by the run; its error is
        of the order of the memory tolerance, which the comparisons allow)."""
        lo, hi = self.memory_interval(c)
        return c.mem if c.mem is not None else (lo + hi) / 2 if math.isfinite(lo) else -math.inf

    @property
    def chances(self) -> Chances:
        """What the cells not yet measured, and the measured ones that may still beat their leader, could still
        change, jointly (bench.execute.settle)."""
        if "chances" not in self._memo:
            self._memo["chances"] = chances(self)
        return self._memo["chances"]

    def settled(self) -> tuple[bool, bool]:
        """(who leads, the frontier): each settled once its chance is below the level (Settings.settle)."""
        ch = self.chances
        return ch.lead < self.s.settle, ch.frontier < self.s.settle

    def chance(self, c: Candidate) -> tuple[float, float]:
        """A cell's own chances: of beating its group's leader by more than the speed tolerance (an unmeasured cell, or
        a measured one that may still be measured again: bench.execute.settle.rivals), and of adding a frontier point
        (an unmeasured cell); 0 where its prediction alone puts it below bench.execute.settle.FLOOR."""
        ch = self.chances
        return ch.cell_lead.get(c.cell.hash, 0.0), ch.cell_frontier.get(c.cell.hash, 0.0)

    def needed(self, c: Candidate) -> bool:
        """An unmeasured cell that could still change an unsettled question: it beat the leader by more than the
        tolerance, or added a frontier point, in some of the joint draws."""
        lead, front = self.settled()
        p_lead, p_front = self.chance(c)
        return (not lead and p_lead > 0) or (not front and p_front > 0)

    def open(self) -> list[Candidate]:
        return [c for c in self.candidates if c.state == "open" and c.cell.hash not in self.in_flight]

    def parked(self) -> list[Candidate]:
        """The micro-batches the search leaves beside their configuration's (bench.execute.families): no frontier
        points, but each may still lead its group if the joint chances say so."""
        return [c for c in self.candidates if c.state == "parked" and c.cell.hash not in self.in_flight]

    def waiting(self) -> list[Candidate]:
        """The cells not measured yet: open, expected to repeat an error, parked or past the memory (an
        out-of-memory end implies each)."""
        states = ("open", "expected", "parked", "wontfit")
        return [c for c in self.candidates if c.state in states and c.cell.hash not in self.in_flight]

    def measurable(self, c: Candidate) -> bool:
        """Whether an attempt of c could start now: open, or measured only in other blocks than this one's."""
        if c.cell.hash in self.in_flight or self.exhausted(c):
            return False
        return c.state in ("open", "parked") or (
            self.here is not None
            and c.state == "measured"
            and not c.obs.get(self.here)
            and self.here not in c.failed_in
        )

    # -- what to measure next -----------------------------------------------------------------------------

    def next(self) -> Request | None:
        """The next attempt to run, or None: nothing until something in flight ends, or nothing left (see
        done()). In a new block with cells measured elsewhere, anchors first; then each group's leader; then the
        three questions take turns (who leads, the frontier, the knob effects), so a budget that runs out leaves
        each partly answered rather than one untouched. Requests over the budget are passed over; the budget
        ends the search when none fits."""
        req = self._first_affordable(self._anchors())
        if req is not None:
            return req
        req = self._first_affordable(self._seed())
        if req is not None or self._seeding():
            return req  # the other picks judge against the groups' leaders: wait for them
        turns = (self._contest, self._frontier, self._effect)
        for k in range(len(turns)):
            req = self._first_affordable(turns[(self._turn + k) % len(turns)]())
            if req is not None:
                self._turn = (self._turn + k + 1) % len(turns)
                return req
        return None

    def _first_affordable(self, requests) -> Request | None:
        for req in requests:
            if self._affordable(req):
                return req
            self.over_budget = True
        return None

    def _contest(self):
        """Who leads: the leader on the full schedule, overlapping cells again, then cells that could lead."""
        yield from self._leader_again()
        yield from self._overlap()
        yield from self._contender()

    def done(self) -> bool:
        return not self.in_flight and self.next() is None

    def _req(self, c: Candidate, rung: int, role: str, why: str) -> Request:
        return Request(c, rung, role, why, _group(self.s, c.group))

    def _affordable(self, r: Request) -> bool:
        if self.s.budget_s is None:
            return True
        flying = sum(self.cost_s(self.by_hash[h], rung) for h, rung in self.in_flight.items())
        return self.spent_s + flying + self.cost_s(r.candidate, r.rung) <= self.s.budget_s

    def _groups(self) -> list[tuple]:
        return list(dict.fromkeys(c.group for c in self.candidates))

    def _seeding(self) -> bool:
        return any(self.by_hash[h].group not in self._led() for h in self.in_flight)

    def _led(self) -> set[tuple]:
        return {c.group for c in self.candidates if c.logs}

    def _anchors(self):
        """A new block ties itself to the others: each group's leader measured elsewhere, then up to EXTRA_ANCHORS
        more cells measured elsewhere (the cheapest, a clean measurement first), until that many cells were
        measured both here and elsewhere."""
        if self.here is None:
            return
        elsewhere = [c for c in self.candidates if any(b != self.here for b in c.obs)]
        leaders = [lead for g in self._groups() if (lead := self.leader(g)) is not None and lead in elsewhere]
        want = min(len(leaders) + EXTRA_ANCHORS, len(elsewhere))
        flying = sum(1 for h in self.in_flight if self._role_of.get(h) == "anchor")
        if sum(1 for c in elsewhere if c.obs.get(self.here)) + flying >= want:
            return
        rest = sorted((c for c in elsewhere if c not in leaders), key=lambda c: (bool(c.flags), self.cost_s(c, 0)))
        for c in leaders + rest:
            if self.measurable(c):
                why = f"an anchor: measured in {len(c.obs)} other block(s) ({_tps(self, c)}); measured here too, it "
                yield self._req(c, 0, "anchor", why + "ties this block's speed to theirs")

    def _seed(self):
        flying = {self.by_hash[h].group for h in self.in_flight}
        for g in self._groups():
            if g in self._led() or g in flying:
                continue
            pool = sorted((c for c in self.open() if c.group == g), key=lambda c: -self.speed(c)[0])
            for c in pool:
                yield self._req(c, 0, "leader", f"the predicted fastest of {_group(self.s, g)}: {_tps(self, c)}")

    def _leader_again(self):
        """Each group's leader on the full schedule, once who leads is settled: the answer's own figure."""
        if not self.s.halving or not self.settled()[0]:
            return
        for g in self._groups():
            lead = self.leader(g)
            if (
                lead is not None
                and 1 not in lead.rungs
                and lead.cell.hash not in self.in_flight
                and not self.exhausted(lead)
            ):
                yield self._req(lead, 1, "leader", f"the leader of {_group(self.s, g)}, on the full schedule")

    def _overlap(self):
        """Of two measured cells that could each lead, the one with fewer measurements takes another short look
        (SHORT_LOOK says why that is enough)."""
        for g in self._groups():
            lead = self.leader(g)
            for m in self.candidates:
                if m is lead or m.group != g or not m.obs or not self.could_lead(m) or self.tie(m, lead):
                    continue
                again = self.again(m, lead)
                if again and again.cell.hash not in self.in_flight:
                    why = f"its interval overlaps the other's: {_tps(self, m)} vs leader {_tps(self, lead)}"
                    yield self._req(again, 0, "contender", f"{m.cell.name} against {lead.cell.name}: {why}")

    def again(self, m: Candidate, lead: Candidate) -> Candidate | None:
        """Which of two measured cells to measure again to tell them apart: the one with fewer measurements, one
        measured only elsewhere first (measured here too, it compares with the other in one block); None where
        neither can be measured again here."""
        pool = [c for c in (lead, m) if not self.exhausted(c) and self.here not in c.failed_in]
        return min(pool, key=lambda c: (self.ran_here(c), len(c.logs)), default=None)

    def _contender(self):
        """Cells that could lead, while who leads is not settled: open ones, and measured ones that may in truth
        beat their leader (one of the two measured again: `again`); the largest chance per predicted second first
        (bench.execute.settle)."""
        if self.settled()[0]:
            return
        led, ch = self._led(), self.chances
        pool = [(c, c) for c in self.open() + self.parked() if c.group in led and self.chance(c)[0] > 0]
        for m in self.candidates:  # measured cells that may still beat their leader: one of the two again
            lead = self.leader(m.group) if m.obs and self.chance(m)[0] > 0 else None
            if lead is not None and (again := self.again(m, lead)) is not None:
                pool.append((m, again))
        share = ch.share_lead
        for c, run in sorted(
            pool,
            key=lambda cr: (
                -share.get(cr[0].cell.hash, 0.0) / max(self.cost_s(cr[1], 0), 1e-3),
                -self.chance(cr[0])[0],
            ),
        ):
            if run.cell.hash in self.in_flight:
                continue
            lead = self.leader(c.group)
            why = (
                f"could lead {_group(self.s, c.group)}: {_tps(self, c)}, the leader {_tps(self, lead)}; its chance of "
                f"beating it by more than {self.s.speed_tolerance:.0%} {self.chance(c)[0]:.1%}, of every cell "
                f"that could still lead {ch.lead:.1%}"
            )
            yield self._req(run, 0, "contender", why if run is c else f"{c.cell.name} against {run.cell.name}: {why}")

    def _frontier(self):
        """Open cells that could add a frontier point, while the frontier is not settled: the largest chance per
        predicted second first."""
        if self.settled()[1]:
            return
        ch = self.chances
        pool = [c for c in self.open() if self.chance(c)[1] > 0]
        share = ch.share_frontier
        for c in sorted(
            pool, key=lambda c: (-share.get(c.cell.hash, 0.0) / max(self.cost_s(c, 0), 1e-3), -self.chance(c)[1])
        ):
            why = (
                f"could be on the frontier: {_mem(self, c)}, {_tps(self, c)}; its chance of adding a point "
                f"{self.chance(c)[1]:.1%}, of every cell left {ch.frontier:.1%}"
            )
            yield self._req(c, 0, "frontier", why)

    def _effect(self):
        """A pair partner for each knob value short of its pairs: a cell whose partner has run first (one
        attempt completes the pair), else the cheaper of two open cells (its partner then comes first). A
        value whose pair attempts failed MAX_MEASUREMENTS times (they ran out of memory, say) is left."""
        halves, news = [], []
        for axis, value, ref, pairs, possible in self.effect_pairs():
            if len(pairs) >= self.s.pairs or self._pair_failures[(axis, value)] >= MAX_MEASUREMENTS:
                continue
            for c, partner in possible:
                cost = self.cost_s(c, 0)
                if self.ran_here(partner):
                    halves.append((cost, axis, value, ref, c, partner))
                elif cost <= self.cost_s(partner, 0):
                    news.append((cost + self.cost_s(partner, 0), axis, value, ref, c, partner))
        for _, axis, value, ref, c, partner in sorted(halves, key=_first) + sorted(news, key=_first):
            short = AXIS[axis].short
            why = f"a pair for {short}={value} against {short}={ref} (with {partner.cell.name})"
            yield Request(c, 0, "effect", why, _group(self.s, c.group), effect=(axis, value))

    # -- knob effects ----------------------------------------------------------------------------------------

    def effect_pairs(self):
        """Per ablated axis and value other than its reference (bench.judge.effects.knob_pairs): (axis, value, ref,
        measured pairs (measured in one block), possible pairs (a cell that can be measured now, the cell it
        pairs with: measured here or measurable too))."""
        if "pairs" in self._memo:
            return self._memo["pairs"]
        out = []
        # A parked micro-batch (bench.execute.families) is no contender, but may complete a knob's pair.
        live = [c for c in self.candidates if c.state in ("open", "measured", "parked")]
        sig = tuple(id(c) for c in live)
        if self._knobs[0] != sig:  # which cells pair changes only when a cell leaves or rejoins the live ones
            self._knobs = (sig, effects.knob_pairs([c.features for c in live]))
        for axis, value, ref, idx in self._knobs[1]:
            both = [(live[i], live[j]) for i, j in idx]
            measured = [(a, b) for a, b in both if set(a.obs) & set(b.obs)]
            possible = [
                (x, y)
                for a, b in both
                if not set(a.obs) & set(b.obs)
                for x, y in ((a, b), (b, a))
                if self._pairable(x) and (self.ran_here(y) or self._pairable(y))
            ]
            out.append((axis, value, ref, measured, possible))
        self._memo["pairs"] = out
        return out

    def _pairable(self, c: Candidate) -> bool:
        """Whether an attempt of c could start now for a knob's pair."""
        return self.measurable(c)

    def effects(self) -> list[tuple[str, object, object, effects.Effect]]:
        """Each knob value's effect on tokens/s against its reference over the pairs measured in one block, with
        its 95% interval (bench.judge.effects.knob_effect, as the report computes it)."""
        return [
            (axis, value, ref, effects.knob_effect([(a.obs, b.obs) for a, b in pairs], self.cross))
            for axis, value, ref, pairs, _ in self.effect_pairs()
        ]

    # -- the end ----------------------------------------------------------------------------------------------

    def frontier(self) -> list[Candidate]:
        """The measured cells on the memory/speed frontier, lightest first: no other measured cell needs no more
        memory (within the tolerance) and is faster."""
        ok = sorted((c for c in self.candidates if c.obs and c.mem is not None), key=lambda c: c.mem)
        slack = math.log(1 + self.s.memory_tolerance)
        return [c for c in ok if not any(m is not c and m.mem <= c.mem + slack and self._faster(m, c) for m in ok)]

    def _faster(self, m: Candidate, c: Candidate) -> bool:
        """m measured faster than c, where a block or anchors tie them (never raw across untied blocks)."""
        return self.comparable(m, c) and self.gap(m, c)[0] > 0

    def left_s(self) -> float:
        """Predicted cell seconds of what could still be measured (each open cell that could change the
        answer, once, on the short schedule), within the budget left."""
        if "left" not in self._memo:  # asked at every record (the ETA); it changes only with an outcome
            self._memo["left"] = sum(self.cost_s(c, 0) for c in self.open() + self.parked() if self.needed(c))
        left = self._memo["left"]
        return left if self.s.budget_s is None else min(left, max(0.0, self.s.budget_s - self.spent_s))

    def full_run_s(self, cells: Iterable[Candidate]) -> float:
        """Predicted cell seconds of measuring these cells once on the full schedule (what a run without
        --answer adds)."""
        return sum(self.cost_s(c, 1) for c in cells)

    def unmeasured(self, stopped: bool = False) -> list[tuple[Candidate, dict]]:
        """Every cell not measured at the end, with its answer note: whether it could still have changed the answer
        (the budget ran out, or the run was stopped first) and why it was not measured, with its chances and its
        predicted speed and memory."""
        out = []
        for c in self.open() + self.parked():
            p_lead, p_front = self.chance(c)
            extra = {"stopped": True} if stopped else {}
            out.append(
                (c, self.note(c, needed=self.needed(c), why=self._why(c, stopped), chance=[p_lead, p_front], **extra))
            )
        for c in (c for c in self.candidates if c.state == "expected"):
            sig = self.lessons.expected(c.features)
            out.append((c, self.note(c, needed=False, why=self.lessons.why(sig), expected_error=sig)))
        out += [(c, self.note(c, needed=False, why=self._aside(c))) for c in self.candidates if c.state == "wontfit"]
        return out

    def _why(self, c: Candidate, stopped: bool) -> str:
        """Why an open or parked cell was not measured, with its chances and all the cells' left together."""
        ch, (p_lead, p_front) = self.chances, self.chance(c)
        budget = f"{self.s.budget_s:.0f} s" if self.s.budget_s is not None else "none"
        odds = (
            f"its chance of beating the leader of {_group(self.s, c.group)} by more than {self.s.speed_tolerance:.0%} "
            f"{p_lead:.1%}" + (f", of adding a frontier point {p_front:.1%}" if c.state == "open" else "")
        )
        head = f"{self._aside(c)}; " if c.state == "parked" else ""
        if self.needed(c):
            cut = "the run was stopped first" if stopped else f"the budget ({budget}) was spent"
            return f"not measured: {cut}; {head}it could still change the answer ({_tps(self, c)}; {odds})"
        left = f"of every cell left together {ch.lead:.1%} and {ch.frontier:.1%}"
        why = f"not needed: {head}{_tps(self, c)}; {odds}; {left}"
        why += f", below the {self.s.settle:.0%} the search stops at" if all(self.settled()) else ""
        if self.spent_at_start:  # this call measured nothing: it settled nothing either
            why = f"not measured: the budget ({budget}) was spent before this call measured anything; {why}"
        return why

    def _aside(self, c: Candidate) -> str:
        """Why a parked micro-batch, or a cell out-of-memory ends put past the memory, was not measured."""
        if c.state == "wontfit":
            return (
                f"not measured: predicted past the memory ({_mem(self, c)} against {self.capacity / 2**30:.1f} GiB and "
                f"the margin) once the out-of-memory end of {self.wont.get(c.cell.hash)} corrected the memory model"
            )
        by = c.parked_by
        how = "smaller and predicted slower" if c.cell.micro_batch < by.cell.micro_batch else "beyond the next larger"
        return (
            f"its configuration is measured at micro-batch {by.cell.micro_batch} ({_mem(self, by)}), the largest the "
            f"memory model fits within the margin, and its neighbours that could be faster; micro-batch "
            f"{c.cell.micro_batch} is {how} (no frontier point)"
        )

    def group_of(self, c: Candidate) -> str:
        """Its group as its records' answer notes name it (`--group-by` values as key=value)."""
        return _group(self.s, c.group)

    def note(self, c: Candidate, **fields) -> dict:
        """The record's answer note for a cell left unmeasured: its group and predicted figures."""
        m, sd = self.speed(c)
        lo_mem, hi_mem = self.memory_interval(c)
        ch = self.chances
        return {
            **fields,
            "settled": [ch.by_group.get(c.group, 0.0), ch.frontier, self.s.settle],
            "group": _group(self.s, c.group),
            "predicted_tokens_per_s": [math.exp(m - Z * sd), math.exp(m), math.exp(m + Z * sd)]
            if math.isfinite(m)
            else None,
            "predicted_peak_bytes": [math.exp(lo_mem), math.exp((lo_mem + hi_mem) / 2), math.exp(hi_mem)]
            if math.isfinite(lo_mem)
            else None,
            "predicted_wall_s": self.cost_s(c, 1) if c.base_cost is not None else None,
        }


def _distinct(feats: list[dict]) -> list[dict]:
    """Each cell's features as the models read them: an axis that every cell has with one value is left out (it
    tells no cells apart, and its pairs with the others are their main effects). A setting only some cells have
    (LoRA's rank, alpha and targets; QLoRA's quantisation and double quantisation) stays, though peft says which
    cells have it: each is a term with its pairs, so a knob's effect on the LoRA cells may differ from its effect
    on the full fine-tunes by several pairs' worth (each such setting adds one peft-by-knob pair's prior width).
    The accumulation stays too; where one batch size makes it follow from the micro-batch, its terms double the
    micro-batch's prior width (the simulator, tools.answer_sim, draws its truths the same way)."""
    values: dict = collections.defaultdict(set)
    for f in feats:
        for k, v in f.items():
            values[k].add(v)
    drop = {k for k, vs in values.items() if len(vs) < 2 and None not in vs}
    return [{k: v for k, v in f.items() if k not in drop} for f in feats]


def agreement(got: Search, full: Search) -> dict:
    """How an answer compares with the answer of the whole grid (`full`: a search that observed every cell),
    "the same" at the measurements' resolution (Search.resolution, as a full run measuring each cell once
    can tell them apart): per group, whether the answer's fastest cell is the grid's or within the
    resolution of it; the share of the grid's frontier that the answer measured, or a cell no heavier
    (within the memory tolerance) and within the resolution as fast; and the share of the grid's cell
    seconds it spent."""
    slack = math.log(1 + full.s.memory_tolerance)
    mine = {c.cell.hash for c in got.candidates if c.obs}
    leaders = {}
    for g in full._groups():
        lead, pick = full.leader(g), got.leader(g)
        theirs = full.by_hash[pick.cell.hash] if pick is not None else None
        same = lead is None or (
            theirs is not None and full.gap(lead, theirs)[0] < math.log(1 + full.resolution(lead, theirs))
        )
        leaders[_group(full.s, g)] = (pick.cell.name if pick else None, lead.cell.name if lead else None, same)
    measured = [full.by_hash[h] for h in mine if full.by_hash[h].mem is not None]
    frontier = full.frontier()
    found = [
        f
        for f in frontier
        if any(m.mem <= f.mem + slack and full.gap(f, m)[0] <= math.log(1 + full.resolution(f, m)) for m in measured)
    ]
    return {
        "leaders": leaders,
        "frontier": (len(found), len(frontier)),
        "cost": got.spent_s / full.spent_s if full.spent_s else None,
    }


def _where(rec: Record) -> str:
    """The machine of a record, in a few words: its GPUs (UUIDs shortened) or its host."""
    m = rec.machine
    if m is None:
        return "an unknown machine"
    gpus = ", ".join(u[:12] for u in m.gpus)
    host = compare.clip(m.host, 60)
    return f"{gpus} (host {host})" if gpus else f"host {host} ({m.cpu_count} CPUs)"


def _first(t: tuple):
    return t[0]


def _group(s: Settings, g: tuple) -> str:
    return ",".join(f"{AXIS[a].short}={v}" for a, v in zip(s.group_by, g)) or "all cells"


def _tps(search: Search, c: Candidate) -> str:
    """Its tokens/s with the interval at 95%: measured (on the reference block's scale, where anchors tie its
    block to it; else as its own block measured it, which that block's name says), or predicted."""
    lo, hi = search.interval(c)
    mid = search.speed(c)[0]
    if c.obs and not set(c.obs) & search.offsets.tied:
        block = max(c.obs, key=lambda b: len(c.obs[b]))
        mid, var = blocks.mean_var(c.obs[block])
        lo, hi = mid - Z * math.sqrt(var), mid + Z * math.sqrt(var)
        where = f" in B{search.order.index(block) + 1}"
    else:
        where = ""
    if not math.isfinite(mid):
        return "tokens/s unknown"
    if not c.obs and c.band and not any(o.obs for o in search.candidates):
        # Nothing measured yet: the prediction's band is the model's held-out error for its family (a slower step
        # than predicted is fewer tokens/s).
        lo, hi = c.base_tps - c.band[1], c.base_tps - c.band[0]
    how = "measured" if c.obs else "predicted"
    return f"{how} {_k(math.exp(mid))} tok/s [{_k(math.exp(lo))}, {_k(math.exp(hi))}] at 95%{where}"


def _mem(search: Search, c: Candidate) -> str:
    lo, hi = search.memory_interval(c)
    if not math.isfinite(lo):
        return "memory unknown"
    how = "measured" if c.mem is not None else "predicted"
    return f"{how} {math.exp((lo + hi) / 2) / 2**30:.1f} GiB"


def _k(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def _hms(seconds: float) -> str:
    m, sec = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"
