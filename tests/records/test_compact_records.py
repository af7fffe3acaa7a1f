"""Records of cells that did not run (skipped, implied_oom, unmeasured) are compact: the cell by id and why it
did not run, nothing the matrix says; their settings come back from the matrix file; an answer run's
unmeasured record is written once per cell, not again by each --resume; old files read as they did."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from bench.cli import main as cli
from bench.judge import results
from bench.matrix import cells, rules, spec
from bench.records import record
from bench.records.record import SCHEMA_VERSION, Record
from bench.records.store import Store
from tests.conftest import as_written

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "schema" / f"record-v{SCHEMA_VERSION}.schema.json"
CELL = cells.Cell(
    model="llama-tiny", seq_len=32, micro_batch=2, grad_accum=1, warmup_steps=1, measured_steps=2, matrix="t"
)
IDENT = {"run_id": "r1", "attempt": 1, "matrix_file": "t.yaml"}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _schema_valid(d: dict) -> None:
    jsonschema.validate(d, json.loads(SCHEMA_FILE.read_text()))


def test_records_of_cells_that_did_not_run_are_compact(tmp_path):
    """A skipped, implied or unmeasured cell's record names the cell and says why, nothing the matrix says (its
    settings), no provenance (nothing ran); cell_name and cell_hash are read back from cell_id."""
    at = {"at": "2026-01-01T00:00:00.000+00:00", **IDENT}
    skip = rules.Skip(rule="r", reason="no", fix="do", source="src")
    pred = {"gpu_bytes": 9, "host_bytes": 1, "terms": {"weights": 9}, "gpu_memory_bytes": 8, "gpu_verdict": "won't fit"}
    by = {"cell_name": "x", "cell_hash": "0123456789", "status": "cuda_oom", "how": "mb=4 vs 2"}
    note = {"why": "not needed", "needed": False, "predicted_tokens_per_s": [1234.5678, 2345.6789, 3456.789]}
    recs = [
        Record.skipped(CELL, skip, **at),
        Record.skipped(CELL, skip, predicted=pred, **at),
        Record.implied_oom(CELL, by, **at),
        Record.unmeasured(CELL, note, **at),
    ]
    store = Store(tmp_path / "r.jsonl")
    for r in recs:
        store.append(r)
    lines = _lines(tmp_path / "r.jsonl")
    ident = {
        "schema_version",
        "run_id",
        "attempt",
        "matrix",
        "matrix_file",
        "cell_id",
        "status",
        "reason",
        "started_at",
    }
    assert [set(x) - ident for x in lines] == [{"skip"}, {"skip", "predicted"}, {"implied_by"}, {"answer"}]
    assert lines[0]["skip"] == {"rule": "r"} and lines[0]["reason"] == "no", "the rule's id and reason, said once"
    assert lines[1]["predicted"] == {"gpu_bytes": 9, "host_bytes": 1, "gpu_memory_bytes": 8, "gpu_verdict": "won't fit"}
    assert lines[3]["answer"]["predicted_tokens_per_s"] == [1235.0, 2346.0, 3457.0]
    back = as_written(tmp_path / "r.jsonl")
    assert [(b["cell_name"], b["cell_hash"]) for b in back] == [(CELL.name, CELL.hash)] * 4
    for d, r in zip(back, recs):
        _schema_valid(d)
        assert record.parse(d) == r
    assert max(len(json.dumps(x)) for x in lines[:3]) < 500


def test_a_compact_record_gets_its_cell_from_the_matrix_file(tmp_path):
    from bench.matrix import spec

    m = tmp_path / "m.yaml"
    m.write_text("name: t\nmodel: llama-tiny\nseq_len: 32\naxes: {zero_stage: [0, 1]}\n")
    cell = spec.expand(spec.load(str(m)))[1]
    skip = rules.Skip(rule="cpuadam-needs-offload", reason="no", fix="do", source="src")
    rec = Record.skipped(cell, skip, at="2026-01-01T00:00:00.000+00:00", run_id="r", attempt=1, matrix_file="m.yaml")
    Store(tmp_path / "results" / "r.jsonl").append(rec)
    (row,) = results.load(tmp_path / "results" / "r.jsonl").to_dict("records")  # m.yaml: beside results/
    assert (row["zero_stage"], row["model"], row["seq_len"]) == (1, "llama-tiny", 32)
    fix = next(r.fix for r in rules.RULES if r.name == "cpuadam-needs-offload")
    assert row["skip_fix"] == fix, "a compact skip's fix is its rule's"
    m.unlink()
    (row,) = results.load(tmp_path / "results" / "r.jsonl").to_dict("records")
    assert row["cell_name"] == cell.name and row["model"] is None, "no matrix file: settings unknown, not defaults"


def test_an_unmeasured_record_is_written_once_per_cell_across_resumed_calls(tmp_path):
    out = tmp_path / "r.jsonl"
    files = ["results/1b.jsonl", "results/1b-rerun.jsonl", "results/1b-paramoffload.jsonl"]
    args = ["run", "matrices/1b.yaml", "--answer", "--replay", *files, "--results", str(out), "--no-report"]
    assert cli([*args, "--no-progress"]) == 0
    first = [r for r in _lines(out) if r["status"] == "unmeasured"]
    assert first
    assert cli([*args, "--no-progress", "--resume"]) == 0
    again = [r for r in _lines(out) if r["status"] == "unmeasured"]
    assert len(again) == len(first), "a second call leaves each unmeasured cell's record as it is"


def test_committed_v2_records_read_as_they_did():
    # results/7b-answer-h200.jsonl was written at version 2: every line reads, whole.
    recs = as_written(ROOT / "results" / "7b-answer-h200.jsonl")
    assert len(recs) == 130 and all(r["cell"] and r["provenance"] for r in recs)
    assert record.upgrade({"schema_version": 2, "x": 1}) == {"schema_version": SCHEMA_VERSION, "x": 1}


@pytest.mark.slow  # runs nothing, but writes a record a cell, one fsync at a time
def test_the_7b_answer_replayed_writes_under_3_mb_a_4320_cells_and_its_report_leads_with_the_failures(tmp_path):
    out = tmp_path / "replay.jsonl"
    args = ["run", "matrices/7b.yaml", "--executor", "replay", "--replay", "results/7b-answer-h200.jsonl", "--answer"]
    assert cli([*args, "--results", str(out), "--report", str(tmp_path / "replay"), "--no-progress"]) == 0
    # The bar was 3 MiB for the 7b matrix's 4,320 cells (the uncompacted file: 19.6 MB); the matrix now searches
    # three micro-batches, so the bar is per cell: 728 bytes.
    cells = len(spec.expand(spec.load("matrices/7b.yaml")))
    assert cells == 12960 and out.stat().st_size <= 3 * 2**20 * cells / 4320, out.stat().st_size
    # The first screens: the counts, the verdict, the blocks, the answer, then what failed.
    screen = (tmp_path / "replay.md").read_text().splitlines()[:50]
    assert "## What failed" in screen and any(ln.startswith("| error | ") for ln in screen)
