"""How the Slurm executor reads a job's end and asks for one: Slurm's states as statuses with the evidence
(the fields are those `scontrol show job` printed for each way a job ended on the test cluster,
tests/slurm_cluster.py and tests/execute/test_slurm_cluster.py), the sbatch options of an attempt, the slurm: block and
the command line's options, and the partition the rules judge a run by (sinfo on the test cluster)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.execute.executors import slurm
from bench.execute.executors.executor import Attempt, Job, Shape
from bench.execute.launch import Launch, NodeEnd, Outcome
from bench.matrix.cells import Cell
from bench.matrix.problems import InputError
from bench.matrix.spec import MatrixError, SlurmSettings, loads
from bench.records.record import Record, WorkerDoc
from bench.records.status import Status
from tests.conftest import TINY, as_written, write_matrix, zerobench

CELL = Cell(model="llama-tiny")


def _judge(info: dict, tail: str = "", stop: str | None = None, cell: Cell = CELL):
    return slurm.judge(cell, "7", info, [], tail, stop)


@pytest.mark.parametrize(
    "info, tail, status, says",
    [
        (
            {"JobState": "TIMEOUT", "Reason": "TimeLimit", "ExitCode": "0:15", "TimeLimit": "00:01:00"},
            "",
            Status.TIMEOUT,
            "Slurm ended the job at its time limit (00:01:00) (Slurm job 7: TIMEOUT, Reason TimeLimit, ExitCode 0:15)",
        ),
        (
            {"JobState": "OUT_OF_MEMORY", "Reason": "OutOfMemory", "ExitCode": "0:125"},
            "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=9.0. Some of your processes may have been "
            "killed",
            Status.HOST_OOM,
            "Slurm ended the job for memory (OUT_OF_MEMORY)",
        ),
        (
            {"JobState": "FAILED", "Reason": "NonZeroExitCode", "ExitCode": "137:0"},
            "slurmstepd: error: StepId=5.0 exceeded memory limit (1266240 > 204800), being killed",
            Status.HOST_OOM,
            "Slurm killed the job for memory: slurmstepd: error: StepId=5.0 exceeded memory limit (1266240 > 204800)",
        ),
        (
            {"JobState": "NODE_FAIL", "Reason": "NodeDown", "ExitCode": "0:0", "NodeList": "n2"},
            "srun: error: Node failure on n2",
            Status.KILLED,
            "a node of the job failed (n2); --resume runs it again",
        ),
        (
            {"JobState": "PREEMPTED", "Reason": "None", "ExitCode": "0:15"},
            "",
            Status.INTERRUPTED,
            "preempted: Slurm gave the job's nodes to another job; --resume runs it again (Slurm job 7: PREEMPTED, "
            "ExitCode 0:15)",
        ),
        (
            {"JobState": "CANCELLED", "Reason": "None", "ExitCode": "0:15"},
            "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-12-02T07:22:20 ***",
            Status.INTERRUPTED,
            "the job was cancelled outside zerobench (scancel)",
        ),
        (
            {"JobState": "FAILED", "Reason": "NonZeroExitCode", "ExitCode": "3:0"},
            "--- Slurm job 7, task 0: stderr ---\nsrun: error: n1: task 0: Exited with exit code 3",
            Status.ERROR,
            "1 of the job's 1 node(s) handed back no launch (Slurm job 7: FAILED, Reason NonZeroExitCode, ExitCode "
            "3:0): srun: error: n1: task 0: Exited with exit code 3",
        ),
        ({}, "", Status.ERROR, "handed back no launch (Slurm job 7: UNKNOWN)"),
    ],
)
def test_a_job_that_handed_back_no_launch_ends_as_slurm_says(info, tail, status, says):
    out = _judge(info, tail)
    assert out.status is status and says in out.reason, out.reason
    assert out.log_tail == tail and out.ranks == []


def _task(killed_for: str | None, exit_code: int | None, status: str = "ok") -> slurm.TaskEnd:
    """A node's launch as run_node hands it back: the rank's document, its exit, why zerobench stopped it."""
    doc = WorkerDoc(rank=0, status=status, reason="" if status == "ok" else "stopped by SIGINT or SIGTERM")
    out = Outcome(Status.ERROR, "", ranks=[doc], exit_code=exit_code, phase_at_end="measured", last_step=3)
    end = NodeEnd(0, "gpu-node-17", "127.0.0.1", [0], out, killed_for, provenance={}, log="x.log")
    return slurm.TaskEnd(0, "n1", end, gpus=None, signal={"time_limit": "USR2", "interrupt": "SIGTERM"}.get(killed_for))


def test_a_launch_stopped_by_the_jobs_signals_keeps_what_it_measured():
    done = {"JobState": "COMPLETED", "ExitCode": "0:0", "TimeLimit": "00:30:00"}
    out = slurm.judge(CELL, "7", done, [_task("time_limit", -15, "interrupted")], "")
    assert out.status is Status.TIMEOUT and out.last_step == 3
    assert out.reason == (
        "stopped as the job's time limit (00:30:00) neared: Slurm signalled USR2 (phase measured, after step 3; "
        "Slurm job 7: COMPLETED, ExitCode 0:0)"
    )
    preempted = {"JobState": "PREEMPTED", "ExitCode": "0:15"}
    out = slurm.judge(CELL, "7", preempted, [_task("interrupt", -15, "interrupted")], "")
    assert out.status is Status.INTERRUPTED and out.reason.startswith("preempted: Slurm gave the job's nodes")
    assert len(out.ranks) == 1 and "phase measured, after step 3" in out.reason
    # A launch that ended by itself is its own outcome, whatever came after it.
    out = slurm.judge(CELL, "7", {"JobState": "CANCELLED", "ExitCode": "0:15"}, [_task(None, 0)], "", stop="stopped")
    assert out.status is Status.OK


def test_the_runs_own_stop_says_so_and_slurm_evidence_follows():
    info = {"JobState": "CANCELLED", "ExitCode": "0:15", "RunTime": "00:01:31"}
    out = _judge(info, stop="stopped by the user (SIGINT)")
    assert out.status is Status.INTERRUPTED
    assert out.reason == "stopped by the user (SIGINT) (Slurm job 7: CANCELLED, ExitCode 0:15)"
    assert (out.exit_code, out.wall_s) == (-15, 91.0)


def test_a_record_names_the_job_its_nodes_and_the_node_that_ran_it():
    started = Record.started(CELL, run_id="r", attempt=1, matrix_file="", started_at="2026-12-02T00:00:00+00:00")
    out = _judge({"JobState": "PREEMPTED", "ExitCode": "0:15"})
    node_prov = {**started.provenance.model_dump(mode="json"), "host": "gpu-node-17"}
    out.node = {"slurm_job": "7", "slurm_nodes": ["n1"], "host": "gpu-node-17", "gpus": [3], "provenance": node_prov}
    rec = Record.from_outcome(started, out, ds_config=None, log="x.log", ended_at="2026-12-02T00:01:00+00:00")
    d = rec.to_dict()
    assert d["status"] == "interrupted" and d["exit_code"] == -15
    assert d["placement"] == {"slurm_job": "7", "slurm_nodes": ["n1"], "node": "gpu-node-17", "gpus": [3]}
    assert d["provenance"]["host"] == "gpu-node-17" and d["orchestrator"]["host"] == started.provenance.host


def test_gres_as_sinfo_prints_them():
    assert slurm._gres_gpus("gpu:4") == (4, None)
    assert slurm._gres_gpus("gpu:h100:8(S:0-1)") == (8, "h100")
    assert slurm._gres_gpus("gpu:a100:4,shard:8") == (4, "a100")
    assert slurm._gres_gpus("(null)") == (0, None)


def test_usr2_comes_before_the_time_limit_by_a_quarter_of_a_short_one():
    assert [slurm.signal_delay_s(s) for s in (60, 300, 3600)] == [15, 75, 90]


PART = slurm.Partition("gpu", nodes=4, gpus_per_node=8, gpu_type="h100", gpus=32, cpus=96, mem_mb=2_000_000)


def _attempt(cell: Cell) -> Attempt:
    job = Job(cell, None, Launch(Path(f"/shared/logs/{cell.hash}.1.log")))
    return Attempt(key=None, cell=cell, shape=Shape(gpus_per_node=cell.gpus, nodes=cell.nodes), job=job)


def test_an_attempts_job_asks_for_its_nodes_gpus_cpus_and_time(tmp_path):
    block = SlurmSettings(account="proj", qos="high", sbatch={"constraint": "h100"})
    s = slurm.Settings.of(block, PART, cuda=True, logs=tmp_path / "logs")
    assert (s.max_jobs, s.folder) == (32, tmp_path / "logs" / "slurm")  # one job per GPU at most, by default
    ex = slurm.SlurmExecutor(settings=s, cuda=True, printer=lambda *_: None)
    assert ex.folder.parent == s.folder and ex.slots == 32
    cell = Cell(model="llama-tiny", gpus=2, nodes=2, timeout_s=1200)
    p = ex.parameters(_attempt(cell))
    assert (p["nodes"], p["ntasks_per_node"], p["gpus_per_node"], p["cpus_per_task"]) == (2, 1, 2, 24)
    assert (p["time"], p["signal_delay_s"]) == (30, 90)  # timeout_s + 10 minutes, in minutes
    assert p["additional_parameters"] == {"no_requeue": True, "constraint": "h100"}
    assert (p["partition"], p["account"], p["qos"]) == ("gpu", "proj", "high")
    assert p["job_name"] == f"zerobench-{cell.hash}.1" and "mem" not in p
    cpu = slurm.Settings.of(SlurmSettings(time_limit="45m", mem_per_node="3G"), PART, cuda=False, logs=tmp_path)
    p = slurm.SlurmExecutor(settings=cpu, cuda=False, printer=lambda *_: None).parameters(_attempt(cell))
    assert "gpus_per_node" not in p and (p["cpus_per_task"], p["time"], p["mem"]) == (2, 45, "3G")
    assert cpu.max_jobs == 4  # CPU cells: one per node at a time


def test_submitit_missing_is_said_with_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)
    with pytest.raises(InputError, match=r"pip install 'zerobench\[slurm\]'"):
        slurm.require()


def test_the_slurm_block_is_checked_with_the_rest_of_the_matrix():
    body = TINY + "slurm: {partition: gpu, time_limit: 90, mem_per_node: 3GB, sbatch: {time: 5}, max_job: 2}\n"
    with pytest.raises(MatrixError) as e:
        loads(body, "m.yaml")
    text = str(e.value)
    assert "slurm.time_limit: '90' has no unit: write 90m for minutes" in text
    assert "slurm.mem_per_node: '3GB' is not a Slurm memory size" in text
    assert "slurm.sbatch: zerobench sets time for each job itself" in text
    assert "slurm.max_job: unknown key" in text and "did you mean 'max_jobs'?" in text
    assert loads(TINY + "slurm: {time_limit: 1h30m}\n").slurm.time_limit == "1h30m"


@pytest.mark.parametrize(
    "args, says",
    [
        (("--partition", "gpu"), "--partition only with --executor slurm"),
        (("--executor", "slurm", "--time-limit", "30"), "--time-limit '30' has no unit"),
        (("--executor", "slurm", "--assume-gpus", "2"), "--assume-gpus with --executor slurm"),
    ],
)
def test_slurm_options_are_checked_before_anything_runs(tmp_path, args, says):
    m = write_matrix(tmp_path / "m.yaml", TINY)
    r = zerobench("run", str(m), "--no-report", *args, cwd=tmp_path)
    assert r.returncode == 2 and says in r.stderr, r.stderr


def test_a_host_without_slurm_is_said_before_anything_runs(tmp_path):
    m = write_matrix(tmp_path / "m.yaml", TINY)
    r = zerobench("run", str(m), "--no-report", "--executor", "slurm", cwd=tmp_path, env={"PATH": str(tmp_path)})
    assert r.returncode == 2 and "sinfo not found: run zerobench on a host with Slurm's client commands" in r.stderr
    assert not (tmp_path / "results").exists()


# -- on the test cluster (sinfo) ---------------------------------------------------------------------------


def test_the_rules_judge_a_slurm_run_by_the_partitions_nodes(slurm_cluster, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    part = slurm.partition(None)  # the default partition
    assert part == slurm.Partition("cells", 2, 2, None, 4, part.cpus, 8192)
    p = slurm.platform_of(part)
    assert (len(p.gpus), p.hosts, p.host_memory_bytes) == (2, 2, 8192 * 2**20)
    assert not p.cuda  # this host's torch is a CPU build: the cells run on the nodes' CPUs
    with pytest.raises(InputError, match=r"partition 'nope' is not on this cluster \(sinfo lists cells, urgent\)"):
        slurm.partition("nope")


def test_a_dry_run_on_slurm_says_which_partition_judged_it(slurm_cluster, tmp_path):
    m = write_matrix(tmp_path / "m.yaml", TINY + "nodes: 3\n")
    env = {"SLURM_CONF": str(slurm_cluster.conf)}
    r = zerobench(
        "run", str(m), "--dry-run", "-v", "--executor", "slurm", "--partition", "cells", cwd=tmp_path, env=env
    )
    assert r.returncode == 0, r.stderr
    assert "runnable on Slurm partition cells's nodes" in r.stdout
    assert "spans 3 nodes; the cluster has 2" in r.stdout  # nodes-available, from sinfo's node count


def test_a_job_sbatch_refuses_is_the_cells_error_with_its_words(slurm_cluster, tmp_path):
    m = write_matrix(tmp_path / "m.yaml", TINY)
    env = {"SLURM_CONF": str(slurm_cluster.conf)}
    r = zerobench("run", str(m), "--results", str(tmp_path / "r.jsonl"), "--no-report", "--executor", "slurm",
                  "--mem-per-node", "100G", cwd=tmp_path, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    (rec,) = [x for x in as_written(tmp_path / "r.jsonl") if x["status"] != "started"]
    assert rec["status"] == "error" and rec["reason"].startswith("sbatch refused the job: "), rec["reason"]
    assert "Requested node configuration is not available" in rec["reason"]
