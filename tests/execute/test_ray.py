"""The Ray executor on a real Ray cluster of two nodes on this machine (each with one zerobench_slot, the
custom resource CPU cells are placed on): the smoke matrix's executor cells (tests/conftest.py
EXECUTOR_CELLS) ending as `--executor local` ends them, a cell whose
worker or whose Ray worker is SIGKILLed, a Ctrl-C to the orchestrator, cells over both nodes, and the clear
errors before any cell. One cluster for the module, torn down at its end."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

from bench.cli import DEFAULT_MATRIX
from bench.execute.executors.executor import Attempt, Handle, Job, Shape
from bench.execute.executors.ray import SLOT, _Held, _killed, _Node, _per_node
from bench.execute.launch import Launch
from bench.matrix.cells import Cell
from bench.matrix.problems import InputError
from bench.records.status import Status
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

MiB = 2**20


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes (a head and one more), each running one CPU cell at a time; CUDA hidden from both."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")  # the nodes' processes inherit this environment
        mp.setenv("ZEROBENCH_NO_GPU", "1")
        mp.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        node = {"num_cpus": 1, "resources": {SLOT: 1}, "object_store_memory": 80 * MiB}
        c = Cluster(initialize_head=True, connect=False, head_node_args={**node, "include_dashboard": False})
        try:
            c.add_node(**node)
            c.wait_for_nodes()
        except BaseException:
            c.shutdown()
            raise
    yield c
    c.shutdown()


def _outcomes(path: Path) -> list[dict]:
    return [r for r in as_written(path) if r["status"] != "started"]


def _tagged_workers(tag: str) -> list[psutil.Process]:
    """The live bench.worker processes (cells and fork servers) whose environment carries the tag (the run's
    ZEROBENCH_* settings travel with each job to its node, so its workers carry it)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if (
                "bench.worker" in " ".join(p.info["cmdline"] or [])
                and p.environ().get("ZEROBENCH_TEST_TAG") == tag
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def _a_fork_server(p: psutil.Process) -> bool:
    """A Ray worker's fork server (the cells it forks show its command line too, but it is their parent)."""
    try:
        return "bench.worker.forkserver" in " ".join(p.cmdline()) and "ray::" in " ".join(p.parent().cmdline())
    except (psutil.Error, AttributeError):
        return False


def _stepping(proc: psutil.Process) -> bool:
    """Whether a worker has taken a step (its events file, in the attempt folder its --spec names)."""
    try:
        spec = Path(proc.cmdline()[proc.cmdline().index("--spec") + 1])
        return '"step"' in (spec.parent / "events.jsonl").read_text()
    except (psutil.Error, ValueError, IndexError, OSError):
        return False


def _wait(pred, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


LONG = TINY.replace("measured: 4", "measured: 5000")  # cells that run until they are stopped


# -- the smoke matrix's executor cells, as local ends them ------------------------------------------------


@pytest.mark.slow
def test_the_smoke_matrix_on_two_ray_nodes_ends_as_on_one_host(cluster, tmp_path):
    ray_run = zerobench(
        "run", "--filter", EXECUTOR_CELLS, "--executor", "ray", "--address", cluster.address,
        "--results", str(tmp_path / "ray.jsonl"),
        "--no-report", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert ray_run.returncode == 0, ray_run.stdout[-3000:] + ray_run.stderr[-3000:]
    assert "ray: 2 node(s), 2 zerobench_slots" in ray_run.stdout
    on_ray = _outcomes(tmp_path / "ray.jsonl")
    assert len(on_ray) == 5 and {r["status"] for r in on_ray} == {"ok", "skipped"}
    ran = ends_as_planned(DEFAULT_MATRIX, on_ray, EXECUTOR_CELLS)
    assert sum(r["cell"]["optimizer"] == "cpuadam" for r in ran) == 2
    # One task per attempt: each cell once, on one of the two nodes, both used; each outcome carries the
    # provenance taken on its node and the planner's beside it. A Ray worker's first cell starts a fresh
    # interpreter while the worker's fork server imports; the cells after it there fork from it.
    assert len({r["cell_hash"] for r in ran}) == len(ran) == 4
    assert len({r["placement"]["node_id"] for r in ran}) == 2
    for r in ran:
        assert r["provenance"]["host"] == r["placement"]["node"] and r["orchestrator"]["host"]
        assert r["provenance"]["source_sha256"] == r["orchestrator"]["source_sha256"]
        assert r["started_by"]["mode"] == "fork" or "Ray worker's fork server" in r["started_by"]["why"], r
        assert (tmp_path / r["log"]).is_file()  # the nodes share this machine's disk: each log is here
    assert "fork" in {r["started_by"]["mode"] for r in ran}


# -- kills: recorded once, never retried ---------------------------------------------------------------


@pytest.mark.slow
def test_a_cell_whose_worker_or_ray_worker_is_sigkilled_is_recorded_once_as_killed(cluster, tmp_path):
    # Two cells at once, one per node: zero=0's worker SIGKILLs itself at step 2 (the launcher's classifier
    # says killed); zero=1's Ray worker, the task's process, is SIGKILLed from here once its cell steps.
    m = write_matrix(tmp_path / "kill.yaml", LONG + "axes: {zero_stage: [0, 1]}\n")
    tag = f"ray-kill-{uuid.uuid4().hex}"
    env = {"ZEROBENCH_FAULT": "sigkill@2~zero=0", "ZEROBENCH_TEST_TAG": tag}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", str(m), "--executor", "ray", "--address", cluster.address,
         "--results", str(tmp_path / "kill.jsonl"), "--no-report", "--no-progress"],
        cwd=tmp_path, env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        victim = _wait(
            lambda: next((p for p in _tagged_workers(tag) if _zero_stage(p) == 1 and _stepping(p)), None),
            600,
            "zero=1 to take a step",
        )
        ray_worker = victim.parent()
        assert "ray::" in " ".join(ray_worker.cmdline()) or "default_worker" in " ".join(ray_worker.cmdline())
        ray_worker.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    recs = as_written(tmp_path / "kill.jsonl")
    assert [r["status"] for r in recs].count("started") == 2
    ends = {r["cell"]["zero_stage"]: r for r in recs if r["status"] != "started"}
    assert sorted(ends) == [0, 1] and len(recs) == 4  # one start and one end each: nothing ran twice
    assert ends[0]["status"] == "killed" and "signal 9" in ends[0]["reason"], ends[0]["reason"]
    assert ends[1]["status"] == "killed", ends[1]["reason"]
    assert "Ray worker that ran the cell died" in ends[1]["reason"] and "max_retries=0" in ends[1]["reason"]
    assert ends[1]["placement"]["node_id"] and ends[1]["provenance"]["host"]
    # The killed Ray worker's cell stopped itself (it watches its parent): no worker of this run is left.
    _wait(lambda: not _tagged_workers(tag), 30, "the run's workers to end")


def _zero_stage(p: psutil.Process) -> int | None:
    """The ZeRO stage of the cell a worker runs (from its spec)."""
    try:
        spec = Path(p.cmdline()[p.cmdline().index("--spec") + 1])
        return json.loads(spec.read_text())["cell"]["zero_stage"]
    except (psutil.Error, ValueError, IndexError, OSError, KeyError):
        return None


# -- Ctrl-C ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_of_the_orchestrator_cancels_the_ray_tasks_and_leaves_no_worker(cluster, tmp_path, sig):
    # SIGTERM too: ray.init installs its own SIGTERM handler (sys.exit), which the run must not keep.
    m = write_matrix(tmp_path / "long.yaml", LONG + "axes: {zero_stage: [0, 1, 2]}\n")
    tag = f"ray-sigint-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", str(m), "--executor", "ray", "--address", cluster.address,
         "--results", str(tmp_path / "long.jsonl"), "--no-report", "--no-progress"],
        cwd=tmp_path, env={**os.environ, "ZEROBENCH_TEST_TAG": tag, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        _wait(lambda: len([p for p in _tagged_workers(tag) if _stepping(p)]) == 2, 600, "two cells to step")
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, out[-3000:]
    # No cell's worker is left when the orchestrator has exited: each task stopped its worker tree before it
    # ended. A Ray worker's fork server goes with the Ray worker, once Ray ends the run's workers.
    assert not [p.cmdline() for p in _tagged_workers(tag) if not _a_fork_server(p)]
    _wait(lambda: not _tagged_workers(tag), 30, "the Ray workers' fork servers to end")
    assert not [p for p in psutil.process_iter(["cmdline"]) if "ray::_run_job" in " ".join(p.info["cmdline"] or [])]
    recs = as_written(tmp_path / "long.jsonl")
    started = [r for r in recs if r["status"] == "started"]
    ends = [r for r in recs if r["status"] != "started"]
    assert len(started) == 2 and len(ends) == 2  # the third cell never started: no task, no record
    why = "stopped by the user (SIGINT)" if sig == signal.SIGINT else "stopped by SIGTERM"
    assert all(r["status"] == "interrupted" and r["reason"] == why for r in ends), [
        (r["status"], r["reason"]) for r in ends
    ]
    # --resume on the same cluster runs nothing twice: the interrupted cells and the third are left to run.
    dry = zerobench("run", str(m), "--resume", "--results", str(tmp_path / "long.jsonl"), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and "3 to run" in dry.stdout, dry.stdout[-2000:]


# -- cells over two Ray nodes ------------------------------------------------------------------------------


def _timed_run(tmp_path: Path, name: str, body: str, *args: str, **env: str) -> tuple[subprocess.Popen, Path, float]:
    """`zerobench run` of a matrix, started (with when), to be waited for."""
    m = write_matrix(tmp_path / f"{name}.yaml", body)
    res = tmp_path / f"{name}.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", str(m), "--results", str(res), "--no-report", "--no-progress", *args],
        cwd=tmp_path, env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    return proc, res, time.time()


@pytest.fixture(scope="module")
def two_node_runs(cluster, tmp_path_factory):
    """On the module's cluster, one run of two ZeRO-3 cells of 2 nodes x 1 rank (gradient checkpointing off and
    on), the second with rank 1 (on node 1) SIGKILLed at step 2; beside it, through `local`, the first cell as 1
    node x 2 ranks. The outcomes by name, and each run's wall time (printed)."""
    d = tmp_path_factory.mktemp("ray-nodes")
    across = ZERO3.replace("precision: [fp32]", "precision: [fp32], grad_ckpt: [false, true]") + "gpus: 1\nnodes: 2\n"
    runs = {
        "ray": _timed_run(
            d, "ray", across, "--executor", "ray", "--address", cluster.address,
            ZEROBENCH_FAULT="sigkill@2#1~gc=on", ZEROBENCH_STALL_S="120",
        ),
        "within": _timed_run(d, "within", ZERO3 + "gpus: 2\n"),
    }  # fmt: skip
    wall, deadline = {}, time.time() + 900
    while len(wall) < len(runs) and time.time() < deadline:  # each run's own wall time (their output is short)
        wall |= {k: time.time() - t0 for k, (proc, _, t0) in runs.items() if k not in wall and proc.poll() is not None}
        time.sleep(0.5)
    recs = {}
    for name, (proc, res, _) in runs.items():
        if proc.poll() is None:
            proc.kill()
        out, _ = proc.communicate()
        assert proc.returncode == 0, (name, out[-3000:])
        recs.update({name if name == "within" else r["cell"]["grad_ckpt"]: r for r in _outcomes(res)})
    print(f"two-node runs: wall s {', '.join(f'{k} {v:.0f}' for k, v in wall.items())}")
    return {"across": recs[False], "killed": recs[True], "within": recs["within"]}


@pytest.mark.slow
def test_two_ray_nodes_of_one_rank_agree_with_one_node_of_two(cluster, two_node_runs):
    across = two_node_runs["across"]
    agree_across_nodes(across, two_node_runs["within"])
    # One task per node, each on a Ray node of its own: every node named with its host and Ray node id; the
    # rendezvous at node 0's address as Ray knows it; the record's placement and provenance are node 0's.
    ids = {n.node_id for n in cluster.list_all_nodes()}
    nodes = across["nodes"]
    assert {n["node_id"] for n in nodes} == ids and len(ids) == 2
    assert all(n["host"] == socket.gethostname() and n["addr"] == cluster.head_node.node_ip_address for n in nodes)
    assert across["placement"]["node_id"] == nodes[0]["node_id"] and across["placement"]["node"] == nodes[0]["host"]
    assert across["provenance"] == nodes[0]["provenance"] and across["orchestrator"]["host"]
    assert nodes[1]["log"].endswith(".node1.log") and across["log"] == nodes[0]["log"]


@pytest.mark.slow
def test_a_rank_killed_on_the_second_ray_node_is_blamed_on_that_rank_and_node(two_node_runs):
    rec = two_node_runs["killed"]
    nodes = blamed_on_the_second_node(rec)
    assert nodes[0]["stopped"] in (None, "peer")  # its next collective failed, or it was stopped after the grace
    assert nodes[0]["node_id"] != nodes[1]["node_id"]


@pytest.mark.slow
def test_a_stop_of_the_orchestrator_stops_every_node_of_a_cell(cluster, tmp_path):
    m = write_matrix(tmp_path / "long.yaml", LONG + "gpus: 1\nnodes: 2\n")
    tag = f"ray-nodes-sigint-{uuid.uuid4().hex}"
    proc, res, _ = _timed_run(tmp_path, "long", m.read_text(), "--executor", "ray", "--address", cluster.address,
                              ZEROBENCH_TEST_TAG=tag)  # fmt: skip
    try:
        # Each node's first rank writes its node's events: both have stepped once two attempt folders show a step.
        _wait(lambda: len({_spec(p) for p in _tagged_workers(tag) if _stepping(p)}) == 2, 600, "both nodes to step")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    # Each node's task stopped its own torchrun and rank before it ended: nothing of the cell is left anywhere.
    assert not [p.cmdline() for p in _tagged_workers(tag)]
    (end,) = _outcomes(res)
    assert end["status"] == "interrupted" and end["reason"] == "stopped by the user (SIGINT)", end["reason"]


def _spec(p: psutil.Process) -> str | None:
    try:
        return p.cmdline()[p.cmdline().index("--spec") + 1]
    except (psutil.Error, ValueError, IndexError):
        return None


def test_a_cell_over_more_nodes_than_the_cluster_has_is_refused_with_what_to_do():
    two = {"a" * 8: _Node("vm", 1), "b" * 8: _Node("vm", 2)}
    assert _per_node(two, SLOT, "c", 2, 2) == 1  # CPU ranks: as many slots as every node of the cell has
    assert _per_node(two, "GPU", "c", 1, 2) == 1
    with pytest.raises(InputError, match=r"spans 3 nodes; the Ray cluster has 2 node\(s\).*--filter"):
        _per_node(two, SLOT, "c", 1, 3)
    with pytest.raises(InputError, match=r"needs 2 GPUs on each of 2 nodes; 1 node\(s\) of the Ray cluster"):
        _per_node(two, "GPU", "c", 2, 2)


@pytest.mark.slow  # no cell runs, but it needs the module's cluster
def test_a_run_with_a_cell_the_cluster_cannot_place_stops_before_any_cell(cluster, tmp_path):
    m = write_matrix(tmp_path / "three.yaml", TINY + "gpus: 1\nnodes: 3\n")
    r = zerobench(
        "run", str(m), "--executor", "ray", "--address", cluster.address, "--results", str(tmp_path / "r.jsonl"),
        "--no-report", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2 and "spans 3 nodes; the Ray cluster has 2 node(s)" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "r.jsonl").exists() or not _outcomes(tmp_path / "r.jsonl")


# -- clear errors before any cell ------------------------------------------------------------------------


def test_an_address_nobody_answers_is_an_input_error_at_once(tmp_path):
    t0 = time.time()
    r = zerobench("run", "--executor", "ray", "--address", "127.0.0.1:1", "--no-report", cwd=tmp_path)
    assert r.returncode == 2 and "no Ray cluster answers there" in r.stderr, r.stderr[-2000:]
    assert time.time() - t0 < 60  # ray.init alone retries for minutes
    smoke = tmp_path / "results" / "local" / "smoke.jsonl"  # where the embedded default writes
    assert not smoke.exists() or not _outcomes(smoke)


def test_without_ray_installed_the_error_says_what_to_install(tmp_path):
    # A `ray` that cannot be imported, first on the path: as on an install without the extra.
    shim = tmp_path / "noray" / "ray"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n")
    env = {"PYTHONPATH": f"{shim.parent}{os.pathsep}{ROOT}"}
    r = zerobench("run", "--executor", "ray", "--no-report", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "pip install 'zerobench[ray]'" in r.stderr, r.stderr[-2000:]


def test_address_without_a_cluster_executor_is_an_input_error(tmp_path):
    r = zerobench("run", "--address", "127.0.0.1:6379", "--no-report", cwd=tmp_path)
    assert r.returncode == 2 and "--executor ray" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow  # no cell runs, but it needs the module's cluster, which only the slow suite starts
def test_a_node_that_cannot_write_the_logs_folder_stops_the_run_before_any_cell(cluster, tmp_path):
    # Root may write anywhere this host's check looks (os.access), but not make a folder in /proc: the
    # nodes' own check (each node makes the folder and a mark in it) is what stops the run.
    if os.geteuid() != 0:
        pytest.skip("needs root: a folder this user cannot write is refused by this host's check first")
    logs = Path("/proc/zerobench-logs")
    r = zerobench(
        "run", str(DEFAULT_MATRIX), "--executor", "ray", "--address", cluster.address, "--logs", str(logs),
        "--results", str(tmp_path / "r.jsonl"), "--no-report", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    assert "cannot write the logs folder /proc/zerobench-logs" in r.stderr and "--logs" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "r.jsonl").exists() or not _outcomes(tmp_path / "r.jsonl")


# -- Ray's memory monitor --------------------------------------------------------------------------------


def test_a_kill_by_rays_memory_monitor_is_killed_with_rays_words(tmp_path):
    # The exception ray.get raises when the memory monitor killed the task's worker (its text in the form of
    # Ray 2.60's raylet format strings), turned into the cell's Outcome: killed, never host_oom (Ray picks
    # its victims by its policy, not by which cell used the most).
    msg = (
        "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 10.0.0.1, ID: abc) "
        "was 22.80GB used / 24.00GB limit (0.950000)"
    )
    log = tmp_path / "cell.log"
    log.write_text("step 1\nstep 2\n")
    job = Job(Cell(matrix="m", model="llama-tiny"), None, Launch(log))
    attempt = Attempt(key=None, cell=job.cell, shape=Shape(), job=job)
    handle = Handle(attempt, placement=_Held(pg=None, width=1, node_ids=["abc"]), where={})
    out = _killed(handle, ray.exceptions.OutOfMemoryError(msg), 12.5, _Node("node-a", 1, {"host": "node-a"}))
    assert out.status is Status.KILLED and out.wall_s == 12.5
    assert out.reason.startswith("Ray's memory monitor killed the Ray worker that ran the cell")
    assert "was 22.80GB used / 24.00GB limit" in out.reason and "step 2" in out.log_tail
    assert out.node == {"host": "node-a", "provenance": {"host": "node-a"}, "node_id": "abc"}
