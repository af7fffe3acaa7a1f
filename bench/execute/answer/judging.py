"""The search's judgements of its cells: who leads, what could beat it, what is a tie, what is settled, what may
still be measured."""

from __future__ import annotations

import math

from ...judge import blocks, effects
from ...judge.blocks import Obs
from .candidate import MAX_MEASUREMENTS, Z1, Candidate, State, Z
from .settle import Chances, chances


class Judging:
    """The search's judgements (a part of bench.execute.answer.Search)."""

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
            i = blocks.leading([c.obs for c in ok], self.offsets, self.cross, self.parts())
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
        return effects.against(m.obs, lead.obs, self.offsets, self.cross, self.parts())

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
        change, jointly (bench.execute.answer.settle)."""
        if "chances" not in self._memo:
            self._memo["chances"] = chances(self)
        return self._memo["chances"]

    def settled(self) -> tuple[bool, bool]:
        """(who leads, the frontier): each settled once its chance is below the level (Settings.settle); the frontier
        is not asked where Settings.frontier is off (True: nothing is measured for it)."""
        ch = self.chances
        return ch.lead < self.s.settle, not self.s.frontier or ch.frontier < self.s.settle

    def chance(self, c: Candidate) -> tuple[float, float]:
        """A cell's own chances: of beating its group's leader by more than the speed tolerance (an unmeasured cell, or
        a measured one that may still be measured again: bench.execute.answer.settle.rivals), and of adding a frontier
        point (an unmeasured cell); 0 where its prediction alone puts it below bench.execute.answer.settle.FLOOR."""
        ch = self.chances
        return ch.cell_lead.get(c.cell.hash, 0.0), ch.cell_frontier.get(c.cell.hash, 0.0)

    def needed(self, c: Candidate) -> bool:
        """An unmeasured cell that could still change an unsettled question: it beat the leader by more than the
        tolerance, or added a frontier point, in some of the joint draws."""
        lead, front = self.settled()
        p_lead, p_front = self.chance(c)
        return (not lead and p_lead > 0) or (not front and p_front > 0)

    def open(self) -> list[Candidate]:
        return [c for c in self.candidates if c.state == State.OPEN and c.cell.hash not in self.in_flight]

    def parked(self) -> list[Candidate]:
        """The micro-batches the search leaves beside their configuration's (bench.execute.answer.outcomes): no frontier
        points, but each may still lead its group if the joint chances say so."""
        return [c for c in self.candidates if c.state == State.PARKED and c.cell.hash not in self.in_flight]

    def waiting(self) -> list[Candidate]:
        """The cells not measured yet: open, expected to repeat an error, parked or past the memory (an
        out-of-memory end implies each)."""
        states = (State.OPEN, State.EXPECTED, State.PARKED, State.WONTFIT)
        return [c for c in self.candidates if c.state in states and c.cell.hash not in self.in_flight]

    def measurable(self, c: Candidate) -> bool:
        """Whether an attempt of c could start now: open, or measured only in other blocks than this one's."""
        if c.cell.hash in self.in_flight or self.exhausted(c):
            return False
        return c.state in (State.OPEN, State.PARKED) or (
            self.here is not None
            and c.state == State.MEASURED
            and not c.obs.get(self.here)
            and self.here not in c.failed_in
        )
