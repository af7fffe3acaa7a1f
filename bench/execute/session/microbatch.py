"""Grid mode's micro-batch searches (micro_batch: auto, bench.estimate.planning.search): each runs its probes under
one unit, one at a time, each next probe first in line; at the batch size the matrix holds, the accumulation makes up
the rest."""

from __future__ import annotations

import dataclasses

from ...estimate import Hardware
from ...estimate.planning.search import SearchResult, ladder, seed_micro_batch
from ...matrix import dsconfig
from ..executors.executor import Attempt
from .units import Run, Unit, attempt_of

__all__ = ["MicroBatches"]


class MicroBatches:
    def __init__(self, run: Run, size: int | None):
        self.run, self.size = run, size  # size: sequences per optimizer step, held (None: none held)
        self.probes: list[Attempt] = []  # the searches' next probes: drawn before the queue

    def begin(self, unit: Unit, hw: Hardware) -> None:
        """A search for the unit's cell from the memory model's seed; its first probe next in line."""
        cell = unit.planned.cell
        ladder_ = ladder(self.size) if self.size else ()
        unit.search = SearchResult(template=cell.name, seed=seed_micro_batch(cell, hw), ladder=ladder_)
        self.next(unit)

    def next(self, unit: Unit) -> None:
        """The search's next probe, first in line; or, once it has ended, say what it found."""
        mb = unit.search.next()
        if mb is not None:
            changes = {"micro_batch": mb, **({"grad_accum": self.size // mb} if self.size else {})}
            cell = dataclasses.replace(unit.planned.cell, **changes)
            self.probes.append(attempt_of(self.run, unit, cell, dsconfig.build(cell)))
            return
        res = unit.search
        self.run.printer(
            f"micro_batch auto for {res.template}: "
            + (f"largest that ran: {res.largest_ok}" if res.largest_ok else "none ran")
            + f" ({len(res.probes)} probes from the model's {res.seed}; {res.ended})"
        )
