"""`zerobench selfcheck`: each cell beside a hand-written DeepSpeed loop and without telemetry."""
from __future__ import annotations

import pytest

from bench.store import read

from .conftest import TINY, write_matrix, zerobench

pytestmark = pytest.mark.slow


def test_three_variants_recorded_and_compared(tmp_path):
    m = write_matrix(tmp_path / "m.yaml", TINY + "axes: {zero_stage: [2]}\n")
    res = tmp_path / "sc.jsonl"
    r = zerobench("selfcheck", str(m), "--results", str(res), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = read(res)
    assert [x["variant"] for x in recs] == ["reference", "zerobench", "no-telemetry"]
    assert all(x["status"] == "ok" and x["metrics"]["step_time_median_s"] > 0 for x in recs), [x["reason"] for x in recs]
    # Same cell, same steps: the yardstick timed as many steps as the worker.
    assert len(recs[0]["step_times_s"]) == len(recs[1]["step_times_s"]) == 5
    assert recs[1]["telemetry"]["samples"] > 0 and recs[2]["telemetry"]["samples"] == 0
    assert "step time vs hand-written loop:" in r.stdout and "telemetry cost:" in r.stdout
    assert "fixed per-cell cost beyond model build:" in r.stdout
