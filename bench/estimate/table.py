"""`zerobench estimate MATRIX`: every cell's predicted peaks, its terms grouped, and whether it fits."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator, Sequence

from ..matrix import dsconfig
from ..matrix.axes import AUTO
from ..matrix.cells import Cell
from .fitted import FITTED, Constants
from .model import Estimate, Hardware, predict
from .steptime import predict_step
from .verdict import DEFAULT_MARGIN, verdict

__all__ = ["GROUPS", "parse_size", "estimate_cells", "estimates", "text", "as_json"]

GiB = 2**30

# The named terms of bench.estimate.model, in the table's columns.
GROUPS: dict[str, tuple[str, ...]] = {
    "weights": ("weights", "qlora_quant_constants", "qlora_dequantized_weight", "zero3_live_parameters"),
    "grads": ("gradients", "fp32_gradients", "zero3_gradient_partitions", "fp32_gradient_buffer"),
    "optimizer": (
        "master_weights",
        "optimizer_state",
        "onebit_error_buffers",
        "optimizer_step_temporaries",
        "onebit_step_temporaries",
    ),
    "activations": ("activations",),
    "deepspeed": ("reduce_buckets", "allreduce_bucket", "offload_copy_buffer"),
    "runtime": ("allocator_fragmentation", "cuda_context", "nccl", "cublas_workspace", "onebit_cupy_buffers"),
}


def parse_size(s: str) -> int:
    """'80GiB', '80G', '141GB', '80' (GiB) -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*", s.lower())
    if not m:
        raise ValueError(f"not a size: {s!r} (e.g. 80GiB, 141GB, 80)")
    num, unit, suffix = float(m.group(1)), m.group(2) or "g", m.group(3)
    base = 1000 if suffix == "b" and unit else 1024  # "GB" is decimal, "G"/"GiB" binary
    return int(num * base ** "kmgt".index(unit) * base)


def estimate_cells(
    cells: Iterable[Cell], hw: Hardware, *, gpus: int | None = None, k: Constants = FITTED
) -> list[tuple[Cell, Estimate | None, str]]:
    """(cell, estimate, "") per cell, or (cell, None, why) when its shape or config is unknown."""
    return list(estimates(cells, hw, gpus=gpus, k=k))


def estimates(
    cells: Iterable[Cell], hw: Hardware, *, gpus: int | None = None, k: Constants = FITTED
) -> Iterator[tuple[Cell, Estimate | None, str]]:
    """estimate_cells(), one cell at a time (a table of a million cells need not hold every estimate's terms)."""
    configs: dict = {}
    for cell in cells:
        if gpus:
            cell = dataclasses.replace(cell, gpus=gpus)
        if cell.micro_batch == AUTO:
            # A search's template: estimated at the search's seed, the largest micro-batch predicted to fit.
            from .planning.search import seed_micro_batch

            cell = dataclasses.replace(cell, micro_batch=seed_micro_batch(cell, hw, k=k))
        try:
            # The generated config depends on few fields: build it once per combination of them.
            key = (cell.zero_stage, cell.offload, cell.precision, cell.optimizer, cell.ds_config, cell.model)
            cfg = configs.get(key)
            if cfg is None:
                cfg = configs[key] = dsconfig.build(cell)
            e = predict(cell, cfg, hw, k)
        except Exception as x:  # noqa: BLE001 - one cell the model cannot read does not stop the table
            yield cell, None, f"{type(x).__name__}: {x}"
            continue
        yield cell, e, ""


def grouped(e: Estimate) -> dict[str, float]:
    g = {name: sum(e.gpu_terms.get(t, 0.0) for t in terms) for name, terms in GROUPS.items()}
    known = {t for ts in GROUPS.values() for t in ts}
    g["runtime"] += sum(v for t, v in e.gpu_terms.items() if t not in known)
    return g


def _gib(x: float) -> str:
    return f"{x / GiB:.1f}"


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.4g}"


def text(rows: Iterable[tuple[Cell, Estimate | None, str]], hw: Hardware, margin: float = DEFAULT_MARGIN) -> str:
    """The table, a line per cell, and what it shows. rows: read once, each estimate laid out and let go (a
    generator of them, bench.estimate.table.estimates, keeps a table of a million cells from holding them all)."""
    head = (*GROUPS, "GPU GiB", "host GiB", "s/step", "phase", "GPU", "host", "cell")
    lines = [head]
    n_fit = 0
    for cell, e, why in rows:
        if e is None:
            lines.append(("-",) * (len(head) - 1) + (f"{cell.id}  ({why})",))
            continue
        g = grouped(e)
        gpu = verdict(e.gpu_bytes, hw.gpu_memory_bytes, margin)
        n_fit += gpu == "fits"
        lines.append(
            (
                *(_gib(g[name]) for name in GROUPS),
                _gib(e.gpu_bytes),
                _gib(e.host_bytes),
                _seconds(predict_step(cell, hw)),
                e.phase,
                gpu,
                verdict(e.host_bytes, hw.host_memory_bytes, margin),
                cell.id,
            )
        )
    widths = [max(len(r[i]) for r in lines) for i in range(len(head) - 1)]
    out = ["  ".join(c.rjust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in lines]
    cap = (f"GPU {hw.gpu_memory_bytes / GiB:.1f} GiB" if hw.gpu_memory_bytes else "no GPU memory given (--gpu-mem)") + (
        f", host {hw.host_memory_bytes / GiB:.1f} GiB" if hw.host_memory_bytes else ""
    )
    out.append(
        f"{len(out) - 1} cells against {cap}, margin {margin:.0%}: {n_fit} fit on the GPU. Per GPU, the "
        "NVML process peak: the terms at the allocator's peak moment (phase), then fragmentation and the "
        "CUDA context (runtime). Paged optimizer state (managed memory) is outside it. s/step: the step-time "
        "model's seconds per optimizer step (bench.estimate.steptime)."
    )
    return "\n".join(out)


def as_json(rows: Sequence[tuple[Cell, Estimate | None, str]], hw: Hardware, margin: float = DEFAULT_MARGIN) -> str:
    cells = []
    for cell, e, why in rows:
        d: dict = {"cell_id": cell.id, "cell": cell.to_dict()}
        if e is None:
            d["error"] = why
        else:
            d["predicted"] = e.to_dict()
            d["gpu_verdict"] = verdict(e.gpu_bytes, hw.gpu_memory_bytes, margin)
            d["host_verdict"] = verdict(e.host_bytes, hw.host_memory_bytes, margin)
        cells.append(d)
    return json.dumps({"hardware": dataclasses.asdict(hw), "margin": margin, "cells": cells}, indent=1)
