"""One attempt of one cell in its own process, to its end: folder, port, launch, watchdog, outcome."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...host import hostmem
from ...host.safefile import open_append, safe_open_new
from ...matrix import faults
from ...matrix.cells import Cell
from ...records.status import Status
from . import telemetry
from .folders import clear_attempt_folder, new_attempt_folder
from .forkserver import _forkserver
from .outcome import Outcome, _classify
from .ports import _LAUNCHES, _PORT_TAKEN_RE, _hold_port, _release_port, child_env
from .procs import _kill_tree, holding_signals


class StopRequest(threading.Event):
    """Stops a cell that runs in another thread as Ctrl-C stops one in the main thread (signals reach only
    the main thread): run_cell stops the worker, and raises `exc` once it is cleaned up. `why` is how the
    launch records the stop: "interrupt" (the user, or the run failing beside it), or "peer" (another
    node of the cell ended first: bench.execute.launch.nodes)."""

    exc: BaseException = KeyboardInterrupt()
    why: str = "interrupt"

    def request(self, exc: BaseException, why: str = "interrupt") -> None:
        self.exc, self.why = exc, why
        self.set()


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


def run_cell(
    cell: Cell,
    ds_config: dict,
    *,
    log_path: Path,
    gpus: list[int] | None,
    stall_s: float = 600.0,
    sample_interval_s: float | None = 0.01,
    extra_env: dict[str, str] | None = None,
    module: str = "bench.worker",
    stop: StopRequest | None = None,
    spawn_why: str | None = None,
) -> Outcome:
    """Run one cell attempt to its end, whatever that end is. A Ctrl-C (or the orchestrator's SIGTERM,
    as KeyboardInterrupt) stops the worker and is raised again after cleaning up; so is stop.exc once
    another thread sets `stop` (a cell run beside others, bench.execute.local).

    sample_interval_s=None runs without telemetry (to measure what telemetry costs); module picks the
    program (bench.worker.reference is the hand-written yardstick loop); spawn_why, where set, is why every
    worker starts a fresh interpreter (no fork server), as the record's started_by says. A cell of several
    nodes runs every node here, at 127.0.0.1 (bench.execute.launch.nodes.launch_here)."""
    if stop is not None and stop.is_set():
        raise stop.exc  # nothing started yet: nothing to stop
    env = {**os.environ, **(extra_env or {})}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if cell.nodes > 1:
        from .nodes import launch_here, node_log

        def here(port: int, again: bool) -> Outcome:
            return launch_here(
                cell, ds_config, port, log_path, gpus, stall_s, sample_interval_s, env, module, again, stop
            )

        return _relaunching(here, env, [node_log(log_path, k) for k in range(cell.nodes)])
    work = new_attempt_folder()
    try:

        def one(port: int, again: bool) -> Outcome:
            rdzv = Rendezvous(port)
            return _launch(
                cell, ds_config, work, rdzv, log_path, gpus, stall_s, sample_interval_s, env, module, again, stop,
                spawn_why=spawn_why,
            )  # fmt: skip

        return _relaunching(one, env, [log_path])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _relaunching(launch: Callable[[int, bool], Outcome], env: dict[str, str], logs: list[Path]) -> Outcome:
    """launch(port, again) on a rendezvous port held while it runs, again on another port (noted in each
    of `logs`) when the port was taken before any step ran: nothing of the cell was measured then."""
    port = _hold_port(env, first=True)
    try:
        notes: list[str] = []
        for n in range(_LAUNCHES):
            out = launch(port, n > 0)
            if not (
                out.status is Status.ERROR
                and out.last_step is None
                and _PORT_TAKEN_RE.search(out.reason + "\n" + out.log_tail)
                and n + 1 < _LAUNCHES
            ):
                break
            new = _hold_port(env, first=False)
            _release_port(port)
            notes.append(f"the rendezvous port {port} was in use; relaunched on port {new}")
            for log_path in logs:
                with os.fdopen(open_append(log_path), "ab") as log:
                    log.write(f"\n--- zerobench: port {port} was in use; relaunching on port {new} ---\n".encode())
            port = new
        out.warnings = notes + out.warnings
        out.port = port
        return out
    finally:
        _release_port(port)


@dataclass
class _Watch:
    """What the launch loop learnt while the worker ran: why it was killed, if it was, and the stop that
    ended it (re-raised once the cell is cleaned up)."""

    killed_for: str | None = None
    stop: BaseException | None = None


def _launch(
    cell: Cell,
    ds_config: dict,
    work: Path,
    rdzv: Rendezvous,
    log_path: Path,
    gpus: list[int] | None,
    stall_s: float,
    sample_interval_s: float | None,
    base_env: dict[str, str],
    module: str,
    again: bool,
    stop_request: StopRequest | None = None,
    *,
    spawn_why: str | None = None,
) -> Outcome:
    """One launch of a cell's worker(s) on one node, classified; a stop is raised once it is cleaned up."""
    out, watch = _run(
        cell, ds_config, work, rdzv, log_path, gpus, stall_s, sample_interval_s, base_env, module, again, stop_request,
        spawn_why=spawn_why,
    )  # fmt: skip
    out.status, out.reason = _classify(out, watch.killed_for, cell)
    if watch.stop is not None:
        raise watch.stop
    return out


def _run(
    cell: Cell,
    ds_config: dict,
    work: Path,
    rdzv: Rendezvous,
    log_path: Path,
    gpus: list[int] | None,
    stall_s: float,
    sample_interval_s: float | None,
    base_env: dict[str, str],
    module: str,
    again: bool,
    stop_request: StopRequest | None = None,
    *,
    spawn_why: str | None = None,
) -> tuple[Outcome, _Watch]:
    """This node's worker(s) of one launch, in the attempt's folder `work`, to their end: the Outcome (not
    yet classified) and what the watch learnt. Only a stop's cleanup is left to the caller (re-raising it)."""
    clear_attempt_folder(work)
    spec_path, events_path = _write_spec(cell, ds_config, work)
    env = child_env(base_env, port=rdzv.port, gpus=gpus, addr=rdzv.addr)
    # NVML indexes all GPUs, not the CUDA_VISIBLE_DEVICES view: sample the physical ones.
    nvml_idx = list(gpus) if gpus and telemetry.nvml_available() else []  # none to sample without NVML
    before = telemetry.gpu_snapshot(nvml_idx)
    oom_before = hostmem.oom_kills()
    t0 = time.time()
    watch = _Watch()
    # Never through a link planted at the log's predictable name (a shared logs folder).
    with os.fdopen(open_append(log_path) if again else safe_open_new(log_path), "ab") as log:
        with holding_signals():  # a worker started is a worker this function will stop
            proc, started_by = _start(cell, spec_path, env, rdzv, log, log_path, module, spawn_why)
        sampler = telemetry.Sampler(proc.pid, nvml_idx, sample_interval_s) if sample_interval_s else None
        if sampler is not None:
            sampler.start()
        try:
            _watch(proc, cell, events_path, t0, stall_s, stop_request, watch)
        finally:
            series = sampler.stop() if sampler is not None else telemetry.Series()
    ranks = range(rdzv.node * cell.gpus, (rdzv.node + 1) * cell.gpus)
    out, phases, end_t = _outcome(
        cell, work, events_path, log_path, proc, t0, before, started_by, env, oom_before, ranks
    )
    out.telemetry = telemetry.summarize(series, phases, end_t)
    out.gpu_after = _wait_gpu_baseline(nvml_idx, before)
    return out, watch


def _write_spec(cell: Cell, ds_config: dict, work: Path) -> tuple[Path, Path]:
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


def _start(
    cell: Cell, spec_path: Path, env: dict[str, str], rdzv: Rendezvous, log, log_path: Path, module: str,
    spawn_why: str | None = None,
):  # fmt: skip
    """Start the worker(s): one rank of the standard worker is forked from the pre-imported server;
    everything else (several ranks or nodes under torchrun, the reference loop, no usable server, or the
    caller's spawn_why) starts a fresh interpreter. The server's one-time start is not the cell's time (the
    clock started before)."""
    # One rank per GPU; on a CPU host `gpus: N` runs N CPU ranks over gloo (how CI tests multi-rank cells).
    nprocs = cell.gpus
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
        server, why = _forkserver(env, log_path.parent)
    if server is not None:
        return server.start(["--spec", str(spec_path)], env, log_path), {
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


def _outcome(cell, work, events_path, log_path, proc, t0, before, started_by, env, oom_before, ranks: range):
    """The Outcome of a launch from what the worker left (events, result documents of `ranks`, the ranks
    this node ran; log), unclassified, with the worker's phases and the launch's end time (for the
    telemetry summary)."""
    end_t = time.time()
    events = _read_events(events_path)
    phases = [(e["phase"], e["t"]) for e in events if e.get("event") == "phase"]
    measured = [
        (t, phases[k + 1][1] if k + 1 < len(phases) else end_t) for k, (ph, t) in enumerate(phases) if ph == "measured"
    ]
    steps = [e for e in events if e.get("event") == "step"]
    docs = []
    for r in ranks:
        p = work / f"result.rank{r}.json"
        if p.exists():
            try:
                docs.append(json.loads(p.read_text()))
            except json.JSONDecodeError:
                pass
    out = Outcome(
        status=Status.ERROR,
        reason="",
        ranks=docs,
        exit_code=proc.returncode,
        wall_s=end_t - t0,
        log_tail=log_tail(log_path),
        phase_at_end=next((ph for ph, _ in reversed(phases) if ph != "exit"), None),
        last_step=steps[-1]["step"] if steps else None,
        gpu_before=before,
        started_by=started_by,
        fault=faults.for_cell(env.get("ZEROBENCH_FAULT"), cell.id),
        oom_evidence=oom_before.rise(hostmem.oom_kills()),
        window=measured[0] if measured else (t0, end_t),
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
