"""`zerobench export --wandb`: one real W&B run per cell, written offline (no network), read back from
W&B's own run files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import wandb_files
from tests.conftest import as_written, zerobench

pytest.importorskip("wandb", reason="the W&B export's test needs wandb (in the test extra)")
DATA = Path(__file__).parent.parent / "data"


def test_export_writes_one_run_per_cell(tmp_path):
    recs = [json.loads(x) for x in (DATA / "synthetic_gpu.jsonl").read_text().splitlines() if x.strip()]
    picked = [r for r in recs if r["status"] == "ok"][:2] + [r for r in recs if r["status"] == "cuda_oom"][:1]
    res = tmp_path / "r.jsonl"
    res.write_text("".join(json.dumps(r) + "\n" for r in picked))
    r = zerobench(
        "export",
        "--wandb",
        str(res),
        "--dir",
        str(tmp_path / "wb"),
        "--project",
        "zb-test",
        cwd=tmp_path,
        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"},
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "3 runs logged" in r.stdout
    runs = {
        x["name"]: x for x in map(wandb_files.run, sorted((tmp_path / "wb").glob("wandb/offline-run-*/run-*.wandb")))
    }
    assert set(runs) == {rec["cell_name"] for rec in picked}
    for rec in picked:
        got = runs[rec["cell_name"]]
        assert got["group"] == rec["matrix"] and got["job_type"] == rec["run_id"] and got["tags"] == [rec["status"]]
        cfg = got["config"]
        assert cfg["zero_stage"] == rec["cell"]["zero_stage"] and cfg["optimizer"] == rec["cell"]["optimizer"]
        assert cfg["cell_hash"] == rec["cell_hash"] and cfg["ds_config"] == rec.get("ds_config")
        assert got["summary"]["status"] == rec["status"] and got["summary"]["reason"] == rec["reason"]
        if rec["status"] == "ok":
            assert [h["loss"] for h in got["history"]] == pytest.approx(rec["losses"])
            assert [h["step_time_s"] for h in got["history"]] == pytest.approx(rec["step_times_s"])
            assert got["summary"]["tokens_per_s"] == pytest.approx(rec["metrics"]["tokens_per_s"])
            assert got["summary"]["memory.nvml_proc_peak_bytes"] == rec["memory"]["nvml_proc_peak_bytes"]
        else:
            assert got["history"] == [] or all("loss" not in h for h in got["history"])


def test_export_without_results_file_says_so(tmp_path):
    r = zerobench("export", "--wandb", str(tmp_path / "nope.jsonl"), cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and "no such results file" in r.stderr


@pytest.mark.slow
def test_run_logs_each_cell_live(tmp_path):
    from tests.conftest import TINY, write_matrix

    m = write_matrix(tmp_path / "m.yaml", TINY + "axes: {zero_stage: [0, 1]}\n")
    res = tmp_path / "r.jsonl"
    r = zerobench(
        "run",
        str(m),
        "--results",
        str(res),
        "--no-report",
        "--wandb",
        "--wandb-dir",
        str(tmp_path / "wb"),
        cwd=tmp_path,
        env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [x for x in as_written(res) if x["status"] != "started"]
    runs = {
        x["name"]: x for x in map(wandb_files.run, sorted((tmp_path / "wb").glob("wandb/offline-run-*/run-*.wandb")))
    }
    assert set(runs) == {x["cell_name"] for x in recs} and len(runs) == 2
    for rec in recs:
        assert rec["status"] == "ok", rec["reason"]
        assert [h["loss"] for h in runs[rec["cell_name"]]["history"]] == pytest.approx(rec["losses"])
