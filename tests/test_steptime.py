"""The step-time model (bench.estimate.steptime): its physics, its fit on the committed H200 records, and
how well it carries to records it was not fitted on (leave one results file out)."""

import dataclasses
import glob
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cells import Cell, Lora, Qlora
from bench.estimate import Hardware
from bench.estimate.band import BAND_COVERAGE, HOST_BOUND, band_group, step_time_band
from bench.estimate.shapes import shape_of
from bench.estimate.steptime import (
    FITTED_TIME,
    HOST_BACKWARD,
    STEP_BAND,
    TRAIT_FILES,
    compute_seconds,
    flops_per_token,
    host_share,
    pinned,
    predict_step,
    predict_wall,
    run_seconds,
    step_parts,
)
from bench.estimate.timecheck import (
    EXCLUDED,
    Miss,
    band_coverage,
    calibrated_levels,
    cross_validate_time,
    error_band,
    fit_time,
    literals,
    time_cases,
    time_summary,
)

ROOT = Path(__file__).resolve().parents[1]
H200 = Hardware(gpu_name="NVIDIA H200")


RESULTS = sorted(glob.glob(str(ROOT / "results" / "*.jsonl")))


@pytest.fixture(scope="module")
def cases():
    return time_cases(RESULTS)


@pytest.fixture(scope="module")
def cv(cases):
    return cross_validate_time(cases)


def test_records_with_an_injected_fault_are_left_out_and_counted():
    excluded: list[tuple[str, str]] = []
    kept = time_cases(RESULTS, excluded=excluded)
    # The comparison gate's A/B runs slowed one cell by 12% and burdened another with 3 GiB on purpose.
    assert len(excluded) == 11 and {f for f, _ in excluded} == {"compare-h200-b.jsonl", "compare-h200-b2.jsonl"}
    assert "fault injected" in EXCLUDED
    assert len(kept) == 325


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


def test_refit_prints_the_literals_as_the_module_holds_them(cases):
    # `zerobench estimate --check results --refit` prints these, to paste over steptime.py's.
    from bench.estimate import steptime

    printed: dict = {}
    exec(literals(cases), {}, printed)  # noqa: S102 - our own output, Python literals
    assert [n for n in printed if not n.startswith("__")] == ["_FIT", "STEP_BAND", "TRAIT_FILES", "FITTED_RUNS"]
    assert printed["_FIT"] == pytest.approx(steptime._FIT, abs=2e-3)  # a BLAS may move the last place
    assert printed["TRAIT_FILES"] == steptime.TRAIT_FILES
    assert printed["FITTED_RUNS"] == steptime.FITTED_RUNS and len(steptime.FITTED_RUNS) >= 45
    for group, band in printed["STEP_BAND"].items():
        assert band == pytest.approx(steptime.STEP_BAND[group], abs=2e-3), group


def test_cross_validated_step_time_error_is_pinned(cv):
    s = time_summary(cv)
    # Every committed file held out in turn, the 7b answer's among them. Achieved: median 7.5% (the target:
    # 12%), p95 35.3% (the target: 35%; before this fit, 44.3% over the same records).
    assert s["n"] == 325
    assert s["median"] <= 0.075 + 0.005
    assert s["p95"] <= 0.353 + 0.01


def test_cross_validated_setup_and_start_errors_are_pinned(cv):
    setup, start = time_summary(cv, "setup"), time_summary(cv, "start")
    # Achieved: setup median 22.1%, p95 67.3%; start median 19.1%, p95 88.1%.
    assert setup["n"] >= 300 and setup["median"] <= 0.221 + 0.02 and setup["p95"] <= 0.673 + 0.03
    assert start["n"] >= 300 and start["median"] <= 0.191 + 0.02 and start["p95"] <= 0.881 + 0.03
    wall = time_summary(cv, "wall")
    # Achieved: wall median 11.4%, p95 75.9%.
    assert wall["n"] >= 300 and wall["median"] <= 0.114 + 0.02 and wall["p95"] <= 0.759 + 0.03


def test_the_published_band_is_the_held_out_error_of_the_fit(cases, cv):
    band, files = error_band(cases, cv)
    assert files == TRAIT_FILES
    assert list(band) == list(STEP_BAND) == ["familiar", "gpu-bound", "host-bound", "unfamiliar"]
    for group, b in band.items():
        assert b["n"] == STEP_BAND[group]["n"] and b["level"] == STEP_BAND[group]["level"], group
        for key in ("median", "p95", "low", "high"):
            assert b[key] == pytest.approx(STEP_BAND[group][key], abs=2e-3), (group, key)
    # Where the step waits on the host, machines with the same GPU differ most: the host-bound band is
    # wider than the GPU-bound one, and a trait the fit saw in fewer files widens it too.
    g, h, u = STEP_BAND["gpu-bound"], STEP_BAND["host-bound"], STEP_BAND["unfamiliar"]
    assert h["high"] - h["low"] > 2 * (g["high"] - g["low"]) and u["high"] - u["low"] > g["high"] - g["low"]
    # "familiar" holds both familiar groups: answer mode's prior width (its p95 of |log error|).
    assert STEP_BAND["familiar"]["n"] == g["n"] + h["n"] and 0.1 < STEP_BAND["familiar"]["p95"] < 0.5


def test_the_band_covers_held_out_records_of_files_it_was_neither_derived_nor_calibrated_on(cases, cv):
    cover = band_coverage(cases, cv)
    inside, n = cover["all"]
    # Each file's held-out errors against the band derived from the other files' held-out errors, at the
    # levels calibrated on those files alone: 296 of 325 (91.1%); before the calibration and the host-bound
    # split, 295 of 325 with a GPU-bound band twice as wide.
    assert n == 325 and inside >= 296
    assert cover["gpu-bound"][0] / cover["gpu-bound"][1] >= 0.94
    assert BAND_COVERAGE == 0.95


def test_a_band_is_taken_at_the_lowest_level_that_holds_95_percent_of_each_other_file():
    # Ten files of 20 errors each, spread alike: the nominal 95% percentiles of nine files hold 95% of the
    # tenth's. One file whose errors lie beyond every other's: no level holds 95% of it and the rest, and the
    # band takes every error seen.
    import random

    rnd = random.Random(1)
    alike = [Miss(f"f{i}", "gpu-bound", rnd.gauss(0, 0.1)) for i in range(10) for _ in range(20)]
    assert calibrated_levels(alike)["gpu-bound"] <= 0.97
    odd = [m if m.file != "f0" else Miss("f0", "gpu-bound", m.log - 0.8) for m in alike]
    assert calibrated_levels(odd)["gpu-bound"] == 1.0


def test_step_time_band_brackets_the_prediction_and_widens_for_host_bound_and_unfamiliar_cells():
    cell = Cell(model="llama-1b", seq_len=2048, micro_batch=4, zero_stage=2)
    low, pred, high = step_time_band(cell, H200)
    assert low < pred < high and pred == predict_step(cell, H200)
    assert band_group(cell, hw=H200) == "gpu-bound" and host_share(cell, H200) < HOST_BOUND
    # 7B QLoRA at micro-batch 1 x 4: bitsandbytes' and PEFT's launches per layer, the host's work.
    qlora = Cell(model="llama-7b", seq_len=2048, micro_batch=1, grad_accum=4, peft="qlora", lora=Lora(r=16))
    qlora = dataclasses.replace(qlora, qlora=Qlora(), zero_stage=1, optimizer="adamw_8bit")
    assert band_group(qlora, hw=H200) == "host-bound" and host_share(qlora, H200) > HOST_BOUND
    qlow, qpred, qhigh = step_time_band(qlora, H200)
    assert qhigh / qlow > high / low
    nvme = dataclasses.replace(cell, zero_stage=3, offload="nvme", optimizer="cpuadam")
    assert band_group(nvme, hw=H200) == "unfamiliar"  # NVMe offload: in two results files only
    nlow, npred, nhigh = step_time_band(nvme, H200)
    assert nhigh / nlow > high / low
    assert step_time_band(dataclasses.replace(cell, model="no-such-model"), H200) is None


def test_a_small_micro_batch_waits_on_the_host_and_a_large_one_on_the_gpu():
    # The host launches each block's kernels and PEFT's wrappers while the GPU runs those queued before: 1B
    # QLoRA micro-batches of 2048, 4096 and 8192 tokens cost about the same (the host's launches), as
    # results/memcheck-h200-*.jsonl measured (0.230, 0.246, 0.253 s); one of 32768 costs more (the GPU's work).
    q = Cell(model="llama-1b", seq_len=1024, peft="qlora", lora=Lora(r=16), qlora=Qlora(), grad_ckpt=False)
    small, eight, large = (predict_step(dataclasses.replace(q, micro_batch=m), H200) for m in (2, 8, 32))
    assert eight / small < 1.15 and large / small > 2
    # The wrappers' cost counts adapted linears: LoRA on q, k, v is cheaper on the host than on all seven.
    lora = dataclasses.replace(q, peft="lora", qlora=None, micro_batch=8, grad_ckpt=True)
    qkv = dataclasses.replace(lora, lora=Lora(r=16, targets=("q_proj", "k_proj", "v_proj")))
    assert step_parts(qkv, H200)["wrappers"][0] == pytest.approx(step_parts(lora, H200)["wrappers"][0] * 3 / 7)
    # Four 7B LoRA micro-batches of 2048 tokens cost four times one's forward and backward, but the
    # optimizer's per-tensor work once: less than four times one step.
    seven = Cell(model="llama-7b", seq_len=2048, micro_batch=1, peft="lora", lora=Lora(r=16), grad_ckpt=False)
    four = dataclasses.replace(seven, grad_accum=4)
    assert 3 * predict_step(seven, H200) < predict_step(four, H200) < 4 * predict_step(seven, H200)


def test_the_optimizer_steps_once_per_step_and_zeros_hooks_run_in_every_micro_batch():
    # The step's per-tensor work (the optimizer's and the gradient norm's launches) runs once per optimizer
    # step; ZeRO's gradient hooks run in every micro-batch's backward (ZeRO-0 has none); the host's launches
    # per layer count a backward as HOST_BACKWARD of a forward.
    one = Cell(model="llama-7b", seq_len=2048, micro_batch=1, peft="lora", lora=Lora(r=16), zero_stage=1)
    four = dataclasses.replace(one, grad_accum=4)
    p1, p4 = step_parts(one, H200), step_parts(four, H200)
    assert p4["tensors"][0] == p1["tensors"][0] > 0 and p4["params"][0] == p1["params"][0]
    assert p4["hooks"][0] == 4 * p1["hooks"][0] > 0 and p4["launch"][0] == 4 * p1["launch"][0]
    assert step_parts(dataclasses.replace(one, zero_stage=0), H200)["hooks"][0] == 0
    gc = step_parts(dataclasses.replace(one, grad_ckpt=True), H200)["launch"][0]
    assert gc / p1["launch"][0] == pytest.approx((2 + HOST_BACKWARD) / (1 + HOST_BACKWARD))


def test_a_slow_machines_host_is_taken_up_by_its_offset_not_by_cell_factors(cases, monkeypatch):
    # Records made by the shipped constants, except that one machine's host runs at half speed: the machine
    # of the 7b answer's second and third calls, whose cells (7B LoRA and QLoRA at micro-batch 1 x 4, the HF
    # Trainer's) no other machine ran. With a host offset per machine the refit predicts its cells on a
    # typical host far closer to the truth, and every other machine's as well, than one fit without.
    from bench.estimate import steptime, timecheck

    slow = next(c.machine for c in cases if c.machine.startswith("GPU-2a96689d"))

    def measured(c):
        seconds = steptime._seconds(c.cell, c.hw, FITTED_TIME, c.ds_config)
        twice = {n: v * (2 if c.machine == slow and n in steptime.HOST_PARTS else 1) for n, v in seconds.items()}
        return steptime.combine(twice)[0]

    records = [dataclasses.replace(c, step_s=measured(c)) for c in cases]

    def misses(k):
        typical = [
            abs(predict_step(c.cell, c.hw, k, c.ds_config) / predict_step(c.cell, c.hw) - 1)
            for c in records
            if c.machine == slow
        ]
        others = [abs(predict_step(c.cell, c.hw, k, c.ds_config) / c.step_s - 1) for c in records if c.machine != slow]
        return statistics.median(typical), max(others)

    apart = misses(fit_time(records))
    monkeypatch.setattr(timecheck, "MACHINE_RIDGE", 1e9)  # every machine's offset held at 0
    together = misses(fit_time(records))
    assert apart[0] < 0.25 < 0.35 < together[0]
    assert apart[1] < 0.25 < together[1]


def test_qlora_records_that_trained_in_eval_mode_are_fitted_without_checkpointing(cases):
    # results/README.md: 1b-axes.jsonl's two QLoRA cells trained in eval mode (from_pretrained's), where
    # transformers skips gradient checkpointing despite gc=on; their records do not say train_mode.
    axes = [c for c in cases if c.file == "1b-axes.jsonl" and c.cell.peft == "qlora"]
    assert len(axes) == 2 and not any(c.cell.grad_ckpt for c in axes)
    assert all(c.cell.grad_ckpt for c in cases if c.file == "1b-axes-2.jsonl" and c.cell.peft == "qlora")


def test_torch_adamw_on_the_host_is_not_torch_adamw_on_the_gpu():
    # DeepSpeed's CPU Adam is "5X-7X faster than the standard PyTorch implementation"; on the GPU torch's
    # AdamW (foreach) costs about what FusedAdam does (results/1b-axes.jsonl: 0.250 s against 0.249 s).
    gpu = Cell(model="llama-1b", seq_len=2048, micro_batch=4)
    assert predict_step(dataclasses.replace(gpu, optimizer="adamw"), H200) < 1.1 * predict_step(gpu, H200)
    off = Cell(model="llama-1b", seq_len=2048, micro_batch=4, zero_stage=2, offload="optimizer", optimizer="cpuadam")
    torch_off = dataclasses.replace(off, optimizer="adamw")
    assert predict_step(torch_off, H200) > 2 * predict_step(off, H200)


def test_fp32_runs_on_the_fp32_cores_and_offload_reads_pinning_and_host_cores():
    bf16 = Cell(model="llama-1b", seq_len=2048, micro_batch=4, precision="bf16")
    fp32 = dataclasses.replace(bf16, precision="fp32")
    # PyTorch's default fp32 matmul is full fp32: the H200's 66.9 TFLOP/s, not the 16-bit 989.
    assert compute_seconds(fp32, H200) / compute_seconds(bf16, H200) == pytest.approx(989.4 / 66.9)
    off = Cell(model="llama-1b", seq_len=2048, micro_batch=4, zero_stage=3, offload="optimizer+params")
    assert pinned(off)  # zerobench's generated config pins offload's buffers
    unpinned = dataclasses.replace(off, ds_config="matrices/ds_configs/trainer/zero3-offload-unpinned.json")
    assert not pinned(unpinned)
    assert predict_step(unpinned, H200) > predict_step(off, H200)
    many = Hardware(gpu_name="NVIDIA H200", host_cores=64)
    assert step_parts(off, many)["host"][0] == pytest.approx(step_parts(off, H200)["host"][0] / 4)
    assert predict_step(off, many) < predict_step(off, H200)


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
    out = _zerobench(
        "estimate",
        "--check",
        "results/compare-h200-a1.jsonl",
        "results/memcheck-h200-c.jsonl",
        "results/compare-h200-b.jsonl",
    )
    memory = out.index("held out (leave one results file out)")
    for title in ("median step time:", "Step-time band", "Setup time", "Start and the rest", "Wall time per cell"):
        assert out.index(title) > memory
    # The A/B file's records with an injected fault are left out of the time check, and it says so.
    assert "Time records left out: 5 (a fault injected" in out


def test_estimate_check_counts_the_records_of_runs_no_constant_was_fitted_on_as_held_out(tmp_path):
    # The committed records of one file, as if a later run had made them: neither model was fitted on that
    # run, so none of its figures is in-sample.
    lines = (ROOT / "results" / "memcheck-h200-c.jsonl").read_text().splitlines()
    other = tmp_path / "later.jsonl"
    other.write_text(
        "".join(line.replace("20261201T085836Z-69b3dd", "20271201T000000Z-000000") + "\n" for line in lines)
    )
    out = _zerobench("estimate", "--check", str(other), "results/compare-h200-a1.jsonl")
    assert "held out (runs no constant was fitted on: later.jsonl): 9 ok records" in out  # the memory model's
    assert "held out (runs no constant was fitted on: later.jsonl): 9 records" in out  # the step-time model's
    assert "in-sample (the runs the constants were fitted on): 24 records" in out  # compare-h200-a1's only
    alone = _zerobench("estimate", "--check", str(other))
    assert "in-sample:" not in alone and "in-sample (" not in alone  # no summary line calls them in-sample
    assert "held out (runs no constant was fitted on: later.jsonl)" in alone


def test_a_micro_batch_search_is_timed_at_its_first_probe():
    from bench.estimate.search import seed_micro_batch

    hw = Hardware(gpu_memory_bytes=143771 * 2**20, gpu_name="NVIDIA H200")
    auto = Cell(model="llama-1b", seq_len=512, micro_batch="auto")
    seed = seed_micro_batch(auto, hw)
    assert seed > 1 and predict_wall(auto, hw) == predict_wall(dataclasses.replace(auto, micro_batch=seed), hw)
    out = _zerobench("run", "matrices/mb-auto-1b.yaml", "--dry-run", "--assume-gpus", "1", "--gpu-mem", "143771MiB")
    assert "predicted GPU time (3 cells" in _gpu_time_line(out)


def test_nested_cross_validation_with_one_grid_point_is_the_plain_one():
    # tools.steptime_nested picks the fit's hyperparameters inside each fold; over all committed records it
    # gave median 7.2%, p95 35.2%, 293 of 325 inside the band (python -m tools.steptime_nested). With the shipped
    # values as the only choice it is the plain leave-one-file-out check, and it leaves the module's values.
    from bench.estimate import steptime, timecheck
    from tools.steptime_nested import nested, shipped

    files = [str(ROOT / "results" / f) for f in ("1b-axes.jsonl", "1b-axes-2.jsonl", "memcheck-h200-c.jsonl")]
    cs = time_cases(files)
    rows, picked = nested(cs, grid=[shipped()])
    plain = cross_validate_time(cs)
    assert set(picked) == {Path(f).name for f in files}
    assert [r.step for r in rows] == pytest.approx([r.step for r in plain])
    other, _ = nested(cs, grid=[(2.0, 0.1, 1.0)])
    assert [r.step for r in other] != pytest.approx([r.step for r in plain])
    assert shipped() == (steptime.OVERLAP, timecheck.STEP_RIDGE, timecheck.MACHINE_RIDGE) == (4.0, 0.03, 3.0)
