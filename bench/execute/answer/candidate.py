"""The search's cells: a candidate, a request to measure one, and the schedule each rung runs."""

from __future__ import annotations

import collections
import dataclasses
import enum
from dataclasses import dataclass, field

from ...judge import effects, results
from ...judge.blocks import Obs
from ...matrix.cells import Cell
from ..plan import Planned

MEMORY_NOISE = 0.02
"""Log spread of a measured peak between repeats (a run's figures differ by 1-2%)."""
Z = 1.96  # two-sided 95%: the intervals shown
Z1 = 1.645  # one-sided 95%: "could it be faster?"
MAX_MEASUREMENTS = 3  # per cell and block: past this, two cells that still overlap are a tie within the noise
EXTRA_ANCHORS = 2  # anchors a new block measures besides the groups' leaders


class State(enum.StrEnum):
    """Where a candidate stands in the search."""

    OPEN = "open"
    """Not measured yet; it may be."""
    MEASURED = "measured"
    """Measured at least once."""
    FAILED = "failed"
    """Its attempts ended without a measurement."""
    IMPLIED = "implied"
    """Not measured: an out-of-memory end of a lighter cell implies its end (bench.execute.schedule)."""
    EXPECTED = "expected"
    """Not measured while it is expected to repeat an error (bench.execute.answer.failures)."""
    PARKED = "parked"
    """Not measured: another micro-batch of its configuration is measured instead (bench.execute.answer.outcomes)."""
    WONTFIT = "wontfit"
    """Not measured: out-of-memory ends put it past the memory (bench.execute.answer.outcomes)."""


@dataclass(eq=False)
class Candidate:
    """One runnable cell as the search sees it."""

    planned: Planned
    group: tuple
    base_tps: float | None  # log tokens/s the step-time model predicts
    base_mem: float | None  # log bytes the memory model predicts (GPU peak; host RSS on a CPU host)
    base_cost: float | None  # log wall seconds the step-time model predicts on the full schedule
    state: State = State.OPEN
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
