"""Scheduling: which cells need not run (implied out of memory), in which order the rest run, and how long
what is left will take. Between `run` and `launch`; torch-free; reads the axis table, never the results.

- Dominance: cell A needs at least as much memory as cell B when every field is equal except axes with a
  certain "heavier" direction (bench.matrix.axes: Axis.gpu_heavier, host_heavier), and along each of those A's
  value is at least B's. When B runs out of GPU memory (cuda_oom), every A not yet run is recorded as
  implied_oom naming B; the same for host memory (host_oom) along the host's directions.
- Order (`order`): for early answers, see its docstring.
- ETA (`Eta`): observed per-cell wall times by a coarse class.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from ..matrix.axes import AUTO, AXES, AXIS, OFFLOADS, heavier_or_equal, optimizer_offloaded
from ..matrix.cells import Cell
from ..records.status import Status

__all__ = ["ORDERS", "GPU", "HOST", "WHERE", "heavier", "implied", "order", "Eta", "duration"]

ORDERS = ("early", "matrix")
"""`zerobench run --order`: early (`order`: early answers, lighter first where a cell may run out of memory)
or matrix (the order the matrix expands in)."""

GPU, HOST = "gpu", "host"
WHERE = {Status.CUDA_OOM.value: GPU, Status.HOST_OOM.value: HOST}
"""Which memory an out-of-memory status ran out of."""

# Only these axes may differ between a cell and one it implies; written once, in bench.matrix.axes.
_DIRECTIONS = {
    GPU: {a.name: a.gpu_heavier for a in AXES if a.gpu_heavier},
    HOST: {a.name: a.host_heavier for a in AXES if a.host_heavier},
}


@functools.lru_cache(maxsize=None)
def _rest(cell: Cell, where: str) -> str:
    """Everything that changes the cell's measurement (its hashed identity) but the directional axes."""
    d = cell.canonical()
    for name in _DIRECTIONS[where]:
        d.pop(name, None)
    return json.dumps(d, sort_keys=True, default=str)


def heavier(a: Cell, b: Cell, where: str = GPU) -> list[str] | None:
    """How cell a needs at least as much `where` (GPU or host) memory as cell b in every respect: the
    differences ("mb=8 vs 2"), [] for the same cell; None when it does not follow (another field
    differs, or a directional axis goes the other way, or a micro-batch is searched)."""
    if _rest(a, where) != _rest(b, where):
        return None
    out = []
    for name, direction in _DIRECTIONS[where].items():
        va, vb = getattr(a, name), getattr(b, name)
        if va == AUTO or vb == AUTO:
            return None
        if va == vb:
            continue
        if not heavier_or_equal(direction, va, vb):
            return None
        ax = AXIS[name]
        out.append(f"{ax.short}={ax.text(va, a)} vs {ax.text(vb, b)}")
    return out


def implied(prover: Cell, status: str, cells: Iterable[Cell]) -> list[tuple[Cell, str]]:
    """The cells (other than the prover) that an out-of-memory end of `prover` (status cuda_oom or
    host_oom) implies, each with how it is heavier; [] for any other status."""
    where = WHERE.get(status)
    if where is None:
        return []
    out = []
    for c in cells:
        how = heavier(c, prover, where) if c.hash != prover.hash else None
        if how:
            out.append((c, ", ".join(how)))
    return out


def _prior(cell: Cell, free: bool, mem: float | None, i: int) -> tuple:
    """The order's prior (smaller first): see `order`."""
    return (not free, OFFLOADS.index(cell.offload), cell.grad_ckpt, math.inf if mem is None else mem, i)


def order(
    cells: Sequence[Cell], *, free: Sequence[bool], risky: Sequence[bool], mem: Sequence[float | None]
) -> list[int]:
    """The run order for early answers, as indices into cells: deterministic, from the cells and the memory
    model alone. free[i]: cell i is recorded without running (a rule's skip, or pruned); risky[i]: it
    might run out of GPU memory (the model's verdict is uncertain, or unknown without a GPU); mem[i]: its
    predicted GPU bytes (None if unknown).

    1. Free cells first: they cost nothing and every one ends with a record at once.
    2. A prior for the speed/memory frontier, stated plainly: no offload before offload (less offload
       first: none, optimizer, optimizer+params, nvme), no checkpointing before checkpointing (each is
       slower for the same work), then the smaller predicted GPU memory first, then the matrix's order.
    3. Among risky cells, along each dominance chain (bench.execute.schedule.heavier, GPU), the lighter run first,
       so one out-of-memory end implies the heavier ones instead of each running out in turn. A lighter
       risky cell takes the earliest prior of the heavier cells waiting on it, so it runs just before them.
    """
    n = len(cells)
    key = [_prior(cells[i], free[i], mem[i], i) for i in range(n)]
    lighter: dict[int, list[int]] = defaultdict(list)  # heavier -> the risky cells strictly lighter
    groups: dict[str, list[int]] = defaultdict(list)
    for i in range(n):
        if risky[i] and not free[i]:
            groups[_rest(cells[i], GPU)].append(i)
    for members in groups.values():
        for h in members:
            for lt in members:
                if h != lt and heavier(cells[h], cells[lt], GPU) and not heavier(cells[lt], cells[h], GPU):
                    lighter[h].append(lt)
    eff = list(key)
    # Dominance is transitive, so each cell's strictly lighter ones are all listed directly: one pass.
    for h in sorted(lighter, key=lambda h: key[h]):
        for lt in lighter[h]:
            eff[lt] = min(eff[lt], key[h])
    waiting = {h: len(ls) for h, ls in lighter.items()}
    heavier_of: dict[int, list[int]] = defaultdict(list)
    for h, ls in lighter.items():
        for lt in ls:
            heavier_of[lt].append(h)
    # Ties on eff (a lighter cell took its heavier one's prior): the cell's own prior decides.
    ready = [(eff[i], key[i], i) for i in range(n) if not waiting.get(i)]
    heapq.heapify(ready)
    out = []
    while ready:
        _, _, i = heapq.heappop(ready)
        out.append(i)
        for h in heavier_of.get(i, ()):
            waiting[h] -= 1
            if not waiting[h]:
                heapq.heappush(ready, (eff[h], key[h], h))
    assert len(out) == n, "dominance is a partial order: no cycles"
    return out


def duration(s: float | None) -> str:
    """1h02m, 4m10s, 35s; '?' when unknown."""
    if s is None or not math.isfinite(s):
        return "?"
    s = int(round(s))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Eta:
    """The time left, from the wall times observed in this run, by a coarse class of cell: whether it
    offloads, and its PEFT mode (offload and full fine-tuning are the slow ones). A class not yet seen
    costs the run's mean; cells recorded without running (skipped, pruned, implied) cost nothing."""

    def __init__(self) -> None:
        self._seen: dict[tuple, list[float]] = defaultdict(list)

    @staticmethod
    def kind(cell: Cell) -> tuple:
        return (optimizer_offloaded(cell.offload), cell.peft)

    def observe(self, cell: Cell, seconds: float) -> None:
        self._seen[self.kind(cell)].append(seconds)

    def remaining(self, cells: Iterable[Cell]) -> float | None:
        """Seconds to run these cells; None before any cell ran (nothing to go by), 0 for none."""
        cells = list(cells)
        if not cells:
            return 0.0
        every = [t for ts in self._seen.values() for t in ts]
        if not every:
            return None
        mean = sum(every) / len(every)
        by_kind = {k: sum(ts) / len(ts) for k, ts in self._seen.items()}
        return sum(by_kind.get(self.kind(c), mean) for c in cells)
