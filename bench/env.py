"""What this machine is: accelerators, library versions, git provenance. Imports no torch, so the
orchestrator stays fast and holds no CUDA context; GPUs are found through NVML."""
from __future__ import annotations

import functools
import importlib.metadata as md
import os
import platform as _platform
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Platform", "probe", "provenance", "version", "version_tuple", "LIBS"]

LIBS = ("torch", "deepspeed", "transformers", "peft", "accelerate", "bitsandbytes", "liger-kernel", "triton",
        "nvidia-ml-py", "pandas", "zerobench")


def version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def version_tuple(v: str | None) -> tuple[int, ...]:
    """'0.19.6+cu130' -> (0, 19, 6); None -> ()."""
    if not v:
        return ()
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_bytes: int
    uuid: str


@dataclass(frozen=True)
class Platform:
    """The facts that rules depend on."""

    gpus: tuple[Gpu, ...] = ()
    driver: str | None = None
    versions: dict = field(default_factory=dict)
    host_memory_bytes: int = 0
    cpu_count: int = 0
    libaio: bool = True
    """libaio's headers, which DeepSpeed's async-I/O op (NVMe offload) compiles against."""

    @property
    def cuda(self) -> bool:
        torch_v = self.versions.get("torch") or ""
        return bool(self.gpus) and "+cpu" not in torch_v

    def has(self, dist: str) -> bool:
        return self.versions.get(dist) is not None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["cuda"] = self.cuda
        return d


def _nvml_gpus() -> tuple[tuple[Gpu, ...], str | None]:
    if os.environ.get("ZEROBENCH_NO_GPU"):
        return (), None
    try:
        import pynvml
    except ImportError:
        return (), None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: a CPU machine
        return (), None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            gpus.append(Gpu(i, name.decode() if isinstance(name, bytes) else name,
                            int(pynvml.nvmlDeviceGetMemoryInfo(h).total), str(pynvml.nvmlDeviceGetUUID(h))))
        drv = pynvml.nvmlSystemGetDriverVersion()
        return tuple(gpus), drv.decode() if isinstance(drv, bytes) else drv
    finally:
        pynvml.nvmlShutdown()


@functools.cache
def probe() -> Platform:
    import psutil

    gpus, driver = _nvml_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and gpus:
        keep = {int(x) for x in visible.split(",") if x.strip().isdigit()}
        gpus = tuple(g for g in gpus if g.index in keep)
    return Platform(gpus=gpus, driver=driver, versions={d: version(d) for d in LIBS},
                    host_memory_bytes=int(psutil.virtual_memory().total), cpu_count=os.cpu_count() or 0,
                    libaio=Path("/usr/include/libaio.h").exists())


def _git(*args: str) -> str | None:
    try:
        root = Path(__file__).resolve().parent.parent
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


@functools.cache
def provenance() -> dict:
    """Where a result came from: host, hardware, library versions, git commit and dirty flag."""
    p = probe()
    status = _git("status", "--porcelain", "--untracked-files=no")
    cpu = _platform.processor() or _platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "host": socket.gethostname(),
        "os": _platform.platform(),
        "python": _platform.python_version(),
        "cpu": cpu,
        "cpu_count": p.cpu_count,
        "host_memory_bytes": p.host_memory_bytes,
        "gpus": [asdict(g) for g in p.gpus],
        "gpu_name": p.gpus[0].name if p.gpus else None,
        "gpu_count": len(p.gpus),
        "driver": p.driver,
        "versions": p.versions,
        # A copy of the tree without .git (a lent GPU host) names its commit in ZEROBENCH_GIT_COMMIT.
        "git_commit": _git("rev-parse", "HEAD") or os.environ.get("ZEROBENCH_GIT_COMMIT"),
        "git_dirty": bool(status) if status is not None else None,
    }
