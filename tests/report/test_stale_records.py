"""Reports mark records made by code older than a fix that changes what they measure (bench.report.stale)."""

from __future__ import annotations

from pathlib import Path

from bench.judge.results import load
from bench.report import stale
from bench.report.analysis import analyse

ROOT = Path(__file__).resolve().parents[2]


def test_zero3_records_made_before_the_same_start_fix_are_marked():
    df = load(str(ROOT / "results" / "1b.jsonl"))
    rows = df.to_dict("records")
    flagged = stale.notes(rows)
    z3_ran = [r for r in rows if r["zero_stage"] == 3 and r["status"] == "ok"]
    assert z3_ran and len(flagged) >= len(z3_ran)
    assert all("zero=3" in name and "same initial weights" in note for name, note in flagged)
    assert all("loss_first" in note for _, note in flagged)
    # The report shows them among its notes.
    assert any("same initial weights" in note for _, note in analyse(df).notes)


def test_a_record_that_says_how_its_weights_were_made_is_not_marked():
    row = {"cell_name": "zero=3", "status": "ok", "zero_stage": 3, "model": "llama-1b"}
    assert stale.notes([row]) and not stale.notes([{**row, "weights_init": "seeded-per-name"}])
    assert not stale.notes([{**row, "zero_stage": 2}])


class _OnlyFields(dict):
    """A results row that fails on any column outside stale.FIELDS, the columns the report hands the fixes."""

    def _check(self, k):
        assert k in stale.FIELDS, f"a fix reads {k!r}, which stale.FIELDS does not list: the report would not pass it"

    def get(self, k, default=None):
        self._check(k)
        return super().get(k, default)

    def __getitem__(self, k):
        self._check(k)
        return super().__getitem__(k)


def test_every_fix_reads_only_the_columns_stale_fields_lists():
    values = {
        "status": ("ok", "skipped"),
        "zero_stage": (2, 3),
        "weights_init": (None, "seeded-per-name", "seeded-per-name-cuda"),
        "model": ("llama-1b", "/models/llama"),
        "engine": ("deepspeed", "hf_trainer"),
        "gpu_name": (None, "NVIDIA H200"),
    }
    rows = [_OnlyFields(cell_name="c")]
    for k, vs in values.items():  # every combination: each test of each fix is reached
        rows = [_OnlyFields(r, **{k: v}) for r in rows for v in vs]
    flagged = {name for name, _ in stale.notes(rows)}
    assert flagged == {"c"} and len(stale.notes(rows)) > len(stale.FIXES)
