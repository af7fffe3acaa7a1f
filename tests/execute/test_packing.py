"""Packing on one host, end to end with real tiny DeepSpeed cells: on a CPU host `--gpus-available 2` is two
slots, so two cells run side by side as two single-GPU cells would on a 2-GPU host.

A SIGINT while two cells step stops both (each recorded interrupted, whole, once), and a --resume runs
the rest side by side: every cell ends with one outcome, cells overlap in time, on disjoint slots and
distinct ports, and each names the other as its neighbour."""

from __future__ import annotations

import datetime as dt
import json
import signal
from pathlib import Path

import pytest

from tests.conftest import TINY, write_matrix
from tests.faults.procs import Run, attempt_dirs, env, wait_for

pytestmark = pytest.mark.slow

# Long enough (a few seconds of steps each) for a signal to land while two cells step.
MATRIX = TINY.replace("measured: 4", "measured: 40") + "axes: {zero_stage: [0, 1, 2, 3], precision: [fp32]}\n"


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _stepping(tmp: Path) -> int:
    n = 0
    for d in attempt_dirs(tmp):
        try:
            n += '"warmup"' in (d / "events.jsonl").read_text()
        except OSError:
            pass
    return n


def _t(s: str) -> float:
    return dt.datetime.fromisoformat(s).timestamp()


def test_two_slots_stop_both_cells_on_sigint_then_resume_runs_the_rest_side_by_side(tmp_path):
    m = write_matrix(tmp_path / "pack.yaml", MATRIX)
    res = tmp_path / "pack.jsonl"
    args = [str(m), "--results", str(res), "--gpus-available", "2", "--no-progress", "--no-report"]

    first = Run(args, tmp_path, env(tmp_path / "tmp1"), tmp_path / "out1.txt").start()
    both = wait_for(lambda: _stepping(tmp_path / "tmp1") >= 2 or first.proc.poll() is not None, 900)
    assert both and first.proc.poll() is None, first.output[-3000:]
    first.signal(signal.SIGINT)
    assert first.wait(120) == 130, first.output[-3000:]
    assert first.leftovers(10.0) == []
    assert attempt_dirs(tmp_path / "tmp1") == []
    recs = _records(res)
    ends = [r for r in recs if r["status"] != "started"]
    stopped = [r for r in ends if r["status"] == "interrupted"]
    assert len(stopped) == 2, [(r["cell_name"], r["status"], r["reason"]) for r in recs]
    assert all(r["reason"] == "stopped by the user (SIGINT)" for r in stopped)
    # Every start of this run has its one end (no attempt left open for --resume to find).
    starts = [r for r in recs if r["status"] == "started"]
    assert sorted((r["cell_hash"], r["attempt"]) for r in starts) == sorted(
        (r["cell_hash"], r["attempt"]) for r in ends
    )
    assert sorted(r["placement"]["cpu_slots"] for r in stopped) == [[0], [1]]

    second = Run([*args, "--resume"], tmp_path, env(tmp_path / "tmp2"), tmp_path / "out2.txt").start()
    assert second.wait(1200) == 0, second.output[-3000:]
    recs = _records(res)
    outcomes = [r for r in recs if r["status"] not in ("started", "interrupted")]
    assert sorted(r["cell"]["zero_stage"] for r in outcomes) == [0, 1, 2, 3], [
        (r["cell_name"], r["status"]) for r in recs
    ]
    assert all(r["status"] == "ok" for r in outcomes), [(r["cell_name"], r["reason"]) for r in outcomes]
    assert "packing: up to 2 cells side by side on CPU slots [0, 1]" in second.output
    pairs = [
        (a, b)
        for i, a in enumerate(outcomes)
        for b in outcomes[i + 1 :]
        if _t(a["started_at"]) < _t(b["ended_at"]) and _t(b["started_at"]) < _t(a["ended_at"])
    ]
    assert pairs, "no two cells ran at the same time"
    for a, b in pairs:
        pa, pb = a["placement"], b["placement"]
        assert pa["port"] != pb["port"] and not set(pa["cpu_slots"]) & set(pb["cpu_slots"])
    # Measured phases overlapped somewhere: at least one cell names another as its neighbour, and only
    # cells that were running then.
    beside = {r["cell_hash"]: r["placement"]["beside"] for r in outcomes}
    assert any(beside.values()), beside
    for h, others in beside.items():
        assert h not in others and set(others) <= set(beside)
