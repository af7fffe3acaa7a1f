"""The run as its session runs it (Run: the settings as run() resolved them, and what run() built for them), a unit
of work (Unit: a cell repeat as drawn) and the attempt that runs one."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...estimate.planning.search import SearchResult
from ...host import env
from ...matrix.cells import Cell
from ...records.record import Record, machine_of
from .. import answer, launch
from ..executors.executor import Attempt, Job, Shape
from ..executors.local import Slots
from ..executors.replay import Recording
from ..launch import telemetry
from ..plan import Planned
from ..settings import RunSettings, stall_s

if TYPE_CHECKING:  # the Slurm executor is imported only when chosen (bench.execute.executors.registry)
    from ..executors.slurm import Settings as SlurmSettings

__all__ = ["Run", "Unit", "attempt_of"]


@dataclass(frozen=True)
class Run:
    """One run as its session runs it: one settings value and the parts run() built for it that no setting holds."""

    settings: RunSettings
    """What the run was asked, with what run() resolved filled in: the results file, the logs folder, the repeats,
    the platform and the executor ("replay" where recorded ends are served)."""
    slots: Slots
    """What cells are placed on: this host's GPUs (or CPU slots); on Slurm, one per job kept in Slurm at once."""
    recording: Recording | None = None
    """The recorded ends the replay executor serves (settings.replay's files, or a simulation's)."""
    slurm: SlurmSettings | None = None
    """The Slurm executor's settings: the matrix's slurm block under the command line's, with its partition's."""
    printer: Callable[[str], object] = print
    on_record: Callable[[Record], object] | None = None
    """Called with each outcome as it is stored (a live export); a failure there is said and the run goes on."""

    @property
    def logs(self) -> Path:
        assert self.settings.logs is not None, "run() resolves the logs folder"
        return Path(self.settings.logs)

    @property
    def platform(self) -> env.Platform:
        assert self.settings.platform is not None, "run() resolves the platform"
        return self.settings.platform

    @property
    def executor(self) -> str:
        return self.settings.executor

    def here(self, run_id: str) -> str | None:
        """The block this run's attempts measure in (bench.records.record.Record.block), where it is known before any
        runs: this host under the local executor. A replay's records keep the block they were measured in, and
        a cluster's nodes are each a machine: there each record says."""
        if self.recording is not None:
            return self.recording.here(run_id)
        if self.executor != "local":
            return None
        m = machine_of(env.provenance())
        return f"{run_id}@{m.id if m is not None else 'unknown'}"


@dataclass(eq=False)
class Unit:
    """A cell repeat as drawn: its progress index, the planned cell and the repeat; a micro-batch search
    (micro_batch: auto) runs its probes under one unit."""

    index: int
    planned: Planned
    repeat: int
    search: SearchResult | None = None
    request: answer.Request | None = None  # answer mode: why it is measured, and at which rung


def attempt_of(run: Run, unit: Unit, cell: Cell, ds_config: dict | None) -> Attempt:
    """The attempt that runs `cell` for a unit: its shape, and its job through the one launcher."""
    s = run.settings
    how = launch.Launch(
        Path(),  # the log's name has the attempt's number, taken when it starts (admit)
        stall_s=stall_s({**os.environ, **(s.extra_env or {})}), extra_env=s.extra_env,
        sample_interval_s=telemetry.interval_for(run.platform.cuda),
    )  # fmt: skip
    job = Job(cell, ds_config, how)
    return Attempt(key=unit, cell=cell, shape=Shape(gpus_per_node=cell.gpus, nodes=cell.nodes), job=job)
