"""GPU faults, on a real GPU (they skip elsewhere; run on the GPU host): a worker killed mid-step hands
the GPU back at its baseline before the next cell, a CUDA OOM is followed by a clean cell, and an
NCCL collective hung on one of two ranks is a timeout found by the no-progress watchdog well before
the wall-clock limit.

On an H200: `pytest -p no:cacheprovider tests/faults/test_gpu_faults.py` (about 3 minutes; the
two-rank test needs two GPUs and skips with one)."""

from __future__ import annotations

import pytest

from tests.conftest import as_written, write_matrix, zerobench

pytestmark = pytest.mark.gpu

# The 1.1B preset with torch's AdamW: no DeepSpeed op to compile on a fresh host.
MATRIX = """\
model: llama-1b
seq_len: 512
batch: {micro: 2, grad_accum: 1}
steps: {warmup: 1, measured: 4}
lr: 1.0e-4
timeout_s: 300
axes: {zero_stage: [0, 1, 2], optimizer: [adamw], precision: [bf16]}
"""
SLACK = 1 * 2**30  # a GPU is back at its baseline within this (NVML's used memory moves a little by itself)


def _used(indices: list[int]) -> dict[int, int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        return {i: int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used) for i in indices}
    finally:
        pynvml.nvmlShutdown()


def _gpus() -> int:
    import pynvml

    pynvml.nvmlInit()
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory):
    """One run of three cells on GPU 0: the first killed mid-step, the second out of CUDA memory, the
    third clean."""
    root = tmp_path_factory.mktemp("gpu")
    base = _used([0])
    m = write_matrix(root / "g.yaml", MATRIX)
    res = root / "g.jsonl"
    r = zerobench(
        "run",
        str(m),
        "--results",
        str(res),
        "--no-report",
        cwd=root,
        env={"ZEROBENCH_FAULT": "sigkill@2~zero=0,cudaoom@2~zero=1"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = {x["cell"]["zero_stage"]: x for x in as_written(res) if x["status"] != "started"}
    return {"results": res, "records": recs, "baseline": base[0]}


def _after(rec: dict) -> dict:
    return next(iter(rec["gpu_after"].values()))


def test_worker_killed_mid_step_hands_the_gpu_back(one_gpu, ledger):
    ledger.fault("gpu-worker-killed-mid-step", "the 1.1B worker is SIGKILLed at step 2 on the GPU")
    recs = one_gpu["records"]
    ledger.account(one_gpu["results"], {recs[0]["cell_name"]: {"killed"}, recs[2]["cell_name"]: {"ok"}}, runs=1)
    killed = recs[0]
    print(killed["reason"], killed["gpu_after"], one_gpu["baseline"])
    # Back at the baseline, with none of its processes left on the GPU, before the next cell started.
    assert _after(killed)["used_bytes"] <= one_gpu["baseline"] + SLACK
    assert _after(killed)["procs"] == []
    assert recs[1]["foreign_gpu_processes"] is None and recs[2]["foreign_gpu_processes"] is None


def test_cuda_oom_then_a_clean_cell(one_gpu, ledger):
    ledger.fault("gpu-cuda-oom-then-clean", "the 1.1B worker allocates GPU memory at step 2 until CUDA runs out")
    recs = one_gpu["records"]
    ledger.account(one_gpu["results"], {recs[1]["cell_name"]: {"cuda_oom"}, recs[2]["cell_name"]: {"ok"}}, runs=1)
    oom = recs[1]
    print(oom["reason"], oom["worker"]["allocator_at_failure"])
    assert oom["reason"].startswith("CUDA out of memory in phase measured")
    assert oom["worker"]["allocator_at_failure"]["reserved_bytes.all.peak"] > 100 * 2**30
    assert _after(oom)["used_bytes"] <= one_gpu["baseline"] + SLACK
    clean = recs[2]
    assert clean["status"] == "ok" and clean["losses"][-1] < clean["losses"][0]


def test_nccl_hang_on_one_of_two_ranks_is_a_timeout(tmp_path, ledger):
    ledger.fault("gpu-nccl-hang-one-rank", "rank 1 of a 2-GPU 1.1B cell stops at step 2; rank 0 waits in NCCL")
    if _gpus() < 2:
        pytest.skip("needs two GPUs")
    base = _used([0, 1])
    stall = 60
    m = write_matrix(tmp_path / "h.yaml", MATRIX.replace("zero_stage: [0, 1, 2]", "zero_stage: [2]") + "gpus: 2\n")
    res = tmp_path / "h.jsonl"
    r = zerobench(
        "run",
        str(m),
        "--results",
        str(res),
        "--no-report",
        cwd=tmp_path,
        env={"ZEROBENCH_FAULT": "hang@2#1", "ZEROBENCH_STALL_S": str(stall)},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (rec,) = ledger.account(res, {"": {"timeout"}}, runs=1)[-1:]
    print(rec["reason"], rec["wall_s"], rec["gpu_after"])
    assert "no progress" in rec["reason"], rec["reason"]
    # Found by zerobench's watchdog (stall seconds after the last step), long before the 300 s limit
    # and NCCL's own 10-minute one.
    steps = sum(rec["step_times_s"] or []) if rec.get("step_times_s") else 0
    assert rec["wall_s"] < 300 and rec["wall_s"] - steps < stall + 120, rec["wall_s"]
    for i, snap in rec["gpu_after"].items():
        assert snap["used_bytes"] <= base[int(i)] + SLACK and snap["procs"] == [], (i, snap)
