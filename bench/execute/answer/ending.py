"""The search's end: the frontier, what is left, and each unmeasured cell's answer note."""

from __future__ import annotations

import math
from collections.abc import Iterable

from .candidate import Candidate, State, Z
from .text import group_name, memory_text, speed_text


class Ending:
    """The answer as the search ends (a part of bench.execute.answer.Search)."""

    def frontier(self) -> list[Candidate]:
        """The measured cells on the memory/speed frontier, lightest first: no other measured cell needs no more
        memory (within the tolerance) and is faster."""
        ok = sorted((c for c in self.candidates if c.obs and c.mem is not None), key=lambda c: c.mem)
        slack = math.log(1 + self.s.memory_tolerance)
        return [c for c in ok if not any(m is not c and m.mem <= c.mem + slack and self._faster(m, c) for m in ok)]

    def _faster(self, m: Candidate, c: Candidate) -> bool:
        """m measured faster than c, where a block or anchors tie them (never raw across untied blocks)."""
        return self.comparable(m, c) and self.gap(m, c)[0] > 0

    def needed_s(self) -> float:
        """Predicted cell seconds of measuring, once each on the short schedule, every open cell that could still
        change the answer."""
        if "left" not in self._memo:  # asked at every record (the ETA); it changes only with an outcome
            self._memo["left"] = sum(self.cost_s(c, 0) for c in self.open() + self.parked() if self.needed(c))
        return self._memo["left"]

    def left_s(self) -> float:
        """needed_s, within the budget left."""
        left = self.needed_s()
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
        for c in (c for c in self.candidates if c.state == State.EXPECTED):
            sig = self.lessons.expected(c.features)
            out.append((c, self.note(c, needed=False, why=self.lessons.why(sig), expected_error=sig)))
        out += [(c, self.note(c, needed=False, why=self.aside(c))) for c in self.candidates if c.state == State.WONTFIT]
        return out

    def _why(self, c: Candidate, stopped: bool) -> str:
        """Why an open or parked cell was not measured, with its chances and all the cells' left together."""
        ch, (p_lead, p_front) = self.chances, self.chance(c)
        budget = f"{self.s.budget_s:.0f} s" if self.s.budget_s is not None else "none"
        odds = (
            f"its chance of beating the leader of {group_name(self.s, c.group)} "
            f"by more than {self.s.speed_tolerance:.0%} "
            f"{p_lead:.1%}" + (f", of adding a frontier point {p_front:.1%}" if c.state == State.OPEN else "")
        )
        head = f"{self.aside(c)}; " if c.state == State.PARKED else ""
        if self.needed(c):
            cut = "the run was stopped first" if stopped else f"the budget ({budget}) was spent"
            return f"not measured: {cut}; {head}it could still change the answer ({speed_text(self, c)}; {odds})"
        left = f"of every cell left together {ch.lead:.1%} and {ch.frontier:.1%}"
        why = f"not needed: {head}{speed_text(self, c)}; {odds}; {left}"
        why += f", below the {self.s.settle:.0%} the search stops at" if all(self.settled()) else ""
        if self.spent_at_start:  # this call measured nothing: it settled nothing either
            why = f"not measured: the budget ({budget}) was spent before this call measured anything; {why}"
        return why

    def aside(self, c: Candidate) -> str:
        """Why a parked micro-batch, or a cell out-of-memory ends put past the memory, was not measured."""
        if c.state == State.WONTFIT:
            return (
                f"not measured: predicted past the memory ({memory_text(self, c)} "
                f"against {self.capacity / 2**30:.1f} GiB and "
                f"the margin) once the out-of-memory end of {self.wont.get(c.cell.hash)} corrected the memory model"
            )
        by = c.parked_by
        how = "smaller and predicted slower" if c.cell.micro_batch < by.cell.micro_batch else "beyond the next larger"
        return (
            f"its configuration is measured at micro-batch {by.cell.micro_batch} ({memory_text(self, by)}), "
            "the largest the "
            f"memory model fits within the margin, and its neighbours that could be faster; micro-batch "
            f"{c.cell.micro_batch} is {how} (no frontier point)"
        )

    def group_of(self, c: Candidate) -> str:
        """Its group as its records' answer notes name it (`--group-by` values as key=value)."""
        return group_name(self.s, c.group)

    def note(self, c: Candidate, **fields) -> dict:
        """The record's answer note for a cell left unmeasured: its group and predicted figures."""
        m, sd = self.speed(c)
        lo_mem, hi_mem = self.memory_interval(c)
        ch = self.chances
        return {
            **fields,
            "settled": [ch.by_group.get(c.group, 0.0), ch.frontier, self.s.settle],
            "group": group_name(self.s, c.group),
            "predicted_tokens_per_s": [math.exp(m - Z * sd), math.exp(m), math.exp(m + Z * sd)]
            if math.isfinite(m)
            else None,
            "predicted_peak_bytes": [math.exp(lo_mem), math.exp((lo_mem + hi_mem) / 2), math.exp(hi_mem)]
            if math.isfinite(lo_mem)
            else None,
            "predicted_wall_s": self.cost_s(c, 1) if c.base_cost is not None else None,
        }
