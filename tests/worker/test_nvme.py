"""NVMe offload (ZeRO-Infinity) as a value of the offload axis, run for real through DeepSpeed's
async-I/O op on CPU (any folder stands in for the drive)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from bench.matrix import spec
from bench.matrix.spec import MatrixError
from tests.conftest import ROOT, TINY, as_written, write_matrix, zerobench

# llama-small, not llama-tiny: DeepSpeed swaps only weights of 1 MiB or more, and none of llama-tiny's
# is that large in bf16, so its nvme cells read no weight from the drive. llama-small's 14 swapped
# weights exceed the 5 swap buffers, which is what ran out at 1.1B on the H200 (results/nvme-1b.jsonl).
SMALL = TINY.replace("model: llama-tiny", "model: llama-small")


def test_nvme_needs_a_path(tmp_path):
    f = write_matrix(tmp_path / "m.yaml", TINY + "axes: {zero_stage: [3], offload: [nvme], optimizer: [cpuadam]}\n")
    with pytest.raises(MatrixError, match="nvme_path: offload: nvme needs a folder"):
        spec.load(f)


@pytest.mark.parametrize(
    "zero",
    [
        # ZeRO-Infinity as the offload axis generates it: both sections on the drive.
        {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": "D"},
            "offload_param": {"device": "nvme", "nvme_path": "D"},
        },
        # A user's: optimizer state on the drive, parameters in CPU memory (no nvme_path of their own).
        {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "D"}, "offload_param": {"device": "cpu"}},
        # A user's: only the optimizer state on the drive, no offload_param at all (the worker used to die
        # on KeyError: 'offload_param').
        {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "D"}},
        {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme", "nvme_path": "D"}},
    ],
)
def test_swap_folder_follows_the_sections_on_nvme(zero, tmp_path):
    from bench.worker.train import _nvme_swap_dirs

    for sec in zero.values():
        if isinstance(sec, dict) and "nvme_path" in sec:
            sec["nvme_path"] = str(tmp_path)
    before = json.loads(json.dumps(zero))
    swaps = _nvme_swap_dirs({"zero_optimization": zero}, {"attempt_id": "a1"})
    assert swaps == [str(tmp_path / "zerobench-a1")] and os.path.isdir(swaps[0])
    for key, sec in before.items():
        if isinstance(sec, dict):
            # The sections on the drive swap into the attempt's own folder; the others are left alone.
            assert zero[key] == (sec | {"nvme_path": swaps[0]} if sec["device"] == "nvme" else sec)


def test_each_drive_gets_its_own_swap_folder(tmp_path):
    from bench.worker.train import _nvme_swap_dirs

    zero = {
        "stage": 3,
        "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path / "a")},
        "offload_param": {"device": "nvme", "nvme_path": str(tmp_path / "b")},
    }
    swaps = _nvme_swap_dirs({"zero_optimization": zero}, {"attempt_id": "a1"})
    assert swaps == [str(tmp_path / "a" / "zerobench-a1"), str(tmp_path / "b" / "zerobench-a1")]
    assert [zero["offload_optimizer"]["nvme_path"], zero["offload_param"]["nvme_path"]] == swaps


def test_no_swap_folder_without_nvme():
    from bench.worker.train import _nvme_swap_dirs

    zero = {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
    assert _nvme_swap_dirs({"zero_optimization": zero}, {}) == []
    assert _nvme_swap_dirs({"zero_optimization": {"stage": 0}}, {}) == []
    assert _nvme_swap_dirs({}, {}) == []


@pytest.mark.slow
def test_nvme_offload_swaps_and_matches_cpu_offload(tmp_path):
    drive = tmp_path / "nvme"
    drive.mkdir()
    m = write_matrix(
        tmp_path / "m.yaml",
        SMALL + f"nvme_path: {drive}\n"
        "axes: {zero_stage: [3], offload: [nvme, optimizer+params], optimizer: [cpuadam]}\n",
    )
    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = {x["cell"]["offload"]: x for x in as_written(res) if x["status"] != "started"}
    nvme, cpu = recs["nvme"], recs["optimizer+params"]
    # Every step after the first runs on the recorded parameter trace, where DeepSpeed's default
    # reuse distance kept swapped weights (and their buffers) until none was left for the next one.
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
    m = write_matrix(
        tmp_path / "m.yaml",
        TINY + f"nvme_path: {drive}\naxes: {{zero_stage: [3], offload: [nvme], optimizer: [cpuadam]}}\n",
    )
    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path, env={"ZEROBENCH_FAULT": "raise@2"})
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = [x for x in as_written(res) if x["status"] != "started"]
    assert rec["status"] == "error" and "injected fault" in rec["reason"]
    assert rec["worker"]["nvme_swap_bytes"] > 0, "it had swapped before failing"
    assert list(drive.iterdir()) == []


# The config a cell runs with, handed to DeepSpeed the way the worker does (zero.Init, then
# initialize); prints where DeepSpeed keeps each parameter between uses.
_PLACEMENT = """
import json, sys
import deepspeed, torch
from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
from bench.matrix import dsconfig
from bench.matrix.cells import Cell
from bench.worker.parts import models
cell = Cell(model="llama-small", zero_stage=3, offload="nvme", optimizer="cpuadam", micro_batch=2,
            nvme_path=sys.argv[1])
cfg = dsconfig.build(cell)
deepspeed.init_distributed(dist_backend="gloo")
model = models.build(cell.model, cell.attn, torch.bfloat16, torch.device("cpu"), cfg)
deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
print(json.dumps({n: [p.ds_numel, p.ds_tensor.final_location == OffloadDeviceEnum.nvme]
                  for n, p in model.named_parameters()}), flush=True)
# DeepSpeed's async-I/O threads are not joined at interpreter exit, which at times aborts the process
# (std::terminate); the forkserver ends a cell with os._exit for the same reason.
import os; os._exit(0)
"""


@pytest.mark.slow
def test_nvme_cell_keeps_weights_on_the_drive(tmp_path):
    # The run above passes whether or not the weights live on the drive: DeepSpeed may instead hold
    # them in pinned CPU memory (offload_param.max_in_cpu) and read the drive only once, at setup.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    r = subprocess.run(
        [sys.executable, "-c", _PLACEMENT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    placed = json.loads(r.stdout.strip().splitlines()[-1])
    on_drive = {n for n, (numel, nvme) in placed.items() if nvme}
    # bf16: DeepSpeed swaps a partition of at least MIN_AIO_BYTES (1 MiB); smaller ones stay in CPU memory.
    assert on_drive == {n for n, (numel, _) in placed.items() if numel * 2 >= 1 << 20}
    assert len(on_drive) == 14
