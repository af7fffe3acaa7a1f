"""Large matrices: a matrix past its cell cap is refused at once, before it is expanded; planning a
committed large matrix stays fast (each cell's hash is computed once)."""

from __future__ import annotations

import dataclasses
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from bench.execute import plan
from bench.matrix import spec
from bench.matrix.cells import Cell

ROOT = Path(__file__).resolve().parents[2]

HUGE = """name: huge
axes:
  zero_stage: [0, 1, 2, 3]
  offload: [none, optimizer, optimizer+params]
  precision: [fp32, fp16, bf16]
  grad_ckpt: [false, true]
  optimizer: [adamw, fusedadam, cpuadam, fusedlamb, onebitadam, zerooneadam, onebitlamb, paged_adamw,
              paged_adamw_8bit, adamw_8bit]
  peft: [none, lora, qlora]
  engine: [deepspeed, hf_trainer]
  micro_batch: [%s]
""" % ", ".join(str(i) for i in range(1, 233))  # 4320 * 232 = 1,002,240 cells


def test_a_million_cells_are_refused_quickly_with_the_cap_and_how_to_raise_it(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text(HUGE)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # CPU seconds: a busy host stretches only wall time
    p = subprocess.run(
        [sys.executable, "-m", "bench", "cells", str(path)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 10
    assert p.returncode == 2, p.stdout[-2000:]
    assert "1,002,240 cells" in p.stderr and "max_cells (50,000)" in p.stderr
    assert "max_cells: 1002240" in p.stderr  # the fix names the key and the value that would admit it


def test_max_cells_counts_include_and_can_be_raised():
    text = "name: m\naxes: {zero_stage: [0, 1, 2, 3]}\ninclude: [{zero_stage: 3, offload: [optimizer]}]\n"
    with pytest.raises(spec.MatrixError) as e:
        spec.loads(text + "max_cells: 4\n")
    assert "cross to 5 cells, more than max_cells (4)" in str(e.value)
    assert len(spec.expand(spec.loads(text + "max_cells: 5\n"))) == 5


def test_a_cells_hash_is_computed_once_and_not_carried_by_replace():
    cell = Cell(zero_stage=3)
    first = cell.hash
    assert cell._hash == first and cell.hash == first
    other = dataclasses.replace(cell, zero_stage=2)
    assert other.hash != first and other == Cell(zero_stage=2) and other.hash == Cell(zero_stage=2).hash
    assert "_hash" not in cell.to_dict() and Cell.from_dict(cell.to_dict()).hash == first


def test_planning_the_7b_matrix_hashes_each_cell_once_per_expansion(monkeypatch):
    calls = []
    canonical = Cell.canonical

    def counted(self):
        calls.append(1)
        return canonical(self)

    monkeypatch.setattr(Cell, "canonical", counted)
    p = plan(str(ROOT / "matrices" / "7b.yaml"))
    ids = [it.cell.id for it in p.items]
    assert len(ids) == 12960 and len(set(ids)) == 12960
    # Loading expands once to check the matrix is not empty, planning once more: two hashes per cell (was 10).
    assert len(calls) <= 2 * len(ids)


def _cpu_seconds(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-m", "bench", *args], capture_output=True, text=True, cwd=cwd, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return p, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def test_divisors_are_found_by_trial_division_to_the_square_root():
    for n in range(1, 400):
        assert spec.divisors(n) == [k for k in range(1, n + 1) if n % k == 0]
    got = spec.divisors(10**12)  # a loop over every number to 10^12 ran for hours
    assert len(got) == 169 and got[:4] == [1, 2, 4, 5] and got[-2:] == [5 * 10**11, 10**12]


BATCHED = "name: m\nmodel: llama-tiny\nseq_len: 32\nsteps: {warmup: 1, measured: 2}\naxes: {zero_stage: [0, 1]}\n"


@pytest.mark.parametrize("verb", [["cells"], ["run", "--answer", "--dry-run"]], ids=["cells", "answer-dry-run"])
def test_a_huge_batch_size_is_refused_at_once_and_the_largest_allowed_plans_quickly(tmp_path, verb):
    def call(size: int) -> tuple[subprocess.CompletedProcess, float]:
        path = tmp_path / f"m{size}.yaml"
        path.write_text(BATCHED + f"batch: {{micro: auto, size: {size}}}\n")
        results = ["--results", str(tmp_path / "r.jsonl")] if verb[0] == "run" else []
        return _cpu_seconds(verb[0], str(path), *verb[1:], *results, cwd=ROOT)

    p, cpu = call(10**12)  # its divisors, found by a loop to 10^12, kept both verbs busy for hours
    assert p.returncode == 2 and cpu < 10, (p.returncode, cpu, p.stdout[-1000:], p.stderr[-1000:])
    assert "batch.size: 1000000000000 is out of range" in p.stderr and "use 1048576 or less" in p.stderr
    p, cpu = call(720720)  # the most divisors below the bound (240): each a micro-batch answer mode may plan
    assert p.returncode == 0 and cpu < 30, (p.returncode, cpu, p.stdout[-1000:], p.stderr[-1000:])


def test_an_odd_micro_batch_is_told_a_few_divisors_of_the_batch_size():
    with pytest.raises(spec.MatrixError) as e:
        spec.loads(BATCHED + "batch: {micro: 7, size: 1048575}\n")
    assert "use micro-batches among 1, 3, 5, 11, 15, 25, 31, 33, 41, 55, 75, ... (36 more), 1048575" in str(e.value)


def test_estimate_expands_the_matrix_once_and_says_how_far_it_got(tmp_path, monkeypatch, capsys):
    """The matrix is expanded once (not again to check it is not empty, nor for the run's plan), and past
    PROGRESS_FROM cells each tenth of the way is said on stderr: a large matrix takes minutes."""
    from bench.cli import estimate, main

    path = tmp_path / "m.yaml"
    path.write_text("name: m\nmodel: llama-tiny\naxes: {zero_stage: [0, 1, 2, 3], micro_batch: [1, 2, 4, 8, 16]}\n")
    expanded = []
    real = spec.expand
    monkeypatch.setattr(spec, "expand", lambda m: expanded.append(1) or real(m))
    monkeypatch.setattr(estimate, "PROGRESS_FROM", 10)
    assert main(["estimate", str(path), "--gpu-mem", "80GiB", "--host-mem", "512GiB"]) == 0
    out, err = capsys.readouterr()
    assert len(expanded) == 1
    assert "zerobench estimate: 20 cells; --filter narrows them" in err
    assert "zerobench estimate: predicted 2 of 20 cells" in err and "predicted 20 of 20 cells" in err
    assert "20 cells against GPU 80.0 GiB" in out
