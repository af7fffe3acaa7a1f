"""The orchestrator's entry: validate everything, then run each cell in its own process and record it.

plan (bench.execute.plan) -> prepare -> the session's loop (bench.execute.session) on an executor -> the
summary. Never imports torch. No exception escapes for a cell that failed: every end is a record.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..estimate import Hardware
from ..estimate.planning.search import ladder
from ..host import env
from ..matrix import dsconfig, rules, spec
from ..matrix.axes import AUTO
from ..matrix.problems import InputError
from ..records import cache
from ..records.record import Record
from ..records.store import Store, check_writable, read_records
from . import launch, schedule
from .answer import Search, State
from .executors import local
from .executors.registry import EXECUTORS
from .executors.replay import Recording
from .plan import (
    Plan,
    Planned,
    _check_faults,
    arrange,
    decide,
    default_results_path,
    hardware,
    host_platform,
    placed_by,
)
from .session import Run, Session
from .settings import AnswerSettings, RunSettings, check_folder, check_settings

if TYPE_CHECKING:  # the executors are imported only when chosen (bench.execute.executors.registry)
    from .executors.slurm import Partition

__all__ = ["run", "new_run_id", "Target", "target", "answer_items", "answer_preview", "family_of"]


def new_run_id() -> str:
    """Sortable and unique: UTC start time plus a random suffix."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]


def run(
    s: RunSettings, *, printer=print, on_record=None, recording: Recording | None = None
) -> tuple[Plan, Path, list[Record]]:
    """Run a matrix as s asks (bench.execute.settings.RunSettings); return the plan, the results path and the
    records written by this call.

    Every runnable cell runs s.repeats times (default: the matrix's `repeats`), interleaved: each cell's first
    repeat, then each one's second, so a drift of the machine over the run (clocks, temperature, a neighbour)
    spreads over all cells instead of landing on the last ones. A skipped cell is recorded once. s.order
    (bench.execute.schedule.ORDERS): "early" runs cells in bench.execute.schedule.order's order, "matrix" in the
    matrix's. With s.prune, a cell that runs out of memory implies the cells not yet run that need at least as
    much in every respect (bench.execute.schedule): each recorded once as implied_oom, naming it.
    on_record(record) is called with each outcome as it is stored (live export, e.g. to W&B); a failure there is
    printed and the run goes on. Where a GPU is known (NVML at the start, or s.gpu_mem), each record carries the
    memory model's prediction (against that and the host's memory, or s.host_mem), and with s.prune a cell
    predicted not to fit (beyond the margin) is recorded as skipped instead of run. recording: the recorded ends
    to serve instead of s.replay's files (a simulation's). Raises InputError before anything runs when the
    results file cannot be written or another run holds it, and StoreWriteError when a record could not be
    written whole (a full disk): the run stops there, having printed what it wrote and what it lost. SIGINT and
    SIGTERM raise Stopped (with the results path) after the running cell is recorded as interrupted.

    Where and how: s.executor (bench.execute.executors.registry) runs the cells on this host's GPUs (local), a Ray
    cluster, Slurm jobs or, replaying results files, nowhere (every record and report says it is a replay, written by
    default to results/local/<matrix name>.replay.jsonl). This process writes every record, whichever executor runs
    the cells."""
    _check_choices(s, recording)
    recording = recording or (Recording(list(s.replay)) if s.replay else None)
    p, t = _planned(s, recording)
    environ = {**os.environ, **(s.extra_env or {})}
    check_settings(environ)  # before anything runs: a bad value would otherwise be every cell's error
    _check_faults(p, environ.get("ZEROBENCH_FAULT"))
    results = s.results
    if recording:  # before anything is created; by default beside the real results, never in them
        results = results or str(default_results_path(p).with_suffix(".replay.jsonl"))
        _check_replay_target(Path(results), recording.paths)
    store, logs = _files(p, results, s.logs)
    if not s.other_matrix:
        check_same_matrix(store.path, p.matrix.name, s.matrix, s.resume)
    slots, slurm_settings = _placing(s, t, logs)
    resolved = dataclasses.replace(
        s, results=str(store.path), logs=str(logs), repeats=s.repeats or p.matrix.repeats, platform=t.platform,
        executor="replay" if recording else s.executor,
    )  # fmt: skip
    how = Run(resolved, slots, recording=recording, slurm=slurm_settings, printer=printer, on_record=on_record)
    # One run per results file: a second run (or a --resume) beside this one would measure every cell
    # twice, number both attempts 1, share their log files and take each other's started cells for dead.
    with store.hold("zerobench run --resume" if s.resume else "zerobench run"):
        session = Session(p, store, how, new_run_id())
        launch.sweep_attempt_folders()  # what a SIGKILLed run before this one could not remove
        _say_hardware(how, session.hw)
        session.load()
        session.go()
    return p, store.path, list(session.written)


def _check_choices(s: RunSettings, recording: Recording | None) -> None:
    """What a run cannot do, said before anything is read (InputError, ValueError for a caller's bad name)."""
    if s.order not in schedule.ORDERS:
        raise ValueError(f"order {s.order!r}: one of {', '.join(schedule.ORDERS)}")
    if s.executor not in EXECUTORS:
        raise ValueError(f"executor {s.executor!r}: one of {', '.join(sorted(EXECUTORS))}")
    if s.executor == "replay" and not (s.replay or recording):
        raise InputError("--executor replay needs the results files to serve: --replay FILE...")
    if s.executor == "slurm" and not (s.replay or recording):
        if s.gpus_available or s.pack:
            raise InputError("--gpus-available and --pack place cells on this host; a Slurm run's width is --max-jobs")
        from .executors import slurm

        slurm.require()


def _planned(s: RunSettings, recording: Recording | None) -> tuple[Plan, Target]:
    """The run's plan (the matrix loaded once) and where it runs: answer mode's cells (with batch.size, a
    micro_batch: auto cell per micro-batch); a replay's, only the cells its files recorded."""
    m = spec.load(s.matrix, ds_configs=s.ds_configs)
    t = target(s, m, recording)
    p = decide(m, s.matrix, s.filters, t.platform, s.shard)
    if s.answer is not None:
        p = answer_items(p, t.platform)
    return (recording.restrict(p) if recording else p), t


@dataclass(frozen=True)
class Target:
    """Where a run's cells run, as the rules judge them: the platform; on Slurm, the matrix's slurm block under the
    command line's options (bench.matrix.spec.SlurmSettings) and its partition as sinfo shows it."""

    platform: env.Platform
    slurm: spec.SlurmSettings | None = None
    partition: Partition | None = None


def target(s: RunSettings, m: spec.Matrix, recording: Recording | None = None) -> Target:
    """Where the run s asks for runs matrix m, the same for its dry run: a replay's recorded machine; a Slurm
    partition's nodes (sinfo: InputError naming what is wrong); the platform s assumes (--assume-gpus); else this
    host's first s.gpus_available GPUs. Under ray a cell's nodes are a cluster's (bench.execute.plan.placed_by)."""
    block = part = None
    if recording is not None:
        platform = recording.platform()
    elif s.executor == "slurm":
        from .executors import slurm

        block = m.slurm.model_copy(update={k: v for k, v in (s.slurm or {}).items() if v is not None})
        part = slurm.partition(block.partition)
        platform = slurm.platform_of(part)
    else:
        platform = s.platform or host_platform(s.gpus_available)
    return Target(placed_by(platform, s.executor), block, part)


def _files(p: Plan, results: str | None, logs_dir: str | None) -> tuple[Store, Path]:
    """The results file (writable, held by no other run) and the logs folder, checked before anything runs."""
    results_path = Path(results) if results else default_results_path(p)
    check_writable(results_path)
    logs = Path(logs_dir) if logs_dir else results_path.parent / "logs" / results_path.stem
    check_folder(logs, "--logs" if logs_dir else f"the logs folder {logs} (--logs)")
    check_folder(cache.root(), "ZEROBENCH_CACHE" if os.environ.get("ZEROBENCH_CACHE") else "the cache folder")
    return Store(results_path), logs


def check_same_matrix(results: Path, name: str, matrix_file: str, resume: bool) -> None:
    """A results file whose records of matrix `name` were written from another version of the matrix file (their
    inputs.matrix_sha256) is not this matrix's: an InputError naming it and what to do, before anything is
    written (appended to, it mixes two matrices' cells; resumed from, its outcomes hide cells of this one)."""
    if not results.is_file():
        return
    mine = env.file_sha(matrix_file)
    shas = (r.inputs.matrix_sha256 for r in read_records(results, warn=False) if r.matrix == name and r.inputs)
    other = Counter(sha for sha in shas if sha not in (None, mine))
    if not other or mine is None:
        return
    n, (sha, _) = sum(other.values()), other.most_common(1)[0]
    raise InputError(
        f"{results} holds {n} record(s) of matrix {name} written from another version of {matrix_file} (matrix "
        f"sha256 {sha[:12]}, this file's {mine[:12]}): "
        + ("resumed from, its outcomes would stand for cells of this version" if resume else "appended to, it would "
           "mix the two versions' cells")
        + "; give --results a new file, or --other-matrix to use this one anyway"
    )  # fmt: skip


def _check_replay_target(results: Path, sources: list[str]) -> None:
    """A replay writes only where no record measured anew is: not into a file it replays, nor among a run's
    measurements, where its records would read as measured anew (InputError, before anything is written)."""
    if not results.is_file():
        return
    same = next((s for s in sources if Path(s).is_file() and os.path.samefile(s, results)), None)
    if same is not None:
        raise InputError(
            f"--results {results} is the --replay file {same}: the replay would append copies of its records to it; "
            "give --results a new file"
        )
    measured = sum(r.status.ran and r.status.is_outcome and r.replay is None for r in read_records(results, warn=False))
    if measured:
        raise InputError(
            f"--results {results} holds {measured} record(s) measured anew: replayed records appended there would read "
            "as measurements too; give --results a new file (a replay's own results file can be resumed)"
        )


def _placing(s: RunSettings, t: Target, logs: Path):
    """What the run places cells on: this host's GPUs (or CPU slots); on Slurm, as many slots as jobs it keeps
    in Slurm at once, and its settings."""
    if t.partition is None:
        return _slots(t.platform, s.gpus_available, s.pack), None
    from .executors.slurm import Settings

    settings = Settings.of(t.slurm, t.partition, t.platform.cuda, logs)
    check_folder(settings.folder, "the Slurm folder (--slurm-folder)")
    return local.Slots(list(range(settings.max_jobs))), settings


def answer_items(p: Plan, platform: env.Platform) -> Plan:
    """The plan answer mode searches. With batch.size each runnable cell belongs to a family, its configuration
    (the cell but its micro-batch and accumulation), and a micro_batch: auto cell becomes one cell per micro-batch
    that divides batch.size, its accumulation holding the batch (bench.estimate.planning.search.ladder), each judged
    by the rules; the search measures of each family the largest the memory model fits and the neighbours that could be
    faster (bench.execute.answer.outcomes). Without batch.size there is no batch to hold: micro_batch: auto is refused
    (InputError)."""
    size = p.matrix.batch.size
    auto = [it.cell.name for it in p.items if it.cell.micro_batch == AUTO]
    if auto and size is None:
        raise InputError(
            f"{p.source}: answer mode searches a micro_batch: auto at a fixed batch ({auto[0]} and {len(auto) - 1} "
            "more): set batch.size (sequences per optimizer step, e.g. batch: {micro: auto, size: 8}), or list the "
            "micro-batches under axes: micro_batch: [...]"
        )
    if size is None:
        return p
    items = []
    for it in p.items:
        if it.skip is not None:  # a rule's skip of an auto cell holds for every micro-batch
            items.append(it)
        elif it.cell.micro_batch != AUTO:
            items.append(dataclasses.replace(it, family=family_of(it.cell)))
        else:
            for mb in ladder(size):
                cell = dataclasses.replace(it.cell, micro_batch=mb, grad_accum=size // mb)
                skip = rules.check(cell, platform)
                items.append(Planned(cell, skip, None if skip else dsconfig.build(cell), family=family_of(cell)))
    return dataclasses.replace(p, items=tuple(items))


def _search(p: Plan, s: RunSettings, platform: env.Platform, settings: AnswerSettings) -> tuple[Plan, Search]:
    """Answer mode's search over plan p as it starts (nothing measured), and the plan it searches."""
    p = answer_items(p, platform)
    hw = hardware(platform, s.gpu_mem, s.host_mem)
    items, preds, free = arrange(list(p.items), hw, s.margin, True, "early")
    return p, Search([it for it in items if id(it) not in free], hw, settings, platform.cuda, predicted=preds)


def answer_budget_cells(p: Plan, s: RunSettings, platform: env.Platform, budget_s: float) -> tuple[int, float]:
    """About how many cells answer mode measures of plan p in budget_s of cell time, if it does not settle first:
    the budget over the median predicted first attempt (the short schedule) of the cells it would open; and
    that median, in seconds."""
    _, search = _search(p, s, platform, dataclasses.replace(AnswerSettings(), budget_s=budget_s))
    costs = sorted(search.cost_s(c, 0) for c in search.open())
    costs = [c for c in costs if c > 0]
    if not costs:
        return 0, 0.0
    median = costs[len(costs) // 2]
    return min(len(search.candidates), int(budget_s // median)), median


def answer_preview(p: Plan, s: RunSettings, platform: env.Platform) -> list[str]:
    """What answer mode would measure first of plan p (judged on platform) as s asks (a dry run's last lines):
    per configuration, which micro-batches, and when it stops."""
    settings = s.answer or AnswerSettings()
    p, search = _search(p, s, platform, settings)
    lines = [f"answer mode: {len(search.candidates)} runnable cells, grouped by {', '.join(settings.group_by)}"]
    if search.families:
        size = p.matrix.batch.size
        mbs = sorted({c.cell.micro_batch for c in search.candidates})
        first = {mb: sum(c.state == State.OPEN for c in search.candidates if c.cell.micro_batch == mb) for mb in mbs}
        parked = sum(c.state == State.PARKED for c in search.candidates)
        lines.append(
            f"  {len(search.families)} configurations x micro-batch {', '.join(map(str, mbs))} at {size} sequences per "
            f"optimizer step (the accumulation makes up the rest); open to measure: "
            + ", ".join(f"micro-batch {mb} in {n}" for mb, n in first.items())
            + f" (per configuration the largest the memory model fits within the margin and the neighbours that "
            f"could be faster); {parked} parked"
        )
    budget = f"; or once --budget {settings.budget_s:.0f} s of cell time is spent" if settings.budget_s else ""
    lines.append(
        f"  it stops once the chance that an unmeasured cell beats its group's fastest by more than "
        f"{settings.speed_tolerance:.0%}, and that one adds a frontier point, are each below {settings.settle:.0%}"
        + budget
    )
    return lines


def family_of(cell) -> str:
    """A cell's configuration: the hash of the cell with its micro-batch searched (the same for each micro-batch
    and accumulation of one configuration)."""
    return dataclasses.replace(cell, micro_batch=AUTO, grad_accum=1).hash


def _say_hardware(r: Run, hw: Hardware) -> None:
    if r.platform.cuda and not r.platform.nvml:
        r.printer(
            "warning: this GPU host has no NVML (pip install nvidia-ml-py): records will "
            "carry the torch allocator's memory only, not NVML's process and device memory, power or utilisation"
        )
    if hw.gpu_memory_bytes:
        r.printer(
            f"memory model: judging cells against {hw.gpu_memory_bytes / 2**30:.1f} GiB of GPU memory"
            + (f" and {hw.host_memory_bytes / 2**30:.1f} GiB of host memory" if hw.host_memory_bytes else "")
            + (
                f", margin {r.settings.margin:.0%}; cells predicted not to fit are skipped (--no-prune runs them)"
                if r.settings.prune
                else ""
            )
        )


def _slots(platform: env.Platform, gpus_available: int | None, pack: bool | None) -> local.Slots:
    """What cells are placed on: the GPUs' physical indexes, or on a CPU host slots 0..N-1."""
    ids = [g.index for g in platform.gpus] if platform.cuda else list(range(gpus_available or 1))
    return local.Slots(ids, max_cells=None if (len(ids) > 1 if pack is None else pack) else 1)
