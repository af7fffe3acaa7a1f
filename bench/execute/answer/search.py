"""Answer mode's search: its candidates, its models and its state (see bench.execute.answer)."""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable

from ...estimate import Hardware, predict
from ...estimate.band import band_group, bands_for
from ...estimate.planning.online import SHARE, Online
from ...estimate.steptime import STEP_BAND, predict_wall, step_and_share
from ...records import quality
from ..plan import Planned
from ..settings import AnswerSettings as Settings
from .candidate import MAX_MEASUREMENTS, MEMORY_NOISE, Candidate, Z, rung_cell
from .ending import Ending
from .failures import Lessons, shared
from .judging import Judging
from .knowledge import Knowledge
from .outcomes import Outcomes, park
from .picking import Picking
from .text import group_name

__all__ = ["Settings", "Search", "agreement"]

# How far the step-time model may miss, on the log scale, once the machine's offset is taken out: one axis value's
# effect, one pair of axis values' (two knobs whose effects do not multiply), and a cell's own (the misfit's prior
# guess; the run learns it from its residuals, never below that guess: docs/answer-mode.md, the joint stopping rule).
# Prior widths set by hand at the size of the step-time model's held-out misses (docs/step-time.md); no committed
# tool derives them yet. On a CPU host, which the step-time model does not describe, each is wider by CPU_WIDE.
MAIN_SD = 0.05
PAIR_SD = 0.01
MISFIT_GUESS = 0.02
FAMILY_PAIR_SD = 0.05
FAMILY_AXES = ("peft", "offload")
"""A knob's effect in one cell family (PEFT mode x offload) against another's, on the step-time model's GPUs: pairs of
cells that differ in one knob, measured on one machine, move by it alike within a family and differently across
families (docs/answer-mode.md, "The measured world"). On a CPU host, which the GPU records say nothing of, every pair
keeps pair_sd."""
CPU_WIDE = 4.0
HOST_SD = 0.1
"""How far a machine's host may be from the typical host's (log host seconds), on the step-time model's GPUs: about
the spread of the per-machine host offsets its fit finds on the committed files
(bench.estimate.checks.timecheck.machine_offsets). It moves a cell by its host share."""
# The same for the memory model's peak on a GPU (set by hand, small: its held-out p95 is 12.5% over all records, less
# within one matrix); a CPU host's RSS is far less sure.
MEMORY_SD = {"offset": 0.05, "main": 0.01, "pair": 0.006, "misfit": 0.01}
MEMORY_SD_CPU = {"offset": 1.0, "main": 0.1, "pair": 0.0, "misfit": 0.05}


class Search(Knowledge, Outcomes, Judging, Picking, Ending):
    """The search's state: candidates, what the run measured (by block), and the fitted corrections. Its methods come
    in parts, one concern each, that read and set the state made here: what it knows of a cell (Knowledge), what the
    run's outcomes teach it (Outcomes), its judgements (Judging), what to measure next (Picking) and the answer as it
    ends (Ending)."""

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
            family_axes=FAMILY_AXES, family_pair_sd=FAMILY_PAIR_SD if cuda else 0.0,
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
        for c, model in zip(self.candidates, distinct([c.features for c in self.candidates])):
            c.model = model | ({SHARE: c.share} if c.share else {})
        self.tps.declare([c.model for c in self.candidates])
        self.memory.declare([c.model for c in self.candidates])
        # A configuration's micro-batches (micro_batch: auto, bench.execute.answer.outcomes), smallest first.
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

    @property
    def settings(self) -> Settings:
        """What the call asked of the answer (--budget, --settle, --group-by, ...)."""
        return self.s

    def forget(self) -> None:
        """Drop the figures worked out since the last outcome (speeds, offsets, chances): for a caller that changed a
        candidate's measurements or tries itself."""
        self._memo.clear()

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


def distinct(feats: list[dict]) -> list[dict]:
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
    for g in full.groups():
        lead, pick = full.leader(g), got.leader(g)
        theirs = full.by_hash[pick.cell.hash] if pick is not None else None
        same = lead is None or (
            theirs is not None and full.gap(lead, theirs)[0] < math.log(1 + full.resolution(lead, theirs))
        )
        leaders[group_name(full.s, g)] = (pick.cell.name if pick else None, lead.cell.name if lead else None, same)
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
