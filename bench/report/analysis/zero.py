"""ZeRO stages side by side: per-GPU memory across stages, all else equal, beside the ZeRO paper's model-state
prediction; and loss parity, cells that differ only in the ZeRO stage (or the engine) training to the same loss."""

from __future__ import annotations

import pandas as pd

from ...judge import compare
from ...records.status import Status
from .ablations import COMPARE_RULE
from .knobs import _FIXED, AXES, _ordered

# Per-GPU memory figures compared across ZeRO stages: (column, label).
ZERO_SCALING_FIGURES = [
    ("nvml_proc_peak_bytes", "NVML process peak"),
    ("torch_max_allocated_bytes", "allocator peak"),
    ("torch_max_allocated_backward_bytes", "allocator peak in backward"),
    ("torch_allocated_between_steps_bytes", "allocated between steps"),
]

ZERO_SCALING_NOTE = (
    "Per-GPU memory in GiB and its ratio to ZeRO-0, all else equal. The paper's prediction covers model states "
    "only (parameters, gradients, optimizer state). They all exist at once only at the end of the backward pass, "
    "so the allocator's peak in backward is the figure to hold against it; the cell's peak may come elsewhere "
    "(the loss's logits in the forward pass, the fp32 gradient copy in the optimizer step), and peaks add "
    "activations and DeepSpeed's communication buffers, which do not shrink with the stage."
)


def _zero_scaling(cells: pd.DataFrame) -> list[dict]:
    """The ZeRO paper's claim, checked: per-GPU memory falls from stage 0 to 3 as optimizer state,
    then gradients, then parameters are sharded. Only full fine-tunes without offload on several
    GPUs, grouped by everything but the stage, with a ZeRO-0 cell to compare against. GPUs are every
    node's (what ZeRO shards over)."""
    need = {"zero_stage", "gpus", "peft", "offload", "estimate_model_states_bytes"}
    if not need <= set(cells):
        return []
    cells = cells.assign(
        _ranks=cells["gpus"].fillna(1) * cells.get("nodes", 1).fillna(1)
        if "nodes" in cells
        else cells["gpus"].fillna(1)
    )
    ok = cells[
        (cells["status"] == Status.OK.value)
        & (cells["_ranks"] > 1)
        & (cells["peft"] == "none")
        & (cells["offload"] == "none")
    ]
    if ok.empty:
        return []
    # A user ds_config sets the stage itself (and may tune ZeRO's buckets), so it is not held equal:
    # such cells are compared with the generated ZeRO-0 cell of the same settings, one row per config.
    others = [c for c, _, _ in AXES if c in ok and c != "zero_stage"] + [
        c for c, _ in _FIXED if c in ok and c != "ds_config"
    ]
    out = []
    gid = ok[others].astype(str).groupby(others, sort=False, dropna=False).ngroup()
    for _, g in ok.groupby(gid, sort=False):
        # The same cell measured by two matrices (a baseline re-run beside new configs): its latest.
        g = g.drop_duplicates("cell_hash", keep="last")
        config = g["ds_config"].map(lambda v: v.rsplit("/", 1)[-1] if isinstance(v, str) and v else "")
        z0 = g[(g["zero_stage"] == 0) & (config == "")]
        if z0.empty or g["zero_stage"].nunique() < 2:
            continue
        z0 = z0.iloc[0]
        for _, r in g.assign(_config=config).sort_values(["zero_stage", "_config"], kind="stable").iterrows():
            row = {
                "cell_name": r["cell_name"],
                "zero_stage": int(r["zero_stage"]),
                "gpus": int(r["_ranks"]),
                "nodes": int(r["nodes"]) if "nodes" in r and not pd.isna(r["nodes"]) else 1,
                "micro_batch": int(r["micro_batch"]),
                "ds_config": r["_config"] or None,
                "predicted_ratio": r["estimate_model_states_bytes"] / z0["estimate_model_states_bytes"],
                "estimate_bytes": r["estimate_model_states_bytes"],
            }
            for col, _ in ZERO_SCALING_FIGURES:
                v, v0 = r.get(col), z0.get(col)
                ok_v = v is not None and v0 is not None and not pd.isna(v) and not pd.isna(v0) and v0 > 0
                row[col] = v if ok_v else None
                row[f"{col}_ratio"] = v / v0 if ok_v else None
            out.append(row)
    return out


# Axes whose values should train the same model to the same loss: ZeRO partitions state, it does not
# change the math; the HF Trainer drives the same engine.
LOSS_PARITY_AXES = [("zero_stage", "ZeRO stage"), ("engine", "engine")]

LOSS_PARITY_NOTE = (
    "Cells that differ only in the ZeRO stage (or the engine) run the same math and should end at the same loss. "
    "Tolerance: {tol:g} (40x the largest spread of one cell across the committed runs, 0.0005), or three times "
    "the spread of a cell's own repeats if larger. ZeRO-0 in bf16/fp16 runs DeepSpeed's FP16_Optimizer wrapper, "
    "which takes one extra Adam step on zero gradients at start (bf16: every early update smaller) and, in fp16, "
    "divides gradients by a loss scale it never applied: see docs/loss-parity.md. Cells that ran different numbers "
    "of steps (adaptive steps) are compared at the last step both ran, named beside their losses."
)


def _loss_parity(cells: pd.DataFrame, samples: dict) -> list[dict]:
    ok = cells[(cells["status"] == Status.OK.value) & cells["loss_final"].notna() & cells["loss_first"].notna()]
    if ok.empty:
        return []
    out = []
    for axis, title in LOSS_PARITY_AXES:
        if axis not in ok or ok[axis].nunique() < 2:
            continue
        others = [c for c, _, _ in AXES if c in ok and c != axis] + [c for c, _ in _FIXED if c in ok and c != axis]
        g = ok.drop_duplicates(["cell_hash", axis], keep="last")
        gid = g[others].astype(str).groupby(others, sort=False, dropna=False).ngroup()
        rank = {v: i for i, v in enumerate(_ordered(axis, pd.unique(g[axis]).tolist()))}
        g = g.assign(_g=gid, _o=g[axis].map(rank))
        g = g[g.groupby("_g")[axis].transform("nunique") >= 2]
        if g.empty:
            continue
        ref = g.sort_values(["_g", "_o"], kind="stable").drop_duplicates("_g", keep="first")
        cols = ["_g", "cell_hash", "cell_name", "variant", axis, "loss_first", "loss_final", "losses"]
        pairs = g[cols + ["precision"]].merge(ref[cols], on="_g", suffixes=("", "_ref"))
        pairs = pairs[pairs["cell_hash"] != pairs["cell_hash_ref"]]
        for p in pairs.to_dict("records"):
            step, at, at_ref, spread = _common_loss(p, samples)
            tol = max(COMPARE_RULE.loss_final_tolerance, 3 * spread)
            d_first, d_final = p["loss_first"] - p["loss_first_ref"], at - at_ref
            same_start = abs(d_first) <= COMPARE_RULE.loss_first_tolerance
            flag = same_start and abs(d_final) > tol
            zero0 = axis == "zero_stage" and 0 in (p[axis], p[axis + "_ref"]) and p["precision"] in ("bf16", "fp16")
            note = ""
            if not same_start:
                note = "different first loss: not the same start (initialisation)"
            elif flag and zero0:
                note = "ZeRO-0's FP16_Optimizer (docs/loss-parity.md)"
            out.append(
                {
                    "axis": title,
                    "reference": p["cell_name_ref"],
                    "cell": p["cell_name"],
                    "values": (str(p[axis + "_ref"]), str(p[axis])),
                    "loss_first": (p["loss_first_ref"], p["loss_first"]),
                    "loss_final": (at_ref, at),
                    "step": step,
                    "difference": d_final,
                    "tolerance": tol,
                    "flag": bool(flag),
                    "note": note,
                }
            )
    return out


def _common_loss(p: dict, samples: dict) -> tuple[int | None, float, float, float]:
    """A pair's losses at the last step both cells (and all their repeats) ran: (that step, 1-based, or
    None where every curve has the same length and the final losses are that step's; the cell's loss
    there, the reference's, and the larger spread of either cell's repeats there)."""
    sides = [
        samples.get(compare.cell_key({"cell_hash": p["cell_hash" + k], "variant": p["variant" + k]}))
        for k in ("", "_ref")
    ]
    step = compare.common_step(*sides) if all(sides) else None
    curves = [p["losses"], p["losses_ref"]]
    if step is None and all(isinstance(c, list) and c for c in curves) and len(curves[0]) != len(curves[1]):
        step = min(len(c) for c in curves)  # no repeats to consult: the two records' own curves
    if step is None:
        reps = [_repeat_values(samples, p["cell_hash" + k], p["variant" + k], "loss_final") for k in ("", "_ref")]
        return (
            None,
            p["loss_final"],
            p["loss_final_ref"],
            max((max(v) - min(v) for v in reps if len(v) > 1), default=0.0),
        )
    reps = [compare.loss_at(s, step) for s in sides if s is not None]
    return (
        step,
        curves[0][step - 1],
        curves[1][step - 1],
        max((max(v) - min(v) for v in reps if len(v) > 1), default=0.0),
    )


def _repeat_values(samples: dict, cell_hash, variant, col: str) -> list[float]:
    s = samples.get(compare.cell_key({"cell_hash": cell_hash, "variant": variant})) if samples else None
    return s.values[col] if s else []
