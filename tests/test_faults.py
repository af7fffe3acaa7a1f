"""Fault injection into a real worker: each way a cell can end is classified right, and the
orchestrator carries on with the next cell."""
from __future__ import annotations

import pytest

from bench.store import read

from .conftest import TINY, write_matrix, zerobench

pytestmark = pytest.mark.slow


def _run(tmp_path, fault: str, extra: str = "", env: dict | None = None) -> dict:
    m = write_matrix(tmp_path / "f.yaml", TINY.replace("timeout_s: 600", "timeout_s: 90") + extra)
    res = tmp_path / f"{fault}.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path,
                  env={"ZEROBENCH_FAULT": fault, **(env or {})})
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [x for x in read(res) if x["status"] != "started"]
    assert len(recs) == 1
    return recs[0]


def test_hang_is_a_timeout_by_watchdog(tmp_path):
    rec = _run(tmp_path, "hang@2", env={"ZEROBENCH_STALL_S": "8"})
    assert rec["status"] == "timeout"
    assert "no progress" in rec["reason"] and "after step 1" in rec["reason"]
    assert rec["wall_s"] < 80


def test_wall_clock_timeout(tmp_path):
    m = TINY.replace("timeout_s: 600", "timeout_s: 12")
    mf = write_matrix(tmp_path / "t.yaml", m)
    r = zerobench("run", str(mf), "--results", str(tmp_path / "t.jsonl"), "--no-report", cwd=tmp_path,
                  env={"ZEROBENCH_FAULT": "hang@1"})
    assert r.returncode == 0
    rec = [x for x in read(tmp_path / "t.jsonl") if x["status"] != "started"][0]
    assert rec["status"] == "timeout" and "12 s limit" in rec["reason"]


def test_sigkill_from_outside_is_host_oom(tmp_path):
    rec = _run(tmp_path, "sigkill@1")
    assert rec["status"] == "host_oom"
    assert "not by zerobench" in rec["reason"] and rec["exit_code"] == -9


def test_exception_is_error_with_reason(tmp_path):
    rec = _run(tmp_path, "raise@1")
    assert rec["status"] == "error"
    assert "RuntimeError in phase measured: injected fault" in rec["reason"]
    assert "injected fault" in rec["traceback"]


def test_nan_loss_is_diverged(tmp_path):
    rec = _run(tmp_path, "nan@2")
    assert rec["status"] == "diverged" and "loss became nan at step 2" in rec["reason"]


def test_exit_without_result(tmp_path):
    rec = _run(tmp_path, "exit@1")
    assert rec["status"] == "error" and "exited with code 3 without a result" in rec["reason"]


def test_matrix_continues_after_failures(tmp_path):
    m = write_matrix(tmp_path / "c.yaml", TINY + "axes: {zero_stage: [0, 1]}\n")
    res = tmp_path / "c.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path, env={"ZEROBENCH_FAULT": "raise@1"})
    assert r.returncode == 0
    assert [x["status"] for x in read(res) if x["status"] != "started"] == ["error", "error"]
    r = zerobench("run", str(m), "--results", str(res), "--no-report", "--strict", cwd=tmp_path,
                  env={"ZEROBENCH_FAULT": "raise@1"})
    assert r.returncode == 1, "--strict fails a CI job when a cell failed"
