"""What the report says, as values: the Analysis, a Section per model and sequence length, an Ablation per
knob; the statuses in the order the report lists them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...matrix.axes import AXES as AXIS_TABLE
from ...records.status import Status

STATUS_ORDER = [s.value for s in Status if s is not Status.STARTED]

AXIS_NAMES = [a.name for a in AXIS_TABLE]

NOT_RUN = [s.value for s in Status if not s.ran]
"""Statuses of cells that never ran: skipped (a rule, or pruned by the memory model) and implied_oom."""


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


def records(frame: pd.DataFrame, cols: list[str]) -> list[dict]:
    """frame[cols].to_dict("records") in a third of the time (a dict per row over 10k rows adds up)."""
    return [dict(zip(cols, row)) for row in zip(*(frame[c].tolist() for c in cols))]


def measured_first(cells: pd.DataFrame) -> pd.DataFrame:
    """The cells table's order: the cells that ran first, then those that did not; each part in input order."""
    return cells.iloc[np.argsort(cells["status"].isin(NOT_RUN).to_numpy(), kind="stable")]
