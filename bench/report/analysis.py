"""Results DataFrame -> what the reports say. Pure pandas, no formatting, no clock.

Markdown (pull requests) and HTML (reading) both render one `Analysis`, so they tell the same story
from the same numbers. What ranks cells (best cells, the frontier, knob effects) is per `Section`, one
model at one sequence length, never across them; `effects` summarises a knob's pairs of cells.
Everything here is ordered by the input or by explicit keys, never by hash or set order, because a
report must be a pure function of its results.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import stats
from ..judge import blocks, compare, effects
from ..judge.results import PEAK_MEMORY_SOURCES, latest
from ..matrix import rules
from ..matrix.axes import AXES as AXIS_TABLE
from ..matrix.axes import AXIS as AXIS_TABLE_BY_NAME
from ..matrix.axes import SHOWN, peft_variant
from ..matrix.presets import PRESETS
from ..records import quality
from ..records.status import Status
from . import fmt, stale

__all__ = [
    "Analysis",
    "Ablation",
    "analyse",
    "replay_note",
    "AXES",
    "MEMORY_VIEW",
    "MEMORY_PHASES",
    "STATUS_ORDER",
    "NOT_RUN",
    "records",
    "measured_first",
    "causes",
    "BLOCKS_NOTE",
    "ANSWER_NOTE",
    "knobs_aside",
    "random_weights",
]

STATUS_ORDER = [s.value for s in Status if s is not Status.STARTED]
AXIS_NAMES = [a.name for a in AXIS_TABLE]
NOT_RUN = [s.value for s in Status if not s.ran]
"""Statuses of cells that never ran: skipped (a rule, or pruned by the memory model) and implied_oom."""

# PEFT is compared as its full variant (lora-r8, qlora-nf4-r8) since rank and quantization travel with it.
_COLUMN = {"peft": "peft_variant"}
# The knobs an ablation view varies one at a time: (column, title, short name used in labels), from the
# axis table (bench.matrix.axes), plus the sequence length, a fixed setting worth comparing across matrices.
AXES = [(_COLUMN.get(a.name, a.name), a.label, a.short) for a in SHOWN if a.ablate] + [
    ("seq_len", "Sequence length", "seq")
]
# Settings that must also match for two cells to count as "differing only in one axis" (with the axes
# reports hold equal rather than compare: a user's DeepSpeed config).
_FIXED = [
    ("model", "model"),
    ("gpus", "gpus"),
    ("nodes", "nodes"),
    # The schedule asked for, not the steps taken: adaptive cells that took different counts still pair.
    ("steps_schedule", "steps"),
    ("seed", "seed"),
    ("data", "data"),
    *[(a.name, a.short) for a in SHOWN if not a.ablate],
    ("lr", "lr"),
    ("attn", "attn"),
]
_SHORT = {c: s for c, _, s in AXES} | dict(_FIXED)
# Values in the table's order (ZeRO 0..3, none before offloads, ...); others after, by value.
_KNOWN_ORDER = {_COLUMN.get(a.name, a.name): a.values for a in SHOWN if a.values}

# Memory figures per cell, in display order: (column, header, drawn as a bar). The allocator figures
# sit beside NVML because the gap between them (CUDA context, NCCL buffers, fragmentation) is the point.
# The ZeRO formula is the paper's model-state accounting (bench/estimate/paper.py): a floor under the peak;
# "predicted" is the memory model's prediction of the NVML peak the record carries (bench/estimate/model.py).
MEMORY_VIEW = [
    ("nvml_proc_peak_bytes", "NVML process", True),
    ("predicted_gpu_bytes", "predicted (memory model)", True),
    ("torch_max_reserved_bytes", "allocator reserved", True),
    ("torch_max_allocated_bytes", "allocator allocated", True),
    ("torch_allocated_between_steps_bytes", "allocated between steps", True),
    ("estimate_model_states_bytes", "model states (ZeRO formula)", True),
    ("outside_allocator_bytes", "outside the allocator", False),
    ("host_rss_peak_bytes", "host RSS", False),
    ("predicted_host_bytes", "host RSS predicted", False),
]
# Where the peak happened: model build and engine init, or the timed steps. The first pair with data is shown.
MEMORY_PHASES = [
    ("nvml_proc_peak_setup_bytes", "nvml_proc_peak_measured_bytes", "NVML process"),
    ("host_rss_peak_setup_bytes", "host_rss_peak_measured_bytes", "host RSS"),
]
_GPU_SOURCES = ("nvml", "torch_reserved")

MAX_LOSS_CURVES = 12  # more overlaid lines stop being readable
MAX_ABLATION_GROUPS = 30  # per axis; the effect summary still uses every group


@dataclass(frozen=True, kw_only=True)
class Ablation:
    """Cells that differ only in `axis`, side by side: the effect of one knob with the others fixed."""

    axis: str
    title: str
    values: list
    """The axis values present, in a meaningful order; the first is the reference for `effects`."""
    groups: list[dict]
    """One dict per group of comparable cells: {"context": label, "cells": {value: row dict or None}}."""
    n_groups: int
    effects: list[dict]
    """Per non-reference value: `tokens` and `memory` (bench.judge.effects.Effect: the ratio to the
    reference value over the pairs where both ran ok, its 95% interval, the number of pairs and the
    verdict), `n` (pairs), `loss_delta` (median difference in loss at the last step both cells of a pair ran)
    and `trainable_ratio`."""


SECTION_NOTE = (
    "One section per model and sequence length: cells are ranked, and knob effects measured, only against cells "
    "of the same model at the same sequence length, since the sequence length is the workload (it sets the "
    "attention cost of each token and the activations held), not a knob to pick for speed. Nothing here ranks "
    "cells of different sections against each other."
)


BLOCKS_NOTE = (
    "A block is one run part (one `zerobench run`) on one machine (the GPUs' UUIDs, the host's boot id and name, its "
    "CPU). Cells compare directly only within a block: machines differ in speed as a whole (blocks of the committed "
    "H200 records by up to 13% over the cells they share), so knob effects pair cells of one block, and blocks are "
    "compared through anchors, cells measured in both (their speed below, at 95%). A block no anchor ties is "
    "compared with none."
)

ANSWER_NOTE = (
    "Judged as answer mode's console judges them: the fastest cell of each group (among the blocks anchors tie "
    "together) with its 95% interval; the cells not told apart from it (the 95% interval of their ratio to it "
    "reaches within compare's 5% minimum effect); the cells no block or anchor ties to it; each knob's effect over "
    "pairs measured in one block, from every measurement of the pair's two cells in the blocks both ran in (named "
    "beside the pairs; the one-knob table below takes each cell's latest attempt, so its ratio for the same pair may "
    "differ), the verdict following from the interval."
)

REPLAY_NOTE = (
    "nothing here ran anew; every measurement was recorded earlier and served by the replay executor "
    "(`zerobench run --replay`) from these files"
)


def replay_note(a: "Analysis") -> str:
    """What the report says of its replayed records: REPLAY_NOTE when every attempt that ran is one, else how
    many are (a replay's records beside real ones: files given together, or a run resumed on either)."""
    if not a.measured_anew:
        return REPLAY_NOTE
    return (
        f"{a.replayed_attempts} of the {a.replayed_attempts + a.measured_anew} attempts that ran here are replays, "
        "which ran nothing anew: their measurements were recorded earlier and served by the replay executor "
        f"(`zerobench run --replay`); the other {a.measured_anew} ran. The replays came from these files"
    )


@dataclass(frozen=True, kw_only=True)
class Section:
    """The cells of one model at one sequence length: the only cells the report ranks against each other."""

    model: str
    """The cells' `model`: a preset name or a local model directory, as the records name it."""
    seq_len: int | None
    label: str
    """The section's heading: "llama-1b, sequence length 2,048"."""
    slug: str
    """For HTML ids and chart file names: [a-z0-9-], unique within the report."""
    cells: pd.DataFrame
    ok: pd.DataFrame
    fastest: dict | None
    smallest: dict | None
    best_mfu: dict | None
    frontier: pd.DataFrame
    """Ok cells nothing here beats on both tokens/s and peak memory (per memory source), by peak memory ascending."""
    peak_label: str
    capacity_label: str | None
    """What the cells' peaks are measured against: the GPU (name, memory), or host memory for CPU runs.
    Each cell's own figure is the `capacity_bytes` column of `cells`."""
    did_not_fit: pd.DataFrame
    """Cells that ran out of memory (measured: cuda_oom, host_oom)."""
    implied: pd.DataFrame
    """Cells recorded as implied_oom, not run: a cell needing no more memory ran out (its reason names it)."""
    compute_metric: str | None
    """"mfu" when any ok cell has MFU, else "tflops_per_gpu" when any has that, else None."""
    ablations: list[Ablation]
    answer: dict | None = None
    """What answer mode settled here (`_answer`); None when no record of the section came from answer mode."""
    failed: list[dict] = field(default_factory=list)
    """Its cells that ran and did not end ok, grouped by cause (Analysis.failure_groups' first part)."""


@dataclass(frozen=True, kw_only=True)
class Analysis:
    title: str
    attempts: int
    """Attempts that ran (the records of cells that did not run, skipped, implied or unmeasured, are not
    attempts); `cells` keeps the last record of each cell."""
    cells: pd.DataFrame
    """Latest attempt per cell in input order, plus `peft_variant`, `section` (its Section's slug), `pareto`
    (bool, on its section's frontier), `capacity_bytes` (the memory its peak counts against),
    `outside_allocator_bytes` (NVML minus allocator reserved) and `tokens_log_se` (effects.Side.log_se)."""
    sections: list[Section]
    """One per model and sequence length, models in input order, shorter sequences first: what is ranked."""
    counts: dict[str, int]
    pruned: int
    """Of the skipped cells, those the memory model predicted not to fit (the rest a rule ruled out)."""
    peak_label: str
    """What `peak_memory_bytes` is over all cells (the cells table and the memory section)."""
    memory_columns: list[tuple[str, str, bool]]
    """The MEMORY_VIEW entries some cell has a figure for."""
    memory_phases: tuple[str, str, str] | None
    """The MEMORY_PHASES entry (setup column, measured column, label) these results have, if any."""
    compute_metric: str | None
    """"mfu" when any ok cell has MFU, else "tflops_per_gpu" when any has that, else None (the cells table)."""
    loss_cells: pd.DataFrame
    failures: pd.DataFrame
    failure_groups: list[dict]
    environment: list[tuple[str, str]]
    blocks: list[dict] = field(default_factory=list)
    """The blocks (one run part on one machine) the ok measurements came from, when more than one: `label`
    (B1, ...), `run`, `machine` (its id), `host`, `gpu`, `measurements`, `reference`, `tied` (anchors tie it to
    the reference block), `anchors` (cells measured in it and another), and its speed against the reference
    block: `ratio` with its 95% interval `low`-`high` (None where untied or the reference)."""
    baseline: pd.DataFrame | None = None
    replayed: list[str] = field(default_factory=list)
    """The results files a replay (`zerobench run --replay`) served these records from: nothing in them ran anew."""
    replayed_attempts: int = 0
    """Attempts that ran (every status a worker reaches) served by a replay."""
    measured_anew: int = 0
    """Attempts that ran and are not replays: with replayed ones beside them, the report says how many of each."""
    baseline_only: list[str] = field(default_factory=list)
    """Cell names that the baseline has and these results do not."""
    zero_scaling: list[dict] = field(default_factory=list)
    """Multi-GPU full fine-tunes at several ZeRO stages, all else equal: per-GPU memory relative to
    ZeRO-0, measured (NVML, allocator peak, allocated between steps) beside the ZeRO paper's
    model-state prediction (bench/estimate/paper.py)."""
    zero_figures: list[tuple[str, str]] = field(default_factory=list)
    """The ZERO_SCALING_FIGURES (column, label) that some row of zero_scaling has."""
    notes: list[tuple[str, str]] = field(default_factory=list)
    """(cell name, warning) for each cell whose last attempt's record warns that its measurement is less
    clean than its status says (an op compiled inside the cell, a relaunch after a taken port)."""
    banner: str | None = None
    """Said above everything when the records that ran come from a CPU or a tiny model: what their figures can and
    cannot say (`_banner`)."""
    loss_parity: list[dict] = field(default_factory=list)
    """Pairs of ok cells that differ only in the ZeRO stage (or the engine): first loss and the loss at
    the last step both ran (`step`; the final loss when they ran the same steps) side by side, the
    tolerance (the larger of CompareSettings.loss_final_tolerance and three times the spread of either
    cell's repeats at that step) and whether the losses there differ beyond it (`flag`)."""


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


def _peft_variant(cells: pd.DataFrame) -> pd.Series:
    """none | lora-r8 | qlora-nf4-r8 per row (bench.matrix.axes.peft_variant, as in cell names)."""

    def rank(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)

    peft = cells["peft"].astype(object).where(cells["peft"].notna(), "none").astype(str)
    return pd.Series(
        [
            peft_variant(p, rank(r), q if isinstance(q, str) and q else None)
            for p, r, q in zip(peft, cells["lora_r"], cells["qlora_quant_type"])
        ],
        index=cells.index,
        dtype=object,
    )


def _pareto(ok: pd.DataFrame) -> pd.Series:
    """True for ok cells on their section's tokens/s (higher) vs peak memory (lower) frontier, drawn only from
    differences beyond the noise the report states (FRONTIER_NOTE): a cell is off it when another is no heavier
    beyond the memory tolerance and faster, or lighter beyond it and no slower beyond the tokens/s bound.

    One frontier per section and kind of memory figure: another model's cells, and host RSS on a CPU run
    against VRAM on a GPU, are not comparable.
    """
    flag = pd.Series(False, index=ok.index)
    have = ok[ok["tokens_per_s"].notna() & ok["peak_memory_bytes"].notna()]
    for (_, source), g in have.groupby(["section", "peak_memory_source"], sort=True):
        g = g.sort_values(["peak_memory_bytes", "tokens_per_s"], ascending=[True, False], kind="stable")
        mem, tps = g["peak_memory_bytes"].to_numpy(float), g["tokens_per_s"].to_numpy(float)
        mt = effects.MEMORY_TOLERANCE.get(source, effects.RULE.nvml_tolerance)
        reps = g["repeats"].to_numpy() if "repeats" in g else np.ones(len(g))
        tt = np.where(reps > 1, effects.RULE.min_effect, effects.RULE.single_run_min_effect)
        best = np.maximum.accumulate(tps)  # the fastest of the lightest k cells
        heavier_ok = np.searchsorted(mem, mem * (1 + mt), side="right")  # cells no heavier beyond the noise
        lighter = np.searchsorted(mem, mem / (1 + mt), side="left")  # cells lighter beyond it
        beaten = best[heavier_ok - 1] > tps
        beaten |= (lighter > 0) & (best[np.maximum(lighter - 1, 0)] * (1 + tt) >= tps)
        keep = ~beaten if (~beaten).any() else tps == tps.max()
        flag[g.index[keep]] = True
    return flag


FRONTIER_NOTE = (
    "numbered as in the chart; a cell is on it only where no other is lighter beyond the memory noise without being "
    "slower beyond the throughput noise, and none as light is faster (memory: NVML {nvml:.0%}, allocator "
    "{alloc:.0%}, host RSS {rss:.0%}; tokens/s: {single:.0%} for a cell run once, {min_effect:.0%} with repeats)"
).format(
    nvml=effects.RULE.nvml_tolerance,
    alloc=effects.RULE.memory_tolerance,
    rss=effects.RULE.host_rss_tolerance,
    single=effects.RULE.single_run_min_effect,
    min_effect=effects.RULE.min_effect,
)


def _best_mfu(ok: pd.DataFrame) -> dict | None:
    """The best MFU among the mixed-precision cells when there are any: fp32 MFU is measured against
    the GPU's much lower non-tensor-core fp32 peak, so it is not comparable as a headline."""
    have = ok[ok["mfu"].notna()]
    mixed = have[have["precision"].isin(["bf16", "fp16"])] if "precision" in have else have
    have = mixed if not mixed.empty else have
    return None if have.empty else have.loc[have["mfu"].idxmax()].to_dict()


def _ordered(axis: str, values) -> list:
    known = _KNOWN_ORDER.get(axis, ())
    return sorted(
        values,
        key=lambda v: (
            known.index(v) if v in known else len(known),
            v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0,
            str(v),
        ),
    )


def _context_labels(keys: pd.DataFrame, cols: list[str]) -> pd.Series:
    """'zero=3, offload=none, ...' per row, from the string view of the context columns (vectorised)."""
    if not cols:
        return pd.Series("all else equal", index=keys.index)
    parts = []
    for c in cols:
        v = keys[c].map({"True": "on", "False": "off"}).fillna(keys[c]) if c == "grad_ckpt" else keys[c]
        parts.append(f"{_SHORT.get(c, c)}=" + v)
    label = parts[0]
    for p in parts[1:]:
        label = label + ", " + p
    return label


_CELL_FIELDS = ["cell_name", "cell_hash", "status", "reason", "tokens_per_s", "peak_memory_bytes"]
# What _effects reads of a cell besides its axis (the last two where results carry them).
_EFFECT_FIELDS = [
    "tokens_per_s", "tokens_log_se", "noise_sd", "peak_memory_bytes", "peak_memory_source", "cell_hash", "variant",
    "loss_final", "params_trainable", "block_label", "losses",
]  # fmt: skip


# PEFT settings (axes with a block) and peft_variant describe one adapter: comparing PEFT variants holds
# none of the settings equal (peft: none has none; alpha was never held equal there), and comparing one
# setting holds peft equal, not the variant (whose name carries the rank and quantization).
_PEFT_SETTINGS = {a.name for a in SHOWN if a.block}


def records(frame: pd.DataFrame, cols: list[str]) -> list[dict]:
    """frame[cols].to_dict("records") in a third of the time (a dict per row over 10k rows adds up)."""
    return [dict(zip(cols, row)) for row in zip(*(frame[c].tolist() for c in cols))]


def _held_equal(cols: list[str], axis: str) -> list[str]:
    """The columns that must match for two cells to differ only in `axis`."""
    if axis == "peft_variant":
        return [c for c in cols if c != axis and c not in _PEFT_SETTINGS]
    if axis in _PEFT_SETTINGS:
        return [c for c in cols if c not in (axis, "peft_variant")] + ["peft"]
    return [c for c in cols if c != axis]


def _ablations(cells: pd.DataFrame, samples: dict) -> list[Ablation]:
    context_cols = [c for c, _, _ in AXES if c in cells] + [c for c, _ in _FIXED if c in cells]
    # The columns read below only: each axis filters the rows, and a copy of some 150 columns costs.
    needed = {*context_cols, "peft", *_CELL_FIELDS, *_EFFECT_FIELDS}
    ran = cells.loc[~cells["status"].isin(NOT_RUN), [c for c in cells if c in needed]]
    if ran.empty:
        return []
    # Strings make None/NaN groupable and comparable; labels show only what differs somewhere.
    keys = ran[context_cols + (["peft"] if "peft" in ran and "peft" not in context_cols else [])].astype(str)
    codes = {c: pd.factorize(keys[c], use_na_sentinel=False)[0] for c in keys}
    varying = [c for c in context_cols if keys[c].nunique() > 1]
    out = []
    for axis, title, _ in AXES:
        if axis not in varying:
            continue
        others = _held_equal(context_cols, axis)
        gid = pd.Series(_group_ids(codes, others), index=ran.index)
        comparable = _values_per_group(gid.to_numpy(), codes[axis]) >= 2
        if not comparable.any():
            continue
        sub, gid = ran[comparable], gid[comparable]
        values = _ordered(axis, pd.unique(sub[axis]).tolist())
        # Labelled from each group's first row only: string building over every row cost seconds at 10k.
        firsts = keys.loc[comparable][~gid.duplicated().to_numpy()]
        labels = _context_labels(firsts, [c for c in varying if c in others])
        group_labels = pd.Series(labels.to_numpy(), index=gid.loc[firsts.index].to_numpy()).sort_values(kind="stable")
        shown = group_labels.index[:MAX_ABLATION_GROUPS]
        # Only the groups shown become dicts; the effect summary below uses all of them, vectorised.
        cells_by_group: dict = {g: {} for g in shown}
        pick = gid.isin(shown)
        for g, v, rec in zip(
            gid[pick], sub.loc[pick, axis].astype(str), sub.loc[pick, _CELL_FIELDS].to_dict("records")
        ):
            cells_by_group[g].setdefault(v, rec)
        groups = [
            {"context": group_labels[g], "cells": {str(v): cells_by_group[g].get(str(v)) for v in values}}
            for g in shown
        ]
        out.append(
            Ablation(
                axis=axis,
                title=title,
                values=values,
                groups=groups,
                n_groups=len(group_labels),
                effects=_effects(sub, gid, axis, values, samples),
            )
        )
    return out


def _group_ids(codes: dict[str, np.ndarray], cols: list[str]) -> np.ndarray:
    """Per row, its group of equal values in `cols` (factorized codes), numbered in order of first appearance
    (as groupby(sort=False).ngroup(), on one integer key: grouping by ten string columns cost seconds).
    Renumbered after each column, the key stays below rows x values: no overflow."""
    key = np.zeros(len(next(iter(codes.values()))), dtype=np.int64)
    for c in cols:
        key = pd.factorize(key * (int(codes[c].max()) + 1) + codes[c])[0].astype(np.int64)
    return pd.factorize(key)[0]


def _values_per_group(gid: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per row, how many distinct values (codes) its group holds."""
    card = int(values.max()) + 1
    pairs = np.unique(gid.astype(np.int64) * card + values)
    return np.bincount(pairs // card, minlength=int(gid.max()) + 1)[gid]


# The report judges an effect by the rule `zerobench compare` uses, with its default thresholds.
COMPARE_RULE = effects.RULE


def _effects(sub: pd.DataFrame, gid: pd.Series, axis: str, values: list, samples: dict) -> list[dict]:
    """Per non-reference value, its throughput and memory effect against the reference value over the
    groups where both ran ok (bench.judge.effects), and what it does to learning and to what trains."""
    # The columns read below only: every filter of the whole frame (some 150 columns) costs a copy of each.
    cols = [axis] + [c for c in _EFFECT_FIELDS if c in sub]
    ok = sub.loc[(sub["status"] == Status.OK.value) & (sub["tokens_per_s"] > 0), cols].assign(_g=gid)
    ref = values[0]
    # What the knob does to what trains (the PEFT settings move it, not memory alone).
    wide_p = _wide(ok, axis, "params_trainable")
    # Each group's first ok cell per value: a pair is a group's reference cell and its cell of the value.
    first = ok.assign(_v=ok[axis].astype(str)).drop_duplicates(["_g", "_v"]).set_index("_g")
    refs = first[first["_v"] == str(ref)]
    out = []
    for v in values[1:]:
        cur = first[first["_v"] == str(v)]
        both = cur.index[cur.index.isin(refs.index)]
        r, c = refs.loc[both], cur.loc[both]
        # Throughput pairs come from one block (one run part on one machine): machines differ by more than most
        # knobs do. Memory does not depend on the machine's speed: every pair counts.
        same = (r["block_label"].to_numpy() == c["block_label"].to_numpy()) if "block_label" in r else slice(None)
        tok = effects.throughput(_sides(r[same], c[same], "tokens_per_s", samples))
        # Memory only where both sides' peaks are the same kind of figure (NVML against host RSS: no ratio).
        have = (r["peak_memory_bytes"] > 0).to_numpy() & (c["peak_memory_bytes"] > 0).to_numpy()
        kinds = set(r.loc[have, "peak_memory_source"]) | set(c.loc[have, "peak_memory_source"])
        one = len(kinds) == 1
        mem_pairs = _sides(r[have], c[have], "peak_memory_bytes", samples) if one else []
        out.append(
            {
                "value": v,
                "reference": ref,
                "n": tok.n,
                "tokens": tok,
                "memory": effects.memory(mem_pairs, kinds.pop() if one else None),
                "loss_delta": _loss_delta(r, c),
                "trainable_ratio": _median_of(wide_p, v, ref, "/"),
            }
        )
    return out


def _sides(r: pd.DataFrame, c: pd.DataFrame, col: str, samples: dict) -> list[tuple[effects.Side, effects.Side]]:
    """Pairs (reference cell, value cell) for one figure, row by row of two aligned frames."""
    return list(zip(_side_list(r, col, samples), _side_list(c, col, samples)))


def _side_list(cells: pd.DataFrame, col: str, samples: dict) -> list[effects.Side]:
    """Each cell for a figure: its value (the median of its repeats), the repeats, its measurements' noise."""
    values = cells[col].to_numpy(dtype=float).tolist()
    noise = cells["noise_sd"].to_numpy(dtype=float).tolist() if col == "tokens_per_s" else [math.nan] * len(cells)
    reps: list = [()] * len(cells)
    sds: list = [() if sd != sd else (sd,) for sd in noise]  # NaN != NaN: no noise known
    if samples:
        figures = [col] * len(cells) if col == "tokens_per_s" else cells["peak_memory_source"].map(_PEAK_COLUMN)
        for i, (k, figure) in enumerate(zip(cells[["cell_hash", "variant"]].to_dict("records"), figures)):
            s = samples.get(compare.cell_key(k))
            xs = [x for x in (s.values.get(figure, []) if s else []) if x > 0]
            if len(xs) >= 2:
                reps[i] = xs
                sds[i] = s.noise if col == "tokens_per_s" and len(s.noise) == len(xs) else sds[i]
    # Positional: a 10k-row report makes some 10^5 of these.
    return [effects.Side(x, rp, sd) for x, rp, sd in zip(values, reps, sds)]


# The column each peak_memory_source names (bench.judge.results.PEAK_MEMORY_SOURCES, reversed).
_PEAK_COLUMN = {v: k for k, v in PEAK_MEMORY_SOURCES.items()}


def _wide(ok: pd.DataFrame, axis: str, col: str) -> pd.DataFrame:
    """Groups x values of the axis: each group's first non-missing figure per value."""
    if col not in ok or ok[col].isna().all():
        return pd.DataFrame()
    firsts = ok.loc[ok[col].notna(), ["_g", axis, col]].drop_duplicates(["_g", axis])
    return firsts.set_index(["_g", axis])[col].unstack(axis)


def _loss_delta(r: pd.DataFrame, c: pd.DataFrame) -> float | None:
    """The median over pairs of the value cell's loss minus the reference cell's at the last step both ran (cells
    with adaptive steps, or a short rung, ran different counts: their final losses are of different steps);
    the final losses where a record has no curve."""
    curves = zip(r.get("losses", [None] * len(r)), c.get("losses", [None] * len(c)), r["loss_final"], c["loss_final"])
    d = []
    for a, b, fa, fb in curves:
        if isinstance(a, list) and isinstance(b, list) and a and b:
            k = min(len(a), len(b))
            fa, fb = a[k - 1], b[k - 1]
        if not fmt.missing(fa) and not fmt.missing(fb) and math.isfinite(fa) and math.isfinite(fb):
            d.append(fb - fa)
    return float(statistics.median(d)) if d else None


def _median_of(wide: pd.DataFrame, v, ref, op: str) -> float | None:
    """The median over groups of value v's figure minus (or over) the reference value's; None without pairs."""
    if ref not in wide.columns or v not in wide.columns:
        return None
    d = (wide[v] - wide[ref] if op == "-" else wide[v] / wide[ref]).dropna()
    return float(d.median()) if len(d) else None


def _tokens_log_se(cells: pd.DataFrame, samples: dict) -> pd.Series:
    """Per ok cell, the standard error of its mean ln(tokens/s) by the one rule (bench.stats.log_mean): the
    larger of what its measurements' noise allows (bench.records.quality: a host-bound or unstable measurement about
    three times a clean one's) and what its repeats' spread shows. NaN where no noise is known."""
    out = pd.Series(np.nan, index=cells.index, dtype=float)
    ok = cells[(cells["status"] == Status.OK.value) & (cells["tokens_per_s"] > 0) & cells["noise_sd"].notna()]
    for i, r in zip(ok.index, records(ok, ["cell_hash", "variant", "tokens_per_s", "noise_sd"])):
        s = samples.get(compare.cell_key(r)) if samples else None
        vals = [x for x in (s.values["tokens_per_s"] if s else []) if x > 0]
        if len(vals) >= 2 and len(s.noise) == len(vals):
            out[i] = math.sqrt(stats.log_mean([math.log(x) for x in vals], s.noise)[1])
        else:
            out[i] = r["noise_sd"]
    return out


def _with_repeats(cells: pd.DataFrame, samples: dict) -> pd.DataFrame:
    """Cells with repeats (in the block of their last attempt) show the median over their ok repeats
    (tokens/s, step time) with a 95% interval by the one rule (bench.stats.log_mean around the median: never
    narrower than the measurements' noise allows); a cell measured once keeps its one figure (and no interval)."""
    nan = np.full(len(cells), np.nan)
    se = _tokens_log_se(cells, samples)
    if not samples:
        return cells.assign(repeats=1, tokens_per_s_ci_low=nan, tokens_per_s_ci_high=nan, tokens_per_s_ci_conf=nan,
                            tokens_log_se=se)  # fmt: skip
    keys = [compare.cell_key(r) for r in cells[["cell_hash", "variant"]].to_dict("records")]
    z = stats.normal_quantile(effects.CONF)
    reps, lo, hi, conf = [], nan.copy(), nan.copy(), nan.copy()
    tok, step = cells["tokens_per_s"].to_numpy(dtype=float).copy(), cells["step_time_median_s"].to_numpy(dtype=float)
    step = step.copy()
    for i, (k, e) in enumerate(zip(keys, se.to_numpy(dtype=float))):
        s = samples.get(k)
        vals = s.values["tokens_per_s"] if s else []
        reps.append(s.repeats if s else 1)
        if len(vals) >= 2:
            tok[i] = stats.median(vals)
            step[i] = stats.median(s.values["step_time_median_s"]) or step[i]
            if e == e:
                lo[i], hi[i], conf[i] = tok[i] * math.exp(-z * e), tok[i] * math.exp(z * e), effects.CONF
    return cells.assign(
        tokens_per_s=tok, step_time_median_s=step, repeats=reps, tokens_per_s_ci_low=lo, tokens_per_s_ci_high=hi,
        tokens_per_s_ci_conf=conf, tokens_log_se=se,
    )  # fmt: skip


def _peak_label(sources: pd.Series) -> str:
    kinds = set(sources.dropna())
    if kinds == {"nvml"}:
        return "NVML process peak"
    if kinds == {"torch_reserved"}:
        return "allocator reserved peak"
    if kinds == {"host_rss"}:
        return "host RSS peak"
    return "NVML, else allocator reserved, else host RSS peak"


def _capacity(cells: pd.DataFrame) -> tuple[pd.Series, str | None]:
    """What 'fits' means per cell: its GPU's memory for a device figure, host memory for host RSS.

    Returns the per-cell capacity and a label for it ("NVIDIA H100 80GB HBM3 (80.0 GiB)").
    """
    gpu_mem = pd.to_numeric(cells["gpu_memory_bytes"], errors="coerce") if "gpu_memory_bytes" in cells else np.nan
    host_mem = pd.to_numeric(cells["host_memory_bytes"], errors="coerce") if "host_memory_bytes" in cells else np.nan
    src = cells["peak_memory_source"]
    cap = pd.Series(
        np.where(src.isin(_GPU_SOURCES), gpu_mem, np.where(src == "host_rss", host_mem, np.nan)),
        index=cells.index,
        dtype=float,
    )
    on_gpu = src.isin(_GPU_SOURCES)
    kinds = []
    if on_gpu.any():
        names = ", ".join(sorted({str(x) for x in cells.loc[on_gpu, "gpu_name"].dropna()})) or "GPU"
        sizes = sorted(set(cap[on_gpu].dropna()))
        kinds.append(f"{names} ({' / '.join(f'{v / 2**30:.1f} GiB' for v in sizes)})" if sizes else names)
    if (src == "host_rss").any():
        sizes = sorted(set(cap[src == "host_rss"].dropna()))
        kinds.append("host memory" + (f" ({' / '.join(f'{v / 2**30:.1f} GiB' for v in sizes)})" if sizes else ""))
    return cap, " or ".join(kinds) or None


def _loss_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """At most MAX_LOSS_CURVES: diverged cells first (the curve is the story), then the frontier, then the fastest."""
    has = cells["losses"].map(lambda v: isinstance(v, list) and len(v) > 0)
    c = cells[has & cells["status"].isin([Status.OK.value, Status.DIVERGED.value])]
    if c.empty:
        return c
    prio = np.where(c["status"] == Status.DIVERGED.value, 0, np.where(c["pareto"], 1, 2))
    order = c.assign(_p=prio, _t=-c["tokens_per_s"].fillna(-np.inf), _i=np.arange(len(c)))
    return order.sort_values(["_p", "_t", "_i"], kind="stable").head(MAX_LOSS_CURVES).drop(columns=["_p", "_t", "_i"])


def _failure_groups(failures: pd.DataFrame) -> list[dict]:
    """Cells that did not end ok, grouped by cause: first those that ran (error, out of memory, diverged, ...),
    their reasons grouped as `causes` says, most cells first; then those that did not run (skipped by a rule
    or pruned, implied out of memory, left unmeasured), by rule or reason. Each group: status, `reason` (the
    cause: the reason with the words that vary between its cells as "…"), `n`, `cells` (names), `example` and
    `example_reason` (its first cell and that cell's own reason), `rule` (a skip's) and `ran`."""
    if failures.empty:
        return []
    rows = records(failures, _GROUP_FIELDS)
    ran = [r for r in rows if r["status"] not in NOT_RUN]
    out = _by_cause(ran) + _by_rule([r for r in rows if r["status"] in NOT_RUN])
    return out


def _by_cause(rows: list[dict]) -> list[dict]:
    """Attempts that failed, grouped by cause (causes), most cells first, then by status order."""
    rank = {s: i for i, s in enumerate(STATUS_ORDER)}
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for st in dict.fromkeys(r["status"] for r in rows):
        mine = [r for r in rows if r["status"] == st]
        for cause, members in causes([str(r["reason"] or "") for r in mine]):
            groups[(st, cause, members[0])] = [mine[i] for i in members]
    out = [_group(st, cause, members, ran=True) for (st, cause, _), members in groups.items()]
    out.sort(key=lambda d: (-d["n"], rank.get(d["status"], len(rank))))
    return out


def _by_rule(rows: list[dict]) -> list[dict]:
    """Cells that did not run, by status and rule (a skip) or reason, in status order, most cells first."""
    rank = {s: i for i, s in enumerate(STATUS_ORDER)}
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        rule = r["skip_rule"] if isinstance(r["skip_rule"], str) else None
        groups.setdefault((r["status"], rule or str(r["reason"] or "")), []).append(r)
    out = []
    for (st, _), members in groups.items():
        g = _group(st, str(members[0]["reason"] or ""), members, ran=False)
        g["rule"] = members[0]["skip_rule"] if isinstance(members[0]["skip_rule"], str) else None
        wordings = len({m["reason"] for m in members})
        g["wordings"] = wordings
        out.append(g)
    out.sort(key=lambda d: (rank.get(d["status"], len(rank)), -d["n"], d["reason"]))
    return out


def _group(status: str, cause: str, members: list[dict], ran: bool) -> dict:
    first = members[0]
    return {
        "status": status, "reason": cause, "n": len(members), "cells": [m["cell_name"] for m in members],
        "example": first["cell_name"], "example_reason": str(first["reason"] or ""), "rule": None, "ran": ran,
    }  # fmt: skip


_GROUP_FIELDS = ["status", "reason", "cell_name", "skip_rule"]
_VARIES = "…"
# What varies between reasons of one cause: numbers, addresses, quoted names, paths of one attempt.
_MASKS = [
    (re.compile(r"'[^']*'|\"[^\"]*\""), "'…'"),
    (re.compile(r"(?<![\w.])(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)?)(?![\w.])"), "N"),
    (re.compile(r"(?:/[\w.+-]+){2,}/?"), "PATH"),
]


def causes(reasons: list[str]) -> list[tuple[str, list[int]]]:
    """Reasons grouped by cause: after masking what varies between attempts (numbers, quoted names, paths), the
    reasons of one cause have the same words but for at most one in ten (at least one), where they differ in
    a name (an optimizer's class, a file). Returns each cause (its reason where all of its reasons are the
    same; else the masked words, "…" where they differ) with the indexes of its reasons, the most first."""
    words = [_masked(r) for r in reasons]
    order = sorted(range(len(reasons)), key=lambda i: (-words.count(words[i]), i))
    groups: list[tuple[list[str], list[int]]] = []
    for i in order:
        w = words[i].split()
        for template, members in groups:
            diff = [k for k, (a, b) in enumerate(zip(template, w)) if a != b]
            if len(template) == len(w) and len(diff) <= max(1, len(w) // 10):
                for k in diff:
                    template[k] = _VARIES
                members.append(i)
                break
        else:
            groups.append((w, [i]))
    groups.sort(key=lambda g: (-len(g[1]), g[1][0]))
    out = []
    for template, members in groups:
        same = len({reasons[i] for i in members}) == 1
        out.append((reasons[members[0]] if same else " ".join(template), sorted(members)))
    return out


def _masked(reason: str) -> str:
    text = " ".join(reason.split())[:400]
    for rx, to in _MASKS:
        text = rx.sub(to, text)
    return text


def _distinct(cells: pd.DataFrame, col: str) -> str:
    if col not in cells:
        return ""
    return ", ".join(sorted({compare.clip(v) for v in cells[col].dropna().unique()} - {""}))


def _environment(cells: pd.DataFrame, df: pd.DataFrame) -> list[tuple[str, str]]:
    def gib(col):
        vals = pd.to_numeric(cells[col], errors="coerce").dropna() if col in cells else pd.Series(dtype=float)
        return ", ".join(f"{v / 2**30:.1f} GiB" for v in sorted(set(vals)))

    rows = [
        ("matrix", _distinct(cells, "matrix")),
        ("model", _distinct(cells, "model")),
        ("host", _distinct(cells, "host")),
        ("GPU", _distinct(cells, "gpu_name")),
        ("GPU count", _distinct(cells, "gpu_count")),
        ("GPU memory", gib("gpu_memory_bytes")),
        ("driver", _distinct(cells, "gpu_driver")),
        ("CUDA", _distinct(cells, "cuda_version")),
        ("CPU", _distinct(cells, "cpu")),
        ("host memory", gib("host_memory_bytes")),
        ("OS", _distinct(cells, "os")),
        ("Python", _distinct(cells, "python_version")),
    ]
    for lib in ("torch", "deepspeed", "transformers", "peft", "bitsandbytes"):
        rows.append((lib, _distinct(cells, f"{lib}_version")))
    if "git_commit" in cells:
        commits = sorted(
            {
                str(c) + (" (dirty)" if d is True else "")
                for c, d in zip(cells["git_commit"], cells.get("git_dirty", [None] * len(cells)))
                if c is not None and not (isinstance(c, float) and math.isnan(c))
            }
        )
        rows.append(("git commit", ", ".join(commits)))
    rows.append(("runs", _distinct(df, "run_id")))
    if "started_at" in df and df["started_at"].notna().any():
        end = df["ended_at"].max() if "ended_at" in df and df["ended_at"].notna().any() else df["started_at"].max()
        rows.append(("time (UTC)", f"{df['started_at'].min():%Y-%m-%d %H:%M:%S} to {end:%Y-%m-%d %H:%M:%S}"))
    return [(k, v) for k, v in rows if v]


def _with_block_labels(df: pd.DataFrame) -> pd.DataFrame:
    """`block_label`: B1, B2, ... for the blocks (one run part on one machine) that measured a cell ok, in the
    order their first ok measurement appears (as answer mode's console names them); for the attempts that ran
    there, empty for the others."""
    ran = ~df["status"].isin(NOT_RUN) if "status" in df else pd.Series(False, index=df.index)
    ok = df["status"] == Status.OK.value if "status" in df else ran
    names = {b: f"B{i}" for i, b in enumerate(dict.fromkeys(df.loc[ok, "block"]), 1)} if "block" in df else {}
    labels = df["block"].map(names) if names else pd.Series(None, index=df.index, dtype=object)
    return df.assign(block_label=labels.where(ran, None))


def _last_block(df: pd.DataFrame) -> pd.DataFrame:
    """The attempts of each cell in the block of its last attempt: a cell's repeats from one machine and run."""
    if "block" not in df or df.empty:
        return df
    last = df.groupby("cell_hash", sort=False)["block"].transform("last")
    return df[df["block"] == last]


def _blocks(df: pd.DataFrame) -> list[dict]:
    """The blocks the ok measurements came from, when more than one: each one's run and machine, its
    measurements, and its speed against the reference block through the anchors (bench.judge.blocks.offsets)."""
    ok = df[(df["status"] == Status.OK.value) & (df["tokens_per_s"] > 0) & df["noise_sd"].notna()]
    if ok.empty or ok["block"].nunique() < 2:
        return []
    rows = records(ok, ["cell_hash", "block", "block_label", "tokens_per_s", "noise_sd", "run_id", "host", "gpu_name"])
    obs: dict = {}
    for r in rows:
        obs.setdefault(r["cell_hash"], {}).setdefault(r["block"], []).append(
            blocks.Obs(math.log(r["tokens_per_s"]), r["noise_sd"])
        )
    cpu = (ok["peak_memory_source"] == "host_rss").any()
    offs = blocks.offsets(obs, quality.CROSS["cpu" if cpu else "gpu"], list(dict.fromkeys(ok["block"])))
    z, out = stats.normal_quantile(effects.CONF), []
    for b, first in {r["block"]: r for r in reversed(rows)}.items():
        tied = b in offs.tied and b != offs.ref
        lo, hi = (math.exp(offs.mean[b] + k * z * offs.sd(b)) for k in (-1, 1)) if tied else (None, None)
        out.append({
            "label": first["block_label"], "run": b.split("@")[0], "machine": b.split("@")[1], "host": first["host"],
            "gpu": first["gpu_name"], "measurements": int((ok["block"] == b).sum()), "reference": b == offs.ref,
            "tied": b in offs.tied, "anchors": offs.anchors.get(b, 0),
            "ratio": math.exp(offs.mean[b]) if tied else None, "low": lo, "high": hi,
        })  # fmt: skip
    return sorted(out, key=lambda r: int(r["label"][1:]))


def _baseline(cells: pd.DataFrame, base_df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Per cell_hash in both: tokens/s and peak memory, baseline and now, with relative change."""
    cols = ["cell_hash", "status", "tokens_per_s", "peak_memory_bytes"]
    base = (
        latest(base_df).drop_duplicates("cell_hash", keep="last")
        if not base_df.empty
        else pd.DataFrame(columns=cols + ["cell_name"])
    )
    m = cells[["cell_name"] + cols].merge(base[cols], on="cell_hash", how="inner", suffixes=("", "_base"))
    m["tokens_per_s_change"] = m["tokens_per_s"] / m["tokens_per_s_base"] - 1
    m["peak_memory_change"] = m["peak_memory_bytes"] / m["peak_memory_bytes_base"] - 1
    only = base.loc[~base["cell_hash"].isin(cells["cell_hash"]), "cell_name"].tolist()
    return m, only


def _empty(title: str, baseline: pd.DataFrame | None) -> Analysis:
    empty = pd.DataFrame(columns=["cell_name", "status", "reason", "pareto"])
    return Analysis(
        title=title,
        attempts=0,
        cells=empty,
        sections=[],
        counts={},
        pruned=0,
        peak_label="peak memory",
        memory_columns=[],
        memory_phases=None,
        compute_metric=None,
        loss_cells=empty,
        failures=empty,
        failure_groups=[],
        environment=[],
        baseline=None if baseline is None else empty,
    )


def _cells(df: pd.DataFrame, samples: dict) -> pd.DataFrame:
    """The latest attempt per cell with the columns every section reads (see Analysis.cells)."""
    cells = _with_repeats(latest(df), samples)
    if "variant" in cells and cells["variant"].notna().any():
        # `zerobench selfcheck` runs one cell several ways: keep the ways apart.
        cells = cells.assign(
            cell_name=cells["cell_name"] + cells["variant"].map(lambda v: f" [{v}]" if isinstance(v, str) and v else "")
        )
    if "model" in cells and cells["model"].nunique() > 1:
        # Cell names carry the axes, not the model: a report over several models must say which.
        cells = cells.assign(cell_name=cells["model"].astype(str) + " " + cells["cell_name"])
    capacity, _ = _capacity(cells)
    cells = cells.assign(
        peft_variant=_peft_variant(cells),
        capacity_bytes=capacity,
        # NVML minus allocator reserved: CUDA context, NCCL buffers, cuBLAS workspaces, other allocators.
        outside_allocator_bytes=cells["nvml_proc_peak_bytes"] - cells["torch_max_reserved_bytes"],
        section=_section_slugs(cells),
    )
    is_ok = cells["status"] == Status.OK.value
    return cells.assign(pareto=_pareto(cells[is_ok]).reindex(cells.index, fill_value=False))


def _section_slugs(cells: pd.DataFrame) -> pd.Series:
    """Each cell's section as a slug ("llama-1b-seq2048"): distinct sections never share one."""
    keys = list(zip(cells["model"].astype(str), cells["seq_len"]))
    slugs: dict = {}
    for m, n in dict.fromkeys(keys):
        base = re.sub(r"[^a-z0-9]+", "-", f"{m} seq{n}".lower()).strip("-")[-60:].strip("-") or "model"
        slug, i = base, 2
        while slug in slugs.values():
            slug, i = f"{base}-{i}", i + 1
        slugs[(m, n)] = slug
    return pd.Series([slugs[k] for k in keys], index=cells.index, dtype=object)


def _compute_metric(ok: pd.DataFrame) -> str | None:
    return "mfu" if ok["mfu"].notna().any() else "tflops_per_gpu" if ok["tflops_per_gpu"].notna().any() else None


def _pick(ok: pd.DataFrame, col: str, largest: bool) -> dict | None:
    have = ok[ok[col].notna()]
    if have.empty:
        return None
    i = have[col].idxmax() if largest else have[col].idxmin()  # first of ties: input order
    return have.loc[i].to_dict()


def _lighter(smallest: dict | None, fastest: dict | None) -> dict | None:
    """The lowest-memory cell, where it is lighter than the fastest beyond the memory noise (else no headline of its
    own: the two are as light as each other, as far as the figures tell)."""
    if smallest is None or fastest is None or smallest["peak_memory_source"] != fastest["peak_memory_source"]:
        return smallest
    tol = effects.MEMORY_TOLERANCE.get(smallest["peak_memory_source"], effects.RULE.nvml_tolerance)
    return smallest if smallest["peak_memory_bytes"] * (1 + tol) < fastest["peak_memory_bytes"] else None


def _answer(cells: pd.DataFrame, attempts: pd.DataFrame) -> dict | None:
    """What answer mode (`zerobench run --answer`) settled among these cells, from the records, judged as its
    console judges them (bench.judge.blocks, bench.judge.effects): per group its fastest ok cell with a 95% interval,
    the cells not told apart from it and those no block or anchor ties to it; each knob's effect over pairs measured
    in one block; the cells measured and what each role cost (wall seconds of every attempt); the cells left
    unmeasured, those the budget (or a stop) left that could still change the answer, those expected to repeat
    an error (bench.execute.answer.failures), and the predicted time measuring them once would add. "measured" counts
    the cells with an ok record; "attempts" every attempt answer mode made, failures included."""
    if "answer_role" not in cells or cells["answer_role"].isna().all():
        return None
    roles = attempts["answer_role"]
    measured = attempts[roles.notna() & (roles != "unmeasured")]
    left = cells[cells["status"] == Status.UNMEASURED.value]
    needed = left[left["answer_needed"].eq(True)]
    chances = _answer_chances(left)
    return {
        **_answer_judged(measured, left),
        "verdict": _answer_verdict(len(needed), chances, _wall_s(needed)),
        "measured": int(measured.loc[measured["status"] == Status.OK.value, "cell_hash"].nunique()),
        "attempts": len(measured),
        "cost_s": {str(k): float(v) for k, v in measured.groupby("answer_role")["wall_s"].sum().items()},
        "spent_s": float(measured["wall_s"].sum()),
        "unmeasured": len(left),
        "needed": len(needed),
        "expected": int(left["answer_expected_error"].notna().sum()) if "answer_expected_error" in left else 0,
        "adds_s": float(pd.to_numeric(left["answer_predicted_wall_s"], errors="coerce").sum()),
        "chances": chances,
    }


def random_weights(s: Section) -> bool:
    """The section's model is a preset shape: it starts from random weights, no checkpoint."""
    return s.model in PRESETS


def knobs_aside(s: Section) -> str:
    """What the one-knob table's reader must know beside its method: where its pairs differ from the answer
    section's, and that its losses are a random-weight model's."""
    out = ""
    if s.answer is not None:
        out += (
            " Each pair here is its two cells' latest attempts; the answer section above pairs every measurement of "
            "the two cells in the blocks both ran in, so a ratio for the same pair may differ between the two tables."
        )
    if random_weights(s):
        out += (
            f" The losses are of {s.model}, a preset shape trained from random weights (no checkpoint): a loss "
            "difference says whether two setups train alike from the same start, not how well a real model learns."
        )
    return out


def _wall_s(cells: pd.DataFrame) -> float:
    """The cells' predicted wall seconds (answer mode's note on each unmeasured record)."""
    return float(pd.to_numeric(cells["answer_predicted_wall_s"], errors="coerce").sum())


def _answer_verdict(needed: int, chances: tuple[float, float, float] | None, needed_s: float) -> tuple[str, str]:
    """What the answer's reader needs first: settled or not settled, and why, in words (the verdict, the rest)."""
    if needed == 0 and (chances is None or max(chances[:2]) < chances[2]):
        said = (
            f"the chance that an unmeasured cell beats its group's fastest by more than the minimum effect is "
            f"{chances[0]:.1%}, that one adds a frontier point {chances[1]:.1%}, each below {chances[2]:.0%}"
            if chances
            else "no unmeasured cell could still change it"
        )
        return "settled", said
    chance = (
        f"the chance that an unmeasured cell beats its group's fastest by more than the minimum effect is "
        f"{chances[0]:.1%}, that one adds a frontier point {chances[1]:.1%} (settled means each below "
        f"{chances[2]:.0%}); "
        if chances
        else ""
    )
    return "not settled", (
        f"{chance}{needed} unmeasured cells could still change the answer; measuring each once would take about "
        f"{needed_s / 60:.0f} min of cell time (predicted)"
    )


_ANSWER_FIELDS = [
    "cell_hash", "cell_name", "block", "tokens_per_s", "noise_sd", "answer_group", "peak_memory_source",
    "peak_memory_bytes", "block_label",
]  # fmt: skip


def _answer_chances(left: pd.DataFrame) -> tuple[float, float, float] | None:
    """The joint stopping rule's figures as the search ended (bench.execute.answer.settle): the largest group's chance
    that an unmeasured cell beats its fastest by more than the minimum effect, the chance that one adds a frontier
    point, and the level; None where the records carry none."""
    if "answer_p_lead" not in left or left["answer_p_lead"].isna().all():
        return None
    lead = pd.to_numeric(left["answer_p_lead"], errors="coerce").max()
    front = pd.to_numeric(left["answer_p_frontier"], errors="coerce").max()
    return float(lead), float(front), float(pd.to_numeric(left["answer_settle"], errors="coerce").max())


def _answer_judged(measured: pd.DataFrame, left: pd.DataFrame) -> dict:
    """Per group the fastest cell, its ties and the cells not compared with it; each knob's effect: from the ok
    attempts' measurements by block, as bench.execute.answer judges them."""
    ok = measured[(measured["status"] == Status.OK.value) & (measured["tokens_per_s"] > 0)]
    rows = records(ok, [c for c in _ANSWER_FIELDS if c in ok])
    obs: dict = {}
    for r in rows:
        obs.setdefault(r["cell_hash"], {}).setdefault(r["block"], []).append(
            blocks.Obs(math.log(r["tokens_per_s"]), r["noise_sd"])
        )
    cpu = any(r.get("peak_memory_source") == "host_rss" for r in rows)
    cross = quality.CROSS["cpu" if cpu else "gpu"]
    offs = blocks.offsets(obs, cross, list(dict.fromkeys(r["block"] for r in rows)))
    part = blocks.parts(obs, offs.ref)
    name = {r["cell_hash"]: r["cell_name"] for r in rows}
    peak: dict = {}  # each cell's highest peak over its ok attempts: what it needs
    for r in rows:
        if isinstance(r.get("peak_memory_bytes"), (int, float)) and not math.isnan(r["peak_memory_bytes"]):
            peak[r["cell_hash"]] = max(peak.get(r["cell_hash"], 0), r["peak_memory_bytes"])
    group = {r["cell_hash"]: r["answer_group"] for r in rows if isinstance(r["answer_group"], str)}
    groups = []
    for g in dict.fromkeys(group.values()):
        members = [h for h in obs if group.get(h) == g]
        lead = members[blocks.leading([obs[h] for h in members], offs, cross, part)]
        judged = {h: effects.against(obs[h], obs[lead], offs, cross, part) for h in members if h != lead}
        lo, mid, hi = _level(obs[lead], offs, cross)
        groups.append({
            "group": g, "cell_name": name[lead], "tokens_per_s": mid, "low": lo, "high": hi,
            "repeats": sum(len(v) for v in obs[lead].values()), "peak_memory_bytes": peak.get(lead),
            "ties": [name[h] for h, e in judged.items() if e is not None and e.verdict != effects.SLOWER],
            "apart": [name[h] for h, e in judged.items() if e is None],
        })  # fmt: skip
    label = {r["block"]: r.get("block_label") or r["block"] for r in rows}
    return {"groups": groups, "effects": _answer_effects(measured, left, obs, cross, label), "offsets": offs}


def _level(s: blocks.Sample, offs: blocks.Offsets, cross: float) -> tuple[float, float, float]:
    """A cell's tokens/s with its 95% interval: on the reference block's scale where anchors tie its block to
    it, else as its own block measured it (as answer mode's console shows it)."""
    if set(s) & offs.tied:
        mean, var = blocks.level(s, offs, cross)
    else:
        mean, var = blocks.mean_var(s[max(s, key=lambda b: len(s[b]))])
    z = stats.normal_quantile(effects.CONF) * math.sqrt(var)
    return math.exp(mean - z), math.exp(mean), math.exp(mean + z)


def _answer_effects(measured: pd.DataFrame, left: pd.DataFrame, obs: dict, cross: float, label: dict) -> list[dict]:
    """Each knob value's effect over the pairs measured in one block, among the cells answer mode measured or
    left unmeasured (bench.judge.effects.knob_pairs, knob_effect), and the blocks those pairs ran in (label: a
    block's name in the report)."""
    if "answer_expected_error" in left:  # a cell expected to repeat an error is out of the search, as in answer mode
        left = left[left["answer_expected_error"].isna()]
    live = pd.concat([measured[measured["cell_hash"].isin(obs)], left]).drop_duplicates("cell_hash", keep="first")
    hashes = live["cell_hash"].tolist()
    feats = [effects.features(r) for r in records(live, [a for a in AXIS_NAMES if a in live])]
    out = []
    for axis, value, ref, idx in effects.knob_pairs(feats):
        pairs = [(obs.get(hashes[i], {}), obs.get(hashes[j], {})) for i, j in idx]
        short = AXIS_TABLE_BY_NAME[axis].short
        out.append({
            "axis": axis, "value": value, "reference": ref, "knob": f"{short}={value} vs {short}={ref}",
            "tokens": effects.knob_effect(pairs, cross),
            "blocks": sorted({str(label.get(b, b)) for r, v in pairs for b in set(r) & set(v)}),
        })  # fmt: skip
    return out


def _section(cells: pd.DataFrame, samples: dict, attempts: pd.DataFrame) -> Section:
    """One model at one sequence length: its headlines, what fits, its frontier and its knob effects."""
    first = cells.iloc[0]
    ok = cells[cells["status"] == Status.OK.value]
    # Unknown only for records of cells that did not run whose matrix file is not here (bench.judge.results).
    seq = None if fmt.missing(first["seq_len"]) else int(first["seq_len"])
    model = "model unknown" if fmt.missing(first["model"]) else str(first["model"])
    return Section(
        model=model,
        seq_len=seq,
        label=f"{model}, sequence length {seq:,}" if seq else f"{model} (its matrix file is not here)",
        slug=first["section"],
        cells=cells,
        ok=ok,
        fastest=(fastest := _pick(ok, "tokens_per_s", True)),
        smallest=_lighter(_pick(ok, "peak_memory_bytes", False), fastest),
        best_mfu=_best_mfu(ok),
        frontier=ok[ok["pareto"]].sort_values(["peak_memory_source", "peak_memory_bytes"], kind="stable"),
        peak_label=_peak_label(cells["peak_memory_source"]),
        capacity_label=_capacity(cells)[1],
        did_not_fit=cells[cells["status"].isin([Status.CUDA_OOM.value, Status.HOST_OOM.value])],
        implied=cells[cells["status"] == Status.IMPLIED_OOM.value],
        compute_metric=_compute_metric(ok),
        ablations=_ablations(cells, samples),
        answer=_answer(cells, attempts),
        failed=_by_cause(records(cells[~cells["status"].isin([*NOT_RUN, Status.OK.value])], _GROUP_FIELDS)),
    )


def _sections(cells: pd.DataFrame, samples: dict, df: pd.DataFrame) -> list[Section]:
    """Models in the order they first appear, each model's sequence lengths ascending (df: every attempt)."""
    models = {m: i for i, m in enumerate(dict.fromkeys(cells["model"].astype(str)))}
    order = cells.assign(_m=cells["model"].astype(str).map(models), _i=np.arange(len(cells)))
    order = order.sort_values(["_m", "seq_len", "_i"], kind="stable")
    slugs = list(dict.fromkeys(order["section"]))
    section_of = dict(zip(cells["cell_hash"], cells["section"]))
    attempt_section = df["cell_hash"].map(section_of)
    return [_section(cells[cells["section"] == s], samples, df[attempt_section == s]) for s in slugs]


def analyse(df: pd.DataFrame, *, title: str = "zerobench report", baseline: pd.DataFrame | None = None) -> Analysis:
    """Everything the reports show, computed once from `bench.judge.results.load()` output."""
    if df.empty:
        return _empty(title, baseline)
    # Only cells measured more than once have a distribution to summarise (and a 10k-row report of
    # single runs pays nothing for it).
    df = _with_block_labels(df)
    repeated = df["repeat"].fillna(1).groupby(df["cell_hash"]).transform("max") > 1 if "repeat" in df else None
    samples = compare.samples(_last_block(df[repeated])) if repeated is not None and repeated.any() else {}
    cells = _cells(df, samples)
    is_ok = cells["status"] == Status.OK.value
    rank = {s: i for i, s in enumerate(STATUS_ORDER)}
    counts = cells["status"].value_counts()
    failures = cells[~is_ok]
    failures = failures.iloc[
        np.argsort(failures["status"].map(lambda s: rank.get(s, len(rank))).to_numpy(), kind="stable")
    ]
    base, only = _baseline(cells, baseline) if baseline is not None else (None, [])
    return Analysis(
        title=title,
        attempts=int((~df["status"].isin(NOT_RUN)).sum()),
        banner=_banner(cells),
        cells=cells,
        sections=_sections(cells, samples, df),
        replayed=sorted(df["replay_source"].dropna().unique()) if "replay_source" in df else [],
        **_replay_counts(df),
        counts={s: int(counts[s]) for s in STATUS_ORDER + sorted(set(counts.index) - set(STATUS_ORDER)) if s in counts},
        pruned=int((cells["status"].eq(Status.SKIPPED.value) & cells["skip_rule"].eq(rules.PRUNED)).sum()),
        peak_label=_peak_label(cells["peak_memory_source"]),
        memory_columns=[m for m in MEMORY_VIEW if m[0] in cells and cells[m[0]].notna().any()],
        memory_phases=next(
            (m for m in MEMORY_PHASES if all(c in cells and cells[c].notna().any() for c in m[:2])), None
        ),
        compute_metric=_compute_metric(cells[is_ok]),
        loss_cells=_loss_cells(cells),
        failures=failures,
        zero_scaling=(zs := _zero_scaling(cells)),
        zero_figures=[(c, h) for c, h in ZERO_SCALING_FIGURES if any(r[c] is not None for r in zs)],
        loss_parity=_loss_parity(cells, samples),
        failure_groups=_failure_groups(failures),
        environment=_environment(cells, df),
        blocks=_blocks(df),
        baseline=base,
        baseline_only=only,
        notes=_notes(cells),
    )


TINY_PARAMS = 100e6
"""Below this many parameters a model is tiny: its step is overhead, not the math a real model's is."""


def _banner(cells: pd.DataFrame) -> str | None:
    """What the records that ran cannot say, when they come from a CPU (no GPU) or a tiny model."""
    ran = cells[~cells["status"].isin(NOT_RUN)]
    if ran.empty:
        return None
    cpu = "gpu_name" in ran and ran["gpu_name"].isna().all()
    params = pd.to_numeric(ran.get("params_total", pd.Series(dtype=float)), errors="coerce").dropna()
    tiny = not params.empty and params.max() < TINY_PARAMS
    if not (cpu or tiny):
        return None
    what = " and ".join(w for w, on in (("on a CPU", cpu), ("of a tiny model", tiny)) if on)
    size = f" ({_distinct(ran, 'model')}, at most {params.max() / 1e6:.1f}M parameters)" if tiny else ""
    return (
        f"These records come from runs {what}{size}: they show the harness working end to end. Their throughput, "
        "memory and knob effects are not what a GPU training a real model would show (a tiny step is mostly "
        "overhead; a CPU has no GPU memory and its timings are noisy), so the knob effects are folded away."
    )


def measured_first(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells table's order: the cells that ran first, then those that did not; each part in input order."""
    return cells.iloc[np.argsort(cells["status"].isin(NOT_RUN).to_numpy(), kind="stable")]


def _replay_counts(df: pd.DataFrame) -> dict[str, int]:
    """Of the attempts that ran, how many a replay served and how many ran anew (none replayed: both 0)."""
    if "replay_source" not in df or df["replay_source"].isna().all():
        return {}
    ran = ~df["status"].isin(NOT_RUN)
    replayed = df["replay_source"].notna()
    return {"replayed_attempts": int((ran & replayed).sum()), "measured_anew": int((ran & ~replayed).sum())}


def _notes(cells: pd.DataFrame) -> list[tuple[str, str]]:
    out = []
    if "warnings" in cells:
        out = [(n, w) for n, ws in zip(cells["cell_name"], cells["warnings"]) if isinstance(ws, list) for w in ws]
    if "flags" in cells:  # weaker evidence (bench.records.quality): the effects take its noise about three times wider
        out += [(n, f) for n, fs in zip(cells["cell_name"], cells["flags"]) if isinstance(fs, list) for f in fs]
    # Rows of the columns the notes read only: a 10k-row report spent seconds making dicts of every column.
    if "steps_ended" in cells:
        capped = cells["warmup_ended"].isin(_CAPS) | cells["steps_ended"].isin(_CAPS)
        rows = records(cells[capped], [c for c in cells if c in _CAP_FIELDS])
        out += [(r["cell_name"], note) for r in rows if (note := _cap_note(r))]
    return out + stale.notes(records(cells, [c for c in stale.FIELDS if c in cells]))


_CAPS = ("step cap", "time cap")
_CAP_FIELDS = frozenset(
    (
        "cell_name", "warmup_ended", "warmup_steps", "steps_ended", "step_time_half_width", "step_time_ci_level",
        "steps_tolerance", "steps_max_seconds", "measured_steps",
    )
)  # fmt: skip


def _cap_note(r: dict) -> str | None:
    """What an adaptive schedule's cap cut short (bench/records/adaptive.py), from the record's `steps`."""
    parts = []
    w, ended = r.get("warmup_ended"), r.get("steps_ended")
    if w in _CAPS:
        parts.append(f"warmup ended at the {w} after {int(r['warmup_steps'])} steps without step time settling")
    if ended in _CAPS:
        half, level, tol = r.get("step_time_half_width"), r.get("step_time_ci_level"), r.get("steps_tolerance")
        cap = f" ({r['steps_max_seconds']:g} s)" if ended == "time cap" and _num(r.get("steps_max_seconds")) else ""
        iv = f"±{half:.1%} at {level:.0%}" if _num(half) and _num(level) else "no interval"
        parts.append(
            f"measurement ended at the {ended}{cap} after {int(r['measured_steps'])} steps, the median step time "
            f"known to {iv}" + (f", not the {tol:.0%} asked" if _num(tol) else "")
        )
    return "; ".join(parts) or None


def _num(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))
