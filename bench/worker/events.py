"""The worker's side of the child protocol: an append-only events file (phases and steps, which the
parent uses as heartbeat and to split telemetry by phase) and the atomic result document."""
from __future__ import annotations

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


def watch_parent(pid: int | None) -> None:
    """Exit if the orchestrator dies (SIGKILL included), so no orphan keeps the GPU busy."""
    if not pid:
        return

    def loop():
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(75)
            except PermissionError:
                pass

    threading.Thread(target=loop, name="zerobench-parent-watch", daemon=True).start()
