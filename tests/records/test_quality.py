"""bench.records.quality: the flags a measurement carries (host-bound, unstable, throttled) with their figures, and the
thresholds and noise figures, recomputed from the committed records by tools/noise.py."""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest

from bench.records import quality
from bench.records.record import parse
from tools import answer_sim, noise, step_spread

ROOT = Path(__file__).resolve().parents[2]


def test_thresholds_and_noise_are_what_the_committed_records_give():
    d = noise.derive()
    util, tail = d["host_bound_split"], d["unstable_split"]
    # Each threshold sits in the gap the likeliest split left: every flagged sample on one side of it.
    assert util["below"] < quality.HOST_BOUND_UTIL_PCT <= d["host_bound_util_pct"]
    assert quality.HOST_BOUND_UTIL_PCT == round(d["host_bound_util_pct"], 1)
    assert d["unstable_tail"] <= quality.UNSTABLE_TAIL < -tail["below"]
    assert quality.UNSTABLE_TAIL == round(d["unstable_tail"], 4)
    assert quality.NOISE == {k: round(v, 4) for k, v in d["noise"].items()}
    assert quality.CROSS == {k: round(v, 4) for k, v in d["cross"].items()}
    # A flagged measurement is noisier than a clean one, by more than twice: weaker evidence, measured.
    assert quality.NOISE["gpu_flagged"] > 2 * quality.NOISE["gpu"]
    assert d["samples"]["gpu"] >= 40 and d["samples"]["gpu_flagged"] >= 40 and d["block_pairs"]["gpu"] >= 10
    # A host term per pair of blocks explains what the offsets leave: the simulator's per-machine deviation of a
    # cell (tools.answer_sim.CROSS_OWN) is no less than what the records leave after it.
    hosted = d["cross_hosted"]
    assert hosted["block_pairs"] == d["block_pairs"]["gpu"] and hosted["gpu"] < quality.CROSS["gpu"] / 2
    assert answer_sim.CROSS_OWN >= hosted["gpu"]


def test_answer_modes_short_look_adds_little_to_a_measurements_noise():
    """Why answer mode's rung 0 may be a short look (bench.execute.answer.SHORT_LOOK; tools/noise.py, short_look):
    replayed over the step times of the committed H200 records, its median lands within a fifth of a clean
    measurement's noise of the record's own where the record flags nothing, and within half of a flagged one's
    where it does; no record ran out of steps before the look ended."""
    k = noise.short_look()
    assert k["clean"][0] >= 15 and k["flagged"][0] >= 10 and k["unfinished"] == 0
    assert k["clean"][1] < quality.NOISE["gpu"] / 5
    assert k["flagged"][1] < quality.NOISE["gpu_flagged"] / 2


def _seven_b() -> list[dict]:
    lines = (ROOT / "results" / "7b-answer-h200.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["status"] == "ok"]


def test_a_host_bound_or_unstable_measurement_carries_its_flags_with_the_figures():
    recs = {(r["run_id"][-6:], r["cell_name"], r["attempt"]): r for r in _seven_b()}
    qlora = next(r for k, r in recs.items() if k[0] == "58b02d" and "qlora" in k[1] and "fusedadam" in k[1])
    flags = quality.flags(parse(qlora))
    assert flags[0].startswith("host-bound: GPU busy 53% of the measured steps (< 76.3%)")
    assert (
        flags[1].startswith("unstable: the p90 step") and quality.noise_sd(parse(qlora)) == quality.NOISE["gpu_flagged"]
    )
    clean = next(
        r for k, r in recs.items() if k[0] == "156cb4" and k[1].startswith("zero=1,offload=none,prec=bf16,gc=off")
    )
    assert quality.flags(parse(clean)) == [] and quality.noise_sd(parse(clean)) == quality.NOISE["gpu"]
    # A cell that offloads to the CPU waits on the host by design: low utilisation is no flag there.
    offload = next(r for r in _seven_b() if "offload=optimizer+params" in r["cell_name"])
    assert offload["metrics"]["gpu_util_mean_pct"] < 50
    assert not any(f.startswith("host-bound") for f in quality.flags(parse(offload)))
    # A thermal slowdown NVML reports is a flag; the power cap, the H200's normal state at full load, is not.
    hot = copy.deepcopy(clean)
    hot["metrics"]["throttle_reasons"] = ["sw_power_cap", "hw_thermal_slowdown"]
    (flag,) = quality.flags(parse(hot))
    assert flag.startswith("throttled: hw_thermal_slowdown (SM clock") and "sw_power_cap" not in flag
    assert clean["metrics"]["throttle_reasons"] == ["sw_power_cap"]


def test_cpu_measurements_carry_no_flag_and_the_cpus_noise():
    rec = next(json.loads(x) for x in (ROOT / "tests" / "data" / "smoke_cpu.jsonl").read_text().splitlines()
               if json.loads(x)["status"] == "ok")  # fmt: skip
    assert quality.kind(parse(rec)) == "cpu" and quality.flags(parse(rec)) == []
    assert quality.noise_sd(parse(rec)) == quality.NOISE["cpu"]


def test_step_spread_reads_the_flags_own_window_and_a_first_look_that_converged_is_never_unstable():
    """tools/step_spread.py (docs/answer-mode.md, why the H100 run flagged so many cells): its measured steps give the
    record's own median and p90; and a measurement whose schedule converged on the range of its steps (the first
    look: every step within the tolerance of the median) cannot pass UNSTABLE_TAIL, so a flag marks a cell the
    schedule had to go on measuring."""
    rows = step_spread.measured(str(ROOT / "results/7b-answer-h200.jsonl"))
    assert len(rows) == 30
    first_looks = 0
    for r, steps in rows:
        assert statistics.median(steps) == pytest.approx(r.metrics.step_time_median_s)
        assert step_spread.pct(steps, 0.9) == pytest.approx(r.metrics.step_time_p90_s)
        s = r.steps
        if s.ended == "converged" and s.ci_low_s == min(steps) and s.ci_high_s == max(steps):
            first_looks += 1
            assert s.half_width <= s.tolerance < quality.UNSTABLE_TAIL
            assert not any(f.startswith("unstable") for f in quality.flags(r))
    assert first_looks >= 5
    assert sum(any(f.startswith("unstable") for f in quality.flags(r)) for r, _ in rows) == 10
