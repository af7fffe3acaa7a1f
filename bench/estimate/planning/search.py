"""`micro_batch: auto`: the largest micro-batch that runs, seeded by the memory model and settled by
real runs. Out of memory is an answer here, not a failure: each probe is its own recorded cell.

From the model's largest micro-batch that fits, the search gallops up while probes run (seed+1, +2,
+4, ...) or down while they run out of memory (seed-1, -2, -4, ...), then bisects the gap until a
micro-batch that ran sits next to one that did not. An accurate model closes it in two probes.

With a batch size held (`batch: {micro: auto, size: N}`), the micro-batches are the divisors of N (a
ladder) and the search runs over their places on it, each probe's accumulation N / its micro-batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...matrix.cells import Cell
from ...matrix.spec import divisors
from ..fitted import FITTED, Constants
from ..model import Hardware, predict

__all__ = ["RAN", "OUT_OF_MEMORY", "ladder", "next_probe", "search_micro_batch", "seed_micro_batch", "SearchResult"]

RAN = ("ok", "diverged")  # it ran to the end: the memory fitted (a diverged loss is not a memory answer)
OUT_OF_MEMORY = ("cuda_oom", "host_oom")
MAX_PROBES = 8
CAP = 4096


@dataclass
class SearchResult:
    template: str
    seed: int
    probes: list[tuple[int, str, str | None]] = field(default_factory=list)
    """(micro_batch, status, cell hash) in the order run."""
    ended: str = ""
    max_probes: int = MAX_PROBES
    cap: int = CAP
    ladder: tuple[int, ...] = ()
    """The micro-batches it may probe (the divisors of a held batch size), smallest first; () for any."""

    def _next(self) -> tuple[int | None, str]:
        if not self.ladder:
            return next_probe(self.seed, [(m, s) for m, s, _ in self.probes], self.max_probes, self.cap)
        place = {mb: i for i, mb in enumerate(self.ladder, 1)}
        seed = max((i for mb, i in place.items() if mb <= self.seed), default=1)
        probes = [(place[m], s) for m, s, _ in self.probes]
        k, why = next_probe(seed, probes, self.max_probes, len(self.ladder), name=lambda i: self.ladder[i - 1])
        return (None if k is None else self.ladder[k - 1]), why.replace("(the search's cap)", "(the batch size)")

    def next(self) -> int | None:
        """The micro-batch to probe next; None once the search has ended (`ended` says why)."""
        mb, why = self._next()
        if mb is None:
            self.ended = why
        return mb

    def add(self, mb: int, status: str, cell_hash: str | None) -> dict:
        """A probe's end, added; the record's `search` as it stands now (with why it ends, if it does)."""
        self.probes.append((mb, status, cell_hash))
        self.ended = self._next()[1]
        return self.to_dict()

    @property
    def largest_ok(self) -> int | None:
        return max((mb for mb, st, _ in self.probes if st in RAN), default=None)

    @property
    def smallest_oom(self) -> int | None:
        return min((mb for mb, st, _ in self.probes if st in OUT_OF_MEMORY), default=None)

    def to_dict(self) -> dict:
        """The record's `search` (bench.records.record.Search)."""
        return {
            "template": self.template,
            "seed": self.seed,
            "probes": [{"micro_batch": mb, "status": st, "cell_hash": h} for mb, st, h in self.probes],
            "largest_ok": self.largest_ok,
            "smallest_oom": self.smallest_oom,
            "ended": self.ended,
        }


def ladder(size: int) -> tuple[int, ...]:
    """The micro-batches that divide a batch of `size` sequences, smallest first."""
    return tuple(divisors(size))


def next_probe(
    seed: int,
    probes: Sequence[tuple[int, str]],
    max_probes: int = MAX_PROBES,
    cap: int = CAP,
    name: Callable[[int], int] = int,
) -> tuple[int | None, str]:
    """The next micro-batch to run, or (None, why the search ends). `name`: the micro-batch a number stands for
    (a place on a ladder), in the reasons."""
    if not probes:
        return max(1, min(seed, cap)), ""
    mb, st = probes[-1]
    if st not in RAN and st not in OUT_OF_MEMORY:
        return None, f"the probe at micro-batch {name(mb)} ended {st}: not a memory answer"
    ok = [m for m, s in probes if s in RAN]
    oom = [m for m, s in probes if s in OUT_OF_MEMORY]
    lo, hi = max(ok, default=0), min(oom, default=None)
    if hi is not None and lo >= hi:
        return None, f"micro-batch {name(lo)} ran but {name(hi)} ran out of memory: not monotonic here, rerun to settle"
    if hi == lo + 1:
        return None, (
            f"micro-batch {name(lo)} runs and {name(hi)} runs out of memory"
            if lo
            else f"even micro-batch {name(1)} runs out of memory"
        )
    if hi is None and lo >= cap:
        return None, f"micro-batch {name(cap)} (the search's cap) runs"
    if len(probes) >= max_probes:
        return None, f"{max_probes} probes (the limit) without closing the gap"
    if hi is None:  # only runs so far: gallop up
        return min(lo + 2 ** (len(ok) - 1), cap), ""
    if lo == 0:  # only out-of-memory so far: gallop down
        return max(1, hi - 2 ** (len(oom) - 1)), ""
    return (lo + hi) // 2, ""


def search_micro_batch(
    run: Callable[[int, Callable[[str, str | None], dict]], tuple[str, str | None]],
    *,
    seed: int,
    template: str,
    max_probes: int = MAX_PROBES,
    cap: int = CAP,
) -> SearchResult:
    """Run probes until the gap is closed. `run(micro_batch, search_after)` runs one probe and returns its
    (status, cell hash); it calls search_after(status, cell_hash) for the `search` its record carries
    (the search as it stands after that probe, with why it ends if it does)."""
    res = SearchResult(template=template, seed=seed, max_probes=max_probes, cap=cap)
    while (mb := res.next()) is not None:

        def search_after(status: str, cell_hash: str | None, mb: int = mb) -> dict:
            return dataclasses.replace(res, probes=list(res.probes)).add(mb, status, cell_hash)

        status, cell_hash = run(mb, search_after)
        res.add(mb, status, cell_hash)
    return res


def seed_micro_batch(template: Cell, hw: Hardware, cap: int = CAP, k: Constants = FITTED) -> int:
    """The largest micro-batch the model predicts to fit the GPU (and the host); 1 without a GPU to judge
    against, or when even 1 does not fit."""
    if not hw.gpu_memory_bytes:
        return 1

    def fits(mb: int) -> bool:
        from ...matrix import dsconfig

        cell = dataclasses.replace(template, micro_batch=mb)
        try:
            e = predict(cell, dsconfig.build(cell), hw, k)
        except ValueError:
            return False
        return e.gpu_bytes <= hw.gpu_memory_bytes and (not hw.host_memory_bytes or e.host_bytes <= hw.host_memory_bytes)

    lo, hi = 0, cap + 1  # fits(lo) (or lo = 0), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return max(lo, 1)
