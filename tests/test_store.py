"""Append-only results: torn last lines are tolerated and sealed; resume state is derived from records."""
from __future__ import annotations

from bench.store import Store, read


def test_torn_last_line(tmp_path):
    p = tmp_path / "r.jsonl"
    s = Store(p)
    s.append({"cell_hash": "a", "status": "ok"})
    with open(p, "a") as f:
        f.write('{"cell_hash": "b", "sta')  # a run killed mid-write
    assert [r["cell_hash"] for r in read(p)] == ["a"]
    s.append({"cell_hash": "c", "status": "ok"})
    assert [r["cell_hash"] for r in read(p)] == ["a", "c"]
    assert p.read_text().count("\n") == 3


def test_resume_state(tmp_path):
    s = Store(tmp_path / "r.jsonl")
    for rec in [("a", "started"), ("a", "ok"), ("b", "started"), ("c", "skipped"), ("d", "started"),
                ("d", "interrupted")]:
        s.append({"cell_hash": rec[0], "status": rec[1], "run_id": "r1"})
    done, stale = s.resume_state()
    assert done == {"a", "c"}
    assert [r["cell_hash"] for r in stale] == ["b"]
