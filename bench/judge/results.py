"""Results files -> a tidy pandas DataFrame: one row per cell attempt, flat columns, units in names.
Records of any schema version are read through bench.records.record (upgraded, then validated).

`load()` is the public API for notebooks; the reports are pure functions of its output.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from ..matrix import rules, spec
from ..matrix.axes import SHOWN, lora_targets_name
from ..matrix.cells import Cell
from ..matrix.problems import ConfigError, InputError
from ..records import quality
from ..records.record import STEP_PARTS, Provenance, Record, WorkerFacts
from ..records.status import Status
from ..records.store import read_records

__all__ = [
    "load",
    "with_cells",
    "latest",
    "records_to_frame",
    "peak_memory",
    "fixed_cost_s",
    "AXIS_COLUMNS",
    "axis_values",
    "METRIC_COLUMNS",
    "MEMORY_COLUMNS",
    "PEAK_MEMORY_SOURCES",
    "PREDICTED_COLUMNS",
    "STEP_PARTS",
    "STEPS_COLUMNS",
    "steps_schedule",
]

AXIS_COLUMNS = [a.name for a in SHOWN]
_CELL_COLUMNS = AXIS_COLUMNS + [
    "model",
    "seq_len",
    "gpus",
    "nodes",
    "warmup_steps",
    "measured_steps",
    "seed",
    "data",
    "lr",
    "attn",
]

_CELL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Cell) if f.default is not dataclasses.MISSING}
_CELL_COLUMN_DEFAULTS = [(k, _CELL_DEFAULTS.get(k)) for k in _CELL_COLUMNS]

# Always present (NaN where a record lacks them: skipped cells, CPU runs without NVML or a CUDA
# allocator), so notebooks and the reports can index them without checking first.
METRIC_COLUMNS = [
    "tokens_per_s",
    "samples_per_s",
    "step_time_median_s",
    "step_time_p90_s",
    "tflops_per_gpu",
    "mfu",
    "hfu",
    "loss_first",
    "loss_final",
]
MEMORY_COLUMNS = [
    "nvml_proc_peak_bytes",
    "nvml_used_peak_bytes",
    "torch_max_reserved_bytes",
    "torch_max_allocated_bytes",
    "torch_allocated_between_steps_bytes",
    "host_rss_peak_bytes",
] + [f"torch_max_allocated_{part}_bytes" for part in STEP_PARTS]

# The memory model's prediction the record carries (NaN where it has none).
PREDICTED_COLUMNS = ["predicted_gpu_bytes", "predicted_host_bytes"]

# `peak_memory_bytes` is the first of these a row has: the device figure that decides whether a cell
# fits (NVML sees the CUDA context and NCCL buffers the allocator does not), else host RSS (CPU runs).
PEAK_MEMORY_SOURCES = {
    "nvml_proc_peak_bytes": "nvml",
    "torch_max_reserved_bytes": "torch_reserved",
    "host_rss_peak_bytes": "host_rss",
}


# The record's `steps` (bench.records.record.StepsTaken) as columns: why measuring ended and the interval.
STEPS_COLUMNS = {
    "steps_ended": "ended",
    "warmup_ended": "warmup_ended",
    "step_time_ci_low_s": "ci_low_s",
    "step_time_ci_high_s": "ci_high_s",
    "step_time_ci_level": "ci_level",
    "step_time_half_width": "half_width",
    "steps_tolerance": "tolerance",
    "steps_max_seconds": "max_seconds",
}


def peak_memory(rec: Record) -> tuple[int | None, str | None]:
    """A record's `peak_memory_bytes` and its source, as records_to_frame has them (PEAK_MEMORY_SOURCES)."""
    for col, name in PEAK_MEMORY_SOURCES.items():
        v = getattr(rec.memory, col, None) if rec.memory is not None else None
        if v is not None:
            return v, name
    return None, None


def steps_schedule(cell: dict) -> str:
    """The step schedule a cell asked for, as text: "2+8" (warmup + measured), or with adaptive phases
    "auto≤20+auto≤50 ±2%" (caps, tolerance, and the time cap where there is one)."""
    w = cell.get("warmup_steps", _CELL_DEFAULTS["warmup_steps"])
    m = cell.get("measured_steps", _CELL_DEFAULTS["measured_steps"])
    a = cell.get("adaptive")
    if not a:
        return f"{w}+{m}"
    text = (f"auto≤{w}" if a.get("warmup") else str(w)) + "+"
    text += f"auto≤{m} ±{a.get('tolerance'):.0%}" if a.get("measured") else str(m)
    return text + (f" ≤{a['max_seconds']:g}s" if a.get("max_seconds") is not None else "")


def axis_values(cell: dict) -> dict:
    """A record's cell (bench.matrix.cells.Cell.to_dict) as its axis values, as the results frame's columns have them:
    a field the record lacks at its default; the PEFT settings from the cell's blocks, empty where they do not
    apply (no adapter, no 4-bit weights)."""
    out = {a.name: cell.get(a.name, _CELL_DEFAULTS.get(a.name)) for a in SHOWN}
    for a in SHOWN:
        if a.block:
            value = (cell.get(a.block) or {}).get(a.block_field)
            out[a.name] = lora_targets_name(value) if a.name == "lora_targets" and value else value
    return out


def fixed_cost_s(rec: Record) -> float | None:
    """What a cell costs besides its steps and its model build: process start, imports, engine setup,
    teardown. From a result record; None when it has no steps."""
    if not rec.step_times_s or not rec.wall_s:
        return None
    return rec.wall_s - sum(rec.step_times_s) - ((rec.worker.model_build_s if rec.worker else None) or 0.0)


class _MatrixCells:
    """The cells of the matrix files compact records name (bench.records.record version 4), each file expanded once,
    by hash; where a file is missing, unreadable or no longer has a cell, said once per file."""

    def __init__(self) -> None:
        self.cells: dict[Path, dict[str, dict]] = {}
        self.missing: dict[str, int] = {}

    def find(self, rec: Record, near: Sequence[Path]) -> dict | None:
        path = self._path(rec.matrix_file, near)
        if path is not None and path not in self.cells:
            self.cells[path] = self._expand(path)
        cell = self.cells.get(path, {}).get(rec.cell_hash) if path is not None else None
        if cell is None:
            self.missing[rec.matrix_file or "(none)"] = self.missing.get(rec.matrix_file or "(none)", 0) + 1
        return cell

    @staticmethod
    def _path(recorded: str | None, near: Sequence[Path]) -> Path | None:
        """The matrix file as recorded (relative to here), else relative to a folder around the results file."""
        if not recorded:
            return None
        for p in (Path(recorded), *(d / recorded for d in near if not Path(recorded).is_absolute())):
            if p.is_file():
                return p.resolve()
        return None

    @staticmethod
    def _expand(path: Path) -> dict[str, dict]:
        try:
            return {c.hash: c.to_dict() for c in spec.expand(spec.load(str(path)))}
        except (ConfigError, InputError, OSError):
            return {}

    def warn(self) -> None:
        for f, n in self.missing.items():
            print(
                f"zerobench: {n} record{'s' if n != 1 else ''} of cells that did not run name matrix file {f}, "
                "which is not here or no longer has them: their settings are unknown (shown by name)",
                file=sys.stderr,
            )
        self.missing.clear()


def with_cells(records: Iterable[Record], near: Sequence[Path] = ()) -> Iterator[Record]:
    """The records, each compact one (a cell that did not run: bench.records.record version 4) with its cell's settings
    from its matrix file, looked for as recorded and then in the folders `near` (those around its results file).
    One whose matrix file is missing, or no longer has the cell, keeps `cell` None (said once per file)."""
    found = _MatrixCells()
    for rec in records:
        if rec.cell is None:
            cell = found.find(rec, near)
            if cell is not None:
                rec = rec.model_copy(update={"cell": cell})
        yield rec
    found.warn()


_NO_PROVENANCE = Provenance()
_NO_WORKER = WorkerFacts()
_RULES = {r.name: r for r in rules.RULES}


def _skip_text(rec: Record, cell: dict) -> tuple[str | None, str | None]:
    """A skip's fix and source: the record's, else (a compact record) its rule's in bench.matrix.rules."""
    if rec.skip is None:
        return None, None
    rule = _RULES.get(rec.skip.rule)
    ranks = str(cell.get("gpus", 1) * cell.get("nodes", 1)) if cell else "N"
    fix = rec.skip.fix or (rule.fix.replace("{ranks}", ranks) if rule else None)
    return fix, rec.skip.source or (rule.source if rule else None)


def _row(rec: Record) -> dict:
    """One attempt's row of the results frame, its columns in the frame's order."""
    cell = rec.cell or {}
    prov = rec.provenance or _NO_PROVENANCE  # a v1 record written without one
    worker = rec.worker or _NO_WORKER
    versions = {**prov.versions, **(worker.versions or {})}  # the worker's own, where it reported them
    return {
        **_attempt_columns(rec),
        **_setting_columns(rec, cell),
        **_measured_columns(rec),
        **_worker_columns(worker),
        **_provenance_columns(worker, prov, versions),
        **_end_columns(rec, cell),
        **_host_columns(prov, versions),
        **_estimate_columns(worker, cell),
        **_plan_columns(rec),
        **_quality_columns(rec),
    }


def _attempt_columns(rec: Record) -> dict:
    """Which attempt of which cell, how it ended and when."""
    return {
        "run_id": rec.run_id,
        "attempt": rec.attempt,
        "repeat": rec.repeat,
        "matrix": rec.matrix,
        "cell_id": rec.cell_id,
        "variant": rec.variant,
        "cell_hash": rec.cell_hash,
        "cell_name": rec.cell_name,
        "status": rec.status.value,
        "reason": rec.reason,
        "started_at": rec.started_at,
        "ended_at": rec.ended_at,
        "wall_s": rec.wall_s,
    }


def _setting_columns(rec: Record, cell: dict) -> dict:
    """The cell's settings and axis values, the step schedule it asked for and the steps it took."""
    # A record written before a field existed ran at that field's default (compile off, hf kernels); a compact
    # record whose matrix file is not here has no settings at all (None, filled from its matrix's other records).
    known = rec.cell is not None
    row = {k: cell.get(k, default if known else None) for k, default in _CELL_COLUMN_DEFAULTS}
    if known:
        row.update(axis_values(cell))
    # The schedule the cell asked for (what cells must share to be compared), then the steps it took:
    # warmup_steps and measured_steps are what ran, so everything that splits step_times_s splits it right.
    row["steps_schedule"] = steps_schedule(cell)
    taken = rec.steps
    if taken is not None:
        row["warmup_steps"], row["measured_steps"] = taken.warmup, taken.measured
    for col, field_ in STEPS_COLUMNS.items():
        row[col] = getattr(taken, field_) if taken is not None else None
    row["qlora_quant_type"] = row["qlora_quant"]
    return row


def _measured_columns(rec: Record) -> dict:
    """The worker's metrics and memory figures (lists and mappings left out), the run's fixed cost, how it began."""
    row = {}
    if rec.metrics:
        row.update(rec.metrics.model_dump(exclude_unset=True))
    if rec.memory:
        row.update(
            (k, v) for k, v in rec.memory.model_dump(exclude_unset=True).items() if not isinstance(v, (list, dict))
        )
    row["fixed_cost_s"] = fixed_cost_s(rec)
    row["started_by"] = rec.started_by.mode if rec.started_by else None
    return row


_WORKER_COLUMNS = (
    "optimizer_class", "params_total", "params_trainable", "fp16_skipped_steps", "fp16_skipped_warmup_steps",
    "loss_scale_final",
)  # fmt: skip


def _worker_columns(worker: WorkerFacts) -> dict:
    """What the worker found of the model and optimizer it trained."""
    row = {k: getattr(worker, k) for k in _WORKER_COLUMNS}
    if worker.weights_init:  # a column only where records carry it: older files' frames stay as they were
        row["weights_init"] = worker.weights_init
    return row


def _provenance_columns(worker: WorkerFacts, prov: Provenance, versions: dict) -> dict:
    """Where and with what it ran: the GPU model and count, the host, the commit and the libraries' versions."""
    row = {
        "gpu_name": worker.gpu_name or prov.gpu_name,
        "gpu_count": prov.gpu_count,
        "host": prov.host,
        "git_commit": prov.git_commit,
        "git_dirty": prov.git_dirty,
    }
    for lib in ("torch", "deepspeed", "transformers", "peft", "bitsandbytes"):
        row[f"{lib}_version"] = versions.get(lib)
    return row


def _end_columns(rec: Record, cell: dict) -> dict:
    """How it ended beyond its status: the skip rule with its fix and source, the exit code, phase and warnings."""
    fix, source = _skip_text(rec, cell)
    return {
        "skip_rule": rec.skip.rule if rec.skip else None,
        "skip_fix": fix,
        "skip_source": source,
        "exit_code": rec.exit_code,
        "phase_at_end": rec.phase_at_end,
        "warnings": list(rec.warnings) if rec.warnings else None,
    }


def _host_columns(prov: Provenance, versions: dict) -> dict:
    """The machine beyond its GPU model: GPU memory, driver and CUDA, OS, Python, CPU and host memory."""
    return {
        "gpu_memory_bytes": prov.gpus[0].memory_bytes if prov.gpus else None,
        "gpu_driver": prov.driver,
        "cuda_version": versions.get("cuda"),
        "os": prov.os,
        "python_version": prov.python,
        "cpu": prov.cpu,
        "host_memory_bytes": prov.host_memory_bytes,
    }


def _estimate_columns(worker: WorkerFacts, cell: dict) -> dict:
    """The model states' bytes on the GPU and the host by bench.estimate, where the worker counted parameters."""
    # A model, not a measurement: computed when loading, so a better estimator needs no re-run.
    row = {"estimate_model_states_bytes": None, "estimate_model_states_host_bytes": None}
    if worker.params_total and cell:
        from ..estimate import model_states

        est = model_states(
            params=worker.params_total,
            trainable=worker.params_trainable,
            zero_stage=cell["zero_stage"],
            gpus=cell.get("gpus", 1) * cell.get("nodes", 1),
            precision=cell["precision"],
            optimizer=cell["optimizer"],
            offload=cell["offload"],
            quantized_4bit=cell["peft"] == "qlora",
        )
        row["estimate_model_states_bytes"] = est["gpu_bytes"]
        row["estimate_model_states_host_bytes"] = est["host_bytes"]
    return row


def _plan_columns(rec: Record) -> dict:
    """What the run planned for it: the memory model's prediction, a micro-batch search's result, answer mode's
    note and a replay's source."""
    # What the memory model predicted when the cell ran (records from a GPU run since 2026-12).
    row = {
        "predicted_gpu_bytes": rec.predicted.gpu_bytes if rec.predicted else None,
        "predicted_host_bytes": rec.predicted.host_bytes if rec.predicted else None,
        "search_largest_ok": rec.search.largest_ok if rec.search else None,
    }
    if rec.answer:  # columns only where records carry them: other files' frames stay as they were
        note = rec.answer
        row |= {"answer_role": note.role, "answer_rung": note.rung, "answer_group": note.group}
        row |= {"answer_needed": note.needed, "answer_predicted_wall_s": note.predicted_wall_s}
        if note.settled:
            row |= {
                "answer_p_lead": note.settled[0],
                "answer_p_frontier": note.settled[1],
                "answer_settle": note.settled[2],
            }
        if note.expected_error:
            row["answer_expected_error"] = note.expected_error
    if rec.replay:
        row["replay_source"] = rec.replay.source
    return row


def _quality_columns(rec: Record) -> dict:
    """Where it ran and how far its measurement can be trusted (bench.records.quality), and its per-step lists."""
    ok = rec.status is Status.OK
    return {
        "machine": rec.machine.id if rec.machine is not None else None,
        "block": rec.block,
        "flags": quality.flags(rec) or None if ok else None,
        "noise_sd": quality.noise_sd(rec) if ok else None,
        "losses": rec.losses,
        "step_times_s": rec.step_times_s,
    }


def records_to_frame(records: Iterable[Record], near: Sequence[Path] = ()):
    """Records (bench.records.store's; a stored line of any version is bench.records.record.parse's) -> one row per
    attempt; started records left out. A compact record's cell comes from its matrix file (with_cells: as
    recorded, else in the folders `near`)."""
    import pandas as pd

    parsed = with_cells(records, near)
    rows = [_row(r) for r in parsed if r.status is not Status.STARTED]
    df = _settings_of_unknown_cells(pd.DataFrame(rows))
    for col in ("started_at", "ended_at"):
        if col in df:
            df[col] = pd.to_datetime(df[col], utc=True, format="ISO8601")
    for col in METRIC_COLUMNS + MEMORY_COLUMNS + ["gpu_memory_bytes", "host_memory_bytes", *PREDICTED_COLUMNS]:
        df[col] = pd.to_numeric(df[col], errors="coerce") if col in df else float("nan")
    peak = pd.Series(float("nan"), index=df.index)
    source = pd.Series(None, index=df.index, dtype=object)
    for col, name in PEAK_MEMORY_SOURCES.items():
        take = peak.isna() & df[col].notna()
        peak[take] = df.loc[take, col]
        source[take] = name
    df["peak_memory_bytes"] = peak
    df["peak_memory_source"] = source
    return df


def _settings_of_unknown_cells(df):
    """Rows of compact records whose matrix file was not found take the matrix-wide settings (model, sequence
    length, steps, ...) of their matrix's other records: one matrix, one model and workload."""
    if df.empty or "model" not in df or not df["model"].isna().any():
        return df
    fixed = [c for c in _CELL_COLUMNS if c not in AXIS_COLUMNS]
    known = df[df["model"].notna()].drop_duplicates("matrix").set_index("matrix")[fixed]
    unknown = df["model"].isna() & df["matrix"].isin(known.index)
    for c in fixed:
        df.loc[unknown, c] = df.loc[unknown, "matrix"].map(known[c])
    return df


def _around(f: Path) -> tuple[Path, ...]:
    """Where a results file's run may have been: the results folder's parent (for results/local/NAME.jsonl, the
    default, its grandparent), or the folder itself."""
    top = f.parent.parent.parent if f.parent.name == "local" else f.parent.parent
    return top, f.parent.parent, f.parent


def load(*paths: str | os.PathLike, include_all_attempts: bool = True):
    """Load one or more results files (or folders of *.jsonl) into one DataFrame; from more than one file, its
    `results_file` column names each row's (each file a run of its own, whose repeats are its own)."""
    files = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            files += [os.path.join(p, name) for name in sorted(os.listdir(p)) if name.endswith(".jsonl")]
        else:
            files.append(p)
    # A compact record's matrix file, as recorded, relative to where the run was (usually the results folder's
    # parent) or to the results folder.
    files = _distinct(files)
    near = list(dict.fromkeys(d for f in files for d in _around(Path(f))))
    sources: list[str] = []  # each row's file, in the frame's order (started records have no row)

    def tagged(f: str) -> Iterator[Record]:
        for rec in read_records(f):
            if rec.status is not Status.STARTED:
                sources.append(f)
            yield rec

    df = records_to_frame(itertools.chain.from_iterable(map(tagged, files)), near=near)
    if len(files) > 1 and len(sources) == len(df):
        df["results_file"] = sources
    return df if include_all_attempts else latest(df)


def _distinct(files: list[str]) -> list[str]:
    """Each results file once, however it was named (twice, through a link, a folder and a file in it):
    read twice, its records would count double."""
    seen: dict[str, str] = {}
    for f in files:
        real = os.path.realpath(f)
        if real in seen:
            print(f"zerobench: {f} is the same file as {seen[real]}; read once", file=sys.stderr)
        else:
            seen[real] = f
    return list(seen.values())


def latest(df):
    """The last attempt of each cell (per matrix, and per selfcheck variant), in first-seen order."""
    if df.empty:
        return df
    keys = ["matrix", "cell_hash", "variant"] if "variant" in df else ["matrix", "cell_hash"]
    order = df.drop_duplicates(keys, keep="first")[keys]
    last = df.drop_duplicates(keys, keep="last")
    return order.merge(last, on=keys, how="left")
