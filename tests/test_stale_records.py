"""Reports mark records made by code older than a fix that changes what they measure (bench.report.stale)."""

from __future__ import annotations

from pathlib import Path

from bench.report import stale
from bench.report.analysis import analyse
from bench.results import load

ROOT = Path(__file__).resolve().parent.parent


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
