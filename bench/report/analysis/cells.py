"""The cells table: each cell's latest attempt with what the sections read of it (its PEFT variant, section,
frontier flag, capacity, the memory outside the allocator, its repeats' spread), and the memory views."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from ... import stats
from ...judge import compare, effects
from ...judge.results import latest
from ...matrix.axes import peft_variant
from ...records.status import Status
from .frontier import _pareto
from .values import records

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
