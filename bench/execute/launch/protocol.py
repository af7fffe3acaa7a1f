"""One launch of a cell's worker(s) on one node, to its end: the spec in the attempt's folder, the worker started
(forked from the fork server, or a fresh interpreter; torchrun for several ranks or nodes), its telemetry sampled,
the wall-clock timeout and the no-progress watchdog enforced, and the Outcome it left, not yet classified.

Above it: bench.execute.launch.nodes (a cell's nodes, each one such launch) and bench.execute.launch.cell (one
attempt: its rendezvous port, relaunches, and the classified Outcome).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...host import hostmem
from ...host.safefile import open_append, safe_open_new
from ...matrix import faults
from ...matrix.cells import Cell
from ...records.measured import worker_documents
from ...records.status import Status
from . import telemetry
from .folders import clear_attempt_folder
from .forkserver import _forkserver
from .outcome import Outcome
from .ports import child_env
from .procs import _kill_tree, holding_signals


class StopRequest(threading.Event):
    """Stops a cell that runs in another thread as Ctrl-C stops one in the main thread (signals reach only
    the main thread): the launch stops the worker, and run_cell raises `exc` once it is cleaned up (run_node
    records it instead). `why` is how the launch records the stop: "interrupt" (the user, or the run failing
    beside it), or "peer" (another node of the cell ended first: bench.execute.launch.nodes)."""

    exc: BaseException = KeyboardInterrupt()
    why: str = "interrupt"

    def request(self, exc: BaseException, why: str = "interrupt") -> None:
        self.exc, self.why = exc, why
        self.set()


@dataclass(frozen=True)
class Launch:
    """How an attempt's worker(s) are launched, whatever cell they run: built once where the attempt is prepared
    and handed down whole (bench.execute.executors.executor.Job, launch.run_cell, each node's NodeLaunch). Plain
    picklable values: a cluster executor ships it to the node that runs it."""

    log_path: Path
    """The worker's stdout and stderr: the attempt's log (node k's beside it, nodes.node_log, where the cell spans
    several nodes), on storage the node that runs it can write."""
    gpus: Sequence[int] | None = None
    """Its GPUs, by physical (NVML) index, set as CUDA_VISIBLE_DEVICES; None on a CPU host. An executor's Job
    leaves them to where the attempt is placed."""
    stall_s: float = 600.0
    """The no-progress watchdog: seconds without a new event, once the warmup has begun, before the worker is
    killed (the wall-clock limit is the cell's timeout_s)."""
    sample_interval_s: float | None = 0.01
    """How often telemetry is sampled; None runs without it (to measure what telemetry costs)."""
    extra_env: dict[str, str] | None = None
    """Set for the worker over this process's environment."""
    module: str = "bench.worker"
    """The worker's program (python -m): bench.worker, or bench.worker.reference, the hand-written yardstick loop."""
    spawn_why: str | None = None
    """Why every worker starts a fresh interpreter, as the record's started_by says (an executor whose job runs one
    attempt, where a fork server would start for that attempt alone); None: from the fork server where it can."""

    def env(self) -> dict[str, str]:
        """What the worker's environment is made from (ports.child_env adds the rendezvous and the GPUs): this
        process's, extra_env over it."""
        return {**os.environ, **(self.extra_env or {})}


@dataclass(frozen=True)
class Rendezvous:
    """Where a cell's ranks meet: torchrun's static rendezvous (a TCP store) on the first node, and which of
    the cell's nodes this launch is. One node: 127.0.0.1."""

    port: int
    addr: str = "127.0.0.1"
    nodes: int = 1
    node: int = 0


def _command(spec_path: Path, nprocs: int, rdzv: Rendezvous, module: str = "bench.worker") -> list[str]:
    """One rank on one node runs the worker itself; anything more runs it under torchrun, which starts
    `nprocs` ranks here (ranks node*nprocs ...) and meets the other nodes' at the rendezvous."""
    worker = ["-m", module, "--spec", str(spec_path)]
    if nprocs == 1 and rdzv.nodes == 1:
        return [sys.executable, *worker]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nprocs),
        "--nnodes",
        str(rdzv.nodes),
        "--node_rank",
        str(rdzv.node),
        "--master_addr",
        rdzv.addr,
        "--master_port",
        str(rdzv.port),
        *worker,
    ]


def _read_events(path: Path) -> list[dict]:
    out = []
    try:
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line being written when the worker died
    except FileNotFoundError:
        pass
    return out


def log_tail(path: Path, n: int = 60) -> str:
    """The last n lines of a log (of its last 64 KiB), "" where there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            lines = f.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-n:])
    except FileNotFoundError:
        return ""


@dataclass
class _Watch:
    """What the launch loop learnt while the worker ran: why it was killed, if it was, and the stop that
    ended it (re-raised once the cell is cleaned up)."""

    killed_for: str | None = None
    stop: BaseException | None = None


@dataclass(frozen=True)
class _Before:
    """The host as the worker found it: its GPUs' memory (NVML's, by index), the OOM kills counted so far, and
    when the launch's clock started."""

    gpus: dict
    oom: hostmem.OomCounts
    t0: float


def run_launch(
    cell: Cell, ds_config: dict | None, launch: Launch, rdzv: Rendezvous, work: Path, again: bool = False,
    stop: StopRequest | None = None,
) -> tuple[Outcome, _Watch]:  # fmt: skip
    """This node's worker(s) of one launch, in the attempt's folder `work`, to their end: the Outcome (not yet
    classified) and what the watch learnt. `again`: a relaunch, whose log is appended to. A stop (`stop`, or a
    Ctrl-C in this thread) stops the worker and is recorded in the watch; raising it is left to the caller."""
    clear_attempt_folder(work)
    spec_path, events_path = _write_spec(cell, ds_config, work)
    env = child_env(launch.env(), port=rdzv.port, gpus=launch.gpus, addr=rdzv.addr)
    # NVML indexes all GPUs, not the CUDA_VISIBLE_DEVICES view: sample the physical ones.
    nvml_idx = list(launch.gpus) if launch.gpus and telemetry.nvml_available() else []  # none to sample without NVML
    before = _Before(telemetry.gpu_snapshot(nvml_idx), hostmem.oom_kills(), time.time())
    watch = _Watch()
    # Never through a link planted at the log's predictable name (a shared logs folder).
    with os.fdopen(open_append(launch.log_path) if again else safe_open_new(launch.log_path), "ab") as log:
        with holding_signals():  # a worker started is a worker this function will stop
            proc, started_by = _start(cell, spec_path, env, rdzv, log, launch)
        interval = launch.sample_interval_s
        sampler = telemetry.Sampler(proc.pid, nvml_idx, interval) if interval else None
        if sampler is not None:
            sampler.start()
        try:
            _watch(proc, cell, events_path, before.t0, launch.stall_s, stop, watch)
        finally:
            series = sampler.stop() if sampler is not None else telemetry.Series()
    ranks = range(rdzv.node * cell.gpus, (rdzv.node + 1) * cell.gpus)
    out, phases, end_t = _outcome(cell, work, events_path, launch.log_path, proc, before, ranks)
    out.started_by, out.fault = started_by, faults.for_cell(env.get("ZEROBENCH_FAULT"), cell.id)
    out.telemetry = telemetry.summarize(series, phases, end_t)
    out.gpu_after = _wait_gpu_baseline(nvml_idx, before.gpus)
    return out, watch


def _write_spec(cell: Cell, ds_config: dict | None, work: Path) -> tuple[Path, Path]:
    spec_path, events_path = work / "spec.json", work / "events.jsonl"
    spec = {
        "cell": cell.to_dict(),
        "ds_config": ds_config,
        "events": str(events_path),
        "attempt_id": work.name,
        "result": str(work / "result.rank{rank}.json"),
        "parent_pid": os.getpid(),
    }
    spec_path.write_text(json.dumps(spec))
    return spec_path, events_path


def _start(cell: Cell, spec_path: Path, env: dict[str, str], rdzv: Rendezvous, log, launch: Launch):
    """Start the worker(s): one rank of the standard worker is forked from the pre-imported server;
    everything else (several ranks or nodes under torchrun, the reference loop, no usable server, or the
    launch's spawn_why) starts a fresh interpreter. The server's one-time start is not the cell's time (the
    clock started before)."""
    # One rank per GPU; on a CPU host `gpus: N` runs N CPU ranks over gloo (how CI tests multi-rank cells).
    nprocs, module, spawn_why = cell.gpus, launch.module, launch.spawn_why
    if spawn_why:
        server, why = None, spawn_why
    elif rdzv.nodes > 1 or nprocs > 1 or module != "bench.worker":
        server, why = (
            None,
            "several nodes"
            if rdzv.nodes > 1
            else "several ranks"
            if nprocs > 1
            else f"program {module}"
            if module != "bench.worker"
            else spawn_why,
        )
    else:
        server, why = _forkserver(env, launch.log_path.parent)
    if server is not None:
        return server.start(["--spec", str(spec_path)], env, launch.log_path), {
            "mode": "fork",
            "server_import_s": server.import_s,
        }
    proc = subprocess.Popen(
        _command(spec_path, nprocs, rdzv, module),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
        cwd=os.getcwd(),
    )
    return proc, {"mode": "spawn", "why": why}


def _watch(proc, cell: Cell, events_path: Path, t0: float, stall_s: float, stop_request, watch: _Watch) -> None:
    """Wait for the worker's end; kill it past the cell's timeout, on no progress, or on a stop."""
    armed = False
    why = "interrupt"  # a Ctrl-C in this thread, or a stop request's own reason
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            if stop_request is not None and stop_request.is_set():
                why = stop_request.why
                raise stop_request.exc
            now = time.time()
            # The watchdog arms when steps start: setup may legitimately sit silent for a minute
            # (a first JIT build of DeepSpeed's ops); the wall-clock timeout covers it.
            armed = armed or (events_path.exists() and '"warmup"' in events_path.read_text())
            if now - t0 > cell.timeout_s:
                watch.killed_for = "timeout"
            elif armed and now - events_path.stat().st_mtime > stall_s:
                watch.killed_for = "stall"
            if watch.killed_for:
                _kill_tree(proc)
                break
    except KeyboardInterrupt as e:
        watch.killed_for, watch.stop = why, e
        with holding_signals():
            _kill_tree(proc)


def _outcome(
    cell: Cell, work: Path, events_path: Path, log_path: Path, proc, before: _Before, ranks: range
) -> tuple[Outcome, list, float]:
    """The Outcome of a launch from what the worker left (events, result documents of `ranks`, the ranks
    this node ran; log), unclassified and without what the launch itself knows (how the worker started, its
    fault, telemetry), with the worker's phases and the launch's end time (for the telemetry summary)."""
    end_t = time.time()
    events = _read_events(events_path)
    phases = [(e["phase"], e["t"]) for e in events if e.get("event") == "phase"]
    measured = [
        (t, phases[k + 1][1] if k + 1 < len(phases) else end_t) for k, (ph, t) in enumerate(phases) if ph == "measured"
    ]
    steps = [e for e in events if e.get("event") == "step"]
    raw = []
    for r in ranks:
        p = work / f"result.rank{r}.json"
        if p.exists():
            try:
                raw.append(json.loads(p.read_text()))
            except json.JSONDecodeError:
                pass
    docs, unreadable = worker_documents(raw)
    out = Outcome(
        status=Status.ERROR,
        reason="",
        ranks=docs,
        unreadable=unreadable,
        exit_code=proc.returncode,
        wall_s=end_t - before.t0,
        log_tail=log_tail(log_path),
        phase_at_end=next((ph for ph, _ in reversed(phases) if ph != "exit"), None),
        last_step=steps[-1]["step"] if steps else None,
        gpu_before=before.gpus,
        oom_evidence=before.oom.rise(hostmem.oom_kills()),
        window=measured[0] if measured else (before.t0, end_t),
    )
    return out, phases, end_t


def _wait_gpu_baseline(nvml_idx: list[int], before: dict, timeout_s: float = 30.0) -> dict:
    """Wait until the GPUs are back to their memory before the cell, so the next cell starts clean."""
    if not nvml_idx or not all(i in before for i in nvml_idx):
        return {}  # nothing to compare with (NVML could not read a GPU before the cell)
    deadline = time.time() + timeout_s
    snap = telemetry.gpu_snapshot(nvml_idx)
    while time.time() < deadline and snap:
        if all(snap[i]["used_bytes"] <= before[i]["used_bytes"] + 512 * 2**20 for i in nvml_idx):
            break
        time.sleep(0.5)
        snap = telemetry.gpu_snapshot(nvml_idx)
    return snap
