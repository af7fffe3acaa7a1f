"""The child-process protocol, written once.

The parent picks the spec, events and result paths, starts the worker in its own process group
(forked from the pre-imported fork server for one GPU, a fresh interpreter otherwise, torchrun for
several GPUs) with a free rendezvous port, samples its telemetry, enforces the
wall-clock timeout and a no-progress watchdog, and classifies the end from the exit code, the
result documents and the log tail. Whatever happens to the cell, an Outcome comes back.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from . import faults, heartbeat, hostmem, telemetry
from .cells import Cell
from .status import Status

__all__ = [
    "ForkServer",
    "Outcome",
    "StopRequest",
    "child_env",
    "first_port",
    "forkserver_ready",
    "holding_signals",
    "run_cell",
    "run_tool",
    "run_tools",
    "stop_forkserver",
    "sweep_attempt_folders",
]

# Worse outcomes win when ranks disagree.
_SEVERITY = [
    Status.OK,
    Status.DIVERGED,
    Status.ERROR,
    Status.TIMEOUT,
    Status.CUDA_OOM,
    Status.HOST_OOM,
    Status.KILLED,
    Status.INTERRUPTED,
]
_CUDA_OOM_RE = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")
_SIGKILL_RE = re.compile(r"Signal 9 \(SIGKILL\)|exitcode\s*:\s*-9|Killed\b")


@dataclass
class Outcome:
    status: Status
    reason: str
    ranks: list[dict] = field(default_factory=list)  # the worker's result documents, by rank
    telemetry: dict = field(default_factory=dict)
    exit_code: int | None = None
    wall_s: float = 0.0
    log_tail: str = ""
    phase_at_end: str | None = None
    last_step: int | None = None
    gpu_before: dict = field(default_factory=dict)
    gpu_after: dict = field(default_factory=dict)
    started_by: dict = field(default_factory=dict)  # {"mode": "fork"|"spawn", "why": ...}: how the worker began
    fault: str | None = None  # ZEROBENCH_FAULT as passed to the worker (tests only)
    oom_evidence: str | None = None  # an OOM kill counted while the cell ran (bench.hostmem), in words
    warnings: list[str] = field(default_factory=list)  # what makes the measurement less clean (record.warnings)
    port: int | None = None  # the rendezvous port of the last launch
    # Wall-clock [start, end) of the measured phase, else of the whole launch: when neighbours count.
    window: tuple[float, float] | None = None


class StopRequest(threading.Event):
    """Stops a cell that runs in another thread as Ctrl-C stops one in the main thread (signals reach only
    the main thread): run_cell stops the worker, and raises `exc` once it is cleaned up."""

    exc: BaseException = KeyboardInterrupt()

    def request(self, exc: BaseException) -> None:
        self.exc = exc
        self.set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(base: dict[str, str], *, port: int, gpus: list[int] | None) -> dict[str, str]:
    env = dict(base)
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.setdefault("RANK", "0")
    env.setdefault("LOCAL_RANK", "0")
    env.setdefault("WORLD_SIZE", "1")
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        # gpus are NVML's (physical, PCI bus order) indexes; CUDA's default order may differ.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    arch = env.get("TORCH_CUDA_ARCH_LIST")
    if arch:
        # Images for Hopper set "9.0a"; DeepSpeed's op builder int()s each part and crashes on the
        # suffix (DeepSpeed issue 7589). Its kernels need no arch-specific features, so drop it.
        env["TORCH_CUDA_ARCH_LIST"] = re.sub(r"(\d+\.\d+)[a-z]+", r"\1", arch)
    return env


def _command(spec_path: Path, nprocs: int, port: int, module: str = "bench.worker") -> list[str]:
    worker = ["-m", module, "--spec", str(spec_path)]
    if nprocs == 1:
        return [sys.executable, *worker]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nprocs),
        "--nnodes",
        "1",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
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


def _tail(path: Path, n: int = 60) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            lines = f.read().decode(errors="replace").splitlines()
        return "\n".join(lines[-n:])
    except FileNotFoundError:
        return ""


def _signal_group(pid: int, sig: int) -> bool:
    """Signal the worker's process group; False if nothing is left to signal."""
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        try:  # a forked worker that has not reached setsid() yet has no group of its own
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False


def _tree(pid: int) -> dict[int, psutil.Process]:
    try:
        root = psutil.Process(pid)
        return {p.pid: p for p in (root, *root.children(recursive=True))}
    except psutil.Error:
        return {}


def _signal_all(procs: dict[int, psutil.Process], sig: int) -> None:
    for p in procs.values():
        try:
            p.send_signal(sig)  # psutil refuses a pid that now belongs to another process
        except psutil.Error:
            pass


def _kill_tree(proc, grace_s: float = 10.0) -> None:
    """Stop a worker or helper with everything it started: its process group, and the descendants
    that live in groups of their own (ninja starts each compiler in one). Descendants are collected
    before and while it stops: a killed parent's children are adopted by init and no longer its."""
    tree = _tree(proc.pid)
    _signal_group(proc.pid, signal.SIGTERM)
    _signal_all(tree, signal.SIGTERM)
    deadline = time.time() + grace_s
    while proc.poll() is None and time.time() < deadline:
        tree |= _tree(proc.pid)
        time.sleep(0.1)
    tree |= _tree(proc.pid)
    _signal_group(proc.pid, signal.SIGKILL)  # stragglers in the group, too
    _signal_all(tree, signal.SIGKILL)
    proc.wait()


# -- the fork server: a pre-imported parent for single-rank workers (bench/worker/forkserver.py) --
# Environment variables the worker reads only at run time: a request may differ from the server's
# environment in these and still be served; any other difference means a fresh interpreter.
# (Not CUDA_VISIBLE_DEVICES: DeepSpeed picks its accelerator, CUDA or CPU, when it is imported.)
_RUNTIME_ENV = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "ZEROBENCH_FAULT",
        "ZEROBENCH_STALL_S",
        "ZEROBENCH_PORT",
    }
)


class _Forked:
    """A worker forked by the server, with the part of subprocess.Popen's interface that launch uses."""

    def __init__(self, server: ForkServer, pid: int):
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if deadline is not None and time.time() > deadline:
                raise subprocess.TimeoutExpired("forked worker", timeout)
            time.sleep(0.05)
        return self.returncode


class ForkServer:
    """The parent's side of the fork server. `why_not` says why it cannot serve, when it cannot."""

    def __init__(self, env: dict[str, str], log_path: Path, ready_timeout_s: float = 600.0):
        self.env, self.log_path = dict(env), log_path
        self.why_not: str | None = None
        self.import_s: float | None = None
        self._exits: dict[int, int] = {}
        self._replies: dict[int, int] = {}
        self._buf = b""
        self._next = 0
        # Cells packed on one host (bench.pool) share a server from their threads: one reader at a time.
        self._lock = threading.RLock()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            # Its own session: a Ctrl-C at the terminal is for the orchestrator, which stops the cell itself.
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.worker.forkserver"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                # Named, not found by getppid(): a parent killed before the server starts would be init.
                env={**self.env, "ZEROBENCH_PARENT_PID": str(os.getpid())},
                cwd=os.getcwd(),
                start_new_session=True,
            )
        self._ready_timeout_s = ready_timeout_s
        self._ready = False

    def wait_ready(self) -> bool:
        """Wait for the server's imports (started in the background by __init__); True if it can serve."""
        with self._lock:
            return self._wait_ready()

    def _wait_ready(self) -> bool:
        if not self._ready and self.why_not is None:
            msg = self._read_until(lambda m: "ready" in m, self._ready_timeout_s)
            if msg is None:
                self.why_not = f"it did not start within {self._ready_timeout_s:g} s (log: {self.log_path})"
                self.close()
            elif not msg["ready"]:
                self.why_not = msg["why"]
                self.close()
            else:
                self.import_s, self._ready = msg.get("import_s"), True
        return self._ready

    def mismatch(self, env: dict[str, str]) -> list[str]:
        """Variables that differ from the server's environment and may have been read at import time."""
        keys = set(env) | set(self.env)
        return sorted(k for k in keys if env.get(k) != self.env.get(k) and k not in _RUNTIME_ENV)

    def start(self, argv: list[str], env: dict[str, str], log_path: Path) -> _Forked:
        with self._lock:
            return self._start(argv, env, log_path)

    def _start(self, argv: list[str], env: dict[str, str], log_path: Path) -> _Forked:
        self._next += 1
        req = {"id": self._next, "argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log_path)}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        rid = self._next
        if self._read_until(lambda m: m.get("id") == rid, 60.0) is None:
            raise RuntimeError(f"the fork server did not start the worker (log: {self.log_path})")
        return _Forked(self, self._replies.pop(rid))

    def exit_code(self, pid: int) -> int | None:
        with self._lock:
            return self._exit_code(pid)

    def _exit_code(self, pid: int) -> int | None:
        self._pump(0.0)
        if pid in self._exits:
            return self._exits.pop(pid)
        if self.proc.poll() is not None:
            # The server died under its child: the child is nobody's to reap now; report it ended
            # once its process is gone (its exit status is lost with the server).
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return 255
        return None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if not self._ready:  # still importing (or refused): nothing of it is worth waiting for
                    raise subprocess.TimeoutExpired("fork server", 0)
                self.proc.stdin.close()  # the server exits on end of input
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def _pump(self, timeout_s: float) -> list[dict]:
        import select

        out = []
        fd = self.proc.stdout.fileno()
        while True:
            r, _, _ = select.select([fd], [], [], timeout_s)
            if not r:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            self._buf += chunk
            timeout_s = 0.0
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            msg = json.loads(line)
            if "exit" in msg:
                self._exits[msg["exit"]] = msg["code"]
            elif "id" in msg:
                self._replies[msg["id"]] = msg["pid"]
            out.append(msg)
        return out

    def _read_until(self, pred, timeout_s: float) -> dict | None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for m in self._pump(min(0.5, max(0.0, deadline - time.time()))):
                if pred(m):
                    return m
            if self.proc.poll() is not None:
                for m in self._pump(0.0):
                    if pred(m):
                        return m
                return None
        return None


# One server per GPU set (CUDA_VISIBLE_DEVICES is read at import), so cells packed on several GPUs each
# fork from their own; None: a CPU host, where all cells share one.
_servers: dict[str | None, ForkServer] = {}
_servers_lock = threading.Lock()


def _forkserver_off() -> bool:
    return os.environ.get("ZEROBENCH_FORKSERVER", "1") == "0"


def start_forkserver(extra_env: dict[str, str] | None, log_dir: Path, gpus: list[int] | None) -> None:
    """Start the fork server's imports in the background (a run calls this before its op builds), in the
    environment its single-GPU cells on `gpus` will have."""
    if not _forkserver_off():
        _forkserver_for(child_env({**os.environ, **(extra_env or {})}, port=free_port(), gpus=gpus), log_dir)


def _forkserver_for(env: dict[str, str], log_dir: Path) -> ForkServer:
    key = env.get("CUDA_VISIBLE_DEVICES") or None  # "" (CUDA hidden) is a CPU host's one server too
    with _servers_lock:
        srv = _servers.get(key)
        if srv is not None and srv.why_not is None and srv.proc.poll() is not None:
            srv = None  # it died: start another
        if srv is None:
            name = "forkserver.log" if not key else f"forkserver-gpu{key.replace(',', '-')}.log"
            srv = _servers[key] = ForkServer(env, log_dir / name)
        return srv


def _forkserver(env: dict[str, str], log_dir: Path) -> tuple[ForkServer | None, str]:
    """The fork server, ready, or None and why a fresh interpreter is used instead."""
    if _forkserver_off():
        return None, "ZEROBENCH_FORKSERVER=0"
    srv = _forkserver_for(env, log_dir)
    srv.wait_ready()
    if srv.why_not:
        return None, f"fork server unusable: {srv.why_not}"
    diff = srv.mismatch(env)
    if diff:
        return None, f"environment differs from the fork server's in {', '.join(diff[:5])}"
    return srv, ""


def forkserver_ready() -> tuple[float | None, str | None]:
    """The started fork servers' import time (the longest, one server per GPU), once they are ready
    (waiting for them); or None and why not."""
    if _forkserver_off():
        return None, "ZEROBENCH_FORKSERVER=0"
    with _servers_lock:
        servers = list(_servers.values())
    if not servers:
        return None, "not started (no single-rank cell)"
    ready = [srv for srv in servers if srv.wait_ready()]
    if not ready:
        return None, "; ".join(sorted({str(srv.why_not) for srv in servers}))
    return max(srv.import_s for srv in ready), None


def stop_forkserver() -> None:
    """Stop every fork server (one per GPU set)."""
    with _servers_lock:
        servers = list(_servers.values())
        _servers.clear()
    for srv in servers:
        srv.close()


atexit.register(stop_forkserver)  # a run stops it itself; this covers direct run_cell callers


@contextlib.contextmanager
def holding_signals():
    """Hold SIGINT and SIGTERM until the block ends, then deliver them: a process half-started or a
    record half-written would otherwise be lost to a Ctrl-C that lands inside it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in old:
        signal.signal(sig, lambda n, _f: held.append(n))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for n in dict.fromkeys(held):
            signal.raise_signal(n)


def run_tool(args: list[str], *, log_path: Path, env: dict[str, str], timeout_s: float) -> int:
    """Run a one-off helper program (e.g. the op prebuild) under the same rules as a worker: its own
    process group, stopped with its children on timeout or Ctrl-C, and stopping itself with them if
    this process dies (ZEROBENCH_PARENT_PID). Returns its exit code."""
    return run_tools([(args, log_path, env, timeout_s)])[0][0]


def run_tools(
    tools: list[tuple[list[str], Path, dict[str, str], float]], on_progress=None, every_s: float = heartbeat.EVERY_S
) -> list[tuple[int, float]]:
    """Run helper programs side by side (args, log path, env, timeout each), each as run_tool runs one;
    a Ctrl-C stops them all. Returns (exit code, wall seconds) for each, in order. on_progress(log path,
    elapsed s) is called for each helper still running every every_s seconds."""
    running: list[tuple[subprocess.Popen, float, float]] = []
    ends: dict[int, tuple[int, float]] = {}
    beat = time.time() + every_s
    try:
        for args, log_path, env, timeout_s in tools:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "wb") as log, holding_signals():
                proc = subprocess.Popen(
                    [sys.executable, *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**env, "ZEROBENCH_PARENT_PID": str(os.getpid())},
                    cwd=os.getcwd(),
                    start_new_session=True,
                )
                running.append((proc, time.time(), timeout_s))  # before a held Ctrl-C lands: it stops this one too
        while len(ends) < len(running):
            for i, (proc, t0, timeout_s) in enumerate(running):
                if i in ends:
                    continue
                if proc.poll() is None and time.time() - t0 > timeout_s:
                    _kill_tree(proc)
                if proc.poll() is not None:
                    ends[i] = (proc.returncode, time.time() - t0)
            if on_progress is not None and time.time() >= beat and len(ends) < len(running):
                beat = time.time() + every_s
                for i, (_, t0, _) in enumerate(running):
                    if i not in ends:
                        on_progress(tools[i][1], time.time() - t0)
            time.sleep(0.05)
    except KeyboardInterrupt:
        with holding_signals():
            for proc, _, _ in running:
                if proc.poll() is None:
                    _kill_tree(proc)
        raise
    return [ends[i] for i in range(len(running))]


def first_port(env: dict[str, str]) -> int:
    """The rendezvous port of a launch: ZEROBENCH_PORT when set (a host whose firewall opens a known
    range), else one the OS says is free now. Either may be taken by the time the worker binds it; a
    launch that finds it taken is relaunched on another (run_cell)."""
    pinned = env.get("ZEROBENCH_PORT", "").strip()
    return int(pinned) if pinned.isdigit() else free_port()


# Ports held by the cells this process runs now: cells packed side by side (bench.pool) never share one,
# though the OS may call a port free twice before either worker binds it.
_held_ports: set[int] = set()
_ports_lock = threading.Lock()


def _hold_port(env: dict[str, str], first: bool) -> int:
    """A rendezvous port no running cell of this process holds, held until _release_port: the first
    launch's as first_port picks it (a pinned ZEROBENCH_PORT taken by a neighbour: the next one up), a
    relaunch's one the OS calls free."""
    with _ports_lock:
        port = first_port(env) if first else free_port()
        pinned = first and env.get("ZEROBENCH_PORT", "").strip().isdigit()
        while port in _held_ports:
            port = port + 1 if pinned else free_port()
        _held_ports.add(port)
        return port


def _release_port(port: int) -> None:
    with _ports_lock:
        _held_ports.discard(port)


_PORT_TAKEN_RE = re.compile(r"EADDRINUSE|[Aa]ddress already in use")
_LAUNCHES = 3  # one, and two more on other ports when the rendezvous port was taken


_ATTEMPT_PREFIX = "zerobench-"
_OWNER = "owner"  # in an attempt folder: "PID CREATE_TIME" of the orchestrator that made it


def _owner_tag(pid: int) -> str:
    try:
        return f"{pid} {psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return f"{pid} 0"


def sweep_attempt_folders() -> None:
    """Remove attempt folders whose orchestrator is gone. A SIGKILLed run cannot clean up after itself;
    its folder (spec, events, a Trainer's output, NVMe swap files) would stay in the temp dir for good.
    A folder is removed only when its owner's PID is dead or now names another process (create time)."""
    for d in Path(tempfile.gettempdir()).glob(_ATTEMPT_PREFIX + "*"):
        try:
            pid, created = (d / _OWNER).read_text().split()
        except (OSError, ValueError):
            continue  # not ours, or a folder from before owners were written: leave it
        if pid.isdigit() and _owner_tag(int(pid)) != f"{pid} {created}":
            shutil.rmtree(d, ignore_errors=True)


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
) -> Outcome:
    """Run one cell attempt to its end, whatever that end is. A Ctrl-C (or the orchestrator's SIGTERM,
    as KeyboardInterrupt) stops the worker and is raised again after cleaning up; so is stop.exc once
    another thread sets `stop` (a cell run beside others, bench.pool).

    sample_interval_s=None runs without telemetry (to measure what telemetry costs); module picks the
    program (bench.worker.reference is the hand-written yardstick loop)."""
    if stop is not None and stop.is_set():
        raise stop.exc  # nothing started yet: nothing to stop
    work = Path(tempfile.mkdtemp(prefix=_ATTEMPT_PREFIX))
    (work / _OWNER).write_text(_owner_tag(os.getpid()))
    env = {**os.environ, **(extra_env or {})}
    port = _hold_port(env, first=True)
    try:
        notes: list[str] = []
        log_path.parent.mkdir(parents=True, exist_ok=True)
        for n in range(_LAUNCHES):
            out = _launch(
                cell, ds_config, work, port, log_path, gpus, stall_s, sample_interval_s, env, module, n > 0, stop
            )
            # A port taken before any step ran: nothing of the cell was measured, so run it again elsewhere.
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
            with open(log_path, "ab") as log:
                log.write(f"\n--- zerobench: port {port} was in use; relaunching on port {new} ---\n".encode())
            port = new
        out.warnings = notes + out.warnings
        out.port = port
        return out
    finally:
        _release_port(port)
        shutil.rmtree(work, ignore_errors=True)


def _launch(
    cell: Cell,
    ds_config: dict,
    work: Path,
    port: int,
    log_path: Path,
    gpus: list[int] | None,
    stall_s: float,
    sample_interval_s: float | None,
    base_env: dict[str, str],
    module: str,
    again: bool,
    stop_request: StopRequest | None = None,
) -> Outcome:
    """One launch of a cell's worker(s) in the attempt's folder `work`, on rendezvous port `port`."""
    for old in work.iterdir():  # a previous launch's documents (and the Trainer's folder) are not this one's
        if old.name == _OWNER:
            continue
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    spec_path, events_path = work / "spec.json", work / "events.jsonl"
    # One rank per GPU; on a CPU host `gpus: N` runs N CPU ranks over gloo (how CI tests multi-rank cells).
    nprocs = cell.gpus
    spec = {
        "cell": cell.to_dict(),
        "ds_config": ds_config,
        "events": str(events_path),
        "attempt_id": work.name,
        "result": str(work / "result.rank{rank}.json"),
        "parent_pid": os.getpid(),
    }
    spec_path.write_text(json.dumps(spec))
    env = child_env(base_env, port=port, gpus=gpus)
    # NVML indexes all GPUs, not the CUDA_VISIBLE_DEVICES view: sample the physical ones.
    nvml_idx = list(gpus) if gpus and telemetry.nvml_available() else []  # none to sample without NVML
    # One rank of the standard worker is forked from the pre-imported server; everything else (several
    # ranks under torchrun, the reference loop, or no usable server) starts a fresh interpreter. The
    # server's one-time start is not the cell's time, so the clock starts after it.
    server, why = (
        _forkserver(env, log_path.parent)
        if nprocs == 1 and module == "bench.worker"
        else (None, "several ranks" if nprocs > 1 else f"program {module}")
    )
    before = telemetry.gpu_snapshot(nvml_idx)
    oom_before = hostmem.oom_kills()
    t0 = time.time()
    killed_for: str | None = None
    stop: BaseException | None = None
    with open(log_path, "ab" if again else "wb") as log:
        with holding_signals():  # a worker started is a worker this function will stop
            if server is not None:
                proc = server.start(["--spec", str(spec_path)], env, log_path)
                started_by = {"mode": "fork", "server_import_s": server.import_s}
            else:
                proc = subprocess.Popen(
                    _command(spec_path, nprocs, port, module),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                    cwd=os.getcwd(),
                )
                started_by = {"mode": "spawn", "why": why}
        sampler = telemetry.Sampler(proc.pid, nvml_idx, sample_interval_s) if sample_interval_s else None
        if sampler is not None:
            sampler.start()
        armed = False
        try:
            while proc.poll() is None:
                time.sleep(0.2)
                if stop_request is not None and stop_request.is_set():
                    raise stop_request.exc
                now = time.time()
                # The watchdog arms when steps start: setup may legitimately sit silent for a minute
                # (a first JIT build of DeepSpeed's ops); the wall-clock timeout covers it.
                armed = armed or (events_path.exists() and '"warmup"' in events_path.read_text())
                if now - t0 > cell.timeout_s:
                    killed_for = "timeout"
                elif armed and now - events_path.stat().st_mtime > stall_s:
                    killed_for = "stall"
                if killed_for:
                    _kill_tree(proc)
                    break
        except KeyboardInterrupt as e:
            killed_for, stop = "interrupt", e
            with holding_signals():
                _kill_tree(proc)
        finally:
            series = sampler.stop() if sampler is not None else telemetry.Series()
    end_t = time.time()
    events = _read_events(events_path)
    phases = [(e["phase"], e["t"]) for e in events if e.get("event") == "phase"]
    measured = [
        (t, phases[k + 1][1] if k + 1 < len(phases) else end_t) for k, (ph, t) in enumerate(phases) if ph == "measured"
    ]
    steps = [e for e in events if e.get("event") == "step"]
    ranks = []
    for r in range(nprocs):
        p = work / f"result.rank{r}.json"
        if p.exists():
            try:
                ranks.append(json.loads(p.read_text()))
            except json.JSONDecodeError:
                pass
    out = Outcome(
        status=Status.ERROR,
        reason="",
        ranks=ranks,
        exit_code=proc.returncode,
        wall_s=end_t - t0,
        log_tail=_tail(log_path),
        phase_at_end=next((ph for ph, _ in reversed(phases) if ph != "exit"), None),
        last_step=steps[-1]["step"] if steps else None,
        gpu_before=before,
        started_by=started_by,
        fault=faults.for_cell(env.get("ZEROBENCH_FAULT"), cell.id),
        oom_evidence=oom_before.rise(hostmem.oom_kills()),
        window=measured[0] if measured else (t0, end_t),
    )
    out.telemetry = telemetry.summarize(series, phases, end_t)
    out.status, out.reason = _classify(out, killed_for, cell)
    out.gpu_after = _wait_gpu_baseline(nvml_idx, before)
    if stop is not None:
        raise stop
    return out


def _where(o: Outcome) -> str:
    s = f"phase {o.phase_at_end or 'start'}"
    return s + (f", after step {o.last_step}" if o.last_step is not None else "")


# A rank's error that another rank's end caused: its peer closed the connection (it died, or stopped
# after its own failure). It says nothing about the cell; the peer's end does.
_COLLATERAL_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|communicator was aborted"
    r"|remote process exited|NCCL Error 6|Socket closed|recvBytes|sendBytes"
)


def _collateral(d: dict) -> bool:
    # An error with no reason is a rank stopped while it was writing one: it cannot be the cause.
    reason = d.get("reason", "")
    return d.get("status") == Status.ERROR.value and (not reason or bool(_COLLATERAL_RE.search(reason)))


def _classify(o: Outcome, killed_for: str | None, cell: Cell) -> tuple[Status, str]:
    if killed_for == "timeout":
        return Status.TIMEOUT, f"ran past the {cell.timeout_s:g} s limit ({_where(o)})"
    if killed_for == "stall":
        return Status.TIMEOUT, f"no progress for too long ({_where(o)}): a hung collective or a stuck rank"
    if killed_for == "interrupt":
        return Status.INTERRUPTED, f"stopped by the user ({_where(o)})"
    ranks = o.ranks
    failed = [d for d in ranks if d.get("status") != Status.OK.value]
    if failed:
        # The cell ended the way its first failing rank did, by time: when one rank fails, the others
        # fail after it, of it. torchrun stops them with SIGTERM ("interrupted": we did not interrupt,
        # killed_for is None here), or their next collective finds the connection closed. Neither is
        # the cause. A rank that died without a document (killed, exited) shows in the exit code and log.
        victims = (
            [d for d in failed if d.get("status") == Status.INTERRUPTED.value or _collateral(d)]
            if cell.gpus > 1
            else []
        )
        causes = [d for d in failed if d not in victims]
        if not causes:
            st, reason = _classify_without_result(o)
            if st is Status.ERROR and not _torchrun_root_cause(o.log_tail) and (o.exit_code or 0) >= 0:
                first = min(victims, key=lambda d: d.get("t_end") or float("inf"))
                # No other end to blame: the connection failure is what is known.
                if _collateral(first) and first.get("reason"):
                    st, reason = Status.ERROR, f"rank {first.get('rank')}: {first.get('reason', '')}"
            return st, reason
        first = min(
            causes,
            key=lambda d: (d.get("t_end") or float("inf"), -_SEVERITY.index(Status(d.get("status", "error")))),
        )
        st, reason = Status(first.get("status", "error")), first.get("reason", "")
        if cell.gpus > 1:
            reason = f"rank {first.get('rank')}: {reason}"
        return st, reason
    if ranks:
        if len(ranks) < cell.gpus:
            return Status.ERROR, f"only {len(ranks)} of {cell.gpus} ranks wrote a result (exit code {o.exit_code})"
        if o.exit_code not in (0, None):
            return Status.ERROR, f"the worker reported ok but exited with code {o.exit_code}"
        return Status.OK, ""
    return _classify_without_result(o)


_ROOT_CAUSE_RE = re.compile(r"Root Cause \(first observed failure\):(?P<block>.*?)(?:={8,}|$)", re.S)


def _torchrun_root_cause(log_tail: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first rank to fail, as torchrun's failure summary names it."""
    m = _ROOT_CAUSE_RE.search(log_tail)
    if not m:
        return None
    rank = re.search(r"rank\s*:\s*(\d+)", m["block"])
    code = re.search(r"exitcode\s*:\s*(-?\d+)", m["block"])
    return (int(rank[1]), int(code[1])) if rank and code else None


def _classify_without_result(o: Outcome) -> tuple[Status, str]:
    # No result document (or only from ranks stopped by another's end): the worker died before it could
    # write one. Under torchrun, its summary names the rank that failed first and how it ended.
    rss = o.telemetry.get("all", {}).get("host_rss_peak_bytes")
    fault = f"; fault injected: {o.fault}" if o.fault else ""
    cause = _torchrun_root_cause(o.log_tail)
    who, code = (f"rank {cause[0]}: ", cause[1]) if cause else ("", o.exit_code)
    if code == -signal.SIGKILL or (code not in (0, None) and _SIGKILL_RE.search(o.log_tail)):
        limit = hostmem.memory_limit()
        mem = f"; host RSS peak {rss / 2**30:.2f} of {limit / 2**30:.2f} GiB" if rss and limit else ""
        # SIGKILL says only that someone killed it. The OOM killer leaves a count behind; a kill with
        # the tree's memory at the limit is one too, even where the count cannot be read.
        evidence = o.oom_evidence or (
            f"its host RSS peak was within 10% of the {limit / 2**30:.2f} GiB limit"
            if rss and limit and rss >= 0.9 * limit
            else None
        )
        if evidence:
            return (
                Status.HOST_OOM,
                f"{who}the kernel's OOM killer stopped the worker ({_where(o)}): {evidence}{mem}{fault}",
            )
        return (
            Status.KILLED,
            f"{who}killed by signal 9 from outside zerobench; no OOM evidence ({_where(o)}{mem}{fault})",
        )
    if _CUDA_OOM_RE.search(o.log_tail):
        return Status.CUDA_OOM, f"{who}CUDA out of memory ({_where(o)}); see the log tail"
    if code is not None and code < 0:
        return Status.ERROR, f"{who}the worker died of signal {signal.Signals(-code).name} ({_where(o)}{fault})"
    last = next((ln for ln in reversed(o.log_tail.splitlines()) if ln.strip()), "")
    return (
        Status.ERROR,
        f"{who}the worker exited with code {code} without a result ({_where(o)}{fault}): {last[-300:]}",
    )


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
