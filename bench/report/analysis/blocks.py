"""The blocks the measurements came from (one run part on one machine) and the anchors that tie them."""

from __future__ import annotations

import math

import pandas as pd

from ... import stats
from ...judge import blocks, effects
from ...records import quality
from ...records.status import Status
from .values import NOT_RUN, records

BLOCKS_NOTE = (
    "A block is one run part (one `zerobench run`) on one machine (the GPUs' UUIDs, the host's boot id and name, its "
    "CPU). Cells compare directly only within a block: machines differ in speed as a whole (blocks of the committed "
    "H200 records by up to 13% over the cells they share), so knob effects pair cells of one block, and blocks are "
    "compared through anchors, cells measured in both (their speed below, at 95%). A block no anchor ties is "
    "compared with none."
)


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
