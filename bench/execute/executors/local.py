"""Packing cells onto one host: each cell gets a disjoint set of the host's GPUs and runs in a thread of
the orchestrator beside the others, at most one cell per GPU.

session -> local (which unit goes on which GPUs, when) -> launch (the one child protocol, per cell)

The rule, first come first served: units start in the order they are given. The first unit that cannot
start (fewer free GPUs than it needs, or the most cells already running) waits, and no unit behind it
starts before it does. A 2-GPU cell behind a stream of 1-GPU cells therefore waits only for two of the
running cells to end, never for the stream; the price is GPUs left idle while it waits, so an order that
keeps cells of one width together packs best (bench.execute.executors.executor.dispatch draws and places).

Signals reach only the main thread: a stop there (Ctrl-C, SIGTERM as bench.execute.Stopped, or an error)
cancels: every running cell is asked to stop (launch.StopRequest), and each one's end is handed back.
"""

from __future__ import annotations

import copy
import os
import queue
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..launch import StopRequest
from .executor import Attempt, Finished, Halted, Handle, Job, Neighbours, stop_for

__all__ = ["Slots", "Lane", "LocalExecutor", "Neighbours", "Halted"]  # the last two: bench.execute.executors.executor's


class Slots:
    """The host's GPUs (physical indexes), or on a CPU host numbered slots, handed out as disjoint sets.

    max_cells bounds how many sets are out at once (1: one cell at a time, as without packing)."""

    def __init__(self, ids: Sequence[int], max_cells: int | None = None):
        if not ids:
            raise ValueError("no GPUs (or slots) to run cells on")
        self.ids = tuple(ids)
        self.max_cells = max_cells or len(self.ids)
        self._free = list(self.ids)
        self._out: list[tuple[int, ...]] = []

    def take(self, n: int) -> tuple[int, ...] | None:
        """The n lowest free ids, now held; None while fewer are free or max_cells sets are out."""
        if n > len(self.ids):
            raise ValueError(f"a cell needs {n} GPUs; this host has {len(self.ids)}")
        if n < 1 or len(self._free) < n or len(self._out) >= self.max_cells:
            return None
        got = tuple(sorted(self._free)[:n])
        self._free = [i for i in self._free if i not in got]
        self._out.append(got)
        return got

    def fits(self, n: int) -> bool:
        """Whether n ids could be taken now (take(n) would not return None)."""
        if n > len(self.ids):
            raise ValueError(f"a cell needs {n} GPUs; this host has {len(self.ids)}")
        return n >= 1 and len(self._free) >= n and len(self._out) < self.max_cells

    def room(self) -> bool:
        """Whether some cell could start now (a slot free, fewer than max_cells sets out)."""
        return bool(self._free) and len(self._out) < self.max_cells

    def give(self, ids: tuple[int, ...]) -> None:
        self._out.remove(ids)
        self._free += ids


@dataclass
class Lane:
    """An attempt's place while it runs: its GPUs (or slots), the request that stops its cell, and the
    neighbours' token for who ran beside whom."""

    slots: tuple[int, ...]
    stop: StopRequest = field(default_factory=StopRequest)
    token: int | None = None


def _sharing_cores(job: Job, width: int, cells: int) -> Job:
    """On a CPU host whose cores several cells share: each cell's worker gets its share of the cores as its
    thread count (OMP_NUM_THREADS, applied by the worker), unless the user set one. Without it every cell
    sizes its thread pool to the whole host, and two cells side by side each ran 16x slower than alone."""
    extra = job.launch.extra_env or {}
    if cells < 2 or "OMP_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in extra:
        return job
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # macOS: none
    share = max(1, cores // cells) * width
    return job.with_launch(extra_env={**extra, "OMP_NUM_THREADS": str(share)})


class LocalExecutor:
    """One host: each attempt on a free disjoint set of its GPUs (or CPU slots), its job in a thread of this
    process, at most one attempt per GPU; first come first served (the module's rule). An Outcome comes
    back with `beside`: the cells that ran during its measured phase."""

    forkservers = None  # single-rank workers fork from the fork servers the run starts (bench.execute.prepare)

    def __init__(self, slots: Slots, cuda: bool = True):
        self.ids, self.slots, self.cuda = slots, slots.max_cells, cuda
        self.neighbours = Neighbours()
        self._ended: queue.Queue[Finished] = queue.Queue()
        self._running: dict[threading.Thread, Lane] = {}

    def room(self) -> bool:
        return self.ids.room()

    def running(self) -> int:
        return len(self._running)

    def place(self, attempt: Attempt) -> Handle | None:
        # Every node of a cell runs here (bench.execute.launch.nodes.launch_here). On a CPU host its ranks are not
        # devices: it takes at most every slot.
        width = attempt.shape.width if self.cuda else min(attempt.shape.width, len(self.ids.ids))
        ids = self.ids.take(width)
        if ids is None:
            return None
        where = {"gpus": list(ids)} if self.cuda else {"cpu_slots": list(ids)}
        if not self.cuda:
            attempt.job = _sharing_cores(attempt.job, len(ids), self.ids.max_cells)
        return Handle(attempt, Lane(ids), where)

    def release(self, handle: Handle) -> None:
        self.ids.give(handle.placement.slots)

    def start(self, handle: Handle) -> None:
        t = threading.Thread(target=self._serve, args=(handle,), name=f"zerobench-cell-{handle.placement.slots}")
        t.daemon = True
        self._running[t] = handle.placement
        t.start()

    def _serve(self, handle: Handle) -> None:
        ln, job = handle.placement, handle.attempt.job
        ln.token = self.neighbours.enter(job.cell.hash, time.time())
        try:
            out = job(list(ln.slots) if self.cuda else None, ln.stop)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which decides
            self.neighbours.leave(ln.token, time.time())
            self._ended.put(Finished(handle, error=e, traceback=traceback.format_exc()[-6000:]))
            return
        self.neighbours.leave(ln.token, time.time())
        out.beside = self.neighbours.during(ln.token, *out.window) if out.window else None
        self._ended.put(Finished(handle, value=out))

    def _reap(self, f: Finished) -> Finished:
        t = next(t for t, ln in self._running.items() if ln is f.handle.placement)
        t.join()
        self.ids.give(self._running.pop(t).slots)
        return f

    def collect(self, timeout_s: float) -> list[Finished]:
        """The next attempt to end, within timeout_s (one at a time: the next placement sees its outcome)."""
        try:
            return [self._reap(self._ended.get(timeout=timeout_s))]
        except queue.Empty:
            return []

    def cancel(self, why: BaseException) -> list[Finished]:
        """Ask every running cell to stop as `why` stopped the main thread (Ctrl-C, SIGTERM: each ends
        interrupted; an error: Halted, saying so), wait for each, and hand on how each ended."""
        exc = stop_for(why)
        for ln in self._running.values():
            ln.stop.request(copy.copy(exc))  # one exception object per thread: each gets its own traceback
        ended = []
        while self._running:
            ended.append(self._reap(self._ended.get()))  # bounded: a stopped worker is killed within its grace
        return ended

    def close(self) -> None:
        """Nothing held past the run: the session stops the fork servers."""
