"""The host's memory limit and the kernel's OOM kills, from the memory cgroup and /proc: the evidence
that tells a worker stopped by the OOM killer from one SIGKILLed by anyone else (a user, a job
scheduler, a test). A leaf; Linux only (None where a file is missing).

Counters read before and after a cell: the cgroup's own count (v2 memory.events, v1
memory.oom_control: `oom_kill N`) and the host kernel's (/proc/vmstat `oom_kill`, every OOM kill on
the machine, containers included).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OomCounts", "oom_kills", "memory_limit", "cgroup_limit", "host_memory", "cgroup_dir"]

_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _field(text: str | None, key: str) -> int | None:
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if k == key and v.strip().isdigit():
            return int(v)
    return None


def cgroup_dir(pid: int | str = "self") -> tuple[Path, int] | None:
    """(the memory cgroup folder of a process, cgroup version 1 or 2), or None."""
    text = _read(Path(f"/proc/{pid}/cgroup"))
    if text is None:
        return None
    v1 = v2 = None
    for line in text.splitlines():
        hid, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if "memory" in ctrls.split(","):
            v1 = path
        elif hid == "0" and not ctrls:
            v2 = path
    # Inside a cgroup namespace the path may be relative to a root the mount does not show: fall back
    # to the mount's root, which is then the process's own cgroup.
    if v1 is not None:
        for d in (_ROOT / "memory" / v1.lstrip("/"), _ROOT / "memory"):
            if (d / "memory.oom_control").exists():
                return d, 1
    if v2 is not None:
        for d in (_ROOT / v2.lstrip("/"), _ROOT):
            if (d / "memory.events").exists():
                return d, 2
    return None


@dataclass(frozen=True)
class OomCounts:
    """OOM kills counted so far: in the worker's memory cgroup, and on the whole host."""

    cgroup: int | None
    host: int | None

    def rise(self, later: OomCounts) -> str | None:
        """What rose between this count and a later one, in words; None if nothing did."""
        if self.cgroup is not None and later.cgroup is not None and later.cgroup > self.cgroup:
            return f"the memory cgroup's oom_kill count rose from {self.cgroup} to {later.cgroup}"
        if self.host is not None and later.host is not None and later.host > self.host:
            return f"the kernel's oom_kill count (/proc/vmstat) rose from {self.host} to {later.host}"
        return None


def oom_kills(pid: int | str = "self") -> OomCounts:
    cg = cgroup_dir(pid)
    n = None
    if cg is not None:
        d, version = cg
        n = _field(_read(d / ("memory.events" if version == 2 else "memory.oom_control")), "oom_kill")
    return OomCounts(cgroup=n, host=_field(_read(Path("/proc/vmstat")), "oom_kill"))


def host_memory() -> int | None:
    """The host's RAM in bytes."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cgroup_limit(pid: int | str = "self") -> int | None:
    """The memory cgroup's limit in bytes, None where none is set (or no cgroup is found)."""
    cg = cgroup_dir(pid)
    if cg is None:
        return None
    d, version = cg
    raw = (_read(d / ("memory.max" if version == 2 else "memory.limit_in_bytes")) or "").strip()
    # cgroup v1 writes "no limit" as a huge page-aligned number.
    return int(raw) if raw.isdigit() and int(raw) < 2**62 else None


def memory_limit(pid: int | str = "self") -> int | None:
    """The memory a process may use: its cgroup's limit where one is set below the host's RAM, else the RAM."""
    limit, total = cgroup_limit(pid), host_memory()
    return min(x for x in (limit, total) if x) if (limit or total) else None
