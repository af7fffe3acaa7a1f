"""The fork server: a pre-imported parent for single-rank workers (bench/worker/forkserver.py), one per
GPU set."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from ...host.safefile import open_append
from .ports import child_env, free_port

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
        # Cells packed on one host (bench.execute.executors.local) share a server from their threads: one reader at
        # a time.
        self._lock = threading.RLock()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(open_append(log_path), "ab") as log:
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
            else:
                self._answered(msg)
        return self._ready

    def ready_now(self) -> bool:
        """Whether it has finished its imports and can serve, without waiting for them."""
        with self._lock:
            if not self._ready and self.why_not is None:
                for msg in self._pump(0.0):
                    if "ready" in msg:
                        self._answered(msg)
            return self._ready

    def _answered(self, msg: dict) -> None:
        """The server's first answer: it serves, or it refused (why)."""
        if not msg["ready"]:
            self.why_not = msg["why"]
            self.close()
        else:
            self.import_s, self._ready = msg.get("import_s"), True

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


def warm_forkserver(extra_env: dict[str, str] | None, log_dir: Path, gpus: list[int] | None) -> bool:
    """For cells run by a process the run does not own (a Ray worker, reused from cell to cell): its fork
    server for `gpus`, started in the background where it has none (any other GPU set's is stopped: one
    server a process); whether it can serve now, without waiting for its imports."""
    environ = {**os.environ, **(extra_env or {})}
    if environ.get("ZEROBENCH_FORKSERVER", "1") == "0":
        return False
    env = child_env(environ, port=free_port(), gpus=gpus)
    key = env.get("CUDA_VISIBLE_DEVICES") or None
    with _servers_lock:
        others = [_servers.pop(k) for k in list(_servers) if k != key]
    for srv in others:
        srv.close()
    return _forkserver_for(env, log_dir).ready_now()


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
