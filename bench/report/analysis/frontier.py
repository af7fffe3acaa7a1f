"""A section's best cells: the tokens/s-memory frontier, the fastest, the smallest, the best MFU."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...judge import effects


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
