"""A dry run a person can read: its summary last (counts, the predicted GPU time, the frontier), each cell only
with --verbose, each rule's reason once; --host-mem judges host memory, and a plan for assumed GPUs does not
judge this machine's; --filter anchors match the end of a cell's name."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def zb(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_the_7b_dry_run_for_one_assumed_gpu_fits_a_screen_and_ends_with_its_time_and_frontier():
    r = zb("run", "matrices/7b.yaml", "--dry-run", "--assume-gpus", "1", "--gpu-mem", "141GiB")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) <= 60, len(lines)
    time = next(i for i, ln in enumerate(lines) if ln.startswith("predicted GPU time"))
    assert "on 1 GPU" in lines[time] and lines[time + 1].startswith("predicted memory/speed frontier")
    assert "adaptive steps at a steady cell's fewest" in lines[time]  # an unsteady cell runs more: the line says so
    assert all(ln.startswith("  ") for ln in lines[time + 2 : -1]), "the frontier, then the answer-mode line, last"
    assert lines[-1].startswith("the full run: ~") and "`--answer --budget 20m` measures about" in lines[-1]
    # The counts just before, and host memory not judged: no cell pruned for this machine's RAM.
    assert "host memory not judged" in lines[time - 2] and "to run" in lines[time - 1]
    assert "(--verbose lists each cell in run order)" in lines[time - 1]
    assert "why:" not in r.stdout, "rule reasons only with --verbose"


def test_verbose_lists_each_cell_on_one_line_and_each_rule_once():
    r = zb("run", "matrices/7b.yaml", "--dry-run", "--verbose", "--assume-gpus", "1", "--gpu-mem", "141GiB")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    rows = lines[lines.index("run order (early), one line per cell:") + 1 :][:4320]
    assert all(ln[:7].strip().isdigit() and "#" in ln for ln in rows)
    rules = [ln for ln in lines if ln.startswith("  ") and ln.split()[1:3] == ["skipped", "by"]]
    assert r.stdout.count("why: ") == len(rules) >= 7
    assert "(host short:" not in r.stdout, "--assume-gpus without --host-mem does not judge this machine's RAM"


def test_host_mem_judges_host_memory():
    assert "--host-mem" in zb("run", "--help").stdout
    dry = ("run", "matrices/7b.yaml", "--dry-run", "--verbose", "--assume-gpus", "1", "--gpu-mem", "141GiB")
    r = zb(*dry, "--host-mem", "24GiB")
    assert r.returncode == 0, r.stderr
    assert "judged against 141.0 GiB of GPU memory and 24.0 GiB of host memory" in r.stdout
    assert "(host short:" in r.stdout


def test_a_filter_anchored_at_the_end_matches_the_end_of_the_name():
    r = zb("cells", "matrices/1b-mfu.yaml", "--filter", "mb=16$")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("matrices/1b-mfu.yaml: 5 cells"), r.stdout
    r = zb("cells", "matrices/1b-mfu.yaml", "--filter", "#52bec20115$")
    assert r.stdout.startswith("matrices/1b-mfu.yaml: 1 cells"), r.stdout


def test_an_answer_dry_run_shows_what_it_measures_first_per_configuration_and_when_it_stops():
    r = zb("run", "matrices/7b.yaml", "--dry-run", "--answer", "--budget", "20m", "--assume-gpus", "1", "--gpu-mem",
           "141GiB")  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) <= 60, len(lines)
    head = next(i for i, ln in enumerate(lines) if ln.startswith("answer mode: "))
    assert "configurations x micro-batch 1, 2, 4 at 4 sequences per optimizer step" in lines[head + 1]
    assert "parked" in lines[head + 1] and "micro-batch 4 in " in lines[head + 1]
    assert lines[head + 2].endswith("are each below 5%; or once --budget 1200 s of cell time is spent")


@pytest.mark.parametrize("extra", [[], ["--answer"]], ids=["plain", "answer"])
def test_a_dry_run_loads_and_plans_the_matrix_once(monkeypatch, capsys, extra):
    """The summary, the preview and answer mode's preview are all of one plan: the matrix is read once and its
    cells selected and judged once, not once per part of the output."""
    from bench.cli import main
    from bench.matrix import spec

    plan = importlib.import_module("bench.execute.plan")  # the module: bench.execute.plan is also its function

    calls = {"load": 0, "select": 0}

    def counted(name, f):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return f(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(spec, "load", counted("load", spec.load))
    monkeypatch.setattr(plan, "select", counted("select", plan.select))  # once per plan of the matrix
    monkeypatch.chdir(ROOT)
    assert main(["run", "matrices/7b.yaml", "--dry-run", *extra]) == 0
    out = capsys.readouterr().out
    assert out.startswith("matrices/7b.yaml: ") and "predicted GPU time" in out
    assert ("answer mode: " in out) == bool(extra)
    assert calls == {"load": 1, "select": 1}, calls


def test_a_long_full_run_says_what_it_costs_and_what_answer_mode_would_do_instead():
    # A fresh clone's headline dry run (no GPU here): what the full run costs, what a 20-minute answer run
    # measures instead, and how to plan for the GPU host the matrix is for.
    r = zb("run", "matrices/7b.yaml", "--dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    hint = next(i for i, ln in enumerate(lines) if "`--assume-gpus N` plans the run as on a host with N GPUs" in ln)
    assert (
        "runnable here" in lines[0] and lines[hint].startswith("no GPU here") and lines[hint + 1].startswith("memory")
    )
    last = lines[-1]
    assert last.startswith("the full run: ~") and last.split("~")[1].split("h")[0].isdigit(), last
    k = int(last.split("measures about ")[1].split(" cells")[0])
    assert 0 < k < 768 and "stops sooner if the answer settles (docs/answer-mode.md)" in last
    # Short runs and answer-mode dry runs are not told; a plan for assumed GPUs needs no --assume-gpus hint.
    short = zb("run", "--dry-run")
    assert short.returncode == 0 and "the full run:" not in short.stdout
    answer = zb("run", "matrices/7b.yaml", "--dry-run", "--assume-gpus", "1", "--answer")
    assert "the full run:" not in answer.stdout and "--assume-gpus N" not in answer.stdout
