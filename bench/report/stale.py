"""Records made by code older than a fix that changes what they measure, found from what each record
carries. One row per fix: what changed, which records it touches (a test on the results row) and which of
their fields it affects. Reports mark such records instead of silently mixing them with newer ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["FIELDS", "FIXES", "Fix", "notes"]


@dataclass(frozen=True, kw_only=True)
class Fix:
    name: str
    what: str
    """What the fix changed in the measurement."""
    affects: tuple[str, ...]
    """The record fields (or statuses) whose values older records got differently."""
    older: Callable[[dict], bool]
    """Whether a results row was made by code before the fix, judged from what the record carries."""


def _ran(r: dict) -> bool:
    return r.get("status") in ("ok", "diverged", "cuda_oom", "host_oom", "timeout")


FIXES: tuple[Fix, ...] = (
    Fix(
        name="same initial weights at every stage",
        what="initial weights drawn per parameter name (worker.weights_init: seeded-per-name); before, a "
        "ZeRO-3 cell built its weights inside zero.Init from another RNG stream than ZeRO 0-2, so it started "
        "from other weights",
        affects=("losses", "loss_first", "loss_final", "status diverged"),
        # A preset cell (random weights) that ran at ZeRO-3 and does not say how its weights were made.
        older=lambda r: (
            _ran(r)
            and r.get("zero_stage") == 3
            and not r.get("weights_init")
            and not str(r.get("model", "")).startswith(("/", "."))
        ),
    ),
    Fix(
        name="the Trainer's batches in order",
        what="the HF Trainer engine feeds the rows in the DeepSpeed loop's order; before, its sampler shuffled "
        "them, so its losses were over other batches than the deepspeed engine's",
        affects=("losses", "loss_first", "loss_final"),
        # weights_init arrived with this fix: a Trainer record without it shuffled.
        older=lambda r: _ran(r) and r.get("engine") == "hf_trainer" and not r.get("weights_init"),
    ),
    Fix(
        name="initial weights drawn on the GPU",
        what="on a GPU host the initial weights are drawn on the GPU (worker.weights_init: seeded-per-name-cuda); "
        "before, on the CPU (minutes for a 7B model), from other generators, so from other weights",
        affects=("losses", "loss_first", "loss_final", "model_build_s", "wall_s"),
        older=lambda r: _ran(r) and r.get("weights_init") == "seeded-per-name" and bool(r.get("gpu_name")),
    ),
)


FIELDS = ("cell_name", "status", "zero_stage", "weights_init", "model", "engine", "gpu_name")
"""The results-row columns the fixes' tests read (tests/report/test_stale_records.py fails on a fix reading another)."""


def notes(rows: list[dict]) -> list[tuple[str, str]]:
    """(cell name, note) for each row made before a fix in FIXES."""
    return [
        (r["cell_name"], f"made before the fix '{f.name}' ({f.what}); affects {', '.join(f.affects)}")
        for r in rows
        for f in FIXES
        if f.older(r)
    ]
