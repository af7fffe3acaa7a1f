"""Fault injection into a real worker: each way a cell can end is classified right, and the
orchestrator carries on with the next cell."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.execute import launch
from bench.host import hostmem
from bench.matrix import dsconfig
from bench.matrix.cells import Cell
from bench.records.record import Record
from bench.records.store import Store
from tests.conftest import ROOT, TINY, as_written, copy_built_ops, write_matrix, zerobench

# copies_ops: it copies the machine's built DeepSpeed ops (a build beside it would leave a partial copy).
pytestmark = [pytest.mark.slow, pytest.mark.copies_ops]

FAKE_NVML = Path(__file__).parent / "fake_nvml"


def _run(tmp_path, fault: str, extra: str = "", env: dict | None = None, *, ledger=None, allowed=None) -> dict:
    m = write_matrix(tmp_path / "f.yaml", TINY + extra)
    res = tmp_path / f"{fault}.jsonl"
    r = zerobench(
        "run", str(m), "--results", str(res), "--no-report", cwd=tmp_path, env={"ZEROBENCH_FAULT": fault, **(env or {})}
    )
    assert r.returncode == 0, r.stderr[-2000:]
    if ledger is not None:
        ledger.account(res, {"": allowed}, runs=1)
    recs = [x for x in as_written(res) if x["status"] != "started"]
    assert len(recs) == 1
    return recs[0]


def test_hang_is_a_timeout_by_watchdog(tmp_path, ledger):
    ledger.fault("worker-hang-watchdog", "the worker stops making progress at step 2")
    # 15 s without a step: far beyond a tiny step even on a busy machine, far below the 600 s limit.
    rec = _run(tmp_path, "hang@2", env={"ZEROBENCH_STALL_S": "15"}, ledger=ledger, allowed={"timeout"})
    assert rec["status"] == "timeout", rec["reason"]
    assert "no progress" in rec["reason"] and "after step 1" in rec["reason"], rec["reason"]


def test_wall_clock_timeout(tmp_path):
    m = TINY.replace("timeout_s: 600", "timeout_s: 12")
    mf = write_matrix(tmp_path / "t.yaml", m)
    # The watchdog is left at its default (600 s), so only the wall clock can end this cell.
    r = zerobench(
        "run",
        str(mf),
        "--results",
        str(tmp_path / "t.jsonl"),
        "--no-report",
        cwd=tmp_path,
        env={"ZEROBENCH_FAULT": "hang@1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    rec = [x for x in as_written(tmp_path / "t.jsonl") if x["status"] != "started"][0]
    assert rec["status"] == "timeout" and "12 s limit" in rec["reason"], rec["reason"]


def test_sigkill_from_outside_is_killed_not_host_oom(tmp_path, ledger):
    ledger.fault("worker-sigkill", "the worker is SIGKILLed from outside at step 1, far below any memory limit")
    rec = _run(tmp_path, "sigkill@1", ledger=ledger, allowed={"killed"})
    assert rec["status"] == "killed", rec["reason"]
    assert rec["reason"].startswith("killed by signal 9 from outside zerobench; no OOM evidence"), rec["reason"]
    assert rec["exit_code"] == -9
    # The fault left no result document: the orchestrator says which fault the worker ran with.
    assert rec["worker"]["fault_injected"] == "sigkill@1" and "fault injected: sigkill@1" in rec["reason"]


def test_exception_is_error_with_reason(tmp_path, ledger):
    ledger.fault("worker-exception", "the worker raises at step 1")
    rec = _run(tmp_path, "raise@1", ledger=ledger, allowed={"error"})
    assert rec["status"] == "error"
    assert "RuntimeError in phase measured: injected fault" in rec["reason"]
    assert "injected fault" in rec["traceback"]


def test_nan_loss_is_diverged(tmp_path, ledger):
    ledger.fault("worker-nan-loss", "the loss becomes NaN at step 2")
    rec = _run(tmp_path, "nan@2", ledger=ledger, allowed={"diverged"})
    assert rec["status"] == "diverged" and "loss became nan at step 2" in rec["reason"]


def test_exit_without_result(tmp_path, ledger):
    ledger.fault("worker-exit-silently", "the worker exits with code 3 at step 1 without a result")
    rec = _run(tmp_path, "exit@1", ledger=ledger, allowed={"error"})
    assert rec["status"] == "error" and "exited with code 3 without a result" in rec["reason"]


def test_matrix_continues_after_failures(tmp_path):
    m = write_matrix(tmp_path / "c.yaml", TINY + "axes: {zero_stage: [0, 1]}\n")
    res = tmp_path / "c.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path, env={"ZEROBENCH_FAULT": "raise@1"})
    assert r.returncode == 0
    assert [x["status"] for x in as_written(res) if x["status"] != "started"] == ["error", "error"]
    r = zerobench(
        "run",
        str(m),
        "--results",
        str(res),
        "--no-report",
        "--strict",
        cwd=tmp_path,
        env={"ZEROBENCH_FAULT": "raise@1"},
    )
    assert r.returncode == 1, "--strict fails a CI job when a cell failed"


# -- one matrix run, several faults: a fault per cell (~regex), and faults of the whole run ---------------

SINGLE = {
    # fault id: (the cell, the fault, allowed final statuses, what is injected)
    "worker-exception-whole-message": (
        "zero=0",
        "raise@1",
        {"error"},
        "the worker raises at step 1 an exception whose message has two lines",
    ),
    "worker-exit-fault-recorded": (
        "zero=1",
        "exit@1",
        {"error"},
        "the worker exits with code 3 at step 1, leaving no result document",
    ),
}
CLEAN = "zero=2"  # the cell without a fault of its own


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One run of three single-rank cells with a stale lock in the extensions folder, the rendezvous
    port taken and an NVML that starts but cannot list its GPUs."""
    root = tmp_path_factory.mktemp("single")
    m = write_matrix(root / "single.yaml", TINY + "axes: {zero_stage: [0, 1, 2], precision: [fp32]}\n")
    res = root / "single.jsonl"
    ext = root / "ext"
    copy_built_ops(ext)
    # A build killed in the middle left torch's FileBaton lock behind: before the fix, the prebuild
    # and every cell waited on it forever.
    (ext / "deepspeed_shm_comm").mkdir(parents=True, exist_ok=True)
    (ext / "deepspeed_shm_comm" / "lock").write_text("")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = zerobench(
            "run",
            str(m),
            "--results",
            str(res),
            "--no-report",
            "--logs",
            str(root / "logs"),
            cwd=root,
            timeout=900,
            env={
                "ZEROBENCH_FAULT": ",".join(f"{f}~{sel}" for sel, f, _, _ in SINGLE.values()),
                "ZEROBENCH_PORT": str(port),
                "TORCH_EXTENSIONS_DIR": str(ext),
                # NVML's binding answers nvmlInit, then fails to count the GPUs (a driver mismatch).
                "PYTHONPATH": str(FAKE_NVML),
                "FAKE_NVML_FAIL": "count",
                "ZEROBENCH_NO_GPU": "",
            },
        )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = [x for x in as_written(res) if x["status"] != "started"]
    cells = {fid: next(x["cell_name"] for x in recs if sel in x["cell_name"]) for fid, (sel, *_) in SINGLE.items()}
    cells["clean"] = next(x["cell_name"] for x in recs if CLEAN in x["cell_name"])
    return {"results": res, "records": {x["cell_name"]: x for x in recs}, "cells": cells, "port": port, "root": root}


def _expect(single) -> dict[str, set[str]]:
    return {single["cells"][f]: SINGLE[f][2] for f in SINGLE} | {single["cells"]["clean"]: {"ok"}}


@pytest.mark.parametrize("fid", list(SINGLE))
def test_a_fault_in_one_cell_of_a_matrix(single, fid, ledger):
    ledger.fault(fid, SINGLE[fid][3])
    name = single["cells"][fid]
    ledger.account(single["results"], {name: SINGLE[fid][2]})
    rec = single["records"][name]
    if fid == "worker-exception-whole-message":
        assert rec["reason"] == (
            "RuntimeError in phase measured: injected fault\nsecond line of the injected fault's message"
        ), rec["reason"]
    if fid == "worker-exit-fault-recorded":
        assert "exited with code 3 without a result" in rec["reason"] and "fault injected: exit@1" in rec["reason"]
        assert rec["worker"]["fault_injected"] == "exit@1"


def test_stale_lock_in_the_extensions_folder(single, ledger):
    ledger.fault("extensions-stale-lock", "a dead build's lock file in TORCH_EXTENSIONS_DIR/deepspeed_shm_comm/")
    ledger.account(single["results"], _expect(single), runs=1)
    log = (single["root"] / "logs" / "prebuild.log").read_text()
    assert "removed a stale lock" in log and "deepspeed_shm_comm/lock" in log, log[-2000:]


def test_rendezvous_port_taken_single_rank(single, ledger):
    ledger.fault("rendezvous-port-taken-single-rank", "every single-rank cell's first rendezvous port is already taken")
    ledger.account(single["results"], _expect(single), runs=1)
    for name in single["cells"].values():
        warnings = single["records"][name].get("warnings") or []
        assert any(f"rendezvous port {single['port']} was in use" in w for w in warnings), (name, warnings)


def test_nvml_cannot_list_its_gpus(single, ledger):
    ledger.fault("nvml-enumeration-fails", "NVML starts but fails to count the GPUs (nvmlDeviceGetCount raises)")
    ledger.account(single["results"], _expect(single), runs=1)
    clean = single["records"][single["cells"]["clean"]]
    assert clean["telemetry"]["nvml"] is False and clean["memory"]["host_rss_peak_bytes"]


# -- faults that must stop a run before anything runs, or that need no worker ----------------------------


@pytest.mark.parametrize(
    ("fid", "fault", "matrix", "says"),
    [
        ("fault-step-past-end", "nan@5", "", "step 5 is past"),
        ("fault-rank-past-world", "raise@1#1", "", "has ranks 0-0"),
        ("fault-matches-no-cell", "raise@1~zero=3", "", "matches no cell"),
    ],
)
def test_a_fault_that_would_never_fire_is_refused(tmp_path, ledger, fid, fault, matrix, says):
    ledger.fault(fid, f"ZEROBENCH_FAULT={fault} on a 1-rank cell of 5 steps: it would silently never fire")
    m = write_matrix(tmp_path / "v.yaml", TINY + matrix)
    res = tmp_path / "v.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path, env={"ZEROBENCH_FAULT": fault})
    assert r.returncode == 2 and says in r.stderr and "nothing was run" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    ledger.account(res, {})
    assert not res.exists()


@pytest.mark.parametrize(
    ("fid", "fail"),
    [("nvml-import-fails", "import"), ("nvml-library-missing", "init")],
)
def test_nvml_missing_is_data(tmp_path, ledger, fid, fail):
    ledger.fault(fid, f"nvidia-ml-py fails at {fail} (no libnvidia-ml on the host)")
    # fp16 cells are skipped on a CPU host: a run that records without starting a worker.
    m = write_matrix(tmp_path / "n.yaml", TINY + "axes: {precision: [fp16]}\n")
    res = tmp_path / "n.jsonl"
    r = zerobench(
        "run",
        str(m),
        "--results",
        str(res),
        "--no-report",
        cwd=tmp_path,
        env={"PYTHONPATH": str(FAKE_NVML), "FAKE_NVML_FAIL": fail, "ZEROBENCH_NO_GPU": ""},
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    (rec,) = ledger.account(res, {"": {"skipped"}}, runs=1)
    # The plan probed the host through the failing NVML; the skipped cell's record is compact (nothing ran).
    assert "provenance" not in rec and rec["skip"]["rule"] == "fp16-needs-cuda" and "fp16" in rec["reason"]


# -- the kernel's OOM killer, for real: a memory cgroup around the run -----------------------------------


def _child_cgroup(name: str) -> tuple[Path, Path] | None:
    """(a new memory cgroup under this process's own, its limit file), where this user may make one."""
    cg = hostmem.cgroup_dir()
    if cg is None or os.getuid() != 0:
        return None
    parent, version = cg
    child = parent / name
    try:
        child.mkdir()
    except OSError:
        return None
    limit = child / ("memory.max" if version == 2 else "memory.limit_in_bytes")
    if not limit.exists():
        child.rmdir()
        return None
    return child, limit


def test_worker_oom_killed_in_a_memory_cgroup(tmp_path, ledger):
    ledger.fault("worker-oom-kill-cgroup", "the worker allocates host memory at step 1 until the OOM killer stops it")
    made = _child_cgroup(f"zerobench-oom-{os.getpid()}")
    if made is None:
        pytest.skip("needs root and a memory cgroup this user may create")
    cg, limit = made
    try:
        limit.write_text(str(5 * 2**29))  # 2.5 GiB: the run's processes fit, the fault's hoard does not
        m = write_matrix(tmp_path / "oom.yaml", TINY + "axes: {precision: [fp32]}\n")
        res = tmp_path / "oom.jsonl"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "ZEROBENCH_FAULT": "oom@1"}
        # The orchestrator moves itself into the cgroup before it starts anything: all its children are in it.
        run = f'"{sys.executable}" -m bench run "{m}" --results "{res}" --no-report'
        script = f"echo $$ > {cg}/cgroup.procs && exec {run}"
        r = subprocess.run(["sh", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:  # its last processes are still exiting
                time.sleep(0.2)
    (rec,) = ledger.account(res, {"": {"host_oom"}}, runs=1)[-1:]
    assert "the kernel's OOM killer stopped the worker" in rec["reason"], rec["reason"]
    assert "the memory cgroup's oom_kill count rose" in rec["reason"], rec["reason"]


# -- an op compiled inside the cell ------------------------------------------------------------------------


def test_an_op_built_inside_the_cell_is_flagged(tmp_path, ledger):
    ledger.fault("op-built-inside-cell", "the shared extensions cache loses a built op before a cell starts")
    ext = tmp_path / "ext"
    if not copy_built_ops(ext) or not (ext / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").exists():
        pytest.skip("needs DeepSpeed's shared-memory op built once (any CPU cell builds it)")
    # Another run cleaned its library: the objects are still there, so the cell relinks it (seconds,
    # not the minutes of a full compile, and still a build inside the cell).
    (ext / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").unlink()
    cell = Cell(model="llama-tiny", seq_len=32, micro_batch=2, warmup_steps=1, measured_steps=4, precision="fp32")
    res = tmp_path / "op.jsonl"
    store = Store(res)
    ident = {"run_id": "op-test", "attempt": 1, "matrix_file": "none"}
    started = Record.started(cell, started_at="2026-01-01T00:00:00.000+00:00", **ident)
    store.append(started)
    # run_cell itself, not `zerobench run`: a run's prebuild would rebuild the op before the cell.
    try:
        how = launch.Launch(tmp_path / "op.log", sample_interval_s=0.05, extra_env={"TORCH_EXTENSIONS_DIR": str(ext)})
        out = launch.run_cell(cell, dsconfig.build(cell), how)
    finally:
        launch.stop_forkserver()
    rec = store.append(Record.from_outcome(started, out, ds_config={}, log="op.log", ended_at="2026-01-01T00:01:00Z"))
    ledger.account(res, {cell.name: {"ok"}}, runs=1)
    assert any("op deepspeed_shm_comm was built inside the cell" in w for w in rec["warnings"]), rec["warnings"]
    assert rec["worker"]["ops_built"][0]["op"] == "deepspeed_shm_comm"
