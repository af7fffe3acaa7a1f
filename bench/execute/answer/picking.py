"""What the search measures next, and the pairs a knob's effect is made of."""

from __future__ import annotations

import math
import statistics

from ...judge import effects
from ...matrix.axes import AXIS
from .candidate import EXTRA_ANCHORS, MAX_MEASUREMENTS, Candidate, Request, State
from .text import group_name, memory_text, speed_text

SCREEN_COST = 1.0
"""The screen's pairs are of cells whose short look is predicted to cost at most this many times the median cell's."""


def _first(t: tuple):
    return t[0]


class Picking:
    """What to measure next (a part of bench.execute.answer.Search)."""

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
        req = self._first_affordable(self._effect(self.s.screen, SCREEN_COST)) if self.s.screen else None
        if req is not None:
            return req
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
        yield from self.overlap()
        yield from self._contender()

    def done(self) -> bool:
        return not self.in_flight and self.next() is None

    def _req(self, c: Candidate, rung: int, role: str, why: str) -> Request:
        return Request(c, rung, role, why, group_name(self.s, c.group))

    def _affordable(self, r: Request) -> bool:
        if self.s.budget_s is None:
            return True
        flying = sum(self.cost_s(self.by_hash[h], rung) for h, rung in self.in_flight.items())
        return self.spent_s + flying + self.cost_s(r.candidate, r.rung) <= self.s.budget_s

    def groups(self) -> list[tuple]:
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
        leaders = [lead for g in self.groups() if (lead := self.leader(g)) is not None and lead in elsewhere]
        want = min(len(leaders) + EXTRA_ANCHORS, len(elsewhere))
        flying = sum(1 for h in self.in_flight if self._role_of.get(h) == "anchor")
        if sum(1 for c in elsewhere if c.obs.get(self.here)) + flying >= want:
            return
        rest = sorted((c for c in elsewhere if c not in leaders), key=lambda c: (bool(c.flags), self.cost_s(c, 0)))
        for c in leaders + rest:
            if self.measurable(c):
                why = f"an anchor: measured in {len(c.obs)} other block(s) ({speed_text(self, c)}); "
                why += "measured here too, it "
                yield self._req(c, 0, "anchor", why + "ties this block's speed to theirs")

    def _seed(self):
        flying = {self.by_hash[h].group for h in self.in_flight}
        for g in self.groups():
            if g in self._led() or g in flying:
                continue
            pool = sorted((c for c in self.open() if c.group == g), key=lambda c: -self.speed(c)[0])
            for c in pool:
                yield self._req(
                    c, 0, "leader", f"the predicted fastest of {group_name(self.s, g)}: {speed_text(self, c)}"
                )

    def _leader_again(self):
        """Each group's leader on the full schedule, once who leads is settled: the answer's own figure."""
        if not self.s.halving or not self.settled()[0]:
            return
        for g in self.groups():
            lead = self.leader(g)
            if (
                lead is not None
                and 1 not in lead.rungs
                and lead.cell.hash not in self.in_flight
                and not self.exhausted(lead)
            ):
                yield self._req(lead, 1, "leader", f"the leader of {group_name(self.s, g)}, on the full schedule")

    def overlap(self):
        """Of two measured cells that could each lead, the one with fewer measurements takes another short look
        (SHORT_LOOK says why that is enough)."""
        for g in self.groups():
            lead = self.leader(g)
            for m in self.candidates:
                if m is lead or m.group != g or not m.obs or not self.could_lead(m) or self.tie(m, lead):
                    continue
                again = self.again(m, lead)
                if again and again.cell.hash not in self.in_flight:
                    why = f"its interval overlaps the other's: {speed_text(self, m)} vs leader {speed_text(self, lead)}"
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
        (bench.execute.answer.settle)."""
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
                f"could lead {group_name(self.s, c.group)}: {speed_text(self, c)}, "
                f"the leader {speed_text(self, lead)}; its chance of "
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
                f"could be on the frontier: {memory_text(self, c)}, {speed_text(self, c)}; "
                "its chance of adding a point "
                f"{self.chance(c)[1]:.1%}, of every cell left {ch.frontier:.1%}"
            )
            yield self._req(c, 0, "frontier", why)

    def _effect(self, want: int = 0, dearest: float = 0.0):
        """A pair partner for each knob value short of its pairs (`want`, else Settings.pairs): a cell whose partner
        has run first (one attempt completes the pair), else the cheaper of two open cells (its partner then comes
        first). A value whose pair attempts failed MAX_MEASUREMENTS times (they ran out of memory, say) is left.
        `dearest`: only cells whose short look is predicted to cost at most that many times the median cell's (the
        screen: its pairs in cheap cells)."""
        halves, news = [], []
        limit = dearest * self._median_cost() if dearest else math.inf
        screen = "a screen's pair" if want else "a pair"
        for axis, value, ref, pairs, possible in self.effect_pairs():
            if len(pairs) >= (want or self.s.pairs) or self._pair_failures[(axis, value)] >= MAX_MEASUREMENTS:
                continue
            for c, partner in possible:
                cost = self.cost_s(c, 0)
                if max(cost, self.cost_s(partner, 0)) > limit:
                    continue
                if self.ran_here(partner):
                    halves.append((cost, axis, value, ref, c, partner))
                elif cost <= self.cost_s(partner, 0):
                    news.append((cost + self.cost_s(partner, 0), axis, value, ref, c, partner))
        for _, axis, value, ref, c, partner in sorted(halves, key=_first) + sorted(news, key=_first):
            short = AXIS[axis].short
            why = f"{screen} for {short}={value} against {short}={ref} (with {partner.cell.name})"
            yield Request(c, 0, "effect", why, group_name(self.s, c.group), effect=(axis, value))

    def _median_cost(self) -> float:
        """The median runnable cell's predicted short look, seconds."""
        if "median_cost" not in self._memo:
            self._memo["median_cost"] = statistics.median(self.cost_s(c, 0) for c in self.candidates)
        return self._memo["median_cost"]

    # -- knob effects ----------------------------------------------------------------------------------------

    def effect_pairs(self):
        """Per ablated axis and value other than its reference (bench.judge.effects.knob_pairs): (axis, value, ref,
        measured pairs (measured in one block), possible pairs (a cell that can be measured now, the cell it
        pairs with: measured here or measurable too))."""
        if "pairs" in self._memo:
            return self._memo["pairs"]
        out = []
        # A parked micro-batch (bench.execute.answer.outcomes) is no contender, but may complete a knob's pair.
        live = [c for c in self.candidates if c.state in (State.OPEN, State.MEASURED, State.PARKED)]
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
