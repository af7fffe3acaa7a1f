"""Results files -> a tidy pandas DataFrame: one row per cell attempt, flat columns, units in names.

`load()` is the public API for notebooks; the reports are pure functions of its output.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

from .cells import Cell
from .store import read

__all__ = ["load", "latest", "records_to_frame", "fixed_cost_s", "AXIS_COLUMNS", "METRIC_COLUMNS", "MEMORY_COLUMNS",
           "PEAK_MEMORY_SOURCES", "STEP_PARTS"]

AXIS_COLUMNS = ["zero_stage", "offload", "precision", "grad_ckpt", "optimizer", "peft", "engine", "compile",
                "kernels", "ds_config"]
_CELL_COLUMNS = AXIS_COLUMNS + ["model", "seq_len", "micro_batch", "grad_accum", "gpus", "warmup_steps",
                                "measured_steps", "seed", "data", "lr", "attn"]

_CELL_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Cell) if f.default is not dataclasses.MISSING}

# Always present (NaN where a record lacks them: skipped cells, CPU runs without NVML or a CUDA
# allocator), so notebooks and the reports can index them without checking first.
METRIC_COLUMNS = ["tokens_per_s", "samples_per_s", "step_time_median_s", "step_time_p90_s", "tflops_per_gpu",
                  "mfu", "hfu", "loss_first", "loss_final"]
# The parts of a measured step whose allocator peaks the worker records (torch_max_allocated_<part>_bytes).
STEP_PARTS = ("forward", "backward", "step")
MEMORY_COLUMNS = ["nvml_proc_peak_bytes", "nvml_used_peak_bytes", "torch_max_reserved_bytes",
                  "torch_max_allocated_bytes", "torch_allocated_between_steps_bytes", "host_rss_peak_bytes"] + [
                  f"torch_max_allocated_{part}_bytes" for part in STEP_PARTS]

# `peak_memory_bytes` is the first of these a row has: the device figure that decides whether a cell
# fits (NVML sees the CUDA context and NCCL buffers the allocator does not), else host RSS (CPU runs).
PEAK_MEMORY_SOURCES = {"nvml_proc_peak_bytes": "nvml", "torch_max_reserved_bytes": "torch_reserved",
                       "host_rss_peak_bytes": "host_rss"}


def fixed_cost_s(rec: dict) -> float | None:
    """What a cell costs besides its steps and its model build: process start, imports, engine setup,
    teardown. From a result record; None when it has no steps."""
    steps = rec.get("step_times_s")
    if not steps or not rec.get("wall_s"):
        return None
    return rec["wall_s"] - sum(steps) - ((rec.get("worker") or {}).get("model_build_s") or 0.0)


def _row(rec: dict) -> dict:
    cell = rec.get("cell") or {}
    prov = rec.get("provenance") or {}
    worker = rec.get("worker") or {}
    versions = (worker.get("versions") or {}) | {k: v for k, v in (prov.get("versions") or {}).items()
                                                 if k not in (worker.get("versions") or {})}
    row = {
        "run_id": rec.get("run_id"), "attempt": rec.get("attempt"), "matrix": rec.get("matrix"),
        "cell_id": rec.get("cell_id"), "variant": rec.get("variant"), "cell_hash": rec.get("cell_hash"), "cell_name": rec.get("cell_name"),
        "status": rec.get("status"), "reason": rec.get("reason") or "",
        "started_at": rec.get("started_at"), "ended_at": rec.get("ended_at"), "wall_s": rec.get("wall_s"),
    }
    for k in _CELL_COLUMNS:
        # A record written before a field existed ran at that field's default (compile off, hf kernels).
        row[k] = cell.get(k, _CELL_DEFAULTS.get(k))
    lora = cell.get("lora") or {}
    row["lora_r"] = lora.get("r")
    row["lora_alpha"] = lora.get("alpha")
    row["qlora_quant_type"] = (cell.get("qlora") or {}).get("quant_type")
    for k, v in (rec.get("metrics") or {}).items():
        row[k] = v
    for k, v in (rec.get("memory") or {}).items():
        if not isinstance(v, (list, dict)):
            row[k] = v
    row["fixed_cost_s"] = fixed_cost_s(rec)
    row["started_by"] = (rec.get("started_by") or {}).get("mode")
    row["optimizer_class"] = worker.get("optimizer_class")
    row["params_total"] = worker.get("params_total")
    row["params_trainable"] = worker.get("params_trainable")
    row["fp16_skipped_steps"] = worker.get("fp16_skipped_steps")
    row["gpu_name"] = worker.get("gpu_name") or prov.get("gpu_name")
    row["gpu_count"] = prov.get("gpu_count")
    row["host"] = prov.get("host")
    row["git_commit"] = prov.get("git_commit")
    row["git_dirty"] = prov.get("git_dirty")
    for lib in ("torch", "deepspeed", "transformers", "peft", "bitsandbytes"):
        row[f"{lib}_version"] = versions.get(lib)
    skip = rec.get("skip") or {}
    row["skip_rule"] = skip.get("rule")
    row["skip_fix"] = skip.get("fix")
    row["skip_source"] = skip.get("source")
    row["exit_code"] = rec.get("exit_code")
    row["phase_at_end"] = rec.get("phase_at_end")
    gpus = prov.get("gpus") or []
    row["gpu_memory_bytes"] = gpus[0].get("memory_bytes") if gpus and isinstance(gpus[0], dict) else None
    row["gpu_driver"] = prov.get("driver")
    row["cuda_version"] = versions.get("cuda")
    row["os"] = prov.get("os")
    row["python_version"] = prov.get("python")
    row["cpu"] = prov.get("cpu")
    row["host_memory_bytes"] = prov.get("host_memory_bytes")
    # A model, not a measurement: computed when loading, so a better estimator needs no re-run.
    row["estimate_model_states_bytes"] = row["estimate_model_states_host_bytes"] = None
    if worker.get("params_total") and cell:
        from .estimate import model_states

        est = model_states(params=worker["params_total"], trainable=worker["params_trainable"],
                           zero_stage=cell["zero_stage"], gpus=cell.get("gpus", 1), precision=cell["precision"],
                           optimizer=cell["optimizer"], offload=cell["offload"], quantized_4bit=cell["peft"] == "qlora")
        row["estimate_model_states_bytes"] = est["gpu_bytes"]
        row["estimate_model_states_host_bytes"] = est["host_bytes"]
    row["losses"] = rec.get("losses")
    row["step_times_s"] = rec.get("step_times_s")
    return row


def records_to_frame(records: Iterable[dict]):
    import pandas as pd

    rows = [_row(r) for r in records if r.get("status") != "started"]
    df = pd.DataFrame(rows)
    for col in ("started_at", "ended_at"):
        if col in df:
            df[col] = pd.to_datetime(df[col], utc=True, format="ISO8601")
    for col in METRIC_COLUMNS + MEMORY_COLUMNS + ["gpu_memory_bytes", "host_memory_bytes"]:
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


def load(*paths: str | os.PathLike, include_all_attempts: bool = True):
    """Load one or more results files (or folders of *.jsonl) into one DataFrame."""
    recs: list[dict] = []
    for p in paths:
        p = os.fspath(p)
        if os.path.isdir(p):
            for name in sorted(os.listdir(p)):
                if name.endswith(".jsonl"):
                    recs += read(os.path.join(p, name))
        else:
            recs += read(p)
    df = records_to_frame(recs)
    return df if include_all_attempts else latest(df)


def latest(df):
    """The last attempt of each cell (per matrix, and per selfcheck variant), in first-seen order."""
    if df.empty:
        return df
    keys = ["matrix", "cell_hash", "variant"] if "variant" in df else ["matrix", "cell_hash"]
    order = df.drop_duplicates(keys, keep="first")[keys]
    last = df.drop_duplicates(keys, keep="last")
    return order.merge(last, on=keys, how="left")
