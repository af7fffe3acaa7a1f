"""User DeepSpeed configs as cells: checked before anything runs, labeled by what they configure."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT, TINY, as_written, write_matrix, zerobench

GOOD = str(ROOT / "matrices/ds_configs/zero2_offload.json")
MISPLACED = str(ROOT / "matrices/ds_configs/misplaced_offload.json")


def test_misplaced_key_stops_the_run(tmp_path):
    m = write_matrix(tmp_path / "m.yaml", TINY)
    r = zerobench(
        "run", str(m), "--ds-config", GOOD, MISPLACED, "--results", str(tmp_path / "r.jsonl"), cwd=tmp_path, timeout=120
    )
    assert r.returncode == 2
    assert "misplaced_offload.json:11: offload_optimizer" in r.stderr
    assert "zero_optimization.offload_optimizer" in r.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_offload_no_axis_value_describes_stops_the_run(tmp_path):
    # ZeRO-3 with only the optimizer state on NVMe: DeepSpeed would run it, but no offload axis value
    # says it (the worker used to die on it with KeyError: 'offload_param').
    m = write_matrix(tmp_path / "m.yaml", TINY)
    f = tmp_path / "opt_nvme.json"
    f.write_text(
        '{\n  "train_micro_batch_size_per_gpu": "auto",\n  "zero_optimization": {\n    "stage": 3,\n'
        f'    "offload_optimizer": {{"device": "nvme", "nvme_path": "{tmp_path}"}}\n  }}\n}}\n'
    )
    r = zerobench(
        "run", str(m), "--ds-config", str(f), "--results", str(tmp_path / "r.jsonl"), cwd=tmp_path, timeout=120
    )
    assert r.returncode == 2
    assert f"{f}:5: zero_optimization.offload_optimizer" in r.stderr and "offload axis" in r.stderr
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.slow
def test_user_config_cell_runs_as_described(tmp_path):
    m = write_matrix(tmp_path / "m.yaml", TINY)
    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--ds-config", GOOD, "--results", str(res), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    rec = [x for x in as_written(res) if x["status"] != "started"][0]
    assert rec["status"] == "ok", rec["reason"]
    # The cell is named after what the file configures, and that is what ran.
    assert rec["cell"]["zero_stage"] == 2 and rec["cell"]["offload"] == "optimizer"
    assert rec["worker"]["optimizer_class"].endswith("DeepSpeedCPUAdam")
    # "auto" batch sizes were filled from the matrix; the stored config is the one DeepSpeed got.
    assert rec["ds_config"]["train_micro_batch_size_per_gpu"] == 2
    assert rec["ds_config"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
