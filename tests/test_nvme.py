"""NVMe offload (ZeRO-Infinity) as a value of the offload axis, run for real through DeepSpeed's
async-I/O op on CPU (any folder stands in for the drive)."""
from __future__ import annotations

import pytest

from bench import matrix
from bench.matrix import MatrixError
from bench.store import read

from .conftest import TINY, write_matrix, zerobench


def test_nvme_needs_a_path(tmp_path):
    f = write_matrix(tmp_path / "m.yaml", TINY + "axes: {zero_stage: [3], offload: [nvme], optimizer: [cpuadam]}\n")
    with pytest.raises(MatrixError, match="nvme_path: offload: nvme needs a folder"):
        matrix.load(f)


@pytest.mark.slow
def test_nvme_offload_swaps_and_matches_cpu_offload(tmp_path):
    drive = tmp_path / "nvme"
    drive.mkdir()
    m = write_matrix(tmp_path / "m.yaml", TINY + f"nvme_path: {drive}\n"
                     "axes: {zero_stage: [3], offload: [nvme, optimizer+params], optimizer: [cpuadam]}\n")
    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = {x["cell"]["offload"]: x for x in read(res) if x["status"] != "started"}
    nvme, cpu = recs["nvme"], recs["optimizer+params"]
    assert nvme["status"] == "ok" and cpu["status"] == "ok", (nvme["reason"], cpu["reason"])
    zero = nvme["ds_config"]["zero_optimization"]
    assert zero["offload_param"]["device"] == "nvme" and zero["offload_optimizer"]["device"] == "nvme"
    assert nvme["worker"]["nvme_swap_bytes"] > 1_000_000, "DeepSpeed wrote its swap files to the drive"
    assert list(drive.iterdir()) == [], "the attempt's swap folder is removed"
    # Same weights, same data, same math: only where the state lives differs.
    assert nvme["losses"] == pytest.approx(cpu["losses"], rel=1e-3)


@pytest.mark.slow
def test_failed_nvme_cell_leaves_no_swap_files(tmp_path):
    # A 7B's swap files can fill a drive; a cell that crashes mid-training must not leave them behind.
    drive = tmp_path / "nvme"
    drive.mkdir()
    m = write_matrix(tmp_path / "m.yaml", TINY + f"nvme_path: {drive}\n"
                     "axes: {zero_stage: [3], offload: [nvme], optimizer: [cpuadam]}\n")
    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path, env={"ZEROBENCH_FAULT": "raise@2"})
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = [x for x in read(res) if x["status"] != "started"]
    assert rec["status"] == "error" and "injected fault" in rec["reason"]
    assert rec["worker"]["nvme_swap_bytes"] > 0, "it had swapped before failing"
    assert list(drive.iterdir()) == []
