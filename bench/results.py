"""Results files -> a tidy pandas DataFrame: one row per cell attempt, flat columns, units in names.

`load()` is the public API for notebooks; the reports are pure functions of its output.
"""
from __future__ import annotations

import os
from collections.abc import Iterable

from .store import read

__all__ = ["load", "latest", "records_to_frame", "AXIS_COLUMNS"]

AXIS_COLUMNS = ["zero_stage", "offload", "precision", "grad_ckpt", "optimizer", "peft", "engine", "ds_config"]
_CELL_COLUMNS = AXIS_COLUMNS + ["model", "seq_len", "micro_batch", "grad_accum", "gpus", "warmup_steps",
                                "measured_steps", "seed", "data"]


def _row(rec: dict) -> dict:
    cell = rec.get("cell") or {}
    prov = rec.get("provenance") or {}
    worker = rec.get("worker") or {}
    versions = (worker.get("versions") or {}) | {k: v for k, v in (prov.get("versions") or {}).items()
                                                 if k not in (worker.get("versions") or {})}
    row = {
        "run_id": rec.get("run_id"), "attempt": rec.get("attempt"), "matrix": rec.get("matrix"),
        "cell_id": rec.get("cell_id"), "cell_hash": rec.get("cell_hash"), "cell_name": rec.get("cell_name"),
        "status": rec.get("status"), "reason": rec.get("reason") or "",
        "started_at": rec.get("started_at"), "ended_at": rec.get("ended_at"), "wall_s": rec.get("wall_s"),
    }
    for k in _CELL_COLUMNS:
        row[k] = cell.get(k)
    lora = cell.get("lora") or {}
    row["lora_r"] = lora.get("r")
    row["lora_alpha"] = lora.get("alpha")
    row["qlora_quant_type"] = (cell.get("qlora") or {}).get("quant_type")
    for k, v in (rec.get("metrics") or {}).items():
        row[k] = v
    for k, v in (rec.get("memory") or {}).items():
        if not isinstance(v, (list, dict)):
            row[k] = v
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
    row["skip_rule"] = (rec.get("skip") or {}).get("rule")
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
    """The last attempt of each cell (per matrix), in first-seen order."""
    if df.empty:
        return df
    order = df.drop_duplicates(["matrix", "cell_hash"], keep="first")[["matrix", "cell_hash"]]
    last = df.drop_duplicates(["matrix", "cell_hash"], keep="last")
    return order.merge(last, on=["matrix", "cell_hash"], how="left")
