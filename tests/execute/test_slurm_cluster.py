"""The test Slurm cluster (tests/slurm_cluster.py) is a real one, and what submitit reports for each way a
job ends on it: the facts a Slurm executor maps to zerobench statuses (docs/slurm.md, "Pitfalls")."""

from __future__ import annotations

import os
import signal
import socket
import time

import psutil
import pytest

from tests.slurm_cluster import wait_until


def test_sbatch_and_srun_run_on_both_nodes(slurm_cluster, tmp_path):
    c = slurm_cluster
    assert c.run("srun", "-N1", "hostname").stdout.strip() == socket.gethostname()
    out = tmp_path / "out"
    task = 'echo "$SLURMD_NODENAME $SLURM_NODEID gpus=$CUDA_VISIBLE_DEVICES"'
    script = f"scontrol show hostnames \"$SLURM_JOB_NODELIST\"; srun bash -c '{task}'"
    r = c.run("sbatch", "--wait", "-N2", "--ntasks-per-node=1", "--gpus-per-node=1", "-o", str(out), "--wrap", script)
    job = r.stdout.split()[-1]
    lines = sorted(out.read_text().splitlines())
    assert lines == ["n1", "n1 0 gpus=0", "n2", "n2 1 gpus=0"]
    info = c.job(job)
    assert (info["JobState"], info["ExitCode"], info["NumNodes"]) == ("COMPLETED", "0:0", "2")


def test_no_accounting_without_slurmdbd(slurm_cluster):
    r = slurm_cluster.run("sacct", "-j", "1", check=False)
    assert r.returncode == 1 and "accounting storage is disabled" in r.stderr


def test_gpus_are_gres_and_cpu_jobs_share_a_node(slurm_cluster, tmp_path):
    """Two one-GPU jobs side by side on one node get the node's two GRES indexes; a job that asks for no
    GPU runs beside them on the same node and sees none."""
    c = slurm_cluster
    jobs = []
    for i, gpus in enumerate(("--gres=gpu:1", "--gpus-per-node=1", None)):
        args = ["sbatch", "-w", "n1", "-c1", "--mem=100M", "-o", str(tmp_path / f"{i}.out")]
        args += [gpus] if gpus else []
        script = 'sleep 3; echo "gpus=$CUDA_VISIBLE_DEVICES job_gpus=$SLURM_JOB_GPUS"'
        jobs.append(c.run(*args, "--wrap", script).stdout.split()[-1])
    for j in jobs:
        assert c.wait_ended(j)["JobState"] == "COMPLETED"
    seen = [(tmp_path / f"{i}.out").read_text().strip() for i in range(3)]
    assert sorted(seen[:2]) == ["gpus=0 job_gpus=0", "gpus=1 job_gpus=1"]
    assert seen[2] == "gpus= job_gpus="


# -- submitit on it -------------------------------------------------------------------------------------


@pytest.fixture
def submitit_on(slurm_cluster, tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))

    def executor(**params):
        ex = submitit.AutoExecutor(folder=tmp_path / "%j", cluster="slurm")
        params.setdefault("slurm_partition", "cells")
        params.setdefault("cpus_per_task", 1)
        params.setdefault("timeout_min", 10)
        params.setdefault("slurm_mem", "500M")
        ex.update_parameters(**params)
        return ex

    return executor


def _where() -> tuple[str, str | None, str | None, int]:
    import submitit

    env = submitit.JobEnvironment()
    return socket.gethostname(), os.environ.get("SLURMD_NODENAME"), os.environ.get("CUDA_VISIBLE_DEVICES"), env.node


def _raise() -> None:
    raise ValueError("raised in the job")


def _sleep(s: float) -> str:
    print(SLEEPING, flush=True)  # submitit calls this after it installed its signal handlers
    time.sleep(s)
    return "slept"


SLEEPING = "zerobench-test: sleeping"


def _sleeping(job, timeout_s: float = 180.0) -> None:
    """Wait until the job's function runs: submitit's handlers are in place (an event, not a guess in seconds)."""
    wait_until(lambda: SLEEPING in (job.stdout() or ""), timeout_s, f"job {job.job_id} to start its function", None)


def _sleep_through_usr2(s: float) -> str:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    time.sleep(s)
    return "slept"


def _hog() -> str:
    held = []
    for _ in range(200):
        held.append(bytearray(os.urandom(1) * (20 * 2**20)))  # touched: counted in RSS
        time.sleep(0.05)
    return "held"


def test_submitit_returns_a_value_from_each_node(slurm_cluster, submitit_on):
    job = submitit_on(slurm_gres="gpu:1").submit(_where)
    host, node, gpus, index = job.result()
    assert (host, node in slurm_cluster.nodes, gpus, index) == (socket.gethostname(), True, "0", 0)
    assert slurm_cluster.wait_ended(job.job_id)["JobState"] == "COMPLETED"
    assert job.state == "UNKNOWN"  # submitit reads states from sacct only, and there is no sacct here
    two = submitit_on(nodes=2, tasks_per_node=1, slurm_gpus_per_node=1).submit(_where)
    results = two.results()
    assert sorted(r[1] for r in results) == ["n1", "n2"]
    assert sorted(r[3] for r in results) == [0, 1]  # JobEnvironment().node: the node's index in the job


def test_submitit_raises_what_the_function_raised(slurm_cluster, submitit_on):
    job = submitit_on().submit(_raise)
    with pytest.raises(Exception, match="raised in the job") as e:
        job.result()
    assert type(e.value).__name__ == "FailedJobError"
    info = slurm_cluster.wait_ended(job.job_id)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "1:0")


def _no_pickle(cluster, job) -> bool:
    """No result once the job's last process is gone (nothing of it is left to write one)."""
    wait_until(lambda: not _processes(cluster, job.job_id), 120, f"job {job.job_id}'s processes to end", cluster)
    return not job.done() and not job.paths.result_pickle.exists() and job.state == "UNKNOWN"


def _processes(cluster, job_id: str) -> list[int]:
    """The live processes of this cluster's job (each carries its SLURM_CONF and SLURM_JOB_ID)."""
    found = []
    for p in psutil.process_iter():
        try:
            e = p.environ()
        except psutil.Error:
            continue
        if e.get("SLURM_JOB_ID") == str(job_id) and e.get("SLURM_CONF") == str(cluster.conf):
            found.append(p.pid)
    return found


@pytest.mark.slow
def test_scancel_memory_and_preemption_leave_no_result(slurm_cluster, submitit_on):
    c = slurm_cluster
    cancelled = submitit_on(slurm_additional_parameters={"nodelist": "n1"}).submit(_sleep, 300)
    hog = submitit_on(slurm_mem="200M", slurm_additional_parameters={"nodelist": "n1"}).submit(_hog)
    _sleeping(cancelled)
    c.run("scancel", cancelled.job_id)
    info = c.wait_ended(cancelled.job_id)
    assert (info["JobState"], info["ExitCode"]) == ("CANCELLED", "0:15")
    assert _no_pickle(c, cancelled)
    assert "Bypassing signal SIGTERM" in cancelled.stdout()

    info = c.wait_ended(hog.job_id)
    assert (info["JobState"], info["ExitCode"]) == ("FAILED", "137:0")
    assert "exceeded memory limit" in hog.stderr()
    assert _no_pickle(c, hog)

    # Preemption: a job of the higher-tier partition takes both CPUs of n2 from a job of `cells`.
    low = submitit_on(cpus_per_task=os.cpu_count(), slurm_additional_parameters={"nodelist": "n2"}).submit(_sleep, 300)
    _sleeping(low)
    c.run(
        "sbatch", "-p", "urgent", "-w", "n2", f"-c{os.cpu_count()}", "--mem=100M", "-o", "/dev/null", "--wrap", "true"
    )
    info = c.wait_ended(low.job_id)
    assert (info["JobState"], info["ExitCode"]) == ("PREEMPTED", "0:15")
    assert _no_pickle(c, low)


@pytest.mark.slow
def test_a_failed_node_requeues_unless_told_not_to(slurm_cluster, submitit_on):
    c = slurm_cluster
    again = submitit_on(slurm_additional_parameters={"nodelist": "n2"}).submit(_sleep, 300)
    once = submitit_on(slurm_additional_parameters={"nodelist": "n2", "no_requeue": True}).submit(_sleep, 300)
    c.wait_state(again.job_id, "RUNNING")
    c.wait_state(once.job_id, "RUNNING")
    try:
        c.run("scontrol", "update", "nodename=n2", "state=down", "reason=zerobench-test")
        info = c.wait_state(again.job_id, "PENDING")
        assert (info["Restarts"], info["Requeue"]) == ("1", "1")  # Slurm runs it again: JobRequeue=1 by default
        info = c.wait_ended(once.job_id)
        assert (info["JobState"], info["Reason"]) == ("NODE_FAIL", "NodeDown")
        assert _no_pickle(c, once)
    finally:
        c.run("scancel", again.job_id, check=False)
        c.resume("n2")


@pytest.mark.slow
def test_time_limit_usr2_fails_the_job_before_slurm_times_it_out(slurm_cluster, submitit_on):
    """submitit's USR2 (90 s before the limit) ends a job as FAILED with
    UncompletedJobError; a function that ignores USR2 runs into Slurm's TIMEOUT, which leaves no pickle."""
    c = slurm_cluster
    short = {"time": "0:15"}  # Slurm rounds it up to a minute
    # Slurm sends --signal once, at a coarse resolution, up to 60 s early (sbatch(1)), to the job's steps as they are
    # then: under a short limit USR2 can come before submitit's handler (the job dies with no result), and on a
    # loaded host before the step. So the job starts with a limit far off and gets its 3 minutes only once its
    # function runs, with submitit's handler in place.
    signalled = submitit_on(slurm_additional_parameters={"time": "20:00"}).submit(_sleep, 600)
    timed_out = submitit_on(slurm_additional_parameters=short, slurm_signal_delay_s=5).submit(_sleep_through_usr2, 300)
    _sleeping(signalled)
    c.run("scontrol", "update", f"JobId={signalled.job_id}", "TimeLimit=3")
    # First: result() waits for ever on a job that died before its handler. Bounded past the job's own limit (Slurm's
    # signal comes at its coarse resolution), so a missed USR2 shows as TIMEOUT, with the job's own log.
    ended = c.wait_ended(signalled.job_id, timeout=330)
    assert (ended["JobState"], ended["ExitCode"]) == ("FAILED", "1:0"), (ended, signalled.stderr(), c.logs())
    with pytest.raises(Exception, match="timed-out and not checkpointable"):
        signalled.result()
    t0 = time.time()
    info = c.wait_ended(timed_out.job_id, timeout=240)
    assert (info["JobState"], info["Reason"], info["ExitCode"], info["TimeLimit"]) == (
        "TIMEOUT",
        "TimeLimit",
        "0:15",
        "00:01:00",
    ), time.time() - t0
    assert _no_pickle(c, timed_out)
