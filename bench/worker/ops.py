"""DeepSpeed's JIT-compiled ops, as a cell and the prebuild meet them.

Two things go wrong with the shared extensions folder (TORCH_EXTENSIONS_DIR/<op>/):
- A build that died (SIGKILL, OOM, a host reboot) leaves torch's FileBaton `lock` file behind, and
  every later load of that op waits for it forever. The baton keeps its file open while it builds, so
  a lock no live process holds open is stale: it is removed at once, and a lock whose holder dies
  while we wait is removed within seconds.
- An op can be compiled inside a cell (the prebuild failed, another run changed the cache): the
  cell's wall time and setup memory then include a compiler. Each such build is recorded
  (`BUILT`), and the record flags the cell.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

__all__ = ["BUILT", "CLEARED", "LOADED", "build_dir", "instrument", "lock_holders", "clear_stale_lock"]

BUILT: list[dict] = []
"""Ops this process compiled (or relinked): {"op", "s"} each, in order."""
LOADED: list[str] = []
"""The build folders of the ops this process loaded, in order (an op's load may load others first:
async_io loads pin_memory)."""
CLEARED: list[str] = []
"""Stale locks this process removed, in words."""

_POLL_S = 2.0


def lock_holders(lock: Path) -> list[int]:
    """PIDs of the live processes that hold `lock` open (those this user may inspect)."""
    target = str(lock.resolve()) if lock.exists() else str(lock)
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                try:
                    if os.readlink(fd) == target:
                        pids.append(int(d.name))
                        break
                except OSError:
                    continue
        except OSError:  # gone, or another user's process
            continue
    return pids


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


def clear_stale_lock(build_dir: Path) -> tuple[str | None, str | None]:
    """Remove build_dir/lock if no live process holds it open. Returns (what was removed, who holds
    it): both None when there is no lock."""
    lock = build_dir / "lock"
    try:
        st = lock.stat()
    except OSError:
        return None, None
    if st.st_uid != os.getuid():
        return None, f"{lock} belongs to another user (uid {st.st_uid}): waiting for it as torch does"
    holders = lock_holders(lock)
    if not holders:
        # The baton closes its file a moment before it removes it: look again before calling it stale.
        time.sleep(0.5)
        try:
            if lock.stat().st_ino != st.st_ino:
                return None, None
        except OSError:
            return None, None
        holders = lock_holders(lock)
    if holders:
        return None, f"{lock} is held by a live build: " + "; ".join(f"pid {p}: {_cmd(p)}" for p in holders)
    try:
        lock.unlink()
    except FileNotFoundError:
        return None, None
    return f"removed a stale lock {lock} ({time.time() - st.st_mtime:.0f} s old; no live process held it)", None


def _say(msg: str) -> None:
    print(f"zerobench: {msg}", file=sys.stderr, flush=True)


def _watch(build_dir: Path, stop: threading.Event) -> None:
    """While this process waits on a lock held by another build, remove it if that build dies."""
    while not stop.wait(_POLL_S):
        removed, _ = clear_stale_lock(build_dir)
        if removed:
            CLEARED.append(removed)
            _say(removed)


def build_dir(name: str) -> Path:
    """The folder torch builds and loads the op `name` in (TORCH_EXTENSIONS_DIR/<name>)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return Path(_get_build_directory(name, False))
    except Exception:  # noqa: BLE001 - a torch without it: the documented layout
        return Path(os.environ.get("TORCH_EXTENSIONS_DIR", "")) / name


def _libs(d: Path) -> dict[str, float]:
    try:
        return {f.name: f.stat().st_mtime for f in d.glob("*.so")}
    except OSError:
        return {}


def instrument() -> None:
    """Wrap DeepSpeed's JIT load (once per process): stale locks cleared first, builds recorded."""
    import importlib

    classes = []
    for mod in ("deepspeed.ops.op_builder.builder", "op_builder.builder"):
        if mod in sys.modules or mod.startswith("deepspeed"):
            try:
                classes.append(importlib.import_module(mod).OpBuilder)
            except (ImportError, AttributeError):
                pass
    for cls in dict.fromkeys(classes):
        if getattr(cls.jit_load, "_zerobench", False):
            continue
        original = cls.jit_load

        def jit_load(self, verbose=True, _original=original):
            d = build_dir(self.name)
            removed, held = clear_stale_lock(d)
            if removed:
                CLEARED.append(removed)
            for msg in (removed, held):
                if msg:
                    _say(msg)
            before = _libs(d)
            stop = threading.Event()
            threading.Thread(target=_watch, args=(d, stop), name="zerobench-lock-watch", daemon=True).start()
            t0 = time.time()
            try:
                return _original(self, verbose)
            finally:
                stop.set()
                LOADED.append(str(d))
                after = _libs(d)
                if any(before.get(k) != v for k, v in after.items()):
                    BUILT.append({"op": self.name, "s": round(time.time() - t0, 1)})

        jit_load._zerobench = True
        cls.jit_load = jit_load
