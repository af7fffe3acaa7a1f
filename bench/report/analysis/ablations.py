"""A section's one-knob tables: cells that differ only in one axis, side by side, and each knob's effect over
their pairs (bench.judge.effects, by `zerobench compare`'s rule)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd

from ...judge import compare, effects
from ...judge.results import PEAK_MEMORY_SOURCES
from ...records.status import Status
from .. import fmt
from .knobs import _FIXED, AXES, _context_labels, _held_equal, _ordered
from .values import NOT_RUN, Ablation

MAX_ABLATION_GROUPS = 30  # per axis; the effect summary still uses every group

_CELL_FIELDS = ["cell_name", "cell_hash", "status", "reason", "tokens_per_s", "peak_memory_bytes"]

# What _effects reads of a cell besides its axis (the last two where results carry them).
_EFFECT_FIELDS = [
    "tokens_per_s", "tokens_log_se", "noise_sd", "peak_memory_bytes", "peak_memory_source", "cell_hash", "variant",
    "loss_final", "params_trainable", "block_label", "losses",
]  # fmt: skip


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
