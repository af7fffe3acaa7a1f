"""What the search learns from the run's outcomes: attempts started, ended, implied, and the budget spent; and a
configuration's micro-batches.

A configuration's micro-batches in answer mode, and what out-of-memory ends teach the memory model.

With `batch: {micro: auto, size: N}` each configuration (a cell but its micro-batch) is one cell per
micro-batch that divides N, its accumulation holding the batch (bench.execute.run.answer_items): a family.
Answer mode measures of each family the largest micro-batch the memory model (corrected by the run) fits
within the margin, the next larger one (which may fit, and is then likely faster), and the next smaller one
where the step-time model puts it within the speed tolerance of the largest (it could be faster); the others
are parked: left unmeasured, each record saying which micro-batch of its configuration the search measures
instead. A micro-batch that ends out of memory leaves the family (it failed); the next smaller becomes its
largest, and the family is judged again after every outcome.

An out-of-memory end is also a measurement: the cell needed more than the memory there is. The memory model
observes the capacity as the cell's peak (a floor, taken as the value), which raises the predictions of the
cells that share its settings; a cell then predicted past the capacity plus the margin is not measured (state
"wontfit"), its record saying so.

Pure: reads and sets the states of a bench.execute.answer.Search's candidates.
"""

from __future__ import annotations

import math

from ...estimate import DEFAULT_MARGIN
from ...judge import results
from ...judge.blocks import Obs
from ...records import quality
from ...records.record import Record
from ...records.status import Status
from .candidate import Candidate, Request, State
from .text import machine_text

__all__ = ["ALIVE", "Outcomes", "park", "wontfit"]


class Outcomes:
    """The run's outcomes as the search takes them (a part of bench.execute.answer.Search)."""

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
        elif c.state != State.MEASURED:
            c.state = State.FAILED
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
        """Errors teach the search (bench.execute.answer.failures): a cell not yet measured is left while it is expected
        to repeat an error, and open again once a cell that ran says otherwise."""
        for c in self.candidates:
            if c.state in (State.OPEN, State.PARKED, State.EXPECTED) and c.cell.hash not in self.in_flight:
                if self.lessons.expected(c.features):
                    c.state = State.EXPECTED
                elif c.state == State.EXPECTED:
                    c.state = State.OPEN  # park parks it again where its family measures another micro-batch

    def _measured(self, c: Candidate, rec: Record, rung: int | None) -> None:
        c.state = State.MEASURED
        block, sd = rec.block, quality.noise_sd(rec)
        if block not in self.order:
            self.order.append(block)
            self.where[block] = machine_text(rec)
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
        if c is not None and c.state in (State.OPEN, State.EXPECTED, State.PARKED, State.WONTFIT):
            c.state = State.IMPLIED
            self._memo.clear()


ALIVE = (State.OPEN, State.MEASURED, State.PARKED)
"""The states of a family member that may still run (failed, implied, expected and wontfit ones may not)."""


def park(s) -> None:
    """Open each family's members the search measures and park the others (see the module's docstring)."""
    if not s.families:
        return
    alive = [c for fam in s.families.values() for c in fam if c.state in ALIVE]
    mem = dict(zip(map(id, alive), _memory(s, alive)))
    tps = dict(zip(map(id, alive), _speed(s, alive)))
    room = math.log(s.capacity * (1 - DEFAULT_MARGIN)) if s.capacity else math.inf
    slower = math.log(1 + s.s.speed_tolerance)
    for fam in s.families.values():
        live = [c for c in fam if c.state in ALIVE]
        if not live:
            continue
        fits = [c for c in live if mem[id(c)] <= room]
        fit = fits[-1] if fits else live[0]
        i = live.index(fit)
        keep = {id(fit)} | ({id(live[i + 1])} if i + 1 < len(live) else set())
        if i > 0 and tps[id(live[i - 1])] + slower >= tps[id(fit)]:
            keep.add(id(live[i - 1]))
        for c in live:
            if c.state == State.PARKED and id(c) in keep:
                c.state, c.parked_by = State.OPEN, None
            elif c.state == State.OPEN and id(c) not in keep and c.cell.hash not in s.in_flight:
                c.state, c.parked_by = State.PARKED, fit


def wontfit(s) -> list:
    """After an out-of-memory end: the cells not yet measured that the corrected memory model now puts past the
    capacity plus the margin; each is set "wontfit" and returned."""
    if not s.capacity:
        return []
    pool = [c for c in s.candidates if c.state in (State.OPEN, State.PARKED) and c.base_mem is not None]
    pool = [c for c in pool if c.cell.hash not in s.in_flight]
    past = math.log(s.capacity * (1 + DEFAULT_MARGIN))
    out = [c for c, m in zip(pool, _memory(s, pool)) if m > past]
    for c in out:
        c.state = State.WONTFIT
    return out


def _memory(s, cells) -> list[float]:
    """log peak memory: measured, else the corrected prediction (-inf where the model cannot read the cell)."""
    ask = [c for c in cells if c.mem is None and c.base_mem is not None]
    means, _ = s.memory.marginals([(c.model, c.base_mem) for c in ask])
    pred = dict(zip(map(id, ask), means))
    return [c.mem if c.mem is not None else pred.get(id(c), -math.inf) for c in cells]


def _speed(s, cells) -> list[float]:
    """log tokens/s: measured (on the reference block's scale), else the corrected prediction."""
    ask = [c for c in cells if not c.obs and c.base_tps is not None]
    means, _ = s.tps.marginals([(c.model, c.base_tps) for c in ask])
    pred = dict(zip(map(id, ask), means))
    return [s.speed(c)[0] if c.obs else pred.get(id(c), math.inf) for c in cells]
