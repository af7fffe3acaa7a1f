"""The executors `zerobench run --executor NAME` chooses from (each implements bench.execute.executor).

Each entry imports its class only when chosen, so an executor's optional dependencies (a cluster's
client library) load only when it is used. Each class is built from the run's local.Slots.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["EXECUTORS", "executor_for"]


def _local() -> type:
    from .local import LocalExecutor

    return LocalExecutor


EXECUTORS: dict[str, Callable[[], type]] = {"local": _local}


def executor_for(name: str, slots):
    """The executor called `name`, built for this run's slots."""
    return EXECUTORS[name]()(slots)
