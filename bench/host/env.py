"""What this machine is: accelerators, library versions, git provenance. Imports no torch, so the
orchestrator stays fast and holds no CUDA context; GPUs are found through NVML."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as md
import os
import platform as _platform
import re
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Platform", "probe", "provenance", "boot_id", "source_sha", "file_sha", "version", "version_tuple", "LIBS"]

LIBS = (
    "torch",
    "deepspeed",
    "transformers",
    "peft",
    "accelerate",
    "bitsandbytes",
    "liger-kernel",
    "triton",
    "nvidia-ml-py",
    "pandas",
)


def version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def version_tuple(v: str | None) -> tuple[int, ...]:
    """'0.19.6+cu130' -> (0, 19, 6); '2.13.0rc1' -> (2, 13, 0); None -> ().

    The release numbers only: a part's leading digits count, and whatever follows them (rc1, a0,
    .dev0, .post1, +cu130) ends the tuple, so a pre-release compares as its release.
    """
    out = []
    for part in (v or "").split("+")[0].split("."):
        digits = re.match(r"\d*", part).group()
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
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
    nvml: bool = True
    """NVML (nvidia-ml-py) answers. False on a GPU host without it: the GPUs were found through
    nvidia-smi, and the NVML memory and power figures are missing from every record."""
    hosts: int | None = 1
    """Hosts one cell's nodes can be placed on: 1 for this host alone (`--executor local`, which runs a
    multi-node cell's nodes side by side on 127.0.0.1); a cluster's node count; None where the cluster
    does not say (its scheduler refuses what it cannot place)."""

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


def _smi_gpus() -> tuple[tuple[Gpu, ...], str | None]:
    """The GPUs as nvidia-smi lists them: how a GPU host without nvidia-ml-py is still known as one."""
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,uuid,driver_version", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return (), None
    gpus, driver = [], None
    for line in r.stdout.splitlines() if r.returncode == 0 else []:
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 5 and parts[0].isdigit() and parts[2].isdigit():
            gpus.append(Gpu(int(parts[0]), parts[1], int(parts[2]) * 2**20, parts[3]))
            driver = parts[4]
    return tuple(gpus), driver


def _nvml_gpus() -> tuple[tuple[Gpu, ...], str | None, bool]:
    """(GPUs, driver, whether NVML answered)."""
    if os.environ.get("ZEROBENCH_NO_GPU"):
        return (), None, True
    try:
        import pynvml
    except Exception:  # noqa: BLE001 - not installed, or a binding that cannot load its library
        return (*_smi_gpus(), False)
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: a CPU machine
        return (), None, True
    try:
        return _enumerate(pynvml)
    except Exception:  # noqa: BLE001 - NVML started but cannot list the GPUs (driver mismatch, a lost GPU)
        return (*_smi_gpus(), False)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _enumerate(pynvml) -> tuple[tuple[Gpu, ...], str | None, bool]:
    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        name = pynvml.nvmlDeviceGetName(h)
        gpus.append(
            Gpu(
                i,
                name.decode() if isinstance(name, bytes) else name,
                int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                str(pynvml.nvmlDeviceGetUUID(h)),
            )
        )
    drv = pynvml.nvmlSystemGetDriverVersion()
    return tuple(gpus), drv.decode() if isinstance(drv, bytes) else drv, True


@functools.cache
def probe() -> Platform:
    import psutil

    gpus, driver, nvml = _nvml_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and gpus:
        keep = {int(x) for x in visible.split(",") if x.strip().isdigit()}
        gpus = tuple(g for g in gpus if g.index in keep)
    return Platform(
        gpus=gpus,
        driver=driver,
        versions={d: version(d) for d in LIBS},
        host_memory_bytes=int(psutil.virtual_memory().total),
        cpu_count=os.cpu_count() or 0,
        libaio=Path("/usr/include/libaio.h").exists(),
        nvml=nvml or not gpus,
    )


_PACKAGE = Path(__file__).resolve().parent.parent  # bench/, whose source the provenance hashes


def _git(root: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _own_checkout() -> Path | None:
    """The root of zerobench's own git checkout when this package runs from one, else None.

    git answers for whatever repository encloses a folder: an installed wheel (site-packages) or a copy
    of the tree inside another repository (as on the lent GPU host) would report that repository's
    commit. Only a checkout whose top level holds this very package, tracked, is ours."""
    root = _PACKAGE.parent
    top = _git(root, "rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != root:
        return None
    tracked = _git(root, "ls-files", "--error-unmatch", "bench/__init__.py", "bench/host/env.py")
    return root if tracked else None


@functools.cache
def source_sha() -> str:
    """sha256 of the bench package's own files (paths and bytes): which code ran, with or without git."""
    h = hashlib.sha256()
    for f in sorted(_PACKAGE.rglob("*")):
        if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".pyo"):
            h.update(f.relative_to(_PACKAGE).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def file_sha(path: str | os.PathLike) -> str | None:
    """sha256 of a file's bytes (a matrix, a DeepSpeed config), None if it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def boot_id() -> str | None:
    """This host's boot id (Linux: a new random one at every boot), None where the system has none. Two lent
    machines may share a host name (every one of them "vm"); their boot ids differ, and so does one machine's
    after a reboot."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _zerobench_version() -> str:
    from .. import __version__

    return __version__


@functools.cache
def provenance() -> dict:
    """Where a result came from: host, hardware, library versions, and the code by content (package
    version and source hash); the git commit and dirty flag only from zerobench's own checkout."""
    p = probe()
    root = _own_checkout()
    status = _git(root, "status", "--porcelain", "--untracked-files=no") if root else None
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
        "boot_id": boot_id(),
        "os": _platform.platform(),
        "python": _platform.python_version(),
        "cpu": cpu,
        "cpu_count": p.cpu_count,
        "host_memory_bytes": p.host_memory_bytes,
        "gpus": [asdict(g) for g in p.gpus],
        "gpu_name": p.gpus[0].name if p.gpus else None,
        "gpu_count": len(p.gpus),
        "driver": p.driver,
        "nvml": p.nvml,
        "versions": p.versions,
        # The package's own: also right where zerobench runs from a copy of the tree, not installed.
        "zerobench_version": _zerobench_version(),
        "source_sha256": source_sha(),
        "git_commit": _git(root, "rev-parse", "HEAD") if root else None,
        "git_dirty": (bool(status) if status is not None else None) if root else None,
    }
