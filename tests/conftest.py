"""Tests split by hardware, honestly.

- `gpu`-marked tests need CUDA: they skip without it (a skip is never evidence; run them on the GPU host).
- Every other test runs with CUDA hidden (CUDA_VISIBLE_DEVICES=""), inherited by the workers it
  starts, so an unmarked test cannot quietly use a GPU: on a GPU host it would fail instead.
- Ctrl-C reaches the processes the tests start: a suite started in the background of a shell without job
  control (`bash .ci/run &`) inherits SIGINT ignored, and so would every `zerobench` a test then stops with
  SIGINT (it would run on and exit 0). A handler, unlike "ignored", is not inherited past exec.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


GRIDS = {
    "1b": ["results/1b.jsonl", "results/1b-rerun.jsonl", "results/1b-paramoffload.jsonl"],
    "1b-axes": ["results/1b-axes.jsonl", "results/1b-axes-2.jsonl"],
    "peft-axes-h200": ["results/peft-axes-h200.jsonl"],
    "compare-h200": ["results/compare-h200-a1.jsonl", "results/compare-h200-a2.jsonl", "results/compare-h200-a3.jsonl"],
}
"""Committed H200 grids answer mode is replayed over: matrix name -> its record files."""


def full_search(matrix_path: str, files: list[str], settings):
    """The answer a recorded grid gives: an answer-mode search (bench.execute.answer.Search) that has observed every
    recorded end."""
    from bench.execute import answer
    from bench.execute.executors.replay import Recording
    from bench.execute.plan import hardware, plan
    from bench.records.record import parse

    rec = Recording(files)
    p = rec.restrict(plan(matrix_path, platform=rec.platform()))
    hw = hardware(rec.platform())
    full = answer.Search([it for it in p.items if it.skip is None], hw, settings, cuda=True)
    for ends in rec.ends.values():
        for r, _ in ends:
            full.observe(parse(r))
    return full


def led_search(matrix_path: str, files: list[str], settings):
    """An answer-mode search over a recorded grid (a replay: each cell measured at most as often as recorded) that has
    observed one recorded end per group, its first recorded cell's: each group has a leader, the rest is open."""
    from bench.execute import answer
    from bench.execute.executors.replay import Recording
    from bench.execute.plan import hardware, plan
    from bench.records.record import parse

    rec = Recording(files)
    items = [it for it in rec.restrict(plan(matrix_path, platform=rec.platform())).items if it.skip is None]
    ends = {h: [r for r, _ in e] for h, e in rec.ends.items()}
    s = answer.Search(items, hardware(rec.platform()), settings, cuda=True, ends=ends)
    for g in s.groups():
        c = next(c for c in s.candidates if c.group == g and c.cell.hash in ends)
        s.observe(parse(ends[c.cell.hash][0]))
    return s


def as_written(path, **kw) -> list[dict]:
    """A results file's records as their JSON lines say them (bench.records.record.Record.to_dict): for tests that
    check what is written. kw: bench.records.store.read's."""
    from bench.records.store import read

    return [r.to_dict() for r in read(path, **kw)]


@functools.cache
def cuda_available() -> bool:
    # In a subprocess: importing torch here would slow every test session and hold a CUDA context.
    r = subprocess.run(
        [sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"], capture_output=True
    )
    return r.returncode == 0


LONG_FIRST = (
    "test_ray.py",
    "test_e2e_cpu.py",
    "test_nvme.py",
    "test_answer_sim.py",
    "test_ranks.py",
    "test_slurm_executor.py",
    "test_autotuner_baseline.py",
    "test_slurm_cluster.py",
    "test_trainer_configs.py",
)
"""Modules whose tests take minutes (the slowest in CI's --durations: their cells, a cluster, an op's compile),
collected first: pytest-xdist hands out files in collection order, one per worker, and a long file started last
leaves the other worker idle at the end."""


def _long_first(item) -> int:
    name = item.path.name
    return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_long_first)  # stable: every module's tests stay together and in order
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if gpu_items and not cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run `nox -s gpu_tests` on the GPU host)")
        for it in gpu_items:
            it.add_marker(skip)


@pytest.fixture(autouse=True)
def _cuda_guard(request, monkeypatch):
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        monkeypatch.setenv("ZEROBENCH_NO_GPU", "1")
    yield


def zerobench(*args: str, cwd: Path, env: dict | None = None, timeout: float = 1200) -> subprocess.CompletedProcess:
    """Run the CLI as a user would, in a fresh process."""
    e = {**os.environ, **(env or {})}
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout
    )


def copy_built_ops(dest: Path) -> bool:
    """Copy the DeepSpeed ops this machine has built to `dest`, a test's own extensions folder (the test's runs
    get TORCH_EXTENSIONS_DIR=dest): they load them instead of compiling (a minute or more each), and a lock or a
    partial build the test leaves stays in its copy. False when there is no folder to copy."""
    from bench.worker.ops import build_dir

    src = build_dir("")  # the folder torch builds and loads every op in, as the worker finds it
    if not src.is_dir():
        return False
    shutil.copytree(src, dest, symlinks=True)  # copy2: the mtimes ninja compares stay, so nothing rebuilds
    return True


def write_matrix(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


TINY = """\
model: llama-tiny
seq_len: 32
batch: {micro: 2, grad_accum: 1}
steps: {warmup: 1, measured: 4}
lr: 3.0e-3
timeout_s: 600
"""

# The multi-node comparison every executor's path passes: ZeRO-3 over 2 nodes x 1 rank and over 1 node x 2 ranks is
# the same training. fp32: a two-rank bf16 ZeRO-3 CPU cell once ended in a NaN loss (tests/worker/test_multirank.py).
ZERO3 = TINY + "axes: {zero_stage: [3], precision: [fp32]}\n"


def agree_across_nodes(across: dict, within: dict) -> None:
    """The records of ZERO3 as 2 nodes x 1 rank (across) and as 1 node x 2 ranks (within): both ok, the same
    losses, and across names each node with its rank."""
    assert across["status"] == within["status"] == "ok", (across["reason"], within["reason"])
    assert across["losses"] == pytest.approx(within["losses"], rel=1e-5)
    assert across["world_size"] == 2 and across["cell_name"].endswith("nodes=2")
    assert [(r["rank"], r["node"]) for r in across["ranks"]] == [(0, 0), (1, 1)]
    assert [(n["node"], n["ranks"], n["exit_code"]) for n in across["nodes"]] == [(0, [0], 0), (1, [1], 0)]
    assert "nodes" not in within and all("node" not in r for r in within["ranks"])


EXECUTOR_CELLS = (
    r"^zero=(0,offload=none,prec=(bf16|fp16),gc=off,opt=adamw,peft=(none|lora-r8)"
    r"|2,offload=optimizer|3,offload=optimizer\+params),"
)
"""The smoke matrix's cells another executor (Ray, Slurm) runs as `local` does (one --filter): a ZeRO-0 cell, its
LoRA twin, ZeRO-2 offloading the optimizer and ZeRO-3 offloading optimizer and parameters (their steps in the CPU
Adam op, loaded on the node) and an fp16 cell the rules skip. What a cell computes is the same under every
executor, and local runs the whole matrix (tests/cli/test_e2e_cpu.py); an executor's share of a run is starting cells
on its nodes, recording their ends and skipping by the rules."""


def ends_as_planned(matrix: Path, ends: list[dict], only: str | None = None) -> list[dict]:
    """The ends of a run of `matrix` (its cells the filter `only` keeps) through another executor, as `local` ends
    it: the same cells skipped by the same rules, every other one ok (local's ends of the whole matrix:
    tests/cli/test_e2e_cpu.py; running it again would prove that twice). The ok records."""
    from bench.execute.plan import host_platform, plan

    planned = plan(str(matrix), [only] if only else None, platform=host_platform(None))
    expected = {it.cell.hash: ("skipped", it.skip.rule) if it.skip else ("ok", None) for it in planned.items}
    got = {x["cell_hash"]: (x["status"], (x.get("skip") or {}).get("rule")) for x in ends}
    assert got == expected, [(x["cell_name"], x["reason"]) for x in ends if x["status"] not in ("ok", "skipped")]
    assert len(ends) == len(got)  # one end per cell: nothing ran twice
    return [x for x in ends if x["status"] == "ok"]


def blamed_on_the_second_node(rec: dict) -> dict:
    """The record of a 2 nodes x 1 rank cell whose rank 1 SIGKILLed itself at step 2 (ZEROBENCH_FAULT sigkill@2#1):
    killed, blamed on rank 1 on node 1 and its host; that node ended by itself. Its nodes, by node."""
    assert rec["status"] == "killed", rec["reason"]
    assert rec["reason"].startswith(f"rank 1 on node 1 ({socket.gethostname()}): killed by signal 9"), rec["reason"]
    nodes = {n["node"]: n for n in rec["nodes"]}
    assert nodes[1]["exit_code"] != 0 and nodes[1]["ranks"] == [1]
    assert nodes[1]["stopped"] is None  # it ended by itself; zerobench stopped nothing there
    return nodes


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real Slurm cluster of two nodes on this machine (tests/slurm_cluster.py), for the whole session;
    stopped, with its jobs and folder, when the session ends however it ends."""
    from tests import slurm_cluster as sc

    why = sc.missing()
    if why:
        pytest.skip(why)
    cluster = sc.start()
    try:
        yield cluster
    finally:
        cluster.stop()
