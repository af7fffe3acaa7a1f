"""The child-process protocol, written once.

The parent picks the spec, events and result paths, starts the worker in its own process group
(forked from the pre-imported fork server for one GPU, a fresh interpreter otherwise, torchrun for
several GPUs) with a free rendezvous port, samples its telemetry, enforces the
wall-clock timeout and a no-progress watchdog, and classifies the end from the exit code, the
result documents and the log tail. Whatever happens to the cell, an Outcome comes back.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import telemetry
from .cells import Cell
from .status import Status

__all__ = ["ForkServer", "Outcome", "child_env", "run_cell", "run_tool", "stop_forkserver"]

# Worse outcomes win when ranks disagree.
_SEVERITY = [Status.OK, Status.DIVERGED, Status.ERROR, Status.TIMEOUT, Status.CUDA_OOM, Status.HOST_OOM,
             Status.INTERRUPTED]
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(base: dict[str, str], *, port: int, gpus: list[int] | None) -> dict[str, str]:
    env = dict(base)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.setdefault("RANK", "0")
    env.setdefault("LOCAL_RANK", "0")
    env.setdefault("WORLD_SIZE", "1")
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
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
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nprocs), "--nnodes", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(port), *worker]


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


def _kill_tree(proc, grace_s: float = 10.0) -> None:
    if not _signal_group(proc.pid, signal.SIGTERM):
        proc.wait()
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc.pid, signal.SIGKILL)  # stragglers in the group, too
    proc.wait()


# -- the fork server: a pre-imported parent for single-rank workers (bench/worker/forkserver.py) --
# Environment variables the worker reads only at run time: a request may differ from the server's
# environment in these and still be served; any other difference means a fresh interpreter.
# (Not CUDA_VISIBLE_DEVICES: DeepSpeed picks its accelerator, CUDA or CPU, when it is imported.)
_RUNTIME_ENV = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "ZEROBENCH_FAULT",
                          "ZEROBENCH_STALL_S"})


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
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            # Its own session: a Ctrl-C at the terminal is for the orchestrator, which stops the cell itself.
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.worker.forkserver"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, env=self.env, cwd=os.getcwd(),
                                         start_new_session=True)
        self._ready_timeout_s = ready_timeout_s
        self._ready = False

    def wait_ready(self) -> bool:
        """Wait for the server's imports (started in the background by __init__); True if it can serve."""
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
        self._next += 1
        req = {"id": self._next, "argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log_path)}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        rid = self._next
        if self._read_until(lambda m: m.get("id") == rid, 60.0) is None:
            raise RuntimeError(f"the fork server did not start the worker (log: {self.log_path})")
        return _Forked(self, self._replies.pop(rid))

    def exit_code(self, pid: int) -> int | None:
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


_server: ForkServer | None = None


def _forkserver_off() -> bool:
    return os.environ.get("ZEROBENCH_FORKSERVER", "1") == "0"


def start_forkserver(extra_env: dict[str, str] | None, log_dir: Path, gpus: list[int] | None) -> None:
    """Start the fork server's imports in the background (a run calls this before its op builds), in the
    environment its single-GPU cells will have."""
    if not _forkserver_off():
        _forkserver_for(child_env({**os.environ, **(extra_env or {})}, port=free_port(), gpus=gpus), log_dir)


def _forkserver_for(env: dict[str, str], log_dir: Path) -> ForkServer:
    global _server
    if _server is not None and _server.why_not is None and _server.proc.poll() is not None:
        _server = None  # it died: start another
    if _server is None:
        _server = ForkServer(env, log_dir / "forkserver.log")
    return _server


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


def stop_forkserver() -> None:
    global _server
    if _server is not None:
        _server.close()
        _server = None


atexit.register(stop_forkserver)  # a run stops it itself; this covers direct run_cell callers


def run_tool(args: list[str], *, log_path: Path, env: dict[str, str], timeout_s: float) -> int:
    """Run a one-off helper program (e.g. the op prebuild) under the same rules as a worker: its own
    process group, stopped with its children on timeout or Ctrl-C. Returns its exit code."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=os.getcwd(), start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
        except KeyboardInterrupt:
            _kill_tree(proc)
            raise
    return proc.returncode


def run_cell(cell: Cell, ds_config: dict, *, log_path: Path, gpus: list[int] | None, stall_s: float = 600.0,
             sample_interval_s: float | None = 0.01, extra_env: dict[str, str] | None = None,
             module: str = "bench.worker") -> Outcome:
    """Run one cell attempt to its end, whatever that end is. Raises KeyboardInterrupt after cleaning up.

    sample_interval_s=None runs without telemetry (to measure what telemetry costs); module picks the
    program (bench.reference is the hand-written yardstick loop)."""
    work = Path(tempfile.mkdtemp(prefix="zerobench-"))
    spec_path, events_path = work / "spec.json", work / "events.jsonl"
    # One rank per GPU; on a CPU host `gpus: N` runs N CPU ranks over gloo (how CI tests multi-rank cells).
    nprocs = cell.gpus
    spec = {"cell": cell.to_dict(), "ds_config": ds_config, "events": str(events_path), "attempt_id": work.name,
            "result": str(work / "result.rank{rank}.json"), "parent_pid": os.getpid()}
    spec_path.write_text(json.dumps(spec))
    port = free_port()
    env = child_env({**os.environ, **(extra_env or {})}, port=port, gpus=gpus)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    # NVML indexes all GPUs, not the CUDA_VISIBLE_DEVICES view: sample the physical ones.
    nvml_idx = list(gpus) if gpus else []
    # One rank of the standard worker is forked from the pre-imported server; everything else (several
    # ranks under torchrun, the reference loop, or no usable server) starts a fresh interpreter. The
    # server's one-time start is not the cell's time, so the clock starts after it.
    server, why = (_forkserver(env, log_path.parent) if nprocs == 1 and module == "bench.worker"
                   else (None, "several ranks" if nprocs > 1 else f"program {module}"))
    before = telemetry.gpu_snapshot(nvml_idx)
    t0 = time.time()
    killed_for: str | None = None
    with open(log_path, "wb") as log:
        if server is not None:
            proc = server.start(["--spec", str(spec_path)], env, log_path)
            started_by = {"mode": "fork", "server_import_s": server.import_s}
        else:
            proc = subprocess.Popen(_command(spec_path, nprocs, port, module), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env, cwd=os.getcwd())
            started_by = {"mode": "spawn", "why": why}
        sampler = telemetry.Sampler(proc.pid, nvml_idx, sample_interval_s) if sample_interval_s else None
        if sampler is not None:
            sampler.start()
        armed = False
        try:
            while proc.poll() is None:
                time.sleep(0.2)
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
        except KeyboardInterrupt:
            killed_for = "interrupt"
            _kill_tree(proc)
        finally:
            series = sampler.stop() if sampler is not None else telemetry.Series()
    end_t = time.time()
    events = _read_events(events_path)
    phases = [(e["phase"], e["t"]) for e in events if e.get("event") == "phase"]
    steps = [e for e in events if e.get("event") == "step"]
    ranks = []
    for r in range(nprocs):
        p = work / f"result.rank{r}.json"
        if p.exists():
            try:
                ranks.append(json.loads(p.read_text()))
            except json.JSONDecodeError:
                pass
    out = Outcome(status=Status.ERROR, reason="", ranks=ranks, exit_code=proc.returncode, wall_s=end_t - t0,
                  log_tail=_tail(log_path), phase_at_end=next((ph for ph, _ in reversed(phases) if ph != "exit"), None),
                  last_step=steps[-1]["step"] if steps else None, gpu_before=before, started_by=started_by)
    out.telemetry = telemetry.summarize(series, phases, end_t)
    out.status, out.reason = _classify(out, killed_for, cell)
    out.gpu_after = _wait_gpu_baseline(nvml_idx, before)
    shutil.rmtree(work, ignore_errors=True)
    if killed_for == "interrupt":
        raise KeyboardInterrupt
    return out


def _where(o: Outcome) -> str:
    s = f"phase {o.phase_at_end or 'start'}"
    return s + (f", after step {o.last_step}" if o.last_step is not None else "")


def _classify(o: Outcome, killed_for: str | None, cell: Cell) -> tuple[Status, str]:
    if killed_for == "timeout":
        return Status.TIMEOUT, f"ran past the {cell.timeout_s:g} s limit ({_where(o)})"
    if killed_for == "stall":
        return Status.TIMEOUT, f"no progress for too long ({_where(o)}): a hung collective or a stuck rank"
    if killed_for == "interrupt":
        return Status.INTERRUPTED, f"stopped by the user ({_where(o)})"
    ranks = o.ranks
    if cell.gpus > 1:
        # torchrun stops the other ranks with SIGTERM when one fails, and a rank stopped that way
        # records "interrupted" (we did not interrupt: killed_for is None here). The failure is the
        # other rank's; if it left no result either, the exit code and the log tell.
        victims = [d for d in ranks if d.get("status") == Status.INTERRUPTED.value]
        if victims:
            ranks = [d for d in ranks if d not in victims]
            if not ranks:
                return _classify_without_result(o)
    if ranks:
        # The worst outcome; among equally bad ones the earliest, since a rank that dies takes the
        # others down with it (their errors are the collective's, not the cause).
        worst = min(ranks, key=lambda d: (-_SEVERITY.index(Status(d.get("status", "error"))),
                                            d.get("t_end", float("inf"))))
        st = Status(worst.get("status", "error"))
        reason = worst.get("reason", "")
        if len(o.ranks) < cell.gpus and st is Status.OK:
            return Status.ERROR, f"only {len(o.ranks)} of {cell.gpus} ranks wrote a result (exit code {o.exit_code})"
        if st is Status.OK and o.exit_code not in (0, None):
            return Status.ERROR, f"the worker reported ok but exited with code {o.exit_code}"
        if cell.gpus > 1 and st is not Status.OK:
            reason = f"rank {worst.get('rank')}: {reason}"
        return st, reason
    return _classify_without_result(o)


def _classify_without_result(o: Outcome) -> tuple[Status, str]:
    # No result document (or only from ranks torchrun stopped): the worker died before it could write one.
    rss = o.telemetry.get("all", {}).get("host_rss_peak_bytes")
    if o.exit_code == -signal.SIGKILL or (o.exit_code not in (0, None) and _SIGKILL_RE.search(o.log_tail)):
        from .env import probe

        total = probe().host_memory_bytes
        mem = f"; host RSS peak {rss / 2**30:.1f} of {total / 2**30:.1f} GiB" if rss and total else ""
        return Status.HOST_OOM, f"the worker was SIGKILLed, not by zerobench: the kernel's OOM killer ({_where(o)}{mem})"
    if _CUDA_OOM_RE.search(o.log_tail):
        return Status.CUDA_OOM, f"CUDA out of memory ({_where(o)}); see the log tail"
    if o.exit_code is not None and o.exit_code < 0:
        return Status.ERROR, f"the worker died of signal {signal.Signals(-o.exit_code).name} ({_where(o)})"
    last = next((ln for ln in reversed(o.log_tail.splitlines()) if ln.strip()), "")
    return Status.ERROR, f"the worker exited with code {o.exit_code} without a result ({_where(o)}): {last[-300:]}"


def _wait_gpu_baseline(nvml_idx: list[int], before: dict, timeout_s: float = 30.0) -> dict:
    """Wait until the GPUs are back to their memory before the cell, so the next cell starts clean."""
    if not nvml_idx:
        return {}
    deadline = time.time() + timeout_s
    snap = telemetry.gpu_snapshot(nvml_idx)
    while time.time() < deadline:
        if all(snap[i]["used_bytes"] <= before[i]["used_bytes"] + 512 * 2**20 for i in nvml_idx):
            break
        time.sleep(0.5)
        snap = telemetry.gpu_snapshot(nvml_idx)
    return snap
