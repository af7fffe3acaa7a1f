"""Packing cells onto one host: each cell gets a disjoint set of the host's GPUs and runs in a thread of
the orchestrator beside the others, at most one cell per GPU.

session -> local (which unit goes on which GPUs, when) -> launch (the one child protocol, per cell)

The rule, first come first served: units start in the order they are given. The first unit that cannot
start (fewer free GPUs than it needs, or the most cells already running) waits, and no unit behind it
starts before it does. A 2-GPU cell behind a stream of 1-GPU cells therefore waits only for two of the
running cells to end, never for the stream; the price is GPUs left idle while it waits, so an order that
keeps cells of one width together packs best. Units are drawn from their iterator only when they can be
placed, so an iterator may decide its next unit from the outcomes so far.

Signals reach only the main thread: a stop there (Ctrl-C, SIGTERM as bench.execute.Stopped, or an error) asks
every running cell to stop (launch.StopRequest), waits for each to be recorded, and raises again.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from .executor import Attempt, Finished, Handle, Shape, dispatch
from .launch import StopRequest

__all__ = ["Slots", "Lane", "LocalExecutor", "Neighbours", "Halted", "lane", "run_units"]

U = TypeVar("U")
R = TypeVar("R")


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


class Neighbours:
    """When each launched cell ran ([start, end), end None while it runs), to say what ran beside whom."""

    def __init__(self):
        self._lock = threading.Lock()
        self._spans: dict[int, list] = {}

    def enter(self, name: str, t: float) -> int:
        with self._lock:
            token = len(self._spans)
            self._spans[token] = [name, t, None]
            return token

    def leave(self, token: int, t: float) -> None:
        with self._lock:
            self._spans[token][2] = t

    def during(self, token: int, a: float, b: float) -> list[str]:
        """The names of the other cells that ran at some time in [a, b), sorted."""
        with self._lock:
            return sorted(
                {name for k, (name, t0, t1) in self._spans.items() if k != token and t0 < b and (t1 is None or t1 > a)}
            )


@dataclass
class Lane:
    """A unit's place while it runs: its GPUs (or slots), the request that stops its cell, who runs when."""

    slots: tuple[int, ...]
    neighbours: Neighbours
    stop: StopRequest = field(default_factory=StopRequest)


_here = threading.local()


def lane() -> Lane | None:
    """The lane of the unit this thread runs; None outside run_units' threads."""
    return getattr(_here, "lane", None)


class LocalExecutor:
    """One host: each attempt on a free disjoint set of its GPUs (or CPU slots), in a thread of this
    process, at most one attempt per GPU; first come first served (the module's rule)."""

    def __init__(self, slots: Slots):
        self.ids, self.slots = slots, slots.max_cells
        self.neighbours = Neighbours()
        self._ended: queue.Queue[Finished] = queue.Queue()
        self._running: dict[threading.Thread, Lane] = {}

    def room(self) -> bool:
        return self.ids.room()

    def fits(self, shape: Shape) -> bool:
        return self.ids.fits(shape.width)

    def running(self) -> int:
        return len(self._running)

    def submit(self, attempt: Attempt) -> Handle:
        ids = self.ids.take(attempt.shape.width)
        if ids is None:
            raise RuntimeError(f"no room for {attempt.shape}: submit only what fits")
        ln = Lane(ids, self.neighbours)
        handle = Handle(attempt, ln)
        t = threading.Thread(target=self._serve, args=(handle,), name=f"zerobench-cell-{ids}", daemon=True)
        self._running[t] = ln
        t.start()
        return handle

    def _serve(self, handle: Handle) -> None:
        _here.lane = handle.placement
        try:
            self._ended.put(Finished(handle, value=handle.attempt.run(handle.placement)))
        except BaseException as e:  # noqa: BLE001 - handed to the main thread, which decides
            self._ended.put(Finished(handle, error=e))

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
        """Ask every running cell to stop as `why` stopped the main thread (Ctrl-C, SIGTERM: each is
        recorded interrupted; an error: the same), wait for each, and hand on what ended whole meanwhile."""
        exc = (
            why
            if isinstance(why, KeyboardInterrupt)
            else Halted(f"stopped: the run failed beside it ({type(why).__name__}: {str(why)[:300]})")
        )
        for ln in self._running.values():
            ln.stop.request(copy.copy(exc))  # one exception object per thread: each gets its own traceback
        ended = []
        while self._running:
            ended.append(self._reap(self._ended.get()))  # bounded: a stopped worker is killed within its grace
        return [f for f in ended if f.error is None]


def run_units(
    units: Iterable[U],
    slots: Slots,
    *,
    need: Callable[[U], int],
    work: Callable[[U], R],
    done: Callable[[U, R], None],
    admit: Callable[[U], bool] | None = None,
    poll_s: float = 0.2,
) -> None:
    """Run each unit's work on a free disjoint set of `need(unit)` slots, in a thread of its own (lane()
    tells it where), first come first served (the module's rule); call done(unit, result) in this thread
    as each ends, in the order they end. A unit that needs 0 slots (a record to write, nothing to run)
    runs here, in its turn. admit(unit), in this thread at the moment a unit is placed, may still turn it
    away (False): what ended while it waited for its slots decided it. A unit's exception stops the others
    and is raised here once they are recorded; so is anything raised in this thread (a signal)."""
    attempts = (
        Attempt(key=u, cell=None, ds_config=None, repeat=1, shape=Shape(need(u)), run=lambda _p, u=u: work(u))
        for u in units
    )
    dispatch(
        LocalExecutor(slots),
        attempts,
        done=lambda a, value: done(a.key, value),
        admit=None if admit is None else (lambda a: admit(a.key)),
        poll_s=poll_s,
    )


class Halted(KeyboardInterrupt):
    """How a running cell is stopped because another unit failed (not the user): its record says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
