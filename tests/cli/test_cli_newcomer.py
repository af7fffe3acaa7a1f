"""What a newcomer reaches for first: --version, --filter's help everywhere, planning a GPU run from a
CPU host (run --dry-run --assume-gpus), why a cell is pruned, and problems in the file's order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import bench

ROOT = Path(__file__).resolve().parents[2]


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


def test_a_repository_matrix_writes_to_the_users_folder_and_never_appends_to_another_version(tmp_path):
    # The committed results/<name>.jsonl is the repository's evidence: a user's run of the same matrix writes
    # results/local/<name>.jsonl (git-ignored), and a results file of another version of the matrix is refused
    # (appended to, it mixes two matrices' cells; resumed from, its outcomes hide cells of this one).
    from bench.execute import default_report_path, default_results_path

    assert default_results_path("7b") == Path("results/local/7b.jsonl")
    assert default_report_path(Path("results/local/7b.jsonl")) == Path("reports/local/7b")
    assert default_report_path(Path("elsewhere/7b.jsonl")) == Path("reports/7b")
    old = tmp_path / "7b.jsonl"  # the committed file, written from an older 7b.yaml
    old.write_bytes((ROOT / "results" / "7b.jsonl").read_bytes())
    for extra in ((), ("--resume",)):
        p = zb("run", "matrices/7b.yaml", "--results", str(old), "--no-report", "--no-progress", *extra)
        assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
        assert f"{old} holds 3250 record(s) of matrix 7b written from another version of matrices/7b.yaml" in p.stderr
        assert "give --results a new file, or --other-matrix" in p.stderr
        assert ("resumed from" in p.stderr) == bool(extra)
    dry = zb("run", "matrices/7b.yaml", "--dry-run", "--resume", "--results", str(old))
    assert dry.returncode == 2 and "another version of matrices/7b.yaml" in dry.stderr and not dry.stdout
    ok = zb("run", "matrices/7b.yaml", "--dry-run", "--resume", "--results", str(old), "--other-matrix")
    assert ok.returncode == 0, ok.stderr
    assert old.read_bytes() == (ROOT / "results" / "7b.jsonl").read_bytes(), "nothing appended"
