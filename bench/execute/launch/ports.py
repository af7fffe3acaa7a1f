"""Where a worker meets its peers: the rendezvous port (free, held while the cell runs, pinned by
ZEROBENCH_PORT) and the environment a child gets."""

from __future__ import annotations

import os
import re
import socket
import sys
import threading


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(base: dict[str, str], *, port: int, gpus: list[int] | None, addr: str = "127.0.0.1") -> dict[str, str]:
    """A worker's environment: the rendezvous (addr: the first node's address), its GPUs, offline hubs."""
    env = dict(base)
    env.update(
        MASTER_ADDR=addr,
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
    env["PATH"] = own_tools_first(env.get("PATH"))
    arch = env.get("TORCH_CUDA_ARCH_LIST")
    if arch:
        # Images for Hopper set "9.0a"; DeepSpeed's op builder int()s each part and crashes on the
        # suffix (DeepSpeed issue 7589). Its kernels need no arch-specific features, so drop it.
        env["TORCH_CUDA_ARCH_LIST"] = re.sub(r"(\d+\.\d+)[a-z]+", r"\1", arch)
    return env


def own_tools_first(path: str | None) -> str:
    """PATH with this interpreter's own bin folder first (a venv's, whether activated or not): torch builds
    DeepSpeed's ops with the `ninja` PATH finds, and another ninja than the one that built them (the system's, when
    the venv's zerobench runs unactivated) reads the build log as "command line changed" and compiles every op
    again."""
    own = os.path.dirname(sys.executable)
    rest = [p for p in (path or os.defpath).split(os.pathsep) if p and p != own]
    return os.pathsep.join([own, *rest]) if own else os.pathsep.join(rest)


def first_port(env: dict[str, str]) -> int:
    """The rendezvous port of a launch: ZEROBENCH_PORT when set (a host whose firewall opens a known
    range), else one the OS says is free now. Either may be taken by the time the worker binds it; a
    launch that finds it taken is relaunched on another (run_cell)."""
    pinned = env.get("ZEROBENCH_PORT", "").strip()
    return int(pinned) if pinned.isdigit() else free_port()


# Ports held by the cells this process runs now: cells packed side by side (bench.execute.executors.local) never
# share one, though the OS may call a port free twice before either worker binds it.
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
