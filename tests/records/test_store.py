"""Append-only results: torn last lines are tolerated and sealed; lines that are not records are skipped
and named; resume state is derived from records; one run holds a results file at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.matrix.cells import Cell
from bench.records.record import Record
from bench.records.store import InputError, ResultsInUse, Store, StoreWriteError
from tests.conftest import as_written

AT = "2026-01-01T00:00:00.000+00:00"


def cell(n: int) -> Cell:
    return Cell(model="llama-tiny", seq_len=32 + 8 * n, micro_batch=2, warmup_steps=1, measured_steps=2, matrix="t")


def started(n: int, run_id: str = "r1") -> Record:
    return Record.started(cell(n), run_id=run_id, attempt=1, matrix_file="", started_at=AT)


def test_torn_last_line(tmp_path):
    p = tmp_path / "r.jsonl"
    s = Store(p)
    s.append(started(0))
    with open(p, "a") as f:
        f.write('{"cell_hash": "b", "sta')  # a run killed mid-write
    assert [r["cell_hash"] for r in as_written(p)] == [cell(0).hash]
    s.append(started(2))
    assert [r["cell_hash"] for r in as_written(p)] == [cell(0).hash, cell(2).hash]
    assert p.read_text().count("\n") == 3


def test_foreign_lines_are_skipped_and_named(tmp_path, capsys):
    p = tmp_path / "r.jsonl"
    Store(p).append(started(0))
    odd = started(1).to_dict() | {"status": "passed"}
    with open(p, "a") as f:
        f.write('{"hello": "world"}\n[1, 2]\n' + json.dumps(odd) + "\n")
    Store(p).append(started(2))
    assert [r["cell_hash"] for r in as_written(p)] == [cell(0).hash, cell(2).hash]
    err = capsys.readouterr().err
    assert "3 lines not zerobench records" in err
    assert "line 2 (" in err and "line 3 (a JSON list" in err and "line 4 (status" in err


def test_fields_are_read_as_typed(tmp_path, capsys):
    """A field a hand edit wrote as "2" is 2 once read; a cell field that is no value of its type is foreign."""
    p = tmp_path / "r.jsonl"
    bad_cell = started(1).to_dict()
    bad_cell["cell"]["lora"] = 5
    p.write_text(json.dumps(started(0).to_dict() | {"attempt": "2"}) + "\n" + json.dumps(bad_cell) + "\n")
    recs = as_written(p)
    assert len(recs) == 1 and recs[0]["attempt"] == 2
    assert "line 2 (cell.lora" in capsys.readouterr().err


def test_resume_state(tmp_path):
    s = Store(tmp_path / "r.jsonl")
    a, b, c, d = (started(n) for n in range(4))
    for rec in [
        a,
        a._end("ok", "", ended_at=AT),
        b,
        c._end("skipped", "", ended_at=AT),
        d,
        Record.interrupted(d, "stopped", ended_at=AT),
    ]:
        s.append(rec)
    done, stale = s.resume_state()
    # A skip is no attempt: the resumed call's plan judges cell 2 again.
    assert done == {(cell(0).hash, 1)}
    assert [r.cell_hash for r in stale] == [cell(1).hash]


def test_resume_state_counts_repeats(tmp_path):
    """Each repeat of a cell is its own unit of work: two of three done leaves the third to run."""
    s = Store(tmp_path / "r.jsonl")
    for n, rep, st in [
        (0, 1, "started"),
        (0, 1, "ok"),
        (0, 2, "started"),
        (0, 2, "ok"),
        (0, 3, "started"),  # killed here
        (1, 1, "started"),
        (1, 1, "cuda_oom"),
    ]:
        start = Record.started(cell(n), run_id="r1", attempt=rep, matrix_file="", started_at=AT, repeat=rep)
        s.append(start if st == "started" else start._end(st, "", ended_at=AT))
    done, stale = s.resume_state()
    assert done == {(cell(0).hash, 1), (cell(0).hash, 2), (cell(1).hash, 1)}
    assert [(r.cell_hash, r.repeat) for r in stale] == [(cell(0).hash, 3)]


def test_one_holder_at_a_time(tmp_path):
    s = Store(tmp_path / "r.jsonl")
    with s.hold("first"):
        lock = tmp_path / "r.jsonl.lock"
        assert json.loads(lock.read_text())["what"] == "first"
        with pytest.raises(ResultsInUse, match=r"r.jsonl is in use by pid \d+ \(first, started at "):
            with Store(tmp_path / "r.jsonl").hold("second"):
                pass
    assert not lock.exists(), "the lock file is removed with the lock"
    with s.hold("third"):
        pass


def test_a_gzipped_results_file_reads_as_its_lines(tmp_path):
    import gzip

    from bench.records.store import read_records

    src = Path("results/compare-h200-a1.jsonl")
    plain = list(read_records(src))
    gz = tmp_path / "a1.jsonl.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    assert [r.cell_id for r in read_records(gz)] == [r.cell_id for r in plain] and plain
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gz.read_bytes()[:100])
    with pytest.raises(InputError, match="gzip"):
        list(read_records(cut))


def test_a_results_file_deleted_mid_run_lets_no_two_runs_write_one_file(tmp_path):
    """The run writes through the descriptor it locked: once its file is deleted (and a second run takes the
    name), its next record is refused with why, never appended to the second run's file beside that run's."""
    path = tmp_path / "r.jsonl"
    first = Store(path)
    with first.hold("first"):
        first.append(started(0, "first"))
        path.unlink()
        second = Store(path)
        with second.hold("second"):
            second.append(started(1, "second"))
            with pytest.raises(StoreWriteError, match=r"r.jsonl no longer names the file this run holds"):
                first.append(started(2, "first"))
            second.append(started(3, "second"))
    assert [r["run_id"] for r in as_written(path)] == ["second", "second"]


def test_a_held_results_file_is_written_through_one_descriptor(tmp_path):
    """While held, appends reuse the locked descriptor (no open per record); the file still reads whole."""
    s = Store(tmp_path / "r.jsonl")
    with s.hold("run"):
        for n in range(3):
            s.append(started(n))
        with open(tmp_path / "r.jsonl", "a") as f:
            f.write('{"torn')  # a line cut short: sealed before the next record
        s.append(started(3))
    assert len(as_written(tmp_path / "r.jsonl", warn=False)) == 4


def test_a_record_repeated_byte_for_byte_is_one_attempt_and_named(tmp_path, capsys):
    """A file appended to itself many times: each repeat of a line is the same attempt, skipped with one warning;
    the file is read a line at a time (reading it whole held it three times over: bytes, text, lines)."""
    import tracemalloc

    lines = (Path(__file__).parent.parent / "data" / "smoke_cpu.jsonl").read_text().splitlines(keepends=True)
    path = tmp_path / "r.jsonl"
    with path.open("w") as f:
        f.writelines(lines)
        for _ in range(1500):
            f.writelines(lines[:4])  # some 6,000 repeated lines, 10 MB
    assert path.stat().st_size > 8 * 2**20
    tracemalloc.start()
    try:
        got = as_written(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(got) == len(lines)
    err = capsys.readouterr().err
    assert f"skipping 6,000 lines that repeat an earlier record byte for byte (lines {len(lines) + 1}, " in err, err
    assert peak < 4 * 2**20, peak


def test_a_gzipped_results_file_is_never_appended_to(tmp_path):
    import gzip

    from bench.records.store import check_writable

    gz = tmp_path / "r.jsonl.gz"
    gz.write_bytes(gzip.compress(json.dumps(started(0, "first").to_dict()).encode() + b"\n"))
    before = gz.read_bytes()
    with pytest.raises(InputError, match="gzip-compressed"):
        check_writable(gz)
    with pytest.raises(InputError, match="gzip-compressed"):
        with Store(gz).hold("second"):
            pass
    assert gz.read_bytes() == before
