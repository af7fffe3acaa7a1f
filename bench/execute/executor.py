"""The Executor protocol: where and when cell attempts run, whichever machines run them.

The session (bench.execute.session) decides what to run and writes every record; an executor only places
attempts on resources, runs them, and hands back how each ended. So the results file has one writer
whatever runs the cells, and `--resume` works whichever executor ran the earlier part.

    executor.fits(shape) -> whether an attempt of this shape could be placed now
    executor.submit(attempt) -> Handle: placed and started (call only when it fits)
    executor.collect(timeout_s) -> the Finished attempts (blocks up to timeout_s for the first)
    executor.cancel(why) -> stops everything in flight; returns what finished whole meanwhile
    executor.slots -> how many attempts may run at once; executor.room() -> whether one could start now

An attempt's `run(placement)` is called where the attempt was placed, with that placement (the GPUs or
slots it holds, its stop request); its return value comes back in Finished.value, an exception in
Finished.error. bench.execute.registry names the executors `--executor` chooses from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ..cells import Cell

__all__ = ["Attempt", "Executor", "Finished", "Handle", "Shape", "dispatch"]


@dataclass(frozen=True)
class Shape:
    """What one attempt holds while it runs: GPUs (or CPU slots) on each of `nodes` nodes."""

    gpus_per_node: int = 1
    nodes: int = 1

    @property
    def width(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass
class Attempt:
    """One unit for an executor: a cell attempt (or a micro-batch search of attempts) and its shape.
    key identifies it to the submitter; run(placement) does the work where it is placed."""

    key: Any
    cell: Cell
    ds_config: dict | None
    repeat: int
    shape: Shape
    run: Callable[[Any], Any]
    attempt: int | None = None  # None: numbered when it starts (a search numbers each probe)


@dataclass
class Handle:
    """An attempt in flight: what it is and where it was placed."""

    attempt: Attempt
    placement: Any


@dataclass
class Finished:
    handle: Handle
    value: Any = None
    error: BaseException | None = None


class Executor(Protocol):
    slots: int

    def room(self) -> bool: ...

    def fits(self, shape: Shape) -> bool: ...

    def running(self) -> int: ...

    def submit(self, attempt: Attempt) -> Handle: ...

    def collect(self, timeout_s: float) -> list[Finished]: ...

    def cancel(self, why: BaseException) -> list[Finished]: ...


def dispatch(
    executor: Executor,
    attempts: Iterable[Attempt],
    *,
    done: Callable[[Attempt, Any], None],
    admit: Callable[[Attempt], bool] | None = None,
    poll_s: float = 0.2,
) -> None:
    """Run each attempt on the executor, first come first served: the first that cannot be placed waits,
    and none behind it is drawn before it is placed (attempts are drawn only when one could start, so
    what ends meanwhile may decide the next). done(attempt, value) is called here, in the order they end.
    An attempt of shape width 0 (a record to write, nothing to run) runs here, in its turn. admit(attempt),
    at the moment it would be placed, may still turn it away. An attempt's exception, or anything raised
    here (a signal), cancels the rest (handing on what ended whole) and is raised again."""
    items = iter(attempts)
    head: Attempt | None = None
    drawn_all = False
    try:
        while True:
            if head is None and not drawn_all and (executor.room() or not executor.running()):
                head = next(items, None)
                drawn_all = head is None
            if drawn_all and not executor.running():
                return
            if head is not None:
                if head.shape.width == 0:
                    unit, head = head, None
                    done(unit, unit.run(None))
                    continue
                if executor.fits(head.shape):
                    unit, head = head, None
                    if admit is None or admit(unit):
                        executor.submit(unit)
                    continue
            for f in executor.collect(poll_s):  # with a timeout: a signal is handled within poll_s
                if f.error is not None:
                    raise f.error
                done(f.handle.attempt, f.value)
    except BaseException as stop:
        for f in executor.cancel(stop):
            if f.error is None:
                try:
                    done(f.handle.attempt, f.value)
                except Exception:  # noqa: BLE001 - the record is stored; the stop under way wins
                    pass
        raise
