"""The step-time model (bench.estimate.steptime): its physics, its fit on the committed H200 records, and
how well it carries to records it was not fitted on (leave one results file out)."""

import dataclasses
import glob
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cells import Cell, Lora
from bench.estimate import Hardware
from bench.estimate.shapes import shape_of
from bench.estimate.steptime import FITTED_TIME, flops_per_token, predict_step, predict_wall, run_seconds
from bench.estimate.timecheck import cross_validate_time, fit_time, time_cases, time_summary

ROOT = Path(__file__).resolve().parents[1]
H200 = Hardware(gpu_name="NVIDIA H200")


@pytest.fixture(scope="module")
def cases():
    return time_cases(sorted(glob.glob(str(ROOT / "results" / "*.jsonl"))))


def test_frozen_weights_need_no_weight_gradient_matmul():
    s = shape_of("llama-1b")
    full = Cell(model="llama-1b", seq_len=2048, grad_ckpt=False)
    lora = dataclasses.replace(full, peft="lora", lora=Lora(r=16))
    n = s.linear_params + s.head_params
    attn = 12 * 2048 * s.hidden * s.layers
    assert flops_per_token(full, s) == 6 * n + attn
    assert 4 * n + attn < flops_per_token(lora, s) < 4.1 * n + attn
    # Checkpointing runs the forward again: 2N more.
    assert (
        flops_per_token(dataclasses.replace(full, grad_ckpt=True), s) == 8 * n + attn + 4 * 2048 * s.hidden * s.layers
    )


def test_refit_on_committed_records_gives_the_literals(cases):
    assert len(cases) >= 250
    k = fit_time(cases)
    # The literals are the fit rounded to 3 places; a BLAS that rounds differently may move the last one.
    for f in dataclasses.fields(k):
        assert getattr(k, f.name) == pytest.approx(getattr(FITTED_TIME, f.name), abs=2e-3), f.name


def test_cross_validated_step_time_error_is_pinned(cases):
    s = time_summary(cross_validate_time(cases))
    # Achieved: median 7.3% (the target: 10%), p95 34.4% (the target, 30%, is not met).
    assert s["median"] <= 0.073 + 0.01
    assert s["p95"] <= 0.344 + 0.02


def test_cross_validated_setup_and_start_errors_are_pinned(cases):
    cv = cross_validate_time(cases)
    setup, start = time_summary(cv, "setup"), time_summary(cv, "start")
    # Achieved: setup median 19.3%, p95 66.1%; start median 16.4%, p95 72.3%.
    assert setup["n"] >= 250 and setup["median"] <= 0.193 + 0.02 and setup["p95"] <= 0.661 + 0.03
    assert start["n"] >= 250 and start["median"] <= 0.164 + 0.02 and start["p95"] <= 0.723 + 0.03
    wall = time_summary(cv, "wall")
    # Achieved: wall median 9.9%, p95 45.6%.
    assert wall["n"] >= 250 and wall["median"] <= 0.099 + 0.02 and wall["p95"] <= 0.456 + 0.03


def test_wall_is_start_setup_and_steps_and_packing_spreads_cells():
    cell = Cell(model="llama-1b", seq_len=2048, micro_batch=4, warmup_steps=3, measured_steps=10)
    step, wall = predict_step(cell, H200), predict_wall(cell, H200)
    assert 0 < step and wall > 13 * step
    total, packed, unknown = run_seconds([cell] * 4, H200, gpus=2)
    assert unknown == 0 and total == pytest.approx(4 * wall) and packed == pytest.approx(2 * wall)
    assert run_seconds([cell], H200, gpus=8)[1] == pytest.approx(wall)  # never less than the longest cell


def _zerobench(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout


def _gpu_time_line(out: str) -> str:
    return next(line.strip() for line in out.splitlines() if "predicted GPU time" in line)


def test_dry_run_and_estimate_print_the_same_predicted_gpu_time():
    dry = _gpu_time_line(_zerobench("run", "matrices/7b.yaml", "--dry-run"))
    assert "on 1 GPU" in dry
    # estimate counts what the run would run: the cells its rules keep, not every cell of the matrix.
    assert _gpu_time_line(_zerobench("estimate", "matrices/7b.yaml")) == dry
    four = _gpu_time_line(_zerobench("run", "matrices/7b.yaml", "--dry-run", "--assume-gpus", "4"))
    assert "on 4 GPUs side by side" in four


def test_estimate_check_prints_the_time_tables_after_the_memory_table():
    out = _zerobench("estimate", "--check", "results/compare-h200-a1.jsonl", "results/memcheck-h200-c.jsonl")
    memory = out.index("cross-validated (leave one results file out)")
    for title in ("median step time:", "Setup time", "Start and the rest", "Wall time per cell"):
        assert out.index(title) > memory
