"""What the report says beside its tables: the machine and stack, a banner for CPU or tiny-model records,
replayed records, and cells whose measurement is less clean than their status."""

from __future__ import annotations

import math

import pandas as pd

from ...judge import compare
from .. import stale
from .values import NOT_RUN, Analysis, records

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
