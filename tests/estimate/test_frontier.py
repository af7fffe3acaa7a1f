"""The predicted memory/speed frontier (bench.estimate.planning.frontier): which cells a plan is predicted to have on
it, per model and PEFT mode, and how `run --dry-run` and `estimate` print it."""

import dataclasses
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from bench.estimate import Hardware, predict
from bench.estimate.planning.frontier import Point, frontier, frontier_lines, pareto, points
from bench.estimate.steptime import predict_step
from bench.matrix.cells import Cell, Lora

ROOT = Path(__file__).resolve().parents[2]
H200 = Hardware(gpu_memory_bytes=143771 * 2**20, gpu_name="NVIDIA H200")


def _point(gib: float, rate: float) -> Point:
    return Point(Cell(), gib * 2**30, rate, rate * 0.8, rate * 1.2)


def test_pareto_keeps_what_no_other_beats_on_memory_and_speed():
    a, b, c, d = _point(10, 100), _point(20, 300), _point(15, 90), _point(30, 250)
    assert pareto([d, c, b, a]) == [a, b]  # c: more memory and slower than a; d: than b
    # A predicted tie (within 1%) goes to the cell with less memory.
    assert pareto([a, _point(12, 100.5)]) == [a]
    assert pareto([a, _point(12, 102)]) == [a, _point(12, 102)]


def _cells() -> list[Cell]:
    base = Cell(model="llama-1b", seq_len=2048, micro_batch=4)
    lora = dataclasses.replace(base, peft="lora", lora=Lora(r=16))
    out = []
    for c in (base, lora):
        for z in (0, 2, 3):
            for ckpt in (False, True):
                out.append(dataclasses.replace(c, zero_stage=z, grad_ckpt=ckpt))
        out.append(dataclasses.replace(c, zero_stage=3, offload="optimizer+params", optimizer="cpuadam"))
    return out


def test_each_group_has_its_own_frontier_and_every_other_cell_is_beaten():
    cells = _cells()
    ps = points([(c, None, predict(c, None, H200).gpu_bytes) for c in cells], H200)
    assert len(ps) == len(cells)
    fronts = frontier(ps)
    assert set(fronts) == {("llama-1b", "none"), ("llama-1b", "lora")}
    for (_, peft), (front, n) in fronts.items():
        group = [p for p in ps if p.cell.peft == peft]
        assert n == len(group) and 1 <= len(front) < n
        for p in group:
            if p not in front:  # beaten by a frontier cell with no more memory and at least as fast
                assert any(f.gpu_bytes <= p.gpu_bytes and f.tokens_per_s >= p.tokens_per_s * 0.99 for f in front)
        # tokens/s is the step's tokens over the predicted step time, inside its band
        for f in front:
            tokens = f.cell.micro_batch * f.cell.seq_len
            assert f.tokens_per_s == pytest.approx(tokens / predict_step(f.cell, H200))
            assert f.slow < f.tokens_per_s < f.fast
    lines = frontier_lines([(c, None, predict(c, None, H200).gpu_bytes) for c in cells], H200, per_group=2)
    assert "predictions" in lines[0] and "nothing measured" in lines[0]
    assert sum(line.startswith("  model=") for line in lines) == 2
    assert all(line.count("GiB") == 1 for line in lines[1:] if not line.startswith("  model="))


def _zerobench(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout


def _frontier_block(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("predicted memory/speed frontier"))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[start:end]


def test_dry_run_ends_with_the_gpu_time_and_the_frontier_as_estimate_prints_them():
    dry = _zerobench("run", "matrices/7b.yaml", "--dry-run")
    block = _frontier_block(dry)
    # The frontier ends the plan; only the full run's cost beside what answer mode would do follows it.
    tail = dry.splitlines()[-len(block) - 1 :]
    assert dry.index("predicted GPU time") < dry.index(block[0]) and tail[:-1] == block
    assert tail[-1].startswith("the full run: ") and "--answer --budget 20m" in tail[-1], tail[-1]
    assert [line for line in block if line.startswith("  model=llama-7b, peft=")]
    # estimate counts the same runnable cells and draws the same frontier
    assert _frontier_block(_zerobench("estimate", "matrices/7b.yaml")) == block


@pytest.mark.parametrize("gpus", ["1", "8"])
def test_dry_run_of_the_7b_matrix_with_its_time_and_frontier_takes_under_10_seconds(gpus):
    # The CPU seconds the dry run spent, not its wall time: another process beside it on a shared 2-core host
    # stretches the wall time (10.6 s against 4.3 s idle) but not the work the dry run does.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = _zerobench("run", "matrices/7b.yaml", "--dry-run", "--assume-gpus", gpus, "--gpu-mem", "143771MiB")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert cpu_s < 10, cpu_s
    # Host memory is not judged (no --host-mem): only the GPU's 140.4 GiB prunes.
    assert "predicted GPU time (2778 cells" in out and _frontier_block(out)
    assert (f"on {gpus} GPUs side by side" in out) == (gpus == "8")
