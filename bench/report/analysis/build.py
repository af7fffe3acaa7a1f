"""analyse(): a results frame's Analysis, each section's part from its module."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...judge import compare
from ...judge.results import latest
from ...matrix import rules
from ...records.status import Status
from .. import fmt
from .ablations import _ablations
from .answer import _answer
from .blocks import _blocks, _last_block, _with_block_labels
from .cells import MEMORY_PHASES, MEMORY_VIEW, _capacity, _cells, _loss_cells, _peak_label
from .failures import _GROUP_FIELDS, _by_cause, _failure_groups
from .frontier import _best_mfu, _compute_metric, _lighter, _pick
from .notes import _banner, _environment, _notes, _replay_counts
from .values import NOT_RUN, STATUS_ORDER, Analysis, Section, records
from .zero import ZERO_SCALING_FIGURES, _loss_parity, _zero_scaling


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
