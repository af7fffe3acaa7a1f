"""What a newcomer reaches for first: --version, --filter's help everywhere, planning a GPU run from a
CPU host (run --dry-run --assume-gpus), why a cell is pruned, and problems in the file's order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import bench

ROOT = Path(__file__).resolve().parent.parent


def zb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_version():
    p = zb("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"zerobench {bench.__version__}"


@pytest.mark.parametrize("cmd", ["run", "cells", "selfcheck", "estimate"])
def test_filter_has_help_in_every_subcommand(cmd):
    assert "only cells whose name or id (name#hash) matches" in " ".join(zb(cmd, "--help").stdout.split())


def test_run_dry_run_plans_as_on_assumed_gpus_and_says_which_memory_is_short():
    dry = ("run", "matrices/7b.yaml", "--dry-run", "--verbose", "--filter", "opt=fusedadam", "--gpu-mem", "10GiB")
    here, there = zb(*dry), zb(*dry, "--assume-gpus", "1")
    assert here.returncode == there.returncode == 0, there.stderr
    assert "runnable on a host with 1 CUDA GPU(s)" in there.stdout
    # QLoRA needs CUDA (bitsandbytes): skipped by a rule here, judged by the memory model on the assumed GPU.
    assert "skipped by bnb-needs-cuda" in here.stdout and "skipped by bnb-needs-cuda" not in there.stdout
    assert len(there.stdout.split(" pruned ")) > len(here.stdout.split(" pruned "))
    pruned = [ln for ln in there.stdout.splitlines() if " pruned " in ln]
    assert pruned and all("(GPU short: " in ln or "(host short: " in ln for ln in pruned), pruned[:3]
    assert any("(GPU short: " in ln and " of 10.0 GiB" in ln for ln in pruned)


def test_assume_gpus_is_for_planning_only():
    p = zb("run", "--assume-gpus", "2", "--no-report")
    assert p.returncode == 2 and "--assume-gpus plans a run (with --dry-run)" in p.stderr


def test_problems_are_listed_in_line_order(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: t\nmodel: nope-model\nseq_len: abc\n")
    err = zb("cells", str(path)).stderr
    assert err.index("bad.yaml:2: model") < err.index("bad.yaml:3: seq_len"), err


def test_a_missing_matrix_suggests_its_near_match_not_the_smoke_one():
    p = zb("run", "matrices/7B.yaml", "--dry-run")
    assert p.returncode != 0 and "no such matrix file" in p.stderr + p.stdout
    assert "give a path such as matrices/7b.yaml" in p.stderr + p.stdout
    far = zb("cells", "nowhere/zzz.yaml")
    assert "give a path such as bench/matrices/smoke.yaml" in far.stderr + far.stdout
