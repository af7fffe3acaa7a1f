"""The step-time model (bench.estimate.steptime): its physics, its fit on the committed H200 records, and
how well it carries to records it was not fitted on (leave one results file out)."""

import dataclasses
import glob
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from bench.estimate import Hardware, fitdata
from bench.estimate.band import BAND_COVERAGE, GPU_BOUND, HOST_BOUND, band_group, step_time_band
from bench.estimate.checks.timecheck import (
    EXCLUDED,
    Miss,
    band_coverage,
    calibrated_levels,
    cross_validate_time,
    error_band,
    fit_section,
    fit_time,
    host_exponent,
    refit,
    time_cases,
    time_summary,
)
from bench.estimate.steptime import (
    FIT,
    FITTED_RUNS,
    FITTED_TIME,
    HOST_BACKWARD,
    HOST_PARTS,
    REF_OPS_S,
    STEP_BAND,
    STEP_BAND_HOST,
    TRAIT_FILES,
    TimeConstants,
    compute_seconds,
    flops_per_token,
    host_share,
    host_time_of,
    paged_excess,
    pinned,
    predict_step,
    predict_wall,
    run_seconds,
    step_and_share,
    step_parts,
    steps_of,
)
from bench.execute.answer import rung_cell
from bench.host.rates import datasheet
from bench.matrix.cells import Adaptive, Cell, Lora, Qlora
from bench.matrix.shapes import shape_of
from bench.records.store import read_records
from tests.conftest import as_written

ROOT = Path(__file__).resolve().parents[2]
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
    # The comparison gate's A/B runs slowed one cell by 12% and burdened another with 3 GiB on purpose: left out
    # and counted, as is every record that says a fault was injected (and no other), whatever else is committed.
    assert {"compare-h200-b.jsonl", "compare-h200-b2.jsonl"} <= {f for f, _ in excluded}
    faulted = {
        os.path.basename(path): sum(bool(r.worker and r.worker.fault_injected) for r in read_records(path, warn=False))
        for path in RESULTS
    }
    assert all(faulted[f] > 0 for f, _ in excluded) and len(excluded) <= sum(faulted.values())
    assert not {(c.file, c.cell.id) for c in kept} & set(excluded)
    assert "fault injected" in EXCLUDED
    # The fit in fit.json took every record the check keeps of the files it names.
    assert len([c for c in kept if c.file in FIT["files"]]) == FIT["records"]


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


@pytest.fixture(scope="module")
def section(cases, cv):
    return fit_section(cases, cv)


def test_the_data_file_holds_the_fit_on_the_committed_records(section):
    # `zerobench estimate --check results --refit` writes this section of bench/estimate/fit.json; the module
    # reads its constants, band and runs from there.
    assert FITTED_TIME == TimeConstants(**FIT["constants"])
    assert section["runs"] == FIT["runs"] == list(FITTED_RUNS)
    assert section["files"] == FIT["files"] and section["records"] == FIT["records"]
    assert section["gpus"] == FIT["gpus"] == ["NVIDIA H200"]
    assert section["rates"] == FIT["rates"] == ["datasheet (H200)"]  # no committed record carries a probe's
    assert section["ref_ops_s"] == REF_OPS_S == FIT["ref_ops_s"]
    for ref in ("ref_host_overhead_s", "ref_cpu_adam", "ref_pageable"):  # no fitting machine was probed
        assert section[ref] is FIT[ref] is None, ref
    assert section["trait_files"] == TRAIT_FILES
    # The constants are the fit rounded to 3 places; a BLAS that rounds differently may move the last one.
    for name, value in section["constants"].items():
        assert value == pytest.approx(FIT["constants"][name], abs=2e-3), name
    for key, shipped in (("band", STEP_BAND), ("band_host", STEP_BAND_HOST)):
        for group, band in section[key].items():
            assert band == pytest.approx(shipped[group], abs=2e-3), (key, group)


def test_no_fitted_figure_lives_in_the_models_source():
    for name in ("steptime.py", "checks/timecheck.py", "checks/timetext.py", "band.py"):
        text = (ROOT / "bench" / "estimate" / name).read_text()
        # A constant's name beside a number of the fit's precision (features are 0 or 1: "setup_log": 1.0).
        assert not any(re.search(rf'"{n}": -?\d+\.\d\d', text) for n in FIT["constants"]), name
        assert not any(run in text for run in FIT["runs"]), name


def test_refit_writes_the_step_time_section_and_keeps_the_others(tmp_path, monkeypatch):
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"memory": {"kept": 1}, "step_time": {}}))
    monkeypatch.setattr(fitdata, "_path", lambda: fit)
    two = [str(ROOT / "results" / "1b-axes.jsonl"), str(ROOT / "results" / "1b-mfu.jsonl")]
    written = refit(two, "zerobench estimate --check two --refit")
    data = json.loads(fit.read_text())
    assert data["memory"] == {"kept": 1}
    assert data["step_time"] == json.loads(json.dumps(written))
    assert written["files"] == ["1b-axes.jsonl", "1b-mfu.jsonl"] and written["records"] == len(time_cases(two))
    assert set(written["constants"]) >= set(FIT["constants"]) and written["band"]


H100 = datasheet("H100")
ON_H100 = Hardware(gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_bytes=85_520_809_984, host_cores=16, rates=H100)


NO_SHEET = "Some GPU no data sheet names"


def _with(**rates) -> Hardware:
    """A probed machine of a GPU model no data sheet names (its probe's rates are the step's denominators),
    at the H100's rates but for `rates`."""
    probe = dataclasses.replace(H100, source="probe", device=NO_SHEET, **rates)
    return dataclasses.replace(ON_H100, gpu_name=NO_SHEET, rates=probe)


def test_the_steps_terms_move_with_the_machines_rates(monkeypatch):
    from bench.estimate import steptime

    base = _with()
    half_pcie = _with(h2d_pinned=H100.h2d_pinned / 2, d2h_pinned=H100.d2h_pinned / 2)
    # ZeRO-3 offloading the optimizer and the parameters: its copies cross PCIe.
    offload = Cell(model="llama-7b", seq_len=2048, micro_batch=4, zero_stage=3, offload="optimizer+params")
    offload = dataclasses.replace(offload, optimizer="cpuadam", peft="lora", lora=Lora(r=16), grad_ckpt=True)
    assert predict_step(offload, half_pcie) > 1.05 * predict_step(offload, base)
    # A 7B full fine-tune with paged AdamW: 54 GB of state beyond an 80 GB GPU, paged in and out every step.
    paged = Cell(model="llama-7b", seq_len=2048, micro_batch=1, grad_accum=4, optimizer="paged_adamw")
    assert paged_excess(paged, base) > 50 * 2**30
    assert predict_step(paged, half_pcie) > 1.4 * predict_step(paged, base)
    # The same cell fits on an H200's 141 GB: nothing pages.
    assert paged_excess(paged, Hardware(gpu_name="NVIDIA H200", gpu_memory_bytes=150_754_820_096)) == 0
    # A 1B full fine-tune at micro-batch 16 waits on its matmuls: twice the matmul rate, a much faster step.
    dense = Cell(model="llama-1b", seq_len=2048, micro_batch=16)
    fast = _with(matmul_bf16=2 * H100.matmul_bf16)
    assert predict_step(dense, fast) < 0.75 * predict_step(dense, base)
    # At the H100's own rates, the probed machine of an unnamed GPU predicts as the H100's data sheet does.
    assert predict_step(dense, base) == pytest.approx(predict_step(dense, ON_H100))
    # A GPU with a data sheet is predicted at it (the fitted efficiencies are relative to the sheets), whatever its
    # probe's device figures; its probe's host figures count.
    sheet_gpu = dataclasses.replace(half_pcie, gpu_name="NVIDIA H100 80GB HBM3")
    assert predict_step(offload, sheet_gpu) == pytest.approx(predict_step(offload, ON_H100))
    # A probed host overhead twice the fitting hosts' doubles the host's parts (where no op prebuild timed it).
    monkeypatch.setattr(steptime, "REF_HOST_OVERHEAD_S", 20e-6)
    probed = dataclasses.replace(ON_H100, rates=dataclasses.replace(H100, source="probe", host_overhead_s=40e-6))
    for part in HOST_PARTS:
        assert step_parts(dense, probed)[part][0] == pytest.approx(2 * step_parts(dense, ON_H100)[part][0])


def test_a_probed_host_or_link_figure_counts_against_the_fitting_machines_probes(monkeypatch):
    # The host part's efficiency is fitted against REF_CPU_ADAM and pcie_unpinned against the fitting machines'
    # links: a probe's CPU Adam rate and pageable rates count as ratios to the same figures probed there, so
    # where the fit carried no probe they change nothing (used as they are, they would count the gap twice).
    from bench.estimate import steptime

    offload = Cell(model="llama-1b", seq_len=2048, micro_batch=4, zero_stage=3, offload="optimizer+params")
    offload = dataclasses.replace(offload, optimizer="cpuadam")
    unpinned = dataclasses.replace(offload, ds_config="matrices/ds_configs/trainer/zero3-offload-unpinned.json")
    plain = _with()
    probed = _with(cpu_adam=2e8, h2d_pageable=H100.h2d_pinned / 8, d2h_pageable=H100.d2h_pinned / 8)
    for cell in (offload, unpinned):
        for part in ("host", "pcie"):
            assert step_parts(cell, probed)[part][0] == pytest.approx(step_parts(cell, plain)[part][0]), part
    # Where the fitting machines' probes measured them: twice their CPU Adam rate halves the host part, and a
    # link whose pageable copies are 4x slower than its pinned ones against their 2x doubles the unpinned copies.
    monkeypatch.setattr(steptime, "REF_PROBED_CPU_ADAM", 1e8)
    monkeypatch.setattr(steptime, "REF_PAGEABLE", 0.25)
    assert step_parts(offload, probed)["host"][0] == pytest.approx(step_parts(offload, plain)["host"][0] / 2)
    slow = step_parts(unpinned, probed)["pcie"][0]
    assert slow == pytest.approx(2 * step_parts(unpinned, plain)["pcie"][0])
    assert step_parts(offload, probed)["pcie"][0] == pytest.approx(step_parts(offload, plain)["pcie"][0])


def test_cross_validated_step_time_error_is_pinned(cv):
    s = time_summary(cv)
    # Every committed file held out in turn, each run's host at the time its op prebuild measured (where it
    # compiled the ops), each at its GPU's data-sheet rates; pinned at what the fit achieves (docs/step-time.md,
    # with its targets and where it misses).
    assert s["n"] == FIT["records"]
    assert s["median"] <= 0.052 + 0.005
    assert s["p95"] <= 0.236 + 0.01
    # The same constants, every host taken as typical (what a prediction does where nothing timed the host): a
    # far wider p95.
    typical = time_summary([dataclasses.replace(r, step=r.typical) for r in cv])
    assert typical["p95"] > 0.35 > s["p95"] + 0.05
    # The machine whose host ran the same work in half the typical time (its prebuild: docs/step-time.md): its
    # records held out are predicted well at the time it measured, far off for a typical host.
    fast = [r for r in cv if r.case.machine.startswith("GPU-2a96689d")]
    assert len(fast) == 21 and all(0.5 < r.case.hw.host_time < 0.6 for r in fast)
    assert statistics.median(abs(r.step_error) for r in fast) <= 0.113 + 0.01
    assert max(abs(r.step_error) for r in fast) <= 0.255 + 0.01
    assert statistics.median(abs(r.typical / r.case.step_s - 1) for r in fast) > 0.5
    # Not the outlier alone: the records of the other runs that measured their host are closer at their measured
    # time than for a typical host.
    others = [r for r in cv if r.case.hw.host_time and not r.case.machine.startswith("GPU-2a96689d")]
    assert len(others) == 58 and len({r.case.run for r in others}) == 6
    assert statistics.median(abs(r.step_error) for r in others) <= 0.040 + 0.005
    assert statistics.median(abs(r.typical / r.case.step_s - 1) for r in others) >= 0.06


def test_leave_one_machine_out_step_time_error_is_pinned(cases):
    # Each machine's records predicted by constants fitted on the other machines' (its host new to them, its
    # results files too), its host's time against theirs; pinned at what the fit achieves (docs/step-time.md).
    s = time_summary(cross_validate_time(cases, by="machine"))
    assert s["n"] == FIT["records"] and len({c.machine for c in cases}) >= 20
    assert s["median"] <= 0.053 + 0.005
    assert s["p95"] <= 0.233 + 0.01


def test_cross_validated_setup_and_start_errors_are_pinned(cv):
    setup, start = time_summary(cv, "setup"), time_summary(cv, "start")
    # Achieved: setup median 22.1%, p95 67.3%; start median 19.1%, p95 88.1%.
    assert setup["n"] >= 300 and setup["median"] <= 0.221 + 0.02 and setup["p95"] <= 0.673 + 0.03
    assert start["n"] >= 300 and start["median"] <= 0.191 + 0.02 and start["p95"] <= 0.881 + 0.03
    wall = time_summary(cv, "wall")
    # Achieved: wall median 10.3%, p95 50.4%.
    assert wall["n"] >= 300 and wall["median"] <= 0.103 + 0.02 and wall["p95"] <= 0.504 + 0.03


def test_the_published_band_is_the_held_out_error_of_the_fit(cases, cv):
    typical, host, files = error_band(cases, cv)
    assert files == TRAIT_FILES
    for band, shipped in ((typical, STEP_BAND), (host, STEP_BAND_HOST)):
        assert sorted(band) == sorted(shipped) == ["familiar", "gpu-bound", "host-bound", "mixed", "unfamiliar"]
        for group, b in band.items():
            assert b["n"] == shipped[group]["n"] and b["level"] == shipped[group]["level"], group
            for key in ("median", "p95", "low", "high"):
                assert b[key] == pytest.approx(shipped[group][key], abs=2e-3), (group, key)
    # Where the step waits on the host, machines with the same GPU differ most: for a host not measured the
    # host-bound band is wider than the GPU-bound one, and a trait the fit saw in fewer files widens it too.
    g, h, u = STEP_BAND["gpu-bound"], STEP_BAND["host-bound"], STEP_BAND["unfamiliar"]
    assert h["high"] - h["low"] > 2 * (g["high"] - g["low"]) and u["high"] - u["low"] > g["high"] - g["low"]
    # "familiar" holds both familiar groups: answer mode's prior width (its p95 of |log error|).
    assert STEP_BAND["familiar"]["n"] == g["n"] + STEP_BAND["mixed"]["n"] + h["n"]
    assert 0.1 < STEP_BAND["familiar"]["p95"] < 0.5
    # A cell whose GPU hides its host (host share below GPU_BOUND) misses least: its band is the narrowest.
    for bands in (STEP_BAND, STEP_BAND_HOST):
        widths = [bands[b]["high"] - bands[b]["low"] for b in ("gpu-bound", "mixed", "host-bound")]
        assert widths == sorted(widths)
    # Where the host's time was measured, a host-bound cell's band is half as wide: the fast host is no
    # longer a surprise (0.77-1.33 against 0.47-1.37).
    hh = STEP_BAND_HOST["host-bound"]
    assert hh["high"] - hh["low"] < 0.6 * (h["high"] - h["low"])
    assert STEP_BAND_HOST["familiar"]["p95"] < STEP_BAND["familiar"]["p95"]


def test_the_band_covers_held_out_records_of_files_it_was_neither_derived_nor_calibrated_on(cases, cv):
    cover = band_coverage(cases, cv)
    inside, n = cover["all"]
    # Each file's held-out errors against the band derived from the other files' held-out errors, at the
    # levels calibrated on those files alone (STEP_BAND_HOST's where the record's run measured its host's
    # time, STEP_BAND's elsewhere): docs/step-time.md gives the coverage.
    assert n == FIT["records"] and inside >= 0.955 * n
    # Those whose run measured its host:
    inside, n = cover["all, host measured"]
    assert inside >= 0.95 * n
    assert cover["all, host not measured"][1] == FIT["records"] - n
    assert cover["gpu-bound"][0] / cover["gpu-bound"][1] >= 0.91
    assert BAND_COVERAGE == 0.95


def test_a_hosts_time_is_its_op_prebuild_against_the_typical_hosts():
    # bench.execute.prepare compiles DeepSpeed's optimizer ops once per machine, each op in a process of its
    # own: two machines' times for the three (docs/step-time.md, the hosts' times).
    three = {"CPUAdamBuilder": "built", "FusedAdamBuilder": "built", "FusedLambBuilder": "built"}
    assert host_time_of({"ops": three, "ops_s": 35.1}) == pytest.approx(35.1 / REF_OPS_S)
    assert 0.5 < host_time_of({"ops": three, "ops_s": 35.1}) < 0.55
    assert host_time_of({"ops": three, "ops_s": 67.4}) == pytest.approx(1.02, abs=0.01)
    # Nothing compiled (the machine's cache held the ops, or the helper found them built): nothing timed it.
    assert host_time_of({"ops": {"FusedAdamBuilder": "cached"}, "forkserver_import_s": 13.5}) is None
    assert host_time_of({"ops": {"FusedAdamBuilder": "cached", "CPUAdamBuilder": "loaded"}, "ops_s": 20.8}) is None
    assert host_time_of({"ops": {"FusedAdamBuilder": "built", "CPUAdamBuilder": "failed"}, "ops_s": 40.0}) is None
    assert host_time_of({"ops": {"AsyncIOBuilder": "built"}, "ops_s": 9.0}) is None  # a far smaller compile
    assert host_time_of(None) is None and host_time_of({}) is None


def test_the_hosts_parts_take_the_hosts_time_and_a_host_not_measured_is_the_typical_one(cases):
    qlora = Cell(model="llama-7b", seq_len=2048, micro_batch=1, grad_accum=4, peft="qlora", lora=Lora(r=16))
    qlora = dataclasses.replace(qlora, qlora=Qlora(), zero_stage=1, optimizer="adamw_8bit")
    fast, typical = Hardware(gpu_name="NVIDIA H200", host_time=0.5), Hardware(gpu_name="NVIDIA H200", host_time=1.0)
    slow, fast_parts = step_parts(qlora, H200), step_parts(qlora, fast)
    for part, (base, _) in slow.items():
        assert fast_parts[part][0] == pytest.approx(base * (0.5 if part in HOST_PARTS else 1.0)), part
    # A host-bound cell takes little more than half the time on a host twice as fast, a GPU-bound one not
    # much less; a host measured typical is predicted as one not measured.
    gpu = Cell(model="llama-1b", seq_len=2048, micro_batch=4, zero_stage=2)
    assert predict_step(qlora, fast) < 0.65 * predict_step(qlora, H200)
    assert predict_step(gpu, fast) > 0.85 * predict_step(gpu, H200)
    assert predict_step(qlora, typical) == pytest.approx(predict_step(qlora, H200))
    assert host_share(qlora, fast) < host_share(qlora, H200)
    for cell in (qlora, gpu):  # answer mode's one pass gives both figures as each alone gives it
        assert step_and_share(cell, fast) == (predict_step(cell, fast), host_share(cell, fast))
    assert step_and_share(dataclasses.replace(gpu, model="no-such-model")) is None
    # Its band is the one of predictions that took the host's time: narrower than a host not measured gets.
    for hw in (fast, typical):
        low, pred, high = step_time_band(qlora, hw)
        wide = step_time_band(qlora, H200)
        assert pred == predict_step(qlora, hw) and high / low < 0.7 * wide[2] / wide[0]
    # The records whose run compiled the ops carry their host's time; older records and those whose machine's
    # cache held the ops carry none, and are predicted for the typical host.
    measured = [c for c in cases if c.hw.host_time is not None]
    assert len(measured) == 79 and {c.file for c in cases if c.file.startswith("1b")}.isdisjoint(
        {c.file for c in measured}
    )
    assert all(c.ops_s and c.hw.host_time == pytest.approx(c.ops_s / REF_OPS_S) for c in measured)


def test_fitted_free_the_host_times_exponent_is_near_the_physics_one(cases):
    # The model holds the exponent of the host's time on the host's parts at 1 (a host that compiles in half
    # the time launches kernels in half the time). Fitted with the rest from a prior of 0 (the prebuild says
    # nothing of the step), every record puts it at 1.25.
    assert 1.0 < host_exponent(cases) < 1.5


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
    assert band_group(cell, hw=H200) == "mixed" and GPU_BOUND <= host_share(cell, H200) < HOST_BOUND
    # At micro-batch 16 the matmuls hide the host's work: the narrowest band.
    big = dataclasses.replace(cell, micro_batch=16)
    assert band_group(big, hw=H200) == "gpu-bound" and host_share(big, H200) < GPU_BOUND
    blow, bpred, bhigh = step_time_band(big, H200)
    assert bhigh / blow < high / low
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
    # QLoRA micro-batches of 2048, 4096 and 8192 tokens cost about the same (the host's launches), as the
    # committed memcheck records measured; one of 32768 costs more (the GPU's work).
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
    # Records made by the shipped constants, except that one machine's host runs at half the speed its op
    # prebuild measured: the fast machine above, whose cells (7B LoRA and QLoRA at micro-batch 1 x 4, the HF
    # Trainer's) no other machine ran. With a host offset per machine the refit
    # predicts its cells at its measured host time far closer to the truth than one fit without, and every
    # other machine's no worse.
    from bench.estimate import steptime
    from bench.estimate.checks import timecheck

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
    assert apart[1] < 0.25 and apart[1] <= together[1]


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
    from bench.estimate.planning.search import seed_micro_batch

    hw = Hardware(gpu_memory_bytes=143771 * 2**20, gpu_name="NVIDIA H200")
    auto = Cell(model="llama-1b", seq_len=512, micro_batch="auto")
    seed = seed_micro_batch(auto, hw)
    assert seed > 1 and predict_wall(auto, hw) == predict_wall(dataclasses.replace(auto, micro_batch=seed), hw)
    out = _zerobench("run", "matrices/mb-auto-1b.yaml", "--dry-run", "--assume-gpus", "1", "--gpu-mem", "143771MiB")
    assert "predicted GPU time (3 cells" in _gpu_time_line(out)


def test_nested_cross_validation_with_one_grid_point_is_the_plain_one():
    # tools.steptime_nested picks the fit's hyperparameters inside each fold; over all committed records it
    # gave median 5.9%, p95 27.5%, 307 of 325 inside the band (python -m tools.steptime_nested). With the shipped
    # values as the only choice it is the plain leave-one-file-out check, and it leaves the module's values.
    from bench.estimate import steptime
    from bench.estimate.checks import timecheck
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


def test_an_adaptive_cell_is_predicted_to_run_its_fewest_steps_within_its_caps():
    a = Adaptive(settle_window=3, min_steps=6, max_seconds=120)
    cell = Cell(model="llama-7b", seq_len=2048, warmup_steps=20, measured_steps=30, adaptive=a)
    assert steps_of(cell, 1.0) == 4 + 6  # the first step, the window of 3, then the fewest measured
    assert steps_of(cell, 1.0, warm=8, meas=40) == 8 + 30  # a phase that would run on stops at its step cap
    # The first step, twice as long (it compiles), counts into the time cap as the worker's Schedule counts it:
    assert steps_of(cell, 12.0) == 4 + 5  # settled after 4 steps (60 s); measuring passes 120 s after 5
    assert steps_of(cell, 30.0) == 1 + 3  # the first step alone passes half of 120 s; then 3 measured at least
    assert steps_of(dataclasses.replace(cell, adaptive=None), 30.0) == 50  # fixed counts run whatever they take


def test_predicted_wall_of_adaptive_cells_is_near_what_their_records_took():
    """Over the committed 7b records (adaptive steps, as answer mode ran them: rung 0's short look or the matrix's
    own schedule), the recorded wall over the wall predicted at the record's own step time: the median within
    x0.8-1.6 (it was x0.36 when the prediction counted the steps' caps; unsteady cells run past the fewest)."""
    ratios = []
    for path in RESULTS:
        for raw in as_written(path):
            cell = raw.get("cell") and Cell.from_dict(raw["cell"])
            if raw.get("status") != "ok" or not cell or cell.adaptive is None or not raw.get("wall_s"):
                continue
            ran = rung_cell(cell, (raw.get("answer") or {}).get("rung", 1))
            ratios.append(raw["wall_s"] / predict_wall(ran, H200, step=raw["metrics"]["step_time_median_s"]))
    assert len(ratios) >= 30 and 0.8 <= statistics.median(ratios) <= 1.6, (len(ratios), statistics.median(ratios))
