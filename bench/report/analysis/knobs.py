"""The knobs a report varies one at a time, the settings held equal beside them, and their values' order."""

from __future__ import annotations

import pandas as pd

from ...matrix.axes import SHOWN

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


# PEFT settings (axes with a block) and peft_variant describe one adapter: comparing PEFT variants holds
# none of the settings equal (peft: none has none; alpha was never held equal there), and comparing one
# setting holds peft equal, not the variant (whose name carries the rank and quantization).
_PEFT_SETTINGS = {a.name for a in SHOWN if a.block}


def _held_equal(cols: list[str], axis: str) -> list[str]:
    """The columns that must match for two cells to differ only in `axis`."""
    if axis == "peft_variant":
        return [c for c in cols if c != axis and c not in _PEFT_SETTINGS]
    if axis in _PEFT_SETTINGS:
        return [c for c in cols if c not in (axis, "peft_variant")] + ["peft"]
    return [c for c in cols if c != axis]
