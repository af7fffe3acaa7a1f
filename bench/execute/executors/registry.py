"""The executors `zerobench run --executor NAME` chooses from (each implements bench.execute.executors.executor).

Each entry imports its class only when chosen, so an executor's optional dependencies (a cluster's
client library) load only when it is used. Each is built from the run's local.Slots, the host's platform
and where the run says its cells go (a cluster's address, the logs folder its nodes write).
"""

from __future__ import annotations

from collections.abc import Callable

from ...matrix.problems import InputError

__all__ = ["EXECUTORS", "executor_for"]


def _local() -> Callable:
    from .local import LocalExecutor

    def build(slots, platform, *, address=None, **_):
        if address:
            raise InputError("--address names a cluster: it goes with --executor ray")
        return LocalExecutor(slots, cuda=platform.cuda)

    return build


def _replay() -> Callable:
    from .replay import ReplayExecutor

    def build(slots, platform, *, recording=None, **_):
        return ReplayExecutor(slots, cuda=platform.cuda, recording=recording)

    return build


def _ray() -> Callable:
    try:
        from .ray import RayExecutor
    except ImportError as e:
        if (e.name or "").split(".")[0] != "ray":
            raise
        raise InputError("--executor ray needs Ray: pip install 'zerobench[ray]'") from None

    def build(slots, platform, *, address=None, logs=None, printer=print, cells=(), **_):
        return RayExecutor(slots, cuda=platform.cuda, address=address, logs=logs, printer=printer, cells=cells)

    return build


def _slurm() -> Callable:
    from .slurm import SlurmExecutor

    def build(slots, platform, *, address=None, printer=print, settings=None, **_):
        if address:
            raise InputError("--address names a Ray cluster: it goes with --executor ray")
        return SlurmExecutor(slots, cuda=platform.cuda, settings=settings, printer=printer)

    return build


EXECUTORS: dict[str, Callable[[], Callable]] = {"local": _local, "ray": _ray, "replay": _replay, "slurm": _slurm}


def executor_for(name: str, slots, platform, **options):
    """The executor called `name`, built for this run's slots on this platform; options, each executor taking
    its own: address (ray: the cluster's), logs (the folder every node must write, checked before any cell),
    printer, recording (replay: what it serves), settings (slurm's), cells (those the run may start: ray refuses
    those its cluster cannot place before any cell)."""
    return EXECUTORS[name]()(slots, platform, **options)
