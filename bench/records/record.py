"""The result record, typed and versioned: what a worker rank writes (`WorkerDoc`, result.rank{N}.json)
and what the store keeps (`Record`, one JSON line per cell attempt in results/*.jsonl).

worker -> WorkerDoc -> launch.Outcome -> Record -> store -> results (DataFrame)

Every stored record is made by one constructor per status: `Record.started`, `.skipped`,
`.implied_oom` (not run: a lighter cell ran out of memory), `.interrupted` (the orchestrator stopped),
`.error` (zerobench failed around the cell) and
`.from_outcome` (whatever the worker and the launcher made of the attempt: ok, diverged, cuda_oom,
host_oom, killed, timeout, error, interrupted). Each carries the provenance of the process that ran the cell
(on a cluster, the node's on its outcome, with the orchestrator's beside it).
`zerobench schema` prints the JSON Schema of `Record`; schema/record-v<N>.schema.json is its copy.

Versions (`schema_version` in every line):
  1  the first format.
  2  `provenance` on every record of every status (v1 wrote it on skipped records and outcomes only);
     `reason` on every record ("" where there is nothing to say; v1 started records had none).
     A v1 record that had no provenance reads as `provenance: null`: the only place a null appears,
     since every record written at v2 carries one.
  3  `machine` on every attempt (started records and their ends): where it ran, by GPU UUIDs, the host's
     boot id and name, CPU model and count (`provenance.boot_id` is new). A v2 record reads with the
     machine its provenance names: its GPUs' UUIDs, the boot id unknown; `machine: null` (unknown) where
     it names no GPU UUID (a CPU run: host names repeat, "vm" on every lent machine).
  4  a record of a cell that did not run (skipped, implied_oom, unmeasured) is compact: it names the cell
     (`cell_id`, `matrix`, `matrix_file`) and says why it did not run (`status`, `reason`, `skip`'s rule,
     `implied_by`, `answer`), nothing the matrix says (the cell's settings: bench.judge.results fills them from
     the matrix file), no provenance (nothing ran), no fixed costs; a pruned cell keeps the prediction's
     figures, not its terms. `cell_name` and `cell_hash` are read from `cell_id` where a record leaves them
     out. A v3 record is a valid v4 record.
Reading goes through `upgrade` (bench.records.versions), one function per version step, so every results file
ever written loads as the current version; the store writes only the current version.

The record's parts live beside it, each importable from here too: the worker's document and measurements
(bench.records.measured), the machine and its provenance (bench.records.machine), the orchestrator's facts
(bench.records.parts) and the upgrade chain (bench.records.versions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, model_validator

from ..host import env
from .machine import Gpu, Machine, Provenance, machine_of, with_rates
from .measured import (
    CLOSED,
    STEP_PARTS,
    AllocatorPeaks,
    ByGpu,
    Memory,
    Metrics,
    Rate,
    StepsTaken,
    WorkerDoc,
    WorkerFacts,
    memory_of,
    metrics_of,
    warnings_of,
    worker_document,
)
from .parts import (
    UNMEASURED_EXPECTED,
    UNMEASURED_NEEDED,
    UNMEASURED_NOT_NEEDED,
    UNMEASURED_SPENT,
    UNMEASURED_STOPPED,
    AnswerNote,
    FixedCosts,
    ImpliedBy,
    Inputs,
    NodeRun,
    Placement,
    Prediction,
    RankEnd,
    Replay,
    Search,
    SearchProbe,
    Skip,
    StartedBy,
)
from .status import Status
from .versions import SCHEMA_VERSION, RecordVersionError, upgrade

__all__ = [
    "SCHEMA_VERSION",
    "STEP_PARTS",
    "Record",
    "WorkerDoc",
    "WorkerFacts",
    "Metrics",
    "Memory",
    "AllocatorPeaks",
    "Provenance",
    "Gpu",
    "Machine",
    "machine_of",
    "Skip",
    "RankEnd",
    "NodeRun",
    "StartedBy",
    "upgrade",
    "parse",
    "json_schema",
    "worker_document",
    "RecordVersionError",
    "Placement",
    "Prediction",
    "FixedCosts",
    "Search",
    "SearchProbe",
    "ImpliedBy",
    "StepsTaken",
    "NOT_RUN",
    "AttemptContext",
]


# What a replayed record takes from the recorded one: the measurement and where it was made.
_REPLAYED = {
    "wall_s", "exit_code", "phase_at_end", "world_size", "ranks", "metrics", "memory", "losses", "step_times_s",
    "steps", "worker", "warnings", "telemetry", "ds_config", "foreign_gpu_processes", "gpu_after", "started_by",
    "log_tail", "traceback", "provenance", "machine",
}  # fmt: skip


class _Cell(Protocol):
    """What a record needs of a bench.matrix.cells.Cell (not imported: this module sits below it)."""

    matrix: str
    id: str
    hash: str
    name: str

    def to_dict(self) -> dict[str, Any]: ...


class _Ended(Protocol):
    """What a record needs of a bench.execute.launch.Outcome (not imported: this module sits below it): the attempt
    as the launcher classified it, with the ranks' documents parsed once where they were read."""

    status: Status
    reason: str
    ranks: list[WorkerDoc]
    unreadable: list[str]
    telemetry: dict
    exit_code: int | None
    wall_s: float
    log_tail: str
    phase_at_end: str | None
    gpu_before: dict
    gpu_after: dict
    started_by: dict
    fault: str | None
    warnings: list[str]
    port: int | None
    nodes: list[dict]
    node: dict | None


@dataclass(frozen=True, kw_only=True)
class AttemptContext:
    """What the run knows of an attempt as it starts it, beyond which cell and attempt it is: each part given
    goes into its started record (and on to its end)."""

    predicted: dict | None = None
    """The memory model's prediction (bench.estimate), where a GPU is known."""
    fixed_costs: dict | None = None
    """What the run paid once before its cells."""
    placement: dict | None = None
    """Its GPUs (or CPU slots), port and neighbours; on a cluster its node and job."""
    answer: dict | None = None
    """In answer mode: why it is measured (its role, why, rung and group)."""
    rates: dict | None = None
    """The run's machine's rates as the probe gave them (bench.host.rates.Rates.to_dict): its machine section's."""


class Record(BaseModel):
    """One cell attempt, as the store keeps it (one JSON line). The record of a cell that did not run (skipped,
    implied_oom, unmeasured) is compact: its cell by `cell_id` within its `matrix` and `matrix_file`, and why it
    did not run (`status`, `reason`, the rule's id in `skip`, `implied_by`, or the `answer` note; a pruned cell's
    `predicted` figures), nothing the matrix says: reading it (`bench.judge.results.load`) takes the cell's settings
    from the matrix file, and a skip's fix and source from its rule. An answer run writes a cell's `unmeasured`
    record once: a later call (`--resume`) writes another only when its reason changes, and a measurement
    supersedes it."""

    model_config = CLOSED
    schema_version: Literal[SCHEMA_VERSION]
    """The record format's version (bench.records.record.SCHEMA_VERSION); older records are upgraded on reading."""
    # -- which cell, which attempt
    run_id: str
    """The run (one `zerobench run`) that wrote it: start time and a random suffix."""
    attempt: int
    """1 for a cell's first attempt in a results file, then counting up (resume, reruns, repeats)."""
    repeat: int = 1
    """Which process-level repeat of the cell this is (`repeats: N` in the matrix, `--repeats`): 1..N.
    Absent from records before repeats existed: those are repeat 1. Not part of the cell's identity."""
    matrix: str
    """The matrix's name."""
    matrix_file: str | None = None
    """The matrix file as given."""
    inputs: Inputs | None = None
    """sha256 of the matrix file and of the user's DeepSpeed config (absent from records before 2026-12)."""
    cell_id: str
    """`cell_name#cell_hash`; the hash is stable across runs and zerobench versions."""
    cell_hash: str
    """Short stable hash of the cell's canonical config: two runs of the same cell share it (a compact record
    leaves it out: it is cell_id's end)."""
    cell_name: str
    """The readable key=value name (axes off their default, in bench.matrix.axes order; a compact record leaves it out:
    it is cell_id's start)."""
    cell: dict[str, Any] | None = None
    """The cell as bench.matrix.cells.Cell.to_dict() wrote it (a field added later is absent from older records:
    it ran at that field's default). Absent from a compact record (a cell that did not run): the matrix
    file's cell of that hash (bench.judge.results fills it in)."""
    variant: str | None = None
    """selfcheck only: reference, zerobench or no-telemetry."""
    # -- how it ended
    status: Status
    """How the attempt ended (the statuses below)."""
    reason: str
    """Why it ended so ("" when it simply ran); for a skip, the rule's reason (before version 4 with its fix and
    source); for a multi-rank cell, the end of the rank that failed first (the others' lost connections are its
    consequence)."""
    warnings: list[str] | None = None
    """What makes the measurement less clean than its status says (an op compiled inside the cell, a
    relaunch after a taken port); shown in the report's notes. None when there is nothing to say."""
    skip: Skip | None = None
    """For a skipped cell: the rule, the fix and the source."""
    started_at: str
    """ISO 8601, UTC."""
    ended_at: str | None = None
    """ISO 8601, UTC."""
    wall_s: float | None = None
    """Wall seconds from launch to the worker's end."""
    exit_code: int | None = None
    """The worker's exit code (negative: the signal that ended it)."""
    phase_at_end: str | None = None
    """The phase the worker was in when it ended (import, setup, warmup, measured, teardown, exit)."""
    world_size: int | None = None
    """Ranks of the attempt."""
    ranks: list[RankEnd] | None = None
    """Every rank's own end (multi-rank attempts only)."""
    nodes: list[NodeRun] | None = None
    """Every node's launch (cells of several nodes only); the memory and telemetry figures are then the
    largest node's or GPU's (host RSS per node, NVML per GPU), the metrics rank 0's."""
    # -- what was measured
    metrics: Metrics | None = None
    """Throughput, FLOPs and the GPU's state over the measured steps (ok and diverged records)."""
    memory: Memory | None = None
    """Peaks of the attempt: host RSS, NVML and the allocator, whole and per phase."""
    losses: list[float | None] | None = None
    """Every step's loss, warmup included."""
    step_times_s: list[Rate] | None = None
    """Every measured step's wall time."""
    steps: StepsTaken | None = None
    """Steps taken and why measuring ended (adaptive or fixed; absent from older records)."""
    worker: WorkerFacts | None = None
    """What the worker found out: the optimizer that ran, parameter counts, build times, versions."""
    telemetry: dict[str, Any] | None = None
    """The orchestrator's samples split by phase (bench.execute.launch.telemetry): open-ended."""
    # -- where and how it ran
    ds_config: dict[str, Any] | None = None
    """The exact DeepSpeed config the worker was given."""
    foreign_gpu_processes: ByGpu = None
    """Other processes on the cell's GPUs before it started, by GPU index."""
    gpu_after: ByGpu = None
    """NVML's used memory on the cell's GPUs after it ended, by GPU index (back to baseline or not)."""
    started_by: StartedBy | None = None
    """How the worker process began: forked from the pre-imported server or spawned."""
    fixed_costs: FixedCosts | None = None
    """What the run paid once before its cells (absent from records before 2026-12)."""
    placement: Placement | None = None
    """Its GPUs (or CPU slots), port and neighbours (absent from records before packing existed); on a cluster its
    node and job."""
    provenance: Provenance | None = None
    """The machine that ran the cell: on an outcome from a cluster node, that node's (its first node's; `nodes` has
    each node's), taken there; otherwise the orchestrator's host. Absent from a compact record (nothing ran); null
    only on a record upgraded from v1 that was written without one."""
    machine: Machine | None = None
    """Where the attempt ran (started records and their ends; absent from records of cells that did not run):
    on a cluster, the node that ran it (its first node's). None: unknown (a record from before schema v3 that
    names no GPU UUID)."""
    orchestrator: Provenance | None = None
    """On an outcome a cluster node ran (`--executor ray` or `slurm`): the provenance of the host that planned the
    run and wrote this record (its started record's). Absent where one host did both."""
    predicted: Prediction | None = None
    """The memory model's prediction, where a GPU was known (absent from records before 2026-12)."""
    search: Search | None = None
    """On the last record of a `micro_batch: auto` search: the whole search."""
    implied_by: ImpliedBy | None = None
    """On an implied_oom record: the cell that ran out of memory and proves it (absent from older records)."""
    answer: AnswerNote | None = None
    """In answer mode: why it was measured (its role and rung) or why it was not (status unmeasured)."""
    replay: Replay | None = None
    """A replayed end: the recorded record it repeats (nothing ran)."""
    log: str | None = None
    """Path of the worker's log file."""
    log_tail: str | None = None
    """The end of the worker's log (failures)."""
    traceback: str | None = None
    """The worker's traceback (failures)."""

    # -- one constructor per status ---------------------------------------------------------------

    @classmethod
    def started(
        cls,
        cell: _Cell,
        *,
        run_id: str,
        attempt: int,
        matrix_file: str,
        started_at: str,
        repeat: int = 1,
        context: AttemptContext = AttemptContext(),
    ) -> "Record":
        """Written before launch, so a run killed mid-cell is found by --resume; with what the run knows of the
        attempt as it starts it (`context`)."""
        prov = env.provenance()
        return cls(
            **_identity(cell, run_id, attempt, matrix_file, repeat),
            status=Status.STARTED,
            reason="",
            started_at=started_at,
            provenance=prov,
            machine=with_rates(machine_of(prov, (context.placement or {}).get("gpus")), context.rates),
            **({"predicted": context.predicted} if context.predicted else {}),
            **({"fixed_costs": context.fixed_costs} if context.fixed_costs else {}),
            **({"placement": context.placement} if context.placement else {}),
            **({"answer": context.answer} if context.answer else {}),
        )

    @model_validator(mode="before")
    @classmethod
    def _name_and_hash(cls, data: Any) -> Any:
        """A compact record writes cell_id alone: cell_name and cell_hash are its two parts."""
        if isinstance(data, dict) and not ("cell_name" in data and "cell_hash" in data):
            cid = data.get("cell_id")
            if isinstance(cid, str) and "#" in cid:
                name, _, h = cid.rpartition("#")
                data = {"cell_name": name, "cell_hash": h, **data}
        return data

    @classmethod
    def skipped(
        cls, cell: _Cell, skip: Any, *, run_id: str, attempt: int, matrix_file: str, at: str,
        predicted: dict | None = None,
    ) -> "Record":  # fmt: skip
        """A rule (bench.matrix.rules.Skip) says the cell cannot run here, or the memory model that it cannot fit: a
        compact record with the rule's id and reason (its fix and source are the rule table's); predicted, given for a
        pruned cell, keeps its figures (the why), not its terms."""
        return cls(
            **_not_run(cell, run_id, attempt, matrix_file, at),
            status=Status.SKIPPED,
            reason=skip.reason,
            skip=Skip(rule=skip.rule),
            **({"predicted": _figures(predicted)} if predicted else {}),
        )

    @classmethod
    def implied_oom(cls, cell: _Cell, by: dict, *, run_id: str, attempt: int, matrix_file: str, at: str) -> "Record":
        """Not run: the cell `by` (ImpliedBy's fields) ran out of memory and needs no more than this one in
        any respect. An outcome for --resume; never a measured out-of-memory. The reason is the same for every
        cell one prover implies (so reports group them); `implied_by.how` says how each differs. Compact."""
        implied = ImpliedBy.model_validate(by)
        where = "GPU" if implied.status is Status.CUDA_OOM else "host"
        return cls(
            **_not_run(cell, run_id, attempt, matrix_file, at),
            status=Status.IMPLIED_OOM,
            reason=f"implied out of {where} memory, not run: {implied.cell_name} (#{implied.cell_hash}) ran out "
            f"({implied.status.value}) and needs no more {where} memory in any respect",
            implied_by=implied,
        )

    @classmethod
    def unmeasured(
        cls, cell: _Cell, note: dict, *, run_id: str, attempt: int, matrix_file: str, at: str, spent: bool = False,
    ) -> "Record":  # fmt: skip
        """Answer mode left it unmeasured: its answer note says why (not needed, or the budget ran out) with its
        predicted figures (4 significant digits). The reason is one of a few fixed sentences, so reports group
        these. spent: a resumed call whose budget afforded no attempt: it measured nothing, so it says no cell is
        not needed (the note's `needed` and `why` keep the figures' verdict). Compact."""
        note = AnswerNote.model_validate({**_rounded(note), "role": "unmeasured"})
        return cls(
            **_not_run(cell, run_id, attempt, matrix_file, at),
            status=Status.UNMEASURED,
            reason=UNMEASURED_EXPECTED
            if note.expected_error
            else UNMEASURED_SPENT
            if spent and not note.needed
            else UNMEASURED_NOT_NEEDED
            if not note.needed
            else UNMEASURED_STOPPED
            if note.stopped
            else UNMEASURED_NEEDED,
            answer=note,
        )

    @classmethod
    def replayed(cls, started: "Record", recorded: dict, *, source: str, reused: bool, ended_at: str) -> "Record":
        """The recorded end `recorded` served for `started` by the replay executor: its measurement and
        provenance, with `replay` naming it."""
        rec = parse(recorded)
        replay = Replay(source=source, run_id=rec.run_id, attempt=rec.attempt, started_at=rec.started_at, reused=reused)
        fields = rec.model_dump(include=_REPLAYED, exclude_unset=True)
        return started._end(rec.status, rec.reason, ended_at=ended_at, replay=replay, **fields)

    @classmethod
    def interrupted(
        cls, started: "Record", reason: str, *, ended_at: str, log: str | None = None, wall_s: float | None = None,
        warnings: list[str] | None = None,
    ) -> "Record":  # fmt: skip
        """The orchestrator stopped while the cell ran (Ctrl-C), or --resume found an attempt that never ended
        (wall_s: how long it ran, as far as its log and the run's records tell; warnings say how it was told).
        It keeps the provenance of the attempt it ends (that of this process for a v1 start, which had none)."""
        return started._end(
            Status.INTERRUPTED,
            reason,
            ended_at=ended_at,
            log=log,
            provenance=started.provenance or Provenance.model_validate(env.provenance()),
            **({"wall_s": wall_s} if wall_s is not None else {}),
            **({"warnings": warnings} if warnings else {}),
        )

    @classmethod
    def error(cls, started: "Record", reason: str, *, ended_at: str, traceback: str, log: str) -> "Record":
        """zerobench itself failed around the cell (not the worker: that is an outcome)."""
        return started._end(Status.ERROR, reason, ended_at=ended_at, traceback=traceback, log=log)

    @classmethod
    def from_outcome(
        cls,
        started: "Record",
        out: _Ended,
        *,
        ds_config: dict | None,
        log: str,
        ended_at: str,
        variant: str | None = None,
        beside: list[str] | None = None,
    ) -> "Record":
        """The attempt as the launcher classified it (a bench.execute.launch.Outcome) with the ranks' documents;
        beside: the cells that ran during its measured phase, where it ran in a pool (bench.execute.executors.local)."""
        docs = sorted(out.ranks, key=lambda d: d.rank)
        status, reason = out.status, out.reason
        if out.unreadable:  # a worker of another version, or a bug: say so instead of guessing what it meant
            status, reason = (
                Status.ERROR,
                "a result document does not match bench.records.record.WorkerDoc: " + "; ".join(out.unreadable),
            )
        rank0 = next((d for d in docs if d.rank == 0), docs[0] if docs else WorkerDoc())
        facts = {k: getattr(rank0, k) for k in WorkerFacts.model_fields}
        facts["fault_injected"] = facts["fault_injected"] or out.fault
        tel = out.telemetry
        foreign = {i: list(s["procs"]) for i, s in out.gpu_before.items() if s.get("procs")}
        return started._end(
            status,
            reason,
            ended_at=ended_at,
            variant=variant,
            wall_s=out.wall_s,
            exit_code=out.exit_code,
            phase_at_end=out.phase_at_end,
            metrics=metrics_of(rank0, tel),
            memory=memory_of(docs, tel),
            losses=rank0.losses,
            step_times_s=rank0.step_times_s,
            **({"steps": rank0.steps} if rank0.steps is not None else {}),
            world_size=len(out.ranks) or None,
            ranks=[RankEnd(rank=d.rank, status=d.status, reason=d.reason[:600], **_node_of(out, d.rank)) for d in docs]
            if len(out.ranks) > 1
            else None,
            **({"nodes": [NodeRun.model_validate(n) for n in out.nodes]} if out.nodes else {}),
            # Every fact, None where the worker had none, so each record has the same keys.
            worker=WorkerFacts(**facts),
            warnings=warnings_of(docs, out.warnings) or None,
            telemetry=tel,
            ds_config=ds_config,
            foreign_gpu_processes=foreign or None,
            gpu_after=out.gpu_after or None,
            started_by=out.started_by or None,
            **_placement(started.placement, out.port, beside, out.node),
            **_node_provenance(started, out.node),
            log=log,
            log_tail=out.log_tail[-6000:],
            traceback=rank0.traceback,
        )

    def _end(self, status: Status, reason: str, **fields) -> "Record":
        if self.status is not Status.STARTED:
            raise ValueError(f"a record ends a started record, not a {self.status} one")
        keep = self.model_dump(
            include={
                "schema_version",
                "run_id",
                "attempt",
                "repeat",
                "matrix",
                "matrix_file",
                "inputs",
                "cell_id",
                "cell_hash",
                "cell_name",
                "cell",
                "started_at",
                "provenance",
                "predicted",
                "fixed_costs",
                "placement",
                "answer",
            }
        )
        for k in ("predicted", "fixed_costs", "placement", "answer"):
            if keep.get(k) is None:
                keep.pop(k, None)  # a record without one has no such key
        # As the started record has them, without the unset defaults.
        if self.fixed_costs is not None:
            keep["fixed_costs"] = self.fixed_costs.model_dump(exclude_unset=True)
        if self.placement is not None:
            keep["placement"] = self.placement.model_dump(exclude_unset=True)
        if self.answer is not None:
            keep["answer"] = self.answer.model_dump(exclude_unset=True)
        out = {**keep, "schema_version": SCHEMA_VERSION, "status": status, "reason": reason, **fields}
        if "machine" not in fields:  # where it ran as its end says: a cluster node's provenance and GPUs
            place = out.get("placement")
            held = place.gpus if isinstance(place, Placement) else (place or {}).get("gpus")
            m = machine_of(out.get("provenance"), held)
            # The probe's figures where it ended on the machine it started on (not on a cluster node beside it).
            same = m is not None and self.machine is not None and m.id == self.machine.id
            out["machine"] = with_rates(m, self.machine.rates if same else None)
        return type(self).model_validate(out)

    @property
    def block(self) -> str:
        """The block the measurement belongs to: one run part (one `zerobench run`; a replayed record's, the run it
        replays) on one machine, "RUN@MACHINE" ("RUN@unknown" where the machine is). Measurements of one block
        compare directly; blocks differ by the machine's speed and compare only through cells measured in both."""
        run = self.replay.run_id if self.replay is not None else self.run_id
        return f"{run}@{self.machine.id if self.machine is not None else 'unknown'}"

    # -- serialisation ------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The record as read: the fields the constructor set (a started record has no metrics key at all)."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def compact(self) -> bool:
        """A record of a cell that did not run (format version 4): it names its cell and says why, nothing more."""
        return self.status in NOT_RUN

    def stored(self) -> dict:
        """The line the store writes: to_dict(), less a compact record's cell_name and cell_hash (its cell_id's)."""
        d = self.to_dict()
        if self.compact and d.get("cell_id") == f"{self.cell_name}#{self.cell_hash}":
            d.pop("cell_name", None)
            d.pop("cell_hash", None)
        return d


def _node_of(out: _Ended, rank: int) -> dict:
    """{"node": k} for a rank of a cell of several nodes; {} on one node."""
    node = next((n["node"] for n in out.nodes if rank in n["ranks"]), None)
    return {"node": node} if node is not None else {}


def _placement(start: Placement | None, port: int | None, beside: list[str] | None, node: dict | None) -> dict:
    """The outcome's placement: where its start said it runs, with the port and the neighbours it had, and on a
    cluster what its executor learnt once it ran (the node, the GPUs its scheduler gave it, the job)."""
    if start is None and port is None and beside is None and not node:
        return {}
    p = (start or Placement()).model_copy()
    if port is not None:
        p.port = port
    if beside is not None:
        p.beside = beside
    for field_, key in (
        ("node", "host"), ("node_id", "node_id"), ("gpus", "gpus"), ("slurm_job", "slurm_job"),
        ("slurm_nodes", "slurm_nodes"),
    ):  # fmt: skip
        if node and node.get(key) is not None:
            setattr(p, field_, node[key])
    return {"placement": p}


def _node_provenance(started: "Record", node: dict | None) -> dict:
    """On an outcome a cluster node ran: the node's provenance, and the orchestrator's (the start's) beside it."""
    if not node or not node.get("provenance"):
        return {}
    return {"provenance": node["provenance"], "orchestrator": started.provenance}


NOT_RUN = (Status.SKIPPED, Status.IMPLIED_OOM, Status.UNMEASURED)
"""The statuses of cells that did not run, whose records are compact (version 4)."""


def _not_run(cell: _Cell, run_id: str, attempt: int, matrix_file: str, at: str) -> dict:
    """A compact record's identity: the cell by id within its matrix (its settings only where the matrix file
    cannot give them back: a DeepSpeed config given on the command line), when it was decided."""
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "attempt": attempt,
        "matrix": cell.matrix,
        "matrix_file": matrix_file,
        "cell_id": cell.id,
        "cell_name": cell.name,
        "cell_hash": cell.hash,
        **({"cell": cell.to_dict()} if getattr(cell, "ds_config", None) else {}),
        "started_at": at,
    }


# A pruned cell's prediction as its record keeps it: what was judged against what, not the terms.
_FIGURES = ("gpu_bytes", "host_bytes", "gpu_memory_bytes", "host_memory_bytes", "margin", "gpu_verdict", "host_verdict")


def _figures(predicted: dict) -> dict:
    return {k: predicted[k] for k in _FIGURES if predicted.get(k) is not None}


def _rounded(note: dict) -> dict:
    """An answer note with its predicted figures to 4 significant digits (model output, not measurements)."""

    def r(x):
        return float(f"{x:.4g}") if isinstance(x, float) else x

    return {k: [r(x) for x in v] if isinstance(v, list) else r(v) for k, v in note.items()}


def _identity(cell: _Cell, run_id: str, attempt: int, matrix_file: str, repeat: int = 1) -> dict:
    inputs = Inputs(
        matrix_sha256=env.file_sha(matrix_file) if matrix_file else None,
        ds_config_sha256=env.file_sha(cell.ds_config) if cell.ds_config else None,
    )
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "attempt": attempt,
        "repeat": repeat,
        "matrix": cell.matrix,
        "matrix_file": matrix_file,
        "inputs": inputs,
        "cell_id": cell.id,
        "cell_hash": cell.hash,
        "cell_name": cell.name,
        "cell": cell.to_dict(),
    }


def parse(rec: dict) -> Record:
    """A stored record of any version, upgraded and validated."""
    return Record.model_validate(upgrade(rec))


def json_schema() -> dict:
    """The published JSON Schema of a stored record (the current version)."""
    s = Record.model_json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **s,
        "title": f"zerobench result record, schema_version {SCHEMA_VERSION}",
    }
