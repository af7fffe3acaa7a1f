"""The per-machine cache (bench.records.cache): what it vouches for is checked against real files, and whatever
does not check out is built again. The slow test runs `zerobench run` twice on one machine."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.execute import RunSettings, prepare, progress, run
from bench.execute.launch.ports import own_tools_first
from bench.host import env
from bench.matrix.cells import Cell
from bench.records import cache
from tests.conftest import TINY, copy_built_ops, write_matrix, zerobench

ENV = {"TORCH_EXTENSIONS_DIR": "/somewhere/ext", "TORCH_CUDA_ARCH_LIST": "9.0"}


# PATH as every helper and cell gets it (the interpreter's own bin folder first), and the ninja it finds: the one
# torch's op builds run, so the one that builds the tests' ops.
PATH = own_tools_first(os.environ.get("PATH"))
NINJA = shutil.which("ninja", path=PATH)


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROBENCH_CACHE", str(tmp_path / "cache"))
    return {**ENV, "ZEROBENCH_CACHE": str(tmp_path / "cache"), "PATH": PATH}


def test_root_is_overridable_and_follows_xdg(tmp_path):
    assert cache.root({"ZEROBENCH_CACHE": str(tmp_path), "XDG_CACHE_HOME": "/x"}) == tmp_path
    assert cache.root({"XDG_CACHE_HOME": "/x"}) == cache.root({"XDG_CACHE_HOME": "/x"}) and str(
        cache.root({"XDG_CACHE_HOME": "/x"})
    ) == os.path.join("/x", "zerobench")


def test_ops_key_names_the_stack_and_the_build_environment():
    k = cache.ops_key(ENV, cuda=True, gpus=["NVIDIA H200"])
    assert k["deepspeed"] == env.version("deepspeed") and k["torch"] == env.version("torch")
    assert k["TORCH_EXTENSIONS_DIR"] == os.path.realpath("/somewhere/ext") and k["gpus"] == ["NVIDIA H200"]
    for change in ({"TORCH_EXTENSIONS_DIR": "/elsewhere"}, {"TORCH_CUDA_ARCH_LIST": "8.0"}, {"CUDA_HOME": "/cuda"}):
        assert cache.ops_key({**ENV, **change}, cuda=True, gpus=["NVIDIA H200"]) != k, change
    assert cache.ops_key(ENV, cuda=False) != k
    assert cache.ops_path(k, {"ZEROBENCH_CACHE": "/c"}) != cache.ops_path(cache.ops_key(ENV, cuda=False))


def test_torch_cuda_version_is_read_without_importing_torch():
    r = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.version.cuda)"], capture_output=True, text=True, check=True
    )
    assert str(cache._torch_cuda()) == r.stdout.strip()


def _libs(tmp_path, op="cpu_adam"):
    """An op's folder as torch's JIT leaves it: a build file, and the library ninja made from a source."""
    d = tmp_path / "ext" / op
    d.mkdir(parents=True)
    src = tmp_path / f"{op}.cpp"
    src.write_text("// the op's source\n")
    (d / "build.ninja").write_text(f"rule link\n  command = cp $in $out\nbuild {op}.so: link {src}\n")
    subprocess.run([NINJA, "-C", str(d)], check=True, capture_output=True)
    return d


def _report(d, ok=True, dirs=None):
    dirs = dirs or [d]
    libs = [str(p) for x in dirs for p in x.glob("*.so")]
    return {"ok": ok, "built": True, "dir": str(d), "dirs": [str(x) for x in dirs], "libs": libs, "s": 1.0}


def test_recorded_ops_are_cached_until_their_library_changes(tmp_path, cache_env):
    key = cache.ops_key(cache_env, cuda=False)
    d = _libs(tmp_path)
    assert cache.ops_missing(key, ["CPUAdamBuilder"], cache_env) == {"CPUAdamBuilder": "not in the cache"}
    cache.record_ops(key, {"CPUAdamBuilder": _report(d)}, cache_env)
    assert cache.ops_missing(key, ["CPUAdamBuilder"], cache_env) == {}
    # Another op of the same stack is still missing; another stack has none.
    assert list(cache.ops_missing(key, ["CPUAdamBuilder", "FusedAdamBuilder"], cache_env)) == ["FusedAdamBuilder"]
    other = cache.ops_key({**cache_env, "TORCH_EXTENSIONS_DIR": str(tmp_path / "x")}, cuda=False)
    assert "CPUAdamBuilder" in cache.ops_missing(other, ["CPUAdamBuilder"], cache_env)

    so = d / "cpu_adam.so"
    so.write_bytes(so.read_bytes() + b"x")  # rebuilt by someone else, or truncated
    assert "changed" in cache.ops_missing(key, ["CPUAdamBuilder"], cache_env)["CPUAdamBuilder"]
    cache.record_ops(key, {"CPUAdamBuilder": _report(d)}, cache_env)
    assert cache.ops_missing(key, ["CPUAdamBuilder"], cache_env) == {}
    (d / "lock").write_text("")  # a build that died left torch's lock: the prebuild clears it
    assert "lock" in cache.ops_missing(key, ["CPUAdamBuilder"], cache_env)["CPUAdamBuilder"]
    (d / "lock").unlink()
    so.unlink()
    assert "gone" in cache.ops_missing(key, ["CPUAdamBuilder"], cache_env)["CPUAdamBuilder"]


def test_an_op_torch_would_compile_again_is_not_cached(tmp_path, cache_env):
    """Cached means torch's next load compiles nothing. It runs ninja on the build file it writes, with the
    install folders in it: another venv's build rewrites that file (and recompiles), and a reinstall gives the
    sources newer times. Either way the prebuild helper must pay the compile, not a cell (a compile in a cell's
    setup can outlast the cell's time limit)."""
    key = cache.ops_key(cache_env, cuda=False)
    pin, aio = _libs(tmp_path, "pin_memory"), _libs(tmp_path, "async_io")
    cache.record_ops(key, {"AsyncIOBuilder": _report(aio, dirs=[pin, aio])}, cache_env)
    assert cache.ops_missing(key, ["AsyncIOBuilder"], cache_env) == {}

    build = pin / "build.ninja"  # the op it loads first, rewritten by another environment's load
    text = build.read_text()
    build.write_text(text.replace("cp $in $out", "cp -f $in $out"))
    subprocess.run([NINJA, "-C", str(pin)], check=True, capture_output=True)
    why = cache.ops_missing(key, ["AsyncIOBuilder"], cache_env)["AsyncIOBuilder"]
    assert why == f"{pin}/build.ninja was rewritten since it was recorded (another environment's build)"
    build.write_text(text)
    subprocess.run([NINJA, "-C", str(pin)], check=True, capture_output=True)
    assert cache.ops_missing(key, ["AsyncIOBuilder"], cache_env) == {}

    src = tmp_path / "async_io.cpp"  # reinstalled: the same source, a newer time
    os.utime(src, (src.stat().st_atime, (aio / "async_io.so").stat().st_mtime + 60))
    why = cache.ops_missing(key, ["AsyncIOBuilder"], cache_env)["AsyncIOBuilder"]
    assert why.startswith(f"ninja would compile in {aio} (") and "async_io.so" in why, why
    no_ninja = {**cache_env, "PATH": str(tmp_path / "empty")}
    assert cache.ops_missing(key, ["AsyncIOBuilder"], no_ninja) == {"AsyncIOBuilder": "ninja is not on PATH"}
    old = cache.ops_path(key, cache_env)  # a record made before build files were recorded
    data = json.loads(old.read_text())
    del data["ops"]["AsyncIOBuilder"]["build_files"]
    old.write_text(json.dumps(data))
    assert cache.ops_missing(key, ["AsyncIOBuilder"], cache_env) == {"AsyncIOBuilder": "no build file recorded"}


def test_a_failed_or_corrupt_entry_means_building(tmp_path, cache_env):
    key = cache.ops_key(cache_env, cuda=False)
    d = _libs(tmp_path)
    cache.record_ops(key, {"CPUAdamBuilder": _report(d), "AsyncIOBuilder": {"ok": False}}, cache_env)
    assert list(cache.ops_missing(key, ["CPUAdamBuilder", "AsyncIOBuilder"], cache_env)) == ["AsyncIOBuilder"]
    cache.record_ops(key, {"CPUAdamBuilder": {"ok": False}}, cache_env)  # a later failure forgets it
    assert "CPUAdamBuilder" in cache.ops_missing(key, ["CPUAdamBuilder"], cache_env)
    cache.record_ops(key, {"CPUAdamBuilder": _report(d)}, cache_env)
    path = cache.ops_path(key, cache_env)
    path.write_text(path.read_text()[:40])  # cut short
    assert "unreadable" in cache.ops_missing(key, ["CPUAdamBuilder"], cache_env)["CPUAdamBuilder"]
    data = {"key": {**key, "torch": "0.0"}, "ops": {"CPUAdamBuilder": {"libs": {}}}}
    path.write_text(json.dumps(data))  # another stack's record under this name
    assert "another stack" in cache.ops_missing(key, ["CPUAdamBuilder"], cache_env)["CPUAdamBuilder"]
    cache.record_ops(key, {"FusedLambBuilder": {"ok": True, "unavailable": True, "libs": []}}, cache_env)
    assert cache.ops_missing(key, ["FusedLambBuilder"], cache_env) == {}  # nothing to build on this accelerator


def test_checkpoint_is_keyed_and_checked_against_its_manifest(tmp_path, cache_env):
    key = cache.checkpoint_key("llama-tiny", "bf16")
    d = cache.checkpoint_dir("llama-tiny", "bf16", cache_env)
    assert d.parent == tmp_path / "cache" / "checkpoints" and d.name.startswith("llama-tiny-bf16-")
    assert d != cache.checkpoint_dir("llama-tiny", "fp32", cache_env)
    assert d != cache.checkpoint_dir("llama-small", "bf16", cache_env)
    assert cache.checkpoint_problem(d, key) == "not in the cache"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"w" * 64)
    assert cache.checkpoint_problem(d, key) == "no readable manifest"  # an old or half-made folder
    cache.write_checkpoint_manifest(d, key)
    assert cache.checkpoint_problem(d, key) is None
    assert cache.checkpoint_problem(d, {**key, "transformers": "0.0"}) == "built for another key"
    (d / "model.safetensors").write_bytes(b"w" * 10)
    assert "changed size" in cache.checkpoint_problem(d, key)
    (d / "model.safetensors").unlink()
    assert "missing" in cache.checkpoint_problem(d, key)
    (d / cache.CHECKPOINT_MANIFEST).write_text("{")
    assert cache.checkpoint_problem(d, key) == "no readable manifest"


def test_prebuild_is_skipped_when_the_cache_vouches_for_every_op(tmp_path, cache_env, monkeypatch):
    """No helper process at all: the ops' libraries were recorded for this stack and are still there."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    platform = env.probe()
    items = [prepare.Planned(Cell(zero_stage=2, offload="optimizer", optimizer="cpuadam"), None, {})]
    ops = prepare._needed_ops(items, platform)
    assert ops == ["CPUAdamBuilder", "ShareMemCommBuilder"]
    tool_env = prepare._tool_env(None, None)
    key = cache.ops_key(tool_env, cuda=platform.cuda, gpus=[g.name for g in platform.gpus])
    cache.record_ops(key, {"CPUAdamBuilder": _report(_libs(tmp_path)), "ShareMemCommBuilder": _report(
        _libs(tmp_path, "deepspeed_shm_comm"))}, tool_env)  # fmt: skip
    lines: list[str] = []
    costs = prepare._prebuild(items, tmp_path / "logs", None, platform, lines.append)
    assert costs == {"ops": {"CPUAdamBuilder": "cached", "ShareMemCommBuilder": "cached"}}
    assert lines == [] and not (tmp_path / "logs").exists()


def test_nothing_is_prepared_for_cells_predicted_not_to_fit(tmp_path, monkeypatch):
    """Every cell pruned by the memory model: no op is built (a fresh extensions folder and cache would
    otherwise take minutes), no fork server is started."""
    monkeypatch.setenv("ZEROBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    m = write_matrix(
        tmp_path / "m.yaml",
        "name: pruned\nmodel: llama-tiny\nseq_len: 64\nsteps: {warmup: 1, measured: 2}\n"
        "axes: {zero_stage: [2], offload: [optimizer], optimizer: [cpuadam], micro_batch: [256]}\n",
    )
    lines: list[str] = []
    s = RunSettings(matrix=str(m), results=str(tmp_path / "r.jsonl"), progress=False, gpu_mem=2 * 2**30)
    _, path, written = run(s, printer=lines.append)
    assert [r.status.value for r in written] == ["skipped"] and written[0].skip.rule == "predicted-oom"
    assert not any("building" in line or "fixed costs" in line for line in lines), lines
    assert not (tmp_path / "ext").exists() and not (tmp_path / "logs").exists()


def test_a_pruned_cell_is_recorded_once_whatever_the_repeats(tmp_path, monkeypatch):
    """With repeats, a pruned cell is one record (as a rule's skip is), and --resume writes no more."""
    monkeypatch.setenv("ZEROBENCH_CACHE", str(tmp_path / "cache"))
    m = write_matrix(
        tmp_path / "m.yaml",
        "name: pruned\nmodel: llama-tiny\nseq_len: 64\nsteps: {warmup: 1, measured: 2}\nrepeats: 3\n"
        "axes: {zero_stage: [2], offload: [optimizer], optimizer: [cpuadam], micro_batch: [256]}\n",
    )
    s = RunSettings(matrix=str(m), results=str(tmp_path / "r.jsonl"), progress=False, gpu_mem=2 * 2**30)
    run(s, printer=lambda _: None)
    run(dataclasses.replace(s, resume=True), printer=lambda _: None)
    recs = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [(r["status"], r.get("repeat", 1)) for r in recs] == [("skipped", 1)], recs


def test_costs_line_says_what_was_paid():
    line = progress.costs_line(
        {
            "ops": {"CPUAdamBuilder": "cached", "FusedAdamBuilder": "built"},
            "ops_s": 41.2,
            "checkpoints": {"llama-7b bf16": "cached"},
            "forkserver_import_s": 12.34,
            "setup_s": 41.9,
        }
    )
    assert line == (
        "fixed costs: ops: cached CPUAdamBuilder; built FusedAdamBuilder in 41 s; checkpoint llama-7b bf16: "
        "cached; fork server import 12.3 s (in the background); setup 41.9 s in all"
    )


CPUADAM = TINY + "name: fixedcost\naxes: {zero_stage: [2], offload: [optimizer], optimizer: [cpuadam]}\n"


@pytest.mark.slow
@pytest.mark.copies_ops  # a build beside its copy would leave a partial copy; its bar is CPU seconds, not wall
def test_second_run_on_the_machine_pays_no_prebuild(tmp_path):
    """Two `zerobench run`s in one extensions folder and cache: the first runs the prebuild helper (which
    finds the ops built, where the machine has them, or builds them), the second does not start it and
    spends less on its setup; a corrupted cache record brings the helper back."""
    ext = tmp_path / "ext"
    copy_built_ops(ext)  # the machine's built ops (CI builds these first) spare this test the compile
    e = {"TORCH_EXTENSIONS_DIR": str(ext), "ZEROBENCH_CACHE": str(tmp_path / "cache")}
    write_matrix(tmp_path / "m.yaml", CPUADAM)

    def go(n: int):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = zerobench("run", "m.yaml", "--results", f"r{n}.jsonl", "--no-report", "--no-progress", cwd=tmp_path, env=e)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        recs = [json.loads(x) for x in (tmp_path / f"r{n}.jsonl").read_text().splitlines()]
        assert [x["status"] for x in recs] == ["started", "ok"], recs[-1].get("reason")
        assert recs[0]["fixed_costs"] == recs[1]["fixed_costs"]
        cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return r.stdout, recs[1]["fixed_costs"], cpu_s

    out1, c1, cpu1 = go(1)
    assert "building DeepSpeed ops once for this machine: CPUAdamBuilder, ShareMemCommBuilder" in out1
    # Built by this run or found built in the copy: either way the helper ran and the cache was empty.
    assert set(c1["ops"]) == {"CPUAdamBuilder", "ShareMemCommBuilder"}, c1
    assert set(c1["ops"].values()) <= {"built", "loaded"}, c1
    assert c1["ops_s"] > 0 and c1["forkserver_import_s"] > 0

    out2, c2, cpu2 = go(2)
    assert "building DeepSpeed ops" not in out2 and "ops_s" not in c2, out2
    assert c2["ops"] == {"CPUAdamBuilder": "cached", "ShareMemCommBuilder": "cached"}
    assert re.search(r"fixed costs: ops: cached CPUAdamBuilder, ShareMemCommBuilder; fork server import", out2)
    # What the second run saves is the helper's interpreter and imports of torch and DeepSpeed (~10 s of
    # CPU here). Its wall time overlaps the fork server's imports, so on a busy 2-core host the setup's
    # wall time is noise; the CPU the run's processes spent is not.
    assert cpu2 < cpu1 - 3, (cpu1, cpu2, c1, c2)

    # A corrupted record: the helper runs again and the record is whole again afterwards.
    (rec,) = (tmp_path / "cache" / "ops").glob("*.json")
    rec.write_text(rec.read_text()[:25])
    out3, c3, _ = go(3)
    assert "unreadable cache record" in out3 and c3["ops"]["CPUAdamBuilder"] in ("loaded", "built")
    assert json.loads(rec.read_text())["ops"]["CPUAdamBuilder"]["libs"]


def test_the_key_is_the_stack_and_where_it_is_installed(tmp_path, cache_env):
    """What decides a built op is its sources by content, versions, compiler and CPU, and the folders
    DeepSpeed and torch are installed in (torch writes them into the op's build file, so another venv's
    load compiles again: that venv has a key of its own). Variables that only name a venv do not count,
    nor does a library's time (same bytes, new mtime: still the one recorded)."""
    import importlib.util

    ds = Path(next(iter(importlib.util.find_spec("deepspeed").submodule_search_locations)))
    torch_dir = Path(next(iter(importlib.util.find_spec("torch").submodule_search_locations)))
    csrc = ds / "ops" / "csrc"
    other = tmp_path / "venv2" / "lib" / "site-packages" / "deepspeed" / "ops" / "csrc"
    shutil.copytree(csrc, other)  # copytree keeps times: set them all anew, as an install would
    for f in other.rglob("*"):
        os.utime(f, (1_000_000_000, 1_000_000_000))
    assert cache.tree_digest(other) == cache.tree_digest(csrc) is not None
    edited = next(p for p in sorted(other.rglob("*.cpp")))
    edited.write_text(edited.read_text() + "\n// edited\n")
    assert cache.tree_digest(other) != cache.tree_digest(csrc)
    venv_a = {**cache_env, "VIRTUAL_ENV": "/venvs/a", "PATH": "/venvs/a/bin:/usr/bin"}
    venv_b = {**cache_env, "VIRTUAL_ENV": "/venvs/b", "PATH": "/venvs/b/bin:/usr/bin"}
    key = cache.ops_key(venv_a, cuda=False)
    assert cache.ops_key(venv_b, cuda=False) == key and key["op_sources"] == cache.tree_digest(csrc)
    assert (key["deepspeed_dir"], key["torch_dir"]) == (str(ds.resolve()), str(torch_dir.resolve()))

    d = _libs(tmp_path)
    cache.record_ops(key, {"CPUAdamBuilder": _report(d)}, cache_env)
    so = d / "cpu_adam.so"
    os.utime(so, (so.stat().st_atime + 3600, so.stat().st_mtime + 3600))
    assert cache.ops_missing(key, ["CPUAdamBuilder"], cache_env) == {}


def test_a_venv_run_unactivated_builds_with_the_venvs_own_ninja(tmp_path, cache_env, monkeypatch):
    """`.venv/bin/zerobench` without activating the venv: PATH finds the system's ninja first. Every helper and
    cell gets the interpreter's own bin folder first, so the ops a run built with the venv's ninja check out
    (another ninja version reads its build log as "command line changed" and compiles every op again), and the
    cache key is the same as an activated run's."""
    from bench.execute import launch

    own = os.path.dirname(sys.executable)
    activated = {**cache_env, "PATH": f"{own}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    unactivated = {**cache_env, "PATH": f"/usr/bin{os.pathsep}/bin"}
    child = launch.child_env(unactivated, port=1, gpus=None)
    assert child["PATH"].split(os.pathsep) == [own, "/usr/bin", "/bin"]
    assert launch.child_env(activated, port=1, gpus=None)["PATH"] == child["PATH"]
    key = cache.ops_key(child, cuda=False)
    assert key == cache.ops_key(launch.child_env(activated, port=1, gpus=None), cuda=False)
    assert key["python_prefix"] == os.path.realpath(sys.prefix)

    venv_ninja, system_ninja = shutil.which("ninja", path=own), shutil.which("ninja", path="/usr/bin:/bin")
    if not (venv_ninja and system_ninja) or cache._ninja_version(venv_ninja) == cache._ninja_version(system_ninja):
        pytest.skip("needs a ninja in the interpreter's bin folder and another version on the system")
    d = _libs(tmp_path)  # built by the interpreter's own ninja
    cache.record_ops(key, {"CPUAdamBuilder": _report(d)}, child)
    assert cache.ops_missing(key, ["CPUAdamBuilder"], child) == {}
    # What the unactivated run's PATH alone would have run: the system's ninja compiles everything again.
    assert "command line changed" in cache.ops_missing(key, ["CPUAdamBuilder"], unactivated)["CPUAdamBuilder"]
