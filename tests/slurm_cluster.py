"""A real Slurm cluster on this machine, for tests: munged, slurmctld and one slurmd per node, started and
stopped by the test session itself (Debian's `slurm-wlm` and `munge`; `apt-get install slurm-wlm munge`).

Every node is this host (NodeAddr 127.0.0.1, its own slurmd port, `slurmd -N name`), so a job of `-N 2`
gets two Slurm nodes, two slurmstepd and two sets of tasks on one machine. GPUs are GRES whose device
files are links to /dev/null: `--gpus-per-node`, `--gres=gpu:k` and `--gpus` are scheduled and counted as
on a GPU cluster, Slurm sets CUDA_VISIBLE_DEVICES, and the cells run on the CPU.

What this cluster does, as observed on it (slurm-wlm 22.05.8, munge 0.5.15, submitit 1.5.4; a job's
state read with `scontrol show job`, since there is no slurmdbd):

- No slurmdbd, so no `sacct`: it exits 1 with "Slurm accounting storage is disabled". submitit reads
  states only through sacct: every `job.state` is "UNKNOWN", each poll logs "Bypassing sacct error", and
  `job.done()` is true only once the job's result pickle exists. A job that ends without one (cancelled,
  past its time limit, killed for memory, its node failed, preempted) is never done: `job.result()` and
  `job.wait()` never return. `scontrol show job` answers for MinJobAge seconds after the end (set to an hour
  here; Slurm's default is 300 s), and jobcomp/filetxt keeps each final state in a file.
- COMPLETED, ExitCode 0:0: the function returned; its value is in the result pickle.
- FAILED, ExitCode 1:0: the function raised; the pickle holds the traceback (submitit raises
  FailedJobError from job.result()). The process's own end without a pickle: os._exit(3) gives FAILED 3:0,
  a SIGKILL FAILED 137:0 (the batch script's exit code: submitit runs the function under srun).
- CANCELLED, ExitCode 0:15 (scancel): slurmstepd sends SIGCONT and SIGTERM, then SIGKILL after KillWait.
  submitit's process ignores SIGTERM ("Bypassing signal SIGTERM"), so its function runs on until the
  SIGKILL and leaves no pickle; the processes it started get the SIGTERM themselves (the step's processes
  are signalled, not only the job's first).
- TIMEOUT, Reason TimeLimit, ExitCode 0:15: the job ran past --time. Slurm keeps limits in whole minutes
  ("0:15" is one minute) and checks them about every 30 s: a 15 s limit ended the job after 60-90 s.
  Before that, submitit's sbatch asks for `--signal=USR2@90` (signal_delay_s): USR2 arrives 90 s before the
  limit, and submitit's handler decides "timed out" when the job has run min(0.8 * limit, limit - 10 min),
  which is negative below 50 minutes: a job of a short limit that gets USR2 at any time raises
  UncompletedJobError("Job not requeued because: timed-out and not checkpointable") and ends FAILED 1:0
  with that in its pickle, before Slurm would have called it TIMEOUT. Only a function that ignores USR2
  reaches the TIMEOUT state (and then has no pickle).
- USR2 on a job of a long limit (>= 50 min) before 80% of it counts as a preemption for submitit: it
  calls `scontrol requeue` and exits, so the function runs again from the start (Requeue=1,
  Restarts=1). With `--no-requeue` the requeue is refused and the job ends FAILED 1:0 with
  CalledProcessError(scontrol requeue) in its pickle.
- Memory over --mem with proctrack/linuxproc and JobAcctGatherParams=OverMemoryKill (this cluster):
  slurmstepd kills the step, "StepId=N.0 exceeded memory limit (X > Y), being killed" in the job's
  stderr, state FAILED 137:0, not OUT_OF_MEMORY. With task/cgroup and ConstrainRAMSpace=yes (tried on
  this machine, cgroup v1): the kernel's OOM killer ends the process, "Detected 1 oom-kill event(s) in
  StepId=N.0" in stderr; the job is OUT_OF_MEMORY 0:125 when the function ran in the batch step
  (submitit's use_srun=False) and FAILED 1:0 with DerivedExitCode 0:125 under srun (the step, not the
  job, ran out). ConstrainDevices=yes made every job fail to launch here (no /dev/null in the job).
- PREEMPTED, ExitCode 0:15 (a job of a higher PriorityTier partition took the node; PreemptMode=CANCEL):
  SIGCONT and SIGTERM (ignored by submitit), then SIGKILL; no USR2, no pickle.
- A node set DOWN under a job (`scontrol update nodename=n state=down`): "JOB N ON n CANCELLED ... DUE TO
  NODE FAILURE" in stderr, and the job is requeued (PENDING, Reason BeginTime, Restarts=1: JobRequeue
  defaults to 1); with `--no-requeue` it ends NODE_FAIL 0:0 (Reason NodeDown), no pickle.
- GRES without cgroup device constraint: CUDA_VISIBLE_DEVICES and SLURM_JOB_GPUS are the node's GRES
  indexes (two one-GPU jobs side by side on a node got 0 and 1); a job of two nodes got CUDA_VISIBLE_DEVICES
  0 on each. GRES device files must be character devices (a plain file is refused: "is not a valid
  character or block device"); a link to /dev/null counts.
- A controller started with -i (no saved state, as here) numbers jobs from 1 again: a submitit folder
  reused across two such clusters held job 1's result pickle from the first, and job.results() of the
  second cluster's job 1 returned it.
- A node's launch (run_node) under submitit, cancelled with scancel while a two-node cell started, handed
  back both nodes' stopped launches with KillWait 30 (the job ended 11 s after the scancel); with KillWait 5 (this
  cluster's default) both tasks were SIGKILLed before they returned.
- Node names need not resolve: `scontrol show hostnames` gives n1, n2 (this cluster's names), which no
  resolver knows; the address to reach a node is its NodeAddr (`scontrol show node n1`).
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

_DAEMONS = ("munged", "slurmctld", "slurmd")
_CLIENTS = ("sbatch", "srun", "scontrol", "squeue", "sinfo", "scancel")
# Slurm's own states for a job that has not ended yet.
_LIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING"}


def missing() -> str | None:
    """Why no cluster can be started here, or None."""
    gone = [b for b in (*_DAEMONS, *_CLIENTS) if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if gone:
        return f"Slurm is not installed ({', '.join(gone)} not found; Debian: apt-get install slurm-wlm munge)"
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SlurmCluster:
    """A running cluster: its folder, configuration and daemons. `env` is what a client needs (SLURM_CONF)."""

    root: Path
    nodes: tuple[str, ...]
    gpus_per_node: int
    conf: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        r = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {r.returncode}: {r.stderr.strip()}\n{self.logs()}")
        return r

    def job(self, job_id: str | int) -> dict[str, str]:
        """The job's fields as `scontrol show job -o` prints them (JobState, Reason, ExitCode, Restarts...)."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_ended(self, job_id: str | int, timeout: float = 180) -> dict[str, str]:
        """The job's fields once Slurm says it ended (a state other than pending, running and the like)."""
        deadline = time.time() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") not in _LIVE:
                return info
            if time.time() > deadline:
                raise TimeoutError(f"job {job_id} still {info.get('JobState')} after {timeout:g} s")
            time.sleep(0.5)

    def wait_state(self, job_id: str | int, state: str, timeout: float = 60) -> dict[str, str]:
        deadline = time.time() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") == state:
                return info
            if time.time() > deadline:
                raise TimeoutError(f"job {job_id} is {info.get('JobState')}, not {state}, after {timeout:g} s")
            time.sleep(0.3)

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def resume(self, node: str) -> None:
        """Bring a node set down by a test back, and wait until it takes jobs again."""
        self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        wait_until(lambda: self.node_states().get(node) == "idle", 30, f"node {node} back to idle", self)

    def logs(self, lines: int = 15) -> str:
        parts = []
        for p in sorted((self.root / "log").glob("*.log")):
            tail = p.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {p.name} ---\n" + "\n".join(tail))
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel every job, stop the daemons, end anything of this cluster still alive, remove its folder."""
        try:
            if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
                self.run("scancel", "--full", "--user", getpass.getuser(), check=False, timeout=30)
                wait_until(lambda: not self.run("squeue", "-h", check=False).stdout.strip(), 30, "no job left", None)
        except (subprocess.SubprocessError, TimeoutError, OSError):
            pass  # stopping regardless: whatever is left is ended below
        for name in sorted(self.procs, key=lambda n: ("slurmd" not in n, n != "slurmctld")):  # slurmd, ctld, munge
            _end(self.procs[name])
        _end_strays(str(self.conf))
        shutil.rmtree(self.root, ignore_errors=True)


def _end(proc: subprocess.Popen, grace_s: float = 10) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _end_strays(conf: str) -> None:
    """Kill what this cluster started and left behind (a slurmstepd, a job's process): each carries our
    SLURM_CONF in its environment (slurmd passes its own to slurmstepd; a job gets its submitter's)."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    strays = []
    for p in psutil.process_iter():
        try:
            if p.pid not in mine and p.environ().get("SLURM_CONF") == conf:
                strays.append(p)
        except psutil.Error:
            continue
    for p in strays:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(strays, timeout=10)


def wait_until(ok, timeout: float, what: str, cluster: SlurmCluster | None) -> None:
    deadline = time.time() + timeout
    while not ok():
        if time.time() > deadline:
            raise TimeoutError(f"waited {timeout:g} s for {what}" + (f"\n{cluster.logs()}" if cluster else ""))
        time.sleep(0.3)


def _config(root: Path, nodes: tuple[str, ...], gpus: int, cpus: int, mem_mb: int, user: str, kill_wait_s: int) -> str:
    ctld_port = _free_port()
    node_lines = "\n".join(
        f"NodeName={n} NodeHostname={socket.gethostname()} NodeAddr=127.0.0.1 Port={_free_port()} "
        f"CPUs={cpus} RealMemory={mem_mb} Gres=gpu:{gpus} State=UNKNOWN"
        for n in nodes
    )
    names = ",".join(nodes)
    return f"""\
ClusterName=zb{os.getpid()}
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
AuthInfo=socket={root}/run/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.%n.log
SlurmdParameters=config_overrides
# No cgroups needed: processes tracked by their parentage, memory limits by sampling (OverMemoryKill).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
GresTypes=gpu
MpiDefault=none
ReturnToService=2
KillWait={kill_wait_s}
MinJobAge=3600
InactiveLimit=0
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
{node_lines}
# A job in `urgent` (higher PriorityTier) preempts (cancels) jobs of `cells` on the nodes it needs.
PartitionName=cells Nodes={names} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL
PartitionName=urgent Nodes={names} MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
"""


def start(
    nodes: int = 2, gpus_per_node: int = 2, mem_mb: int = 8192, kill_wait_s: int = 5, timeout_s: float = 60
) -> SlurmCluster:
    """Start munged, slurmctld and a slurmd per node in a fresh folder; return once every node is idle.
    kill_wait_s: Slurm's KillWait, from a job's SIGTERM to its SIGKILL (Slurm's default is 30).
    Anything started is stopped again if the cluster does not come up."""
    # Short: the munge socket's path must fit a Unix socket address (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="zb-slurm-"))
    root.chmod(0o755)
    for d in ("run", "log", "state", "spool", "gpu", "key"):
        (root / d).mkdir()
    (root / "key").chmod(0o700)
    key = root / "key" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    names = tuple(f"n{i + 1}" for i in range(nodes))
    conf = root / "slurm.conf"
    cpus = os.cpu_count() or 1
    conf.write_text(_config(root, names, gpus_per_node, cpus, mem_mb, getpass.getuser(), kill_wait_s))
    gres = []
    for n in names:
        for g in range(gpus_per_node):
            dev = root / "gpu" / f"{n}-gpu{g}"
            dev.symlink_to("/dev/null")  # a character device, as a GRES file must be
            gres.append(f"NodeName={n} Name=gpu File={dev}")
    (root / "gres.conf").write_text("\n".join(gres) + "\n")
    cluster = SlurmCluster(root=root, nodes=names, gpus_per_node=gpus_per_node, conf=conf)
    try:
        _launch(cluster, key)
        wait_until(lambda: all(cluster.node_states().get(n) == "idle" for n in names), timeout_s, "idle nodes", cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _launch(cluster: SlurmCluster, key: Path) -> None:
    root, env = cluster.root, cluster.env

    def daemon(name: str, args: list[str]) -> None:
        log = open(root / "log" / f"{name}.out", "wb")
        # Its own session: a Ctrl-C at the terminal stops the tests, which then stop the cluster in order.
        cluster.procs[name] = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    sock = root / "run" / "munge.socket"
    munged = [_binary("munged"), "-F", "--force", f"--key-file={key}", f"--socket={sock}"]
    munged += [f"--pid-file={root}/run/munged.pid", f"--log-file={root}/log/munged.log"]
    daemon("munged", [*munged, f"--seed-file={root}/run/munge.seed"])
    wait_until(sock.exists, 15, "munged's socket", cluster)
    daemon("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", str(cluster.conf)])
    for n in cluster.nodes:
        daemon(f"slurmd-{n}", [_binary("slurmd"), "-D", "-N", n, "-f", str(cluster.conf)])
    for name, p in cluster.procs.items():
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited {p.returncode} at start\n{cluster.logs()}")
