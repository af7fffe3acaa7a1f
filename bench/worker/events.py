"""The worker's side of the child protocol: an append-only events file (phases and steps, which the
parent uses as heartbeat and to split telemetry by phase) and the atomic result document."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

__all__ = ["Events", "write_result", "watch_parent"]


class Events:
    def __init__(self, path: str | None, enabled: bool):
        self._f = open(path, "a", buffering=1) if (path and enabled) else None

    def emit(self, kind: str, **data) -> None:
        if self._f is not None:
            self._f.write(json.dumps({"t": time.time(), "event": kind, **data}) + "\n")

    def phase(self, name: str) -> None:
        self.emit("phase", phase=name)


def write_result(path: str, doc: dict) -> None:
    """Write then rename, so the parent never reads half a document."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def watch_parent(pid: int | None, *, group: bool = False) -> None:
    """Exit if the orchestrator dies (SIGKILL included), so no orphan keeps the GPU busy.

    group: this process leads its own process group (a worker or helper the orchestrator started in a
    new session); take the whole group down, so what it started (ninja and the compiler of a JIT build)
    does not run on for minutes."""
    if not pid:
        return

    def loop():
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                # Said in the log: its last write is when the attempt stopped (what --resume counts it ran for).
                with contextlib.suppress(OSError):
                    os.write(2, f"zerobench worker: the orchestrator (pid {pid}) is gone; stopping\n".encode())
                if group and os.getpgid(0) == os.getpid():
                    _kill_all_i_started()
                os._exit(75)
            except PermissionError:
                pass

    threading.Thread(target=loop, name="zerobench-parent-watch", daemon=True).start()


def _descendants(pid: int) -> list[int]:
    """This process's descendants, from /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for d in entries:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_all_i_started() -> None:
    """SIGKILL this process's group and every descendant, those in groups of their own included (ninja
    starts each compiler in one). They are stopped first, so none forks or is orphaned while collected."""
    import signal

    stopped: set[int] = set()
    for _ in range(5):
        new = [p for p in _descendants(os.getpid()) if p not in stopped]
        if not new:
            break
        for p in new:
            try:
                os.kill(p, signal.SIGSTOP)
            except OSError:
                pass
        stopped.update(new)
    for p in stopped:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    os.killpg(0, signal.SIGKILL)  # this process included: nothing of it is worth keeping
