"""Cells on a Slurm cluster through submitit: one job per cell attempt, one Slurm node per node of the cell.

session -> slurm (sbatch one job per attempt; its end read from squeue, scontrol and what it handed back)
        -> in the job: run_task on each node -> launch.run_node (the same launcher as on one host)

Each attempt is a job of the cell's nodes, one task per node (--ntasks-per-node=1) holding the node's GPUs
(--gpus-per-node, GRES) and CPUs (--cpus-per-task), never requeued (--no-requeue: a cell is measured once,
and a job Slurm stops ends as what stopped it). Every task runs its node's part of the attempt through
launch.take_part (run_node), a cell of one node too: the job's signals become the launch's stops (SIGTERM
from scancel, a preemption or the time limit: interrupt; submitit's USR2 shortly before the time limit:
time_limit), and a stopped launch still hands back what its ranks wrote, with the node's provenance. Node 0
of a multi-node cell publishes the rendezvous (its address as Slurm knows it, a port free on it) in the
attempt's folder, the board its nodes meet on (_Folder); a node whose launch failed marks it there, and its
peers are stopped as "peer" PEER_GRACE_S later.

The orchestrator keeps at most max_jobs jobs in Slurm and submits the next attempt when one ends (so an
out-of-memory end can still imply the heavier cells behind it). States come from squeue and scontrol: sacct
needs slurmdbd, which a cluster may not run, and submitit reads states only from sacct. A job's end is judged
(judge) from what its tasks handed back (submitit's result pickles) and Slurm's evidence: its state, reason,
exit code and the tasks' stderr. No job arrays: an array submits its attempts at once, before an outcome
can imply any of them (docs/slurm.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...host import env
from ...matrix.cells import Cell
from ...matrix.problems import InputError
from ...matrix.spec import SlurmSettings, duration_s
from ...records.status import Status
from .. import launch
from .executor import Attempt, Finished, Handle, Job, stop_for

__all__ = ["Partition", "Settings", "SlurmExecutor", "Task", "TaskEnd", "judge", "partition", "platform_of", "run_task"]

SPAWN_WHY = "Slurm job: one attempt per job, so no fork server (it would start for that attempt alone)"
JOB_START_S = 600.0  # a job's time limit past the cell's timeout_s, by default: its start, imports and teardown
POLL_S = 2.0  # how often the orchestrator asks Slurm how its jobs are
RESULT_GRACE_S = 10.0  # after a job's end, how long its result pickles may take to show on shared storage
CANCEL_S = 120.0  # how long cancelled jobs get to end (Slurm's KillWait is 30 s by default)
# Slurm's states of a job that has not ended.
LIVE = frozenset("PENDING CONFIGURING RUNNING COMPLETING SUSPENDED REQUEUED RESIZING SIGNALING STAGE_OUT".split())
# What slurmstepd writes to a job's stderr when it, or the kernel in the job's cgroup, kills it for memory.
_MEMORY_RE = re.compile(r".*(?:exceeded memory limit|oom-kill event).*")


# -- the partition and the run's settings -------------------------------------------------------------


@dataclass(frozen=True)
class Partition:
    """A partition as sinfo shows it: its node count, and its largest node's GPUs (GRES gpu), CPUs, memory."""

    name: str
    nodes: int
    gpus_per_node: int
    gpu_type: str | None
    gpus: int
    """Every node's GPUs together."""
    cpus: int
    mem_mb: int


def _slurm(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """A Slurm client command (one that did not answer within timeout: exit -1); InputError where the command is
    missing (not a Slurm host)."""
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(args, -1, "", f"{args[0]} did not answer within {timeout:g} s")
    except FileNotFoundError:
        raise InputError(
            f"--executor slurm: {args[0]} not found: run zerobench on a host with Slurm's client commands "
            "(sbatch, squeue, scontrol, scancel, sinfo)"
        ) from None


def partition(name: str | None) -> Partition:
    """The partition called `name` (None: the cluster's default), from sinfo; InputError naming what is wrong."""
    r = _slurm(["sinfo", "-h", "-N", "-o", "%P|%N|%G|%c|%m"])
    if r.returncode != 0:
        raise InputError(f"--executor slurm: sinfo failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")
    rows = [line.split("|") for line in r.stdout.splitlines() if line.count("|") == 4]
    names = sorted({p.rstrip("*") for p, *_ in rows})
    if name is None:
        name = next((p.rstrip("*") for p, *_ in rows if p.endswith("*")), None)
        if name is None:
            raise InputError(f"this cluster has no default partition: name one of {', '.join(names)} (--partition)")
    mine = {n: (g, c, m) for p, n, g, c, m in rows if p.rstrip("*") == name}
    if not mine:
        raise InputError(f"partition {name!r} is not on this cluster (sinfo lists {', '.join(names) or 'none'})")
    gres = [_gres_gpus(g) for g, _, _ in mine.values()]
    return Partition(
        name=name,
        nodes=len(mine),
        gpus_per_node=max(n for n, _ in gres),
        gpu_type=next((t for n, t in sorted(gres, reverse=True) if t), None),
        gpus=sum(n for n, _ in gres),
        cpus=max(int(c.rstrip("+")) for _, c, _ in mine.values()),
        mem_mb=max(int(m.rstrip("+")) for _, _, m in mine.values()),
    )


def _gres_gpus(gres: str) -> tuple[int, str | None]:
    """(GPUs, type) of a node's GRES as sinfo prints them: gpu:4, gpu:h100:8(S:0-1), (null)."""
    found = re.findall(r"(?:^|,)gpu(?::([^:,()]+))?:(\d+)", gres)
    return sum(int(n) for _, n in found), next((t for t, _ in found if t), None)


def platform_of(part: Partition) -> env.Platform:
    """The platform the rules judge a Slurm run by: the partition's largest node (its GRES GPUs, CPUs and
    memory; its node count as the hosts a cell may span) with this host's Python packages, which the nodes
    run too (one environment on shared storage). GPU memory is not known before a job runs: --gpu-mem gives it."""
    here = env.probe()
    kind = part.gpu_type or "GPU"
    gpus = tuple(
        env.Gpu(i, f"{kind} (GRES of partition {part.name})", 0, f"slurm-gres-{i}") for i in range(part.gpus_per_node)
    )
    return dataclasses.replace(
        here, gpus=gpus, driver=None, host_memory_bytes=part.mem_mb * 2**20, cpu_count=part.cpus, hosts=part.nodes,
        nvml=True,  # each node's: every record says what its node sampled
    )  # fmt: skip


@dataclass(frozen=True)
class Settings:
    """A Slurm run's settings: the matrix's slurm block, the command line's options over it, the defaults
    filled in from the partition (bench.matrix.spec.SlurmSettings documents each)."""

    partition: Partition
    folder: Path
    max_jobs: int
    account: str | None = None
    qos: str | None = None
    time_limit_s: float | None = None
    mem_per_node: str | None = None
    cpus_per_gpu: int | None = None
    sbatch: dict = field(default_factory=dict)

    @classmethod
    def of(cls, block: SlurmSettings, part: Partition, cuda: bool, logs: Path) -> Settings:
        jobs = block.max_jobs or (part.gpus if cuda and part.gpus else part.nodes)
        return cls(
            partition=part, folder=Path(block.folder or logs / "slurm").absolute(), max_jobs=max(1, jobs),
            account=block.account, qos=block.qos,
            time_limit_s=duration_s(str(block.time_limit)) if block.time_limit else None,
            mem_per_node=block.mem_per_node, cpus_per_gpu=block.cpus_per_gpu, sbatch=dict(block.sbatch),
        )  # fmt: skip


def require() -> Any:
    """submitit, or InputError saying how to install it."""
    try:
        import submitit
    except ImportError:
        raise InputError("--executor slurm needs submitit: pip install 'zerobench[slurm]'") from None
    return submitit


# -- in the job: one task per node --------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """What each task of an attempt's job runs (submitit pickles it into the attempt's folder)."""

    job: Job
    folder: str
    """The attempt's folder, which its nodes and the orchestrator share: the rendezvous and the nodes' ends."""
    gpu: bool
    """A GPU cell: the node's GPUs are those Slurm gave the task."""


@dataclass
class TaskEnd:
    """What one task hands back: its node's launch (None: stopped before it began), the Slurm node it ran on,
    the GPUs Slurm gave it, and the signal that stopped it, if one did."""

    node: int
    slurm_node: str
    launch: launch.NodeEnd | None
    gpus: list[int] | None = None
    signal: str | None = None


def run_task(task: Task) -> TaskEnd:
    """One node's part of an attempt, as a Slurm task: meet the other nodes in the attempt's folder, then the
    node's launch (launch.take_part) while this (the main) thread takes the job's signals as stops. Raises only
    for zerobench's own failure (submitit pickles it); a node that fails marks it for its peers."""
    node, folder = int(os.environ.get("SLURM_NODEID", "0")), Path(task.folder)
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    stop, seen = launch.StopRequest(), []
    with _signals_stop(stop, seen):
        end = launch.take_part(
            _Folder(folder), node, lambda: _node_launch(task.job, node, _gpus(task)), lambda: _node_addr(name), stop
        )
    return TaskEnd(node, name, end, _gpus(task), seen[0] if seen else None)


@contextlib.contextmanager
def _signals_stop(stop: launch.StopRequest, seen: list[str]):
    """The job's signals as stops of the node's launch: USR2 (submitit asks Slurm for it signal_delay_s before
    the time limit) as time_limit, SIGTERM (scancel, preemption, the limit itself) and SIGINT as interrupt.
    Replaces submitit's handlers, which would requeue on USR2 and ignore SIGTERM until Slurm's SIGKILL."""

    def on(signum, _frame):
        seen.append(signal.Signals(signum).name)
        if not stop.is_set():
            why = "time_limit" if signum == signal.SIGUSR2 else "interrupt"
            stop.request(KeyboardInterrupt(f"{seen[-1]} from Slurm"), why=why)

    old = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)}
    for s in old:
        signal.signal(s, on)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _gpus(task: Task) -> list[int] | None:
    """The GPUs Slurm gave this task (CUDA_VISIBLE_DEVICES, as it sets it from the job's GRES), or None for a
    CPU cell."""
    if not task.gpu:
        return None
    text = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    try:
        gpus = [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        raise RuntimeError(f"Slurm set CUDA_VISIBLE_DEVICES={text!r}, not GPU indexes") from None
    if len(gpus) != task.job.cell.gpus:
        raise RuntimeError(
            f"Slurm gave this task {len(gpus)} GPU(s) (CUDA_VISIBLE_DEVICES={text!r}); the cell needs "
            f"{task.job.cell.gpus} per node: are the nodes' GPUs GRES (gres.conf)?"
        )
    return gpus


def _node_addr(name: str) -> str:
    """The address the other nodes reach this one at: its NodeAddr (what Slurm itself reaches it at; node names
    need not resolve), else its host name."""
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True, timeout=30)
        m = re.search(r"\bNodeAddr=(\S+)", out.stdout)
        if m:
            return m[1]
    except (OSError, subprocess.SubprocessError):
        pass
    return socket.getfqdn()


def _node_launch(job: Job, node: int, gpus: list[int] | None) -> launch.NodeLaunch:
    """The node's launch, its rendezvous's address and port left to launch.take_part."""
    log = launch.node_log(job.launch.log_path, node)
    here = dataclasses.replace(job.launch, log_path=log, gpus=gpus, spawn_why=SPAWN_WHY)
    return launch.NodeLaunch(job.cell, job.ds_config, here, launch.Rendezvous(0, "", job.cell.nodes, node))


class _Folder:
    """The attempt's folder as the board its nodes meet on (launch.Board): every node of the job shares it. Node
    0's rendezvous in rendezvous.json, each node's end in nodeK.ended ("ok" or "failed")."""

    def __init__(self, path: Path):
        self.path = path
        self.unmet = f"do the nodes share {path}?"

    def publish(self, addr: str, port: int) -> None:
        _write(self.path / "rendezvous.json", json.dumps({"addr": addr, "port": port}))

    def rendezvous(self) -> tuple[str, int] | None:
        path = self.path / "rendezvous.json"
        if not path.exists():
            return None
        met = json.loads(path.read_text())
        return met["addr"], int(met["port"])

    def mark(self, node: int, failed: bool) -> None:
        with contextlib.suppress(OSError):
            _write(self.path / f"node{node}.ended", "failed" if failed else "ok")

    def peer_failed(self, node: int) -> bool:
        for p in self.path.glob("node*.ended"):
            if p.name != f"node{node}.ended":
                with contextlib.suppress(OSError):
                    if p.read_text() == "failed":
                        return True
        return False


def _write(path: Path, text: str) -> None:
    """Whole or not at all, for a reader on another node."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- how a job ended ----------------------------------------------------------------------------------

# Slurm's states that end a job from outside it, as statuses: killed and interrupted are no outcome (--resume
# runs the cell again); a node that failed says nothing of the cell, a preemption or a cancel neither.
_FROM_OUTSIDE = {
    "TIMEOUT": (Status.TIMEOUT, "Slurm ended the job at its time limit ({TimeLimit})"),
    "OUT_OF_MEMORY": (Status.HOST_OOM, "Slurm ended the job for memory (OUT_OF_MEMORY)"),
    "NODE_FAIL": (Status.KILLED, "a node of the job failed ({NodeList}); --resume runs it again"),
    "PREEMPTED": (Status.INTERRUPTED, "preempted: Slurm gave the job's nodes to another job; --resume runs it again"),
    "CANCELLED": (Status.INTERRUPTED, "the job was cancelled outside zerobench (scancel); --resume runs it again"),
}


def evidence(job_id: str, info: dict) -> str:
    """What Slurm says of a job's end, for a reason: its state, reason and exit code."""
    why = info.get("Reason")
    return (
        f"Slurm job {job_id}: {info.get('JobState', 'UNKNOWN')}"
        + (f", Reason {why}" if why and why != "None" else "")
        + (f", ExitCode {info['ExitCode']}" if info.get("ExitCode") else "")
    )


def judge(
    cell: Cell, job_id: str, info: dict, ends: list[TaskEnd], tail: str, stop: str | None = None
) -> launch.Outcome:
    """An attempt's Outcome from its job: every node's launch where each handed one back (classified as on one
    host, bench.execute.launch.of_nodes), the status Slurm's state gives where Slurm ended it from outside,
    memory evidence in the tasks' stderr, else an error naming what is missing. info: `scontrol show job`'s
    fields; tail: the tasks' stderr tails; stop: zerobench's own stop (the run was stopped), if it cancelled."""
    launches = [e.launch for e in ends if e.launch is not None]
    whole = len(launches) == cell.nodes
    out = launch.of_nodes(cell, launches) if whole else _missing(cell, job_id, info, tail, len(launches))
    state, said = info.get("JobState", "UNKNOWN"), evidence(job_id, info)
    stopped = [e.killed_for for e in launches if e.killed_for is not None]
    where = f"{launch.ended_where(out)}; " if whole else ""
    if stop is not None and (stopped or not whole):
        out.status, out.reason = Status.INTERRUPTED, f"{stop} ({where}{said})"
    elif state in _FROM_OUTSIDE and (stopped or not whole):
        status, why = _FROM_OUTSIDE[state]
        out.status, out.reason = status, f"{why.format(**{'TimeLimit': '?', 'NodeList': '?', **info})} ({where}{said})"
    elif not whole and (m := _MEMORY_RE.search(tail)):
        out.status, out.reason = Status.HOST_OOM, f"Slurm killed the job for memory: {m[0].strip()[-300:]} ({said})"
    elif whole and "time_limit" in stopped and out.status is Status.TIMEOUT:
        limit = info.get("TimeLimit", "?")
        out.reason = f"stopped as the job's time limit ({limit}) neared: Slurm signalled USR2 ({where}{said})"
    return out


def _missing(cell: Cell, job_id: str, info: dict, tail: str, got: int) -> launch.Outcome:
    """The Outcome of a job whose nodes did not all hand back their launch: an error that says so, with Slurm's
    words (a state from outside the job replaces it, judge)."""
    last = next((ln.strip() for ln in reversed(tail.splitlines()) if ln.strip() and not ln.startswith("---")), "")
    return launch.Outcome(
        status=Status.ERROR,
        reason=f"{cell.nodes - got} of the job's {cell.nodes} node(s) handed back no launch ({evidence(job_id, info)})"
        + (f": {last[-300:]}" if last else ""),
        exit_code=_exit_code(info.get("ExitCode")),
        wall_s=_seconds(info.get("RunTime")),
        log_tail=tail,
    )


def _exit_code(text: str | None) -> int | None:
    """Slurm's CODE:SIGNAL as a record's exit code (negative: the signal that ended it)."""
    m = re.fullmatch(r"(\d+):(\d+)", text or "")
    return None if m is None else -int(m[2]) if int(m[2]) else int(m[1])


def _seconds(text: str | None) -> float:
    """Seconds of a Slurm duration ([D-]HH:MM:SS); 0 where there is none."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d+):(\d+)", text or "")
    return float(int(m[1] or 0) * 86400 + int(m[2]) * 3600 + int(m[3]) * 60 + int(m[4])) if m else 0.0


def signal_delay_s(limit_s: float) -> int:
    """How long before a job's time limit Slurm signals it (USR2, submitit's --signal): 90 s (submitit's
    default), less for a short limit (a quarter of it, at least 10 s). Slurm may signal up to 60 s early."""
    return int(max(10, min(90, limit_s // 4)))


# -- the orchestrator's side --------------------------------------------------------------------------


@dataclass
class _Job:
    """An attempt's job in Slurm: submitit's handle, the attempt's folder, when Slurm was seen to end it."""

    handle: Handle
    job: Any
    folder: Path
    ended_at: float | None = None


class SlurmExecutor:
    """One Slurm job per attempt, at most settings.max_jobs in Slurm at once (the module's rule)."""

    prepares = False  # the nodes build DeepSpeed's ops where they run them; no fork server serves a job
    forkservers = None
    spawn_why = SPAWN_WHY

    def __init__(self, slots=None, cuda: bool = True, settings: Settings | None = None, printer=print):
        if settings is None:
            raise ValueError("the slurm executor needs its settings (bench.execute.executors.slurm.Settings)")
        self.submitit, self.cuda, self.s = require(), cuda, settings
        self.slots = settings.max_jobs
        settings.folder.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix=time.strftime("run-%Y%m%dT%H%M%S-"), dir=settings.folder))
        self._jobs: dict[int, _Job] = {}  # id(handle) -> its job, while Slurm has it
        self._refused: list[Finished] = []  # attempts sbatch refused, to hand back
        self._in = 0  # attempts started and not collected
        self._next_poll = 0.0
        p = settings.partition
        printer(
            f"slurm: partition {p.name} ({p.nodes} node(s), {p.gpus_per_node} GPU(s) per node as GRES), up to "
            f"{self.slots} job(s) at once; each job's files in {self.folder}"
        )

    def room(self) -> bool:
        return self._in < self.slots

    def running(self) -> int:
        return self._in

    def place(self, attempt: Attempt) -> Handle | None:
        return Handle(attempt, None) if self.room() else None

    def release(self, handle: Handle) -> None:
        pass  # nothing is held before the job is submitted

    def start(self, handle: Handle) -> None:
        """Submit the attempt's job (with signals held: a job submitted is one this run knows, and cancels)."""
        a = handle.attempt
        self._in += 1
        folder = self.folder / a.job.launch.log_path.stem
        job = a.job.with_launch(log_path=a.job.launch.log_path.absolute())
        try:
            ex = self.submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
            ex.update_parameters(**self.parameters(a))
            with launch.holding_signals():
                submitted = ex.submit(run_task, Task(job, str(folder), self.cuda))
        except Exception as e:  # noqa: BLE001 - sbatch refused it (a request no node can meet...): its record says
            said = " ".join(str(e).split())[-1500:]
            out = launch.Outcome(Status.ERROR, f"sbatch refused the job: {type(e).__name__}: {said}")
            self._refused.append(Finished(handle, value=out))
            return
        self._jobs[id(handle)] = _Job(handle, submitted, folder)

    def parameters(self, a: Attempt) -> dict:
        """The sbatch options of an attempt's job (submitit's SlurmExecutor names)."""
        s, cell, p = self.s, a.cell, self.s.partition
        limit_s = s.time_limit_s or cell.timeout_s + JOB_START_S
        per_rank = s.cpus_per_gpu or (max(1, p.cpus // p.gpus_per_node) if self.cuda and p.gpus_per_node else 1)
        params: dict[str, Any] = {
            "job_name": f"zerobench-{a.job.launch.log_path.stem}",
            "partition": p.name,
            "nodes": a.shape.nodes,
            "ntasks_per_node": 1,
            "cpus_per_task": per_rank * a.shape.gpus_per_node,
            "time": max(1, math.ceil(limit_s / 60)),
            "signal_delay_s": signal_delay_s(limit_s),
            "srun_args": ["--kill-on-bad-exit=1"],  # a task that dies (SIGKILL) takes its peers' down with it
            "additional_parameters": {"no_requeue": True, **s.sbatch},
        }
        if self.cuda:
            params["gpus_per_node"] = a.shape.gpus_per_node
        for k, v in (("account", s.account), ("qos", s.qos), ("mem", s.mem_per_node)):
            if v:
                params[k] = v
        return params

    def collect(self, timeout_s: float) -> list[Finished]:
        """The attempts whose jobs ended, within timeout_s (Slurm is asked at most every POLL_S)."""
        deadline = time.time() + timeout_s
        while True:
            ended, self._refused = self._refused, []
            if time.time() >= self._next_poll:
                self._next_poll = time.time() + POLL_S
                with launch.holding_signals():  # a job is handed back whole or stays in flight
                    ended += self._poll()
            if ended or time.time() >= deadline:
                self._in -= len(ended)
                return ended
            time.sleep(max(0.0, min(deadline, self._next_poll) - time.time()))

    def close(self) -> None:
        """Nothing held past the run: every job ended or was cancelled."""

    def cancel(self, why: BaseException) -> list[Finished]:
        """scancel every job in flight, wait for Slurm to end them (CANCEL_S at most), and hand each back: as its
        nodes ended it where they ended it by themselves meanwhile, else interrupted with why's reason."""
        stop = getattr(stop_for(why), "reason", None) or "stopped by the user"
        ended, self._refused = self._refused, []
        if self._jobs:
            _slurm(["scancel", *(j.job.job_id for j in self._jobs.values())])
        deadline = time.time() + CANCEL_S
        while self._jobs and time.time() < deadline:
            ended += self._poll(stop)
            if self._jobs:
                time.sleep(1.0)
        for j in self._jobs.values():  # still not ended: recorded all the same, saying so
            reason = f"{stop}; Slurm had not ended job {j.job.job_id} {CANCEL_S:g} s after scancel (scancel it again)"
            ended.append(Finished(j.handle, value=launch.Outcome(Status.INTERRUPTED, reason, node=self._node(j, []))))
        self._jobs.clear()
        self._in = 0
        return ended

    # -- reading Slurm -----------------------------------------------------------------------------------

    def _poll(self, stop: str | None = None) -> list[Finished]:
        """The jobs that ended: every task handed back a launch that ended by itself, or Slurm says the job ended
        (its result pickles then get RESULT_GRACE_S to show)."""
        if not self._jobs:
            return []
        states = _states([j.job.job_id for j in self._jobs.values()])
        if states is None:  # Slurm did not answer: ask again at the next poll
            return []
        out = []
        for key, j in list(self._jobs.items()):
            got = self._results(j)
            live = states.get(j.job.job_id) in LIVE
            if live and not (all(got) and all(_by_itself(r) for r in got)):
                continue
            if not live and not all(got):
                j.ended_at = j.ended_at or time.time()
                if time.time() - j.ended_at < RESULT_GRACE_S:
                    continue
            out.append(self._finished(j, got, stop))
            del self._jobs[key]
        return out

    def _results(self, j: _Job) -> list[tuple[str, Any] | None]:
        """Each task's pickled end as submitit wrote it (("success", TaskEnd) or ("error", traceback)), or None."""
        with contextlib.suppress(OSError):
            j.folder.chmod(j.folder.stat().st_mode)  # refreshes a network file system's view of the folder
        out = []
        for k in range(j.handle.attempt.shape.nodes):
            path = j.job.task(k).paths.result_pickle
            try:
                out.append(self.submitit.core.utils.pickle_load(path) if path.exists() else None)
            except (OSError, EOFError):  # being written
                out.append(None)
        return out

    def _finished(self, j: _Job, got: list, stop: str | None) -> Finished:
        """A job's end as the attempt's Finished: zerobench's own failure in a task as an error, else judge()."""
        job_id, cell = j.job.job_id, j.handle.attempt.cell
        failed = [r[1] for r in got if r is not None and r[0] == "error"]
        if failed and stop is None:
            last = next((ln for ln in reversed(str(failed[0]).splitlines()) if ln.strip()), "")
            return Finished(j.handle, error=RuntimeError(f"in Slurm job {job_id}: {last}"), traceback=str(failed[0]))
        ends = sorted((r[1] for r in got if r is not None and r[0] == "success"), key=lambda e: e.node)
        info = _job_info(job_id) or {}
        tail = _stderr_tails(j, ends)
        out = judge(cell, job_id, info, ends, tail, stop)
        out.node = self._node(j, ends, info)
        return Finished(j.handle, value=out)

    def _node(self, j: _Job, ends: list[TaskEnd], info: dict | None = None) -> dict:
        """The record's placement and provenance facts (launch.Outcome.node) from the first node's end."""
        first = next((e for e in ends if e.node == 0), None)
        names = [e.slurm_node for e in ends] if len(ends) == j.handle.attempt.shape.nodes else _hostnames(info)
        node: dict[str, Any] = {"slurm_job": j.job.job_id, "slurm_nodes": names or None}
        if first is not None and first.launch is not None:
            node.update(host=first.launch.host, gpus=first.gpus, provenance=first.launch.provenance)
        return node


def _by_itself(r: tuple[str, Any] | None) -> bool:
    """A task's end that needs no word from Slurm: its launch ended without a stop."""
    return r is not None and r[0] == "success" and r[1].launch is not None and r[1].launch.killed_for is None


def _states(ids: list[str]) -> dict[str, str] | None:
    """Slurm's state of each job it still lists (squeue; a job it forgot, MinJobAge after its end, is not
    listed); None where Slurm did not answer."""
    r = _slurm(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i %T"])
    if r.returncode == 0:
        return dict(line.split()[:2] for line in r.stdout.splitlines() if len(line.split()) >= 2)
    if len(ids) > 1 or "Invalid job id" not in r.stderr:  # one unknown id of several is left out, not an error
        return None
    return {}


def _job_info(job_id: str) -> dict[str, str] | None:
    """`scontrol show job`'s fields of a job: {} once Slurm has forgotten it, None where Slurm did not answer."""
    r = _slurm(["scontrol", "show", "job", "-o", job_id])
    if r.returncode == 0:
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))
    return {} if "Invalid job id" in r.stderr else None


def _hostnames(info: dict | None) -> list[str]:
    nodelist = (info or {}).get("NodeList")
    if not nodelist or nodelist == "(null)":
        return []
    r = _slurm(["scontrol", "show", "hostnames", nodelist])
    return r.stdout.split() if r.returncode == 0 else [nodelist]


def _stderr_tails(j: _Job, ends: list[TaskEnd], n: int = 20) -> str:
    """The job's evidence for a reason: each task's stderr tail (Slurm's words: memory kills, node failures),
    and the worker log's tail where a node handed back no launch."""
    parts = []
    if len(ends) < j.handle.attempt.shape.nodes:
        log = launch.log_tail(j.handle.attempt.job.launch.log_path.absolute(), n)
        parts += [f"--- worker log ---\n{log}"] if log else []
    for k in range(j.handle.attempt.shape.nodes):
        text = launch.log_tail(j.job.task(k).paths.stderr, n)
        parts += [f"--- Slurm job {j.job.job_id}, task {k}: stderr ---\n{text}"] if text else []
    return "\n".join(parts)
