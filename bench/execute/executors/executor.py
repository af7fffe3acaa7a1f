"""The Executor protocol: where and when cell attempts run, whichever machines run them.

The session (bench.execute.session) decides what to run and writes every record; an executor only places
attempts on resources, runs each one's Job where it placed it, and hands back how each ended. So the results
file has one writer whatever runs the cells, and `--resume` works whichever executor ran the earlier part.

    executor.place(attempt) -> Handle | None: resources held for it now (None: not free yet)
    executor.start(handle)                  : run the attempt's job where it was placed
    executor.release(handle)                : give back a placement that will not start
    executor.collect(timeout_s)             -> the Finished attempts (blocks up to timeout_s for the first)
    executor.cancel(why)                    -> stops everything in flight; a Finished for each
    executor.room() / running()             : whether one more could start now / how many are in flight
    executor.close()                        : the run is over: give back what the executor holds
    executor.forkservers                    : where its workers fork from, if not from this host's (None)

A Job is plain data (picklable): a remote executor ships it to the node that owns the GPUs and calls it
there with the GPUs it holds, so the launcher (bench.execute.launch) runs on that node, the same for every
executor. bench.execute.executors.registry names the executors `--executor` chooses from.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...matrix.cells import Cell
from .. import launch

__all__ = ["Attempt", "Executor", "Finished", "Halted", "Handle", "Job", "Neighbours", "Shape", "dispatch", "stop_for"]


@dataclass(frozen=True)
class Shape:
    """What one attempt holds while it runs: GPUs (or CPU slots) on each of `nodes` nodes."""

    gpus_per_node: int = 1
    nodes: int = 1

    @property
    def width(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class Job:
    """What an attempt runs where it is placed: one cell's worker(s) through the launcher, to an Outcome.
    Plain data, so it pickles to another node; the launch's log path must be on storage that node can write."""

    cell: Cell
    ds_config: dict | None
    launch: launch.Launch
    """How the worker(s) are launched; its GPUs are left to where the attempt is placed (the call's)."""

    def __call__(self, gpus: list[int] | None, stop: launch.StopRequest | None = None) -> launch.Outcome:
        """Run it here on `gpus` (None: a CPU host). A stop (Ctrl-C, stop.exc) is raised once the worker is
        stopped; any other exception is zerobench's own failure around the cell."""
        return launch.run_cell(self.cell, self.ds_config, dataclasses.replace(self.launch, gpus=gpus), stop)

    def with_launch(self, **changes) -> Job:
        """The same job with some of its launch's fields changed (dataclasses.replace's)."""
        return dataclasses.replace(self, launch=dataclasses.replace(self.launch, **changes))


@dataclass
class Attempt:
    """One unit for an executor: a cell attempt, its shape and its job. key identifies it to the submitter."""

    key: Any
    cell: Cell
    shape: Shape
    job: Job


@dataclass
class Handle:
    """An attempt placed: where (placement, the executor's own), and what the started record says of it
    (where: {"gpus": [...]} or {"cpu_slots": [...]}, plus a node where the executor knows one)."""

    attempt: Attempt
    placement: Any
    where: dict = field(default_factory=dict)


@dataclass
class Finished:
    """An attempt's end: the launcher's Outcome, or the exception its job raised (a stop: KeyboardInterrupt),
    with the traceback text taken where it was raised."""

    handle: Handle
    value: Any = None
    error: BaseException | None = None
    traceback: str = ""


class Executor(Protocol):
    slots: int
    # Where its single-rank workers fork from, when not from the fork servers the run starts on this host
    # (bench.execute.prepare; None: those).
    forkservers: str | None

    def room(self) -> bool: ...

    def running(self) -> int: ...

    def place(self, attempt: Attempt) -> Handle | None: ...

    def start(self, handle: Handle) -> None: ...

    def release(self, handle: Handle) -> None: ...

    def collect(self, timeout_s: float) -> list[Finished]: ...

    def cancel(self, why: BaseException) -> list[Finished]: ...

    def close(self) -> None: ...


class Halted(KeyboardInterrupt):
    """How a running cell is stopped because another unit failed (not the user): its record says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def stop_for(why: BaseException) -> KeyboardInterrupt:
    """What stops the attempts in flight when `why` stopped the run: a stop (Ctrl-C, SIGTERM) as it is, each
    recorded interrupted with its reason; an error as Halted, saying the run failed beside them."""
    if isinstance(why, KeyboardInterrupt):
        return why
    return Halted(f"stopped: the run failed beside it ({type(why).__name__}: {str(why)[:300]})")


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


WAIT = None
"""What a source yields when it has nothing to run until an attempt in flight ends (a search that waits for
its last probe)."""
_END = object()


def dispatch(
    executor: Executor,
    source: Iterator[Attempt | None],
    *,
    admit: Callable[[Handle], bool],
    done: Callable[[Finished], None],
    poll_s: float = 0.2,
) -> None:
    """Run the attempts the source yields, first come first served: the first that cannot be placed waits,
    and none behind it is drawn before it is placed (attempts are drawn only when one could start, so
    what ends meanwhile may decide the next). admit(handle), once placed, writes its start or turns it away
    (False: released, not run). done(finished) is called here, in the order they end. The source may yield
    WAIT (nothing until something ends). Anything raised here (a signal, done's error) cancels the rest,
    hands on what ended meanwhile, and is raised again."""
    head: Attempt | None = None
    drained = waiting = False
    try:
        while True:
            if head is None and not (drained or waiting) and (executor.room() or not executor.running()):
                drawn = next(source, _END)
                drained, waiting = drawn is _END, drawn is WAIT
                head = None if drained or waiting else drawn
            if (drained or waiting) and not executor.running():
                if drained:
                    return
                raise RuntimeError("the run waits for an attempt, but none is in flight")
            if head is not None and (handle := executor.place(head)) is not None:
                head = None
                executor.start(handle) if admit(handle) else executor.release(handle)
                continue
            for f in executor.collect(poll_s):  # with a timeout: a signal is handled within poll_s
                waiting = False
                done(f)
    except BaseException as stop:
        for f in executor.cancel(stop):
            try:
                done(f)
            except Exception:  # noqa: BLE001 - the stop under way wins; what could be stored was
                pass
        raise
