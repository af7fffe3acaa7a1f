"""The per-machine cache: what a run builds once and the next run on the same machine reuses.

Two things are kept, under `root()` ($ZEROBENCH_CACHE, else $XDG_CACHE_HOME/zerobench, else
~/.cache/zerobench; delete the folder to clear it):
- ops/<key>.json: which DeepSpeed JIT ops were built, for which stack (`ops_key`: DeepSpeed, torch and its
  CUDA, Python (its real executable and prefix), ninja's version, accelerator, GPUs, TORCH_CUDA_ARCH_LIST,
  CUDA_HOME, the extensions folder, the compiler, the CPU's flags, DeepSpeed's op sources by content and the
  folders DeepSpeed and torch are installed in), each op's shared libraries by path, size and content hash,
  and the build file torch wrote in each of its folders. An op checks out only when torch's next load of it
  will compile nothing: its build file is the one recorded (torch writes the install folders into it, so
  another venv's load rewrites it and recompiles everything) and `ninja -n` finds nothing to do there (a
  reinstall gives the sources newer times). A run whose ops all check out skips the prebuild helper (an
  interpreter importing torch and DeepSpeed: 25-60 s); any other run compiles in that helper, never inside a
  cell.
- checkpoints/<preset>-<precision>-<key>/: the random-weight checkpoint QLoRA cells quantize from,
  keyed by the preset's shape, precision, seed and library versions, with a manifest of its files
  written last, so its presence is checked here without a helper process.
- probe/<key>.json: the machine's rates as `zerobench probe` measured them (bench.execute.probe), keyed by the
  machine (its boot and GPUs, bench.records.record.machine_of) and the libraries timed; the matmuls per shape.
Anything that does not check out (another stack, a missing or rebuilt library, a build lock left
behind, an unreadable record, a manifest that disagrees with the files) is built again: a cache entry
is only ever a reason to skip work, never a reason to fail.

Imports no torch: versions are read from the installed distributions.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ..host.env import version
from ..matrix.presets import PRESETS

__all__ = [
    "CHECKPOINT_MANIFEST",
    "CHECKPOINT_SEED",
    "root",
    "ops_key",
    "ops_path",
    "ops_missing",
    "tree_digest",
    "record_ops",
    "checkpoint_key",
    "checkpoint_dir",
    "checkpoint_problem",
    "write_checkpoint_manifest",
    "deepspeed_prebuilt",
    "probe_read",
    "probe_write",
]

# torch's default seed: what the checkpoint helper's unseeded build always used, so the weights of
# checkpoints built before this cache are made again bit for bit.
CHECKPOINT_SEED = 67280421310721
CHECKPOINT_MANIFEST = "zerobench-checkpoint.json"


def root(environ: Mapping[str, str] | None = None) -> Path:
    e = os.environ if environ is None else environ
    if e.get("ZEROBENCH_CACHE"):
        return Path(e["ZEROBENCH_CACHE"])
    return Path(e.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zerobench"


def _torch_cuda() -> str | None:
    """torch's CUDA version (torch.version.cuda), read from its file: importing torch takes seconds."""
    try:
        text = md.distribution("torch").locate_file("torch/version.py").read_text()
    except (md.PackageNotFoundError, OSError):
        return None
    m = re.search(r"^cuda\b[^=\n]*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else None


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _read_json(path: Path) -> dict | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _write_json(path: Path, data: dict) -> None:
    """Whole or not at all: two runs may write the same entry at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


# -- DeepSpeed ops ----------------------------------------------------------------------------------


def ops_key(environ: Mapping[str, str], *, cuda: bool, gpus: list[str] | None = None) -> dict:
    """What a built op depends on, in the environment its builder runs in (the helper's and the cells')."""
    ext = environ.get("TORCH_EXTENSIONS_DIR")
    return {
        "deepspeed": version("deepspeed"),
        "torch": version("torch"),
        "torch_cuda": _torch_cuda(),
        "python": platform.python_version(),
        # The interpreter and its environment, by what they are (not by PATH or how zerobench was started): a
        # venv run activated or not is one stack; another venv is another.
        "python_executable": os.path.realpath(sys.executable),
        "python_prefix": os.path.realpath(sys.prefix),
        # The ninja torch's build runs (the environment's own first, bench.execute.launch.ports): its build log is
        # read by that ninja only (another version sees every command line changed).
        "ninja": _ninja_version(shutil.which("ninja", path=environ.get("PATH"))),
        "machine": platform.machine(),
        "accelerator": "cuda" if cuda else "cpu",
        "gpus": sorted(set(gpus or [])) if cuda else [],
        "TORCH_CUDA_ARCH_LIST": environ.get("TORCH_CUDA_ARCH_LIST"),
        "CUDA_HOME": environ.get("CUDA_HOME") or environ.get("CUDA_PATH"),
        "DS_ACCELERATOR": environ.get("DS_ACCELERATOR"),
        # What the op's objects are compiled from and for: DeepSpeed builds with -march=native, so the CPU's
        # flags; the compiler; the op sources by content (another venv's copy of them is the same op).
        "compiler": _compiler(environ.get("CXX") or "c++"),
        "cpu_flags": _cpu_flags(),
        "op_sources": _deepspeed_sources(),
        # torch writes where both are installed into the op's build file (-I, the sources): another venv's
        # build of the same sources rewrites it, and ninja then compiles every object again.
        "deepspeed_dir": _package_dir("deepspeed"),
        "torch_dir": _package_dir("torch"),
        # torch's default folder already depends on its version and CUDA, both in the key.
        "TORCH_EXTENSIONS_DIR": str(Path(ext).resolve()) if ext else None,
    }


@functools.cache
def _compiler(cxx: str) -> str | None:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0].strip() if out else None


@functools.cache
def _ninja_version(exe: str | None) -> str | None:
    if exe is None:
        return None
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


@functools.cache
def _cpu_flags() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    m = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M)
    return hashlib.sha256(" ".join(sorted(m.group(1).split())).encode()).hexdigest()[:16] if m else None


@functools.cache
def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)  # finds the package without importing it (and torch)
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(next(iter(spec.submodule_search_locations))).resolve())


@functools.cache
def _deepspeed_sources() -> str | None:
    d = _package_dir("deepspeed")
    return tree_digest(Path(d) / "ops" / "csrc") if d else None


def tree_digest(folder: Path) -> str | None:
    """The files under folder by relative path and content: the same wherever the tree is installed."""
    if not folder.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f.relative_to(folder).as_posix().encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def ops_path(key: dict, environ: Mapping[str, str] | None = None) -> Path:
    return root(environ) / "ops" / f"{_digest(key)}.json"


def _lib_state(path: str) -> list | None:
    """Size and content hash: a library copied or touched (another venv's load, a restore) is the same
    library; one rebuilt or cut short is not."""
    try:
        with open(path, "rb") as f:
            return [os.fstat(f.fileno()).st_size, hashlib.file_digest(f, "sha256").hexdigest()[:16]]
    except OSError:
        return None


def _build_file(folder: str) -> str | None:
    """The digest of the build file torch wrote in an op's folder (None: there is none)."""
    try:
        return hashlib.sha256(Path(folder, "build.ninja").read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def _ninja_work(folder: str, environ: Mapping[str, str]) -> str | None:
    """Why ninja would compile something in folder, as torch's next load of the op runs it (None: nothing
    to do)."""
    exe = shutil.which("ninja", path=environ.get("PATH"))
    if exe is None:
        return "ninja is not on PATH"
    try:
        r = subprocess.run([exe, "-n", "-d", "explain", "-C", folder], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"`ninja -n` in {folder} failed: {e}"
    if r.returncode != 0:
        return f"`ninja -n` in {folder} failed: {(r.stderr or r.stdout).strip()[-200:]}"
    if "no work to do" in r.stdout:
        return None
    why = next((ln for ln in r.stderr.splitlines() if ln.startswith("ninja explain:")), "")
    return f"ninja would compile in {folder}" + (f" ({why.removeprefix('ninja explain: ')})" if why else "")


def _op_problem(entry, environ: Mapping[str, str]) -> str | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("libs"), dict):
        return "no usable entry"
    if entry.get("unavailable"):
        return None  # the accelerator has no such op: nothing to build, the cells say so
    if not entry["libs"]:
        return "no library recorded"
    for lib, state in entry["libs"].items():
        now = _lib_state(lib)
        if now is None:
            return f"{lib} is gone"
        if now != state:
            return f"{lib} changed since it was recorded"
    d = entry.get("dir")
    if d and os.path.exists(os.path.join(d, "lock")):
        return f"a build lock is left in {d}"
    builds = entry.get("build_files")
    if not isinstance(builds, dict) or not builds:
        return "no build file recorded"
    for folder, digest in builds.items():
        if _build_file(folder) != digest:
            return f"{folder}/build.ninja was rewritten since it was recorded (another environment's build)"
    for folder in builds:
        if why := _ninja_work(folder, environ):
            return why
    return None


def ops_missing(key: dict, builders: list[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The builders whose ops are not known built for this key, each with why (empty: all cached)."""
    environ = os.environ if environ is None else environ
    path = ops_path(key, environ)
    if not path.exists():
        return {b: "not in the cache" for b in builders}
    data = _read_json(path)
    if data is None or not isinstance(data.get("ops"), dict):
        return {b: f"unreadable cache record {path}" for b in builders}
    if data.get("key") != key:
        return {b: f"cache record {path} is for another stack" for b in builders}
    out = {}
    for b in builders:
        why = _op_problem(data["ops"].get(b), environ)
        if why:
            out[b] = why
    return out


def deepspeed_prebuilt(op: str) -> bool:
    """DeepSpeed was installed with this op (e.g. cpu_adam) compiled in (DS_BUILD_*=1): its load imports it and
    compiles nothing. Read from the installed package's file, without importing DeepSpeed."""
    import ast

    try:
        spec = importlib.util.find_spec("deepspeed")
        folder = Path(next(iter(spec.submodule_search_locations or ()))) if spec else None
        text = (folder / "git_version_info_installed.py").read_text() if folder else ""
        m = re.search(r"^installed_ops\s*=\s*(\{.*\})\s*$", text, re.M)
        return bool(m and ast.literal_eval(m.group(1)).get(op))
    except (ImportError, OSError, ValueError, SyntaxError, StopIteration):
        return False


def record_ops(key: dict, report: Mapping[str, dict], environ: Mapping[str, str] | None = None) -> None:
    """Record the ops a prebuild left ready (its report: builder -> {ok, unavailable, dir, dirs, libs, s}),
    with each library's size and content and each folder's build file as they are now (dirs: every op
    folder the builder's load used, its own and those it loads first). Failed builds are not recorded."""
    path = ops_path(key, environ)
    data = _read_json(path)
    ops = data["ops"] if data and data.get("key") == key and isinstance(data.get("ops"), dict) else {}
    for b, r in report.items():
        if not r.get("ok"):
            ops.pop(b, None)
            continue
        libs = {lib: s for lib in r.get("libs") or [] if (s := _lib_state(lib)) is not None}
        folders = r.get("dirs") or ([r["dir"]] if r.get("dir") else [])
        ops[b] = {
            "dir": r.get("dir"),
            "libs": libs,
            "build_files": {d: _build_file(d) for d in folders},
            "unavailable": bool(r.get("unavailable")),
            "s": r.get("s"),
        }
    _write_json(path, {"key": key, "ops": ops})


# -- QLoRA source checkpoints -----------------------------------------------------------------------


def checkpoint_key(preset: str, precision: str) -> dict:
    return {
        "preset": preset,
        "shape": PRESETS[preset],
        "precision": precision,
        "seed": CHECKPOINT_SEED,
        "torch": version("torch"),
        "transformers": version("transformers"),
        "safetensors": version("safetensors"),
    }


def checkpoint_dir(preset: str, precision: str, environ: Mapping[str, str] | None = None) -> Path:
    return root(environ) / "checkpoints" / f"{preset}-{precision}-{_digest(checkpoint_key(preset, precision))}"


def write_checkpoint_manifest(folder: Path, key: dict) -> None:
    """Written last into a finished checkpoint: its key and every file's size."""
    files = {f.name: f.stat().st_size for f in sorted(Path(folder).iterdir()) if f.name != CHECKPOINT_MANIFEST}
    (Path(folder) / CHECKPOINT_MANIFEST).write_text(json.dumps({"key": key, "files": files}, indent=1, sort_keys=True))


def checkpoint_problem(folder: Path, key: dict) -> str | None:
    """Why the checkpoint in folder cannot be used as it is (None: it can)."""
    m = _read_json(Path(folder) / CHECKPOINT_MANIFEST)
    if m is None:
        return "no readable manifest" if Path(folder).exists() else "not in the cache"
    if m.get("key") != key:
        return "built for another key"
    files = m.get("files")
    if not isinstance(files, dict) or "config.json" not in files:
        return "its manifest lists no config.json"
    for name, size in files.items():
        try:
            if (Path(folder) / name).stat().st_size != size:
                return f"{name} has changed size"
        except OSError:
            return f"{name} is missing"
    return None


# -- the machine's probed rates -------------------------------------------------------------------


def _probe_path(key: dict, environ: Mapping[str, str] | None = None) -> Path:
    return root(environ) / "probe" / f"{_digest(key)}.json"


def probe_read(key: dict, environ: Mapping[str, str] | None = None) -> dict | None:
    """The figures probes with this key left (bench.execute.probe's entry), or None: never probed, or an entry
    that does not check out."""
    data = _read_json(_probe_path(key, environ))
    if data is None or data.get("key") != key or not isinstance(data.get("figures"), dict):
        return None
    return data["figures"]


def probe_write(key: dict, figures: Mapping, environ: Mapping[str, str] | None = None) -> Path:
    path = _probe_path(key, environ)
    _write_json(path, {"key": key, "figures": dict(figures)})
    return path
