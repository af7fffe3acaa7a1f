"""A configuration's micro-batches in answer mode, and what out-of-memory ends teach the memory model.

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
from .candidate import State

__all__ = ["park", "wontfit", "ALIVE"]

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
