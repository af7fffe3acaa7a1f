"""Results into experiment trackers: one Weights & Biases run per cell attempt.

For people who compare runs in W&B (run tables, parallel coordinates, grouped loss curves): each run's
config is the cell's axes and settings plus the exact DeepSpeed config; its summary holds the status,
reason and every metric and memory figure; its history is the loss and step time per step. Runs are
grouped by matrix, with the zerobench run id as the job type, so a matrix's cells line up in one
table. A replayed record (`zerobench run --replay`: nothing ran anew) is tagged `replay`, its config naming
the record it replays (`replay.source`, `replay.run_id`, ...). Without a W&B login the runs are written
offline (`wandb sync DIR` uploads them later).
Imports wandb only when called: the orchestrator stays light.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..records.record import Record

__all__ = ["to_wandb", "TrackerError"]


class TrackerError(RuntimeError):
    pass


def _flat(prefix: str, d: dict | None) -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            out[f"{prefix}{k}"] = v
    return out


def _dump(part) -> dict:
    """A part of a record as written (its set fields, as JSON values); {} where the record has none."""
    return part.model_dump(mode="json", exclude_unset=True) if part is not None else {}


def _config(rec: Record) -> dict:
    cell = dict(rec.cell or {})
    for k in ("lora", "qlora"):  # nested settings as flat keys, so W&B's table can sort and filter them
        for kk, v in (cell.pop(k, None) or {}).items():
            cell[f"{k}.{kk}"] = ",".join(v) if isinstance(v, list) else v
    prov = _dump(rec.provenance)
    return {
        **cell,
        "cell_id": rec.cell_id,
        "cell_hash": rec.cell_hash,
        "matrix": rec.matrix,
        "run_id": rec.run_id,
        "attempt": rec.attempt,
        "repeat": rec.repeat,
        "ds_config": rec.ds_config,
        **_flat("provenance.", {k: v for k, v in prov.items() if k not in ("gpus", "versions")}),
        **_flat("versions.", prov.get("versions")),
        **_flat("replay.", _dump(rec.replay)),
    }


def _summary(rec: Record) -> dict:
    worker = _dump(rec.worker)
    return {
        "status": rec.status.value,
        "reason": rec.reason or "",
        "wall_s": rec.wall_s,
        **_flat("", _dump(rec.metrics)),
        **_flat("memory.", _dump(rec.memory)),
        **_flat("worker.", {k: v for k, v in worker.items() if k != "versions"}),
    }


def to_wandb(
    records: Iterable[Record],
    *,
    project: str = "zerobench",
    entity: str | None = None,
    directory: str | os.PathLike | None = None,
    mode: str | None = None,
) -> list[str]:
    """Log each record as a W&B run; returns the runs' local folders.

    mode: "online", "offline" or "disabled"; default WANDB_MODE, else online when WANDB_API_KEY is set,
    else offline."""
    try:
        import wandb
    except ImportError as e:
        raise TrackerError("the W&B export needs wandb: pip install 'zerobench[wandb]' (or pip install wandb)") from e
    mode = mode or os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    if directory is not None:
        Path(directory).mkdir(parents=True, exist_ok=True)
    folders = []
    for rec in records:
        if rec.status.value == "started":
            continue
        run = wandb.init(
            project=project,
            entity=entity,
            dir=None if directory is None else str(directory),
            mode=mode,
            name=rec.cell_name,
            group=rec.matrix,
            job_type=rec.run_id,
            # A replay (`zerobench run --replay`) ran nothing anew: said in its tags and its config.
            tags=[rec.status.value] + (["replay"] if rec.replay else []),
            config=_config(rec),
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        try:
            losses, times = rec.losses or [], rec.step_times_s or []
            for i in range(max(len(losses), len(times))):
                row = {}
                if i < len(losses) and losses[i] is not None:
                    row["loss"] = losses[i]
                if i < len(times) and times[i] is not None:
                    row["step_time_s"] = times[i]
                run.log(row, step=i)
            run.summary.update(_summary(rec))
            folders.append(str(Path(run.dir).parent))
        finally:
            run.finish(exit_code=0 if rec.status.value in ("ok", "skipped") else 1)
    return folders
