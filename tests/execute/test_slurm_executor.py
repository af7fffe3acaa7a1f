"""`zerobench run --executor slurm` on a real Slurm cluster of two nodes (tests/slurm_cluster.py): one job per
cell attempt through submitit, real DeepSpeed cells in the jobs, every end recorded by the orchestrator as
Slurm and the nodes say it ended."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.execute.executors.slurm import LIVE
from bench.matrix.cells import Cell
from bench.matrix.spec import expand, loads
from tests.conftest import (
    EXECUTOR_CELLS,
    ROOT,
    TINY,
    ZERO3,
    agree_across_nodes,
    as_written,
    blamed_on_the_second_node,
    ends_as_planned,
    write_matrix,
    zerobench,
)
from tests.faults.procs import attempt_dirs, wait_for

pytestmark = pytest.mark.slow

SMOKE = ROOT / "bench" / "matrices" / "smoke.yaml"
# The test cluster's default is 1 GiB a CPU. Slurm sums the RSS of a job's processes (submitit's, the launcher,
# the worker: each maps torch), 3.2-3.3 GB for a smoke cell, and more while a job compiles a DeepSpeed op (4.3 GB).
SLURM = ("--executor", "slurm", "--mem-per-node", "6G")
TWO = TINY + "axes: {zero_stage: [0], precision: [bf16, fp32]}\n"  # two cells, a job each


def _env(cluster, **extra) -> dict[str, str]:
    return {"SLURM_CONF": str(cluster.conf), "PYTHONPATH": str(ROOT), **extra}


def _tmpdir(tmp_path: Path) -> Path:
    """A TMPDIR of the run's own: its attempts' folders (and their events files) are the test's to read."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp


def _ends(results: Path) -> list[dict]:
    return [x for x in as_written(results) if x["status"] != "started"]


def _start(cluster, tmp_path: Path, name: str, body: str, *args: str, **env) -> tuple[subprocess.Popen, Path]:
    """`zerobench run` of a matrix through Slurm, started (the caller waits or signals it)."""
    m = write_matrix(tmp_path / f"{name}.yaml", body)
    res = tmp_path / f"{name}.jsonl"
    cmd = [sys.executable, "-m", "bench", "run", str(m), "--results", str(res), "--no-report", *SLURM, *args]
    e = {**os.environ, **_env(cluster, **env)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, res


def _jobs(cluster) -> dict[str, tuple[str, str]]:
    """Every job Slurm lists (any state): id -> (name, state)."""
    out = cluster.run("squeue", "-h", "-t", "all", "-o", "%i %j %T").stdout
    return {f[0]: (f[1], f[2]) for f in (line.split() for line in out.splitlines()) if len(f) == 3}


def _running(cluster, cell_hash: str, timeout: float = 120) -> str:
    """The id of the running job of a cell (its name is zerobench-HASH.ATTEMPT), once it runs."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for job, (name, state) in _jobs(cluster).items():
            if name.startswith(f"zerobench-{cell_hash}.") and state == "RUNNING":
                return job
        time.sleep(0.3)
    raise TimeoutError(f"no running job of cell {cell_hash} after {timeout:g} s: {_jobs(cluster)}")


def _stepping(tmp: Path, *cells: Cell) -> None:
    """Wait until the workers of these cells, run with TMPDIR=tmp, step (each attempt's spec and events files): a
    stop then lands on running workers, not on jobs still importing."""

    def stepping() -> bool:
        up = [_spec_cell(d) for d in attempt_dirs(tmp) if '"warmup"' in _text(d / "events.jsonl")]
        return all(_settings(c.to_dict()) in up for c in cells)

    assert wait_for(stepping, 300), f"the workers of {[c.name for c in cells]} never stepped (TMPDIR {tmp})"


def _spec_cell(attempt: Path) -> dict | None:
    try:
        return _settings(json.loads(_text(attempt / "spec.json"))["cell"])
    except (ValueError, KeyError, TypeError):
        return None


def _settings(cell: dict) -> dict:
    """A cell's settings, whichever matrix file named it."""
    return {k: v for k, v in cell.items() if k != "matrix"}


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # not written yet, or the attempt already ended
        return ""


def _worker_started(cluster, job: str) -> None:
    """Wait until the job's worker process runs (the cell is under way; its imports may go on past a short time
    limit, so not its first step)."""

    def started() -> bool:
        for p in psutil.process_iter():
            try:
                e = p.environ()
                if e.get("SLURM_JOB_ID") == job and e.get("SLURM_CONF") == str(cluster.conf):
                    if "--spec" in p.cmdline():  # the cell's worker, not a helper the launcher runs first
                        return True
            except psutil.Error:
                continue
        return False

    assert wait_for(started, 300), f"job {job}'s worker never started"


def _strays(cluster) -> list[str]:
    """Processes of this cluster's jobs still alive (each carries its SLURM_CONF), besides its daemons."""
    daemons = {p.pid for p in cluster.procs.values()}
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid not in daemons and p.status() != psutil.STATUS_ZOMBIE:
                if p.environ().get("SLURM_CONF") == str(cluster.conf) and p.pid != os.getpid():
                    found.append(" ".join(p.cmdline())[:200])
        except psutil.Error:
            continue
    return found


def test_the_smoke_matrix_ends_as_it_does_on_this_host(slurm_cluster, tmp_path):
    """The smoke matrix's executor cells (EXECUTOR_CELLS), each in its own Slurm job, end as `local` ends them:
    the same cells, skipped by the same rules, every other one ok (local's ends of the whole matrix:
    tests/cli/test_e2e_cpu.py); each record names its job, its Slurm node and the node's provenance beside the
    orchestrator's."""
    res = tmp_path / "s.jsonl"
    r = zerobench("run", str(SMOKE), "--filter", EXECUTOR_CELLS, "--results", str(res), "--no-report", *SLURM,
                  cwd=tmp_path, env=_env(slurm_cluster))  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = ends_as_planned(SMOKE, _ends(res), EXECUTOR_CELLS)
    assert len(ran) == 4 and sum(x["cell"]["optimizer"] == "cpuadam" for x in ran) == 2
    assert len({x["placement"]["slurm_job"] for x in ran}) == 4
    for x in ran:
        assert x["placement"]["slurm_nodes"][0] in slurm_cluster.nodes and x["placement"]["node"]
        assert x["provenance"]["host"] == x["orchestrator"]["host"] == socket.gethostname()  # one machine here
        assert x["started_by"]["mode"] == "spawn" and "Slurm job" in x["started_by"]["why"]
        assert x["metrics"]["tokens_per_s"] > 0 and x["losses"][-1] < x["losses"][0]
    assert not any(state in LIVE for _, state in _jobs(slurm_cluster).values())


def test_a_time_limit_is_a_timeout_and_scancel_an_interruption(slurm_cluster, tmp_path):
    """Two hung cells: one runs into the jobs' time limit (1 minute; Slurm's USR2 before it stops the cell),
    the other's job is cancelled with scancel while it runs. Each is recorded with Slurm's evidence."""
    bf16, fp32 = (c.hash for c in expand(loads(TWO)))
    proc, res = _start(slurm_cluster, tmp_path, "two", TWO, "--time-limit", "1m", ZEROBENCH_FAULT="hang@1")
    job = _running(slurm_cluster, fp32)
    _worker_started(slurm_cluster, job)
    slurm_cluster.run("scancel", job)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    ends = {x["cell_hash"]: x for x in _ends(res)}
    cancelled, timed_out = ends[fp32], ends[bf16]
    assert cancelled["status"] == "interrupted", cancelled["reason"]
    assert "cancelled outside zerobench" in cancelled["reason"] and f"Slurm job {job}: CANCELLED" in cancelled["reason"]
    assert cancelled["placement"]["slurm_job"] == job
    assert timed_out["status"] == "timeout", timed_out["reason"]
    assert (
        "time limit" in timed_out["reason"]
        and f"Slurm job {timed_out['placement']['slurm_job']}" in timed_out["reason"]
    )
    assert timed_out["wall_s"] < 90  # stopped by zerobench, not by Slurm's limit and KillWait


def test_sigint_to_the_orchestrator_leaves_nothing_in_slurm(slurm_cluster, tmp_path):
    """Ctrl-C to a real `zerobench run`: every job cancelled and ended before it exits, each cell recorded as
    interrupted by SIGINT, and no process of the jobs left on the nodes."""
    tmp = _tmpdir(tmp_path)
    proc, res = _start(slurm_cluster, tmp_path, "sigint", TWO, ZEROBENCH_FAULT="hang@1", TMPDIR=str(tmp))
    cells = expand(loads(TWO))
    for cell in cells:
        _running(slurm_cluster, cell.hash)
    _stepping(tmp, *cells)
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    stop_s = time.time() - t0
    assert proc.returncode == 130, out[-3000:]
    assert {job: state for job, (_, state) in _jobs(slurm_cluster).items() if state in LIVE} == {}
    ends = _ends(res)
    assert [x["status"] for x in ends] == ["interrupted", "interrupted"], [x["reason"] for x in ends]
    assert all(x["reason"].startswith("stopped by the user (SIGINT)") and "CANCELLED" in x["reason"] for x in ends)
    assert _strays(slurm_cluster) == []
    assert stop_s < 60, stop_s


def test_a_preemption_is_an_interruption_and_a_failed_node_a_kill(slurm_cluster, tmp_path):
    """Two hung cells, each pinned to a node through the slurm: block's sbatch options: a job of the higher-tier
    partition takes n1's CPUs from the first (PREEMPTED), and n2 is set down under the second (NODE_FAIL,
    never requeued). Neither end is the cell's: interrupted and killed, which --resume runs again."""
    c, cells = slurm_cluster, expand(loads(TWO))
    pinned = "axes: {precision: [PREC]}\nslurm: {sbatch: {nodelist: NODE}}\n"
    tmp = _tmpdir(tmp_path)
    runs = [
        _start(
            c,
            tmp_path,
            name,
            TINY + pinned.replace("PREC", cell.precision).replace("NODE", node),
            ZEROBENCH_FAULT="hang@1",
            TMPDIR=str(tmp),
        )  # fmt: skip
        for name, cell, node in (("preempted", cells[0], "n1"), ("failed", cells[1], "n2"))
    ]
    jobs = [_running(c, cell.hash) for cell in cells]
    _stepping(tmp, *cells)
    try:
        c.run(
            "sbatch",
            "-p",
            "urgent",
            "-w",
            "n1",
            f"-c{os.cpu_count()}",
            "--mem=100M",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        )
        c.run("scontrol", "update", "nodename=n2", "state=down", "reason=zerobench-test")
        for proc, _ in runs:
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, out[-3000:]
    finally:
        c.resume("n2")
    (preempted,), (failed,) = (_ends(res) for _, res in runs)
    assert preempted["status"] == "interrupted" and preempted["reason"].startswith("preempted"), preempted["reason"]
    assert f"Slurm job {jobs[0]}: PREEMPTED" in preempted["reason"]
    assert failed["status"] == "killed" and "a node of the job failed (n2)" in failed["reason"], failed["reason"]
    assert f"Slurm job {jobs[1]}: NODE_FAIL" in failed["reason"]


@pytest.fixture(scope="module")
def two_node_runs(slurm_cluster, tmp_path_factory):
    """A ZeRO-3 cell over 2 nodes x 1 rank, the same cell as 1 node x 2 ranks, and the 2-node cell with rank 1
    (on the second node) SIGKILLed at step 2: three runs side by side, each job on the cluster's nodes."""
    d = tmp_path_factory.mktemp("nodes")
    runs = {
        "across": _start(slurm_cluster, d, "across", ZERO3 + "gpus: 1\nnodes: 2\n"),
        "within": _start(slurm_cluster, d, "within", ZERO3 + "gpus: 2\n"),
        "killed": _start(
            slurm_cluster,
            d,
            "killed",
            ZERO3 + "gpus: 1\nnodes: 2\n",
            ZEROBENCH_FAULT="sigkill@2#1",
            ZEROBENCH_STALL_S="120",
        ),
    }
    ends = {}
    for name, (proc, res) in runs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, (name, out[-3000:])
        (ends[name],) = _ends(res)
    return ends


def test_two_slurm_nodes_of_one_rank_agree_with_one_node_of_two(two_node_runs):
    across, within = two_node_runs["across"], two_node_runs["within"]
    agree_across_nodes(across, within)
    assert across["placement"]["slurm_nodes"] == ["n1", "n2"] and len(within["placement"]["slurm_nodes"]) == 1
    assert [n["host"] for n in across["nodes"]] == [socket.gethostname()] * 2
    assert across["nodes"][0]["addr"] == "127.0.0.1"  # node n1's NodeAddr, published by node 0
    assert across["provenance"] == across["nodes"][0]["provenance"]


def test_a_rank_killed_on_the_second_slurm_node_is_blamed_on_that_rank_and_node(two_node_runs):
    ends = blamed_on_the_second_node(two_node_runs["killed"])
    assert ends[0]["stopped"] in (None, "peer")  # its next collective failed, or it was stopped after the grace
