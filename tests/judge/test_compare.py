"""`zerobench compare`: the decision logic on records of known shape, through the real command (exit
codes, Markdown), and the statistics under it (bench/stats.py) against exact values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import stats
from bench.judge import compare, comparetext
from bench.judge.results import records_to_frame
from bench.matrix.spec import CompareSettings, MatrixError, loads
from bench.records import quality
from bench.records.record import parse
from bench.records.store import read
from tests.conftest import zerobench

GiB = 2**30
PROV = {
    "host": "fixture",
    "gpu_name": "NVIDIA H200",
    "gpu_count": 1,
    "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_bytes": 141 * GiB}],
    "driver": "580.1",
    "versions": {"torch": "2.11.0", "deepspeed": "0.19.6"},
}


def rec(cell: int, repeat: int, *, tps: float, status: str = "ok", alloc: float = 20 * GiB, prov=None, loss=6.6):
    """One stored record (schema v2) of cell `cell`, repeat `repeat`."""
    name = f"zero={cell},offload=none,prec=bf16"
    r = {
        "schema_version": 2,
        "run_id": "fixture",
        "attempt": repeat,
        "repeat": repeat,
        "matrix": "m",
        "cell_id": f"{name}#{cell:010x}",
        "cell_hash": f"{cell:010x}",
        "cell_name": name,
        "cell": {"zero_stage": cell, "precision": "bf16", "model": "llama-1b", "warmup_steps": 1, "measured_steps": 4},
        "status": status,
        "reason": "" if status == "ok" else f"synthetic {status}",
        "started_at": "2026-12-01T00:00:00+00:00",
        "provenance": prov or PROV,
    }
    if status == "ok":
        step = 8192 / tps if tps else None
        r["metrics"] = {"tokens_per_s": tps, "step_time_median_s": step, "loss_first": 10.78, "loss_final": loss}
        r["memory"] = {"torch_max_allocated_bytes": int(alloc), "nvml_proc_peak_bytes": int(alloc + 4 * GiB)}
        r["step_times_s"] = [1.0] + [step or 0.0] * 4
    return r


def frame(recs):
    return records_to_frame(map(parse, recs))


def run_cmp(base, cur, **kw):
    return compare.compare(frame(base), frame(cur), **kw)


def verdict(cmp, cell: int = 0) -> compare.CellComparison:
    return next(c for c in cmp.cells if c.key == f"{cell:010x}")


# 1% run-to-run noise, three repeats a side.
NOISE = (1.0, 1.01, 0.99)


def test_genuine_slowdown_with_low_noise_is_flagged():
    base = [rec(0, i + 1, tps=30_000 * f) for i, f in enumerate(NOISE)]
    cur = [rec(0, i + 1, tps=27_000 * f) for i, f in enumerate(NOISE)]  # 10% slower
    c = verdict(run_cmp(base, cur))
    assert c.verdict == compare.REGRESSION
    tok = c.figures["tokens_per_s"]
    assert tok.p == pytest.approx(0.05) and tok.ratio == pytest.approx(0.9)
    assert tok.ci[0] < 0.9 < tok.ci[1] < 1, "the interval of the ratio excludes 1"
    assert any("tokens/s" in r for r in c.reasons)


def test_aa_pair_is_not_flagged():
    base = [rec(0, i + 1, tps=30_000 * f) for i, f in enumerate(NOISE)]
    cur = [rec(0, i + 1, tps=30_000 * f) for i, f in enumerate((1.005, 0.995, 1.0))]
    cmp = run_cmp(base, cur)
    assert verdict(cmp).verdict == compare.UNCHANGED and cmp.exit_code == 0


def test_separated_but_small_change_is_not_flagged():
    """Every current repeat slower by 2% (p = 0.05), repeats that agree to 0.1%: the interval is as wide as the
    measured noise of an H200 measurement allows (bench.records.quality), not as the repeats' chance agreement, and
    covers ×1."""
    base = [rec(0, i + 1, tps=30_000 * f) for i, f in enumerate((1.0, 1.001, 0.999))]
    cur = [rec(0, i + 1, tps=29_400 * f) for i, f in enumerate((1.0, 1.001, 0.999))]
    tok = verdict(run_cmp(base, cur)).figures["tokens_per_s"]
    assert tok.p == pytest.approx(0.05) and tok.verdict == stats.NO_CHANGE and "covers ×1" in tok.why
    half = math.log(tok.ci[1] / tok.ratio)
    assert half == pytest.approx(stats.normal_quantile(0.9) * quality.NOISE["gpu"] * math.sqrt(2 / 3), rel=1e-6)


def test_noisy_cell_with_large_median_change_is_not_flagged():
    """Medians 10% apart, but the repeats overlap: the test cannot tell it from noise."""
    base = [rec(0, i + 1, tps=t) for i, t in enumerate((30_000, 26_000, 33_000))]
    cur = [rec(0, i + 1, tps=t) for i, t in enumerate((27_000, 31_000, 24_000))]
    tok = verdict(run_cmp(base, cur)).figures["tokens_per_s"]
    assert tok.ratio < 0.95 and tok.p > 0.05 and tok.verdict == stats.NO_CHANGE


def test_one_repeat_a_side_is_judged_by_the_noise_of_two_measurements_and_says_so():
    base, cur = [rec(0, 1, tps=30_000)], [rec(0, 1, tps=27_000)]  # 10%
    cmp = run_cmp(base, cur)
    tok = verdict(cmp).figures["tokens_per_s"]
    # The interval is the measured noise of two single measurements: it excludes x1 and reaches inside 5%.
    half = stats.normal_quantile(0.9) * quality.NOISE["gpu"] * math.sqrt(2)
    assert tok.ci == pytest.approx((0.9 * math.exp(-half), 0.9 * math.exp(half))) and tok.p is None
    assert tok.verdict == stats.NOT_SETTLED and verdict(cmp).verdict == compare.NOT_SETTLED and cmp.exit_code == 0
    assert cmp.single_repeat and "noise cannot be estimated" in comparetext.markdown(cmp)
    far = verdict(run_cmp(base, [rec(0, 1, tps=24_000)]))  # 20%: the whole interval beyond 5%
    assert far.verdict == compare.REGRESSION and far.figures["tokens_per_s"].ci[1] < 1 / 1.05


def test_zero_and_missing_baseline_figures_are_no_data_not_a_crash():
    base = [rec(0, 1, tps=0.0), rec(1, 1, tps=30_000)]
    del base[1]["metrics"]["tokens_per_s"]
    cur = [rec(0, 1, tps=30_000), rec(1, 1, tps=30_000)]
    cmp = run_cmp(base, cur)
    for cell in (0, 1):
        tok = verdict(cmp, cell).figures["tokens_per_s"]
        assert tok.verdict == stats.NO_DATA and verdict(cmp, cell).verdict != compare.REGRESSION
    assert "baseline's figure is 0" in verdict(cmp, 0).figures["tokens_per_s"].why
    comparetext.markdown(cmp)  # renders


def test_new_failure_is_a_regression_and_a_fix_an_improvement():
    base = [rec(0, r, tps=30_000) for r in (1, 2, 3)] + [rec(1, 1, tps=0, status="cuda_oom")]
    cur = [rec(0, 1, tps=30_000), rec(0, 2, tps=0, status="cuda_oom"), rec(0, 3, tps=30_000), rec(1, 1, tps=9_000)]
    cmp = run_cmp(base, cur)
    assert verdict(cmp, 0).verdict == compare.REGRESSION and "cuda_oom now" in verdict(cmp, 0).reasons[0]
    assert verdict(cmp, 1).verdict == compare.IMPROVEMENT
    assert cmp.exit_code == 1


def test_environment_mismatch_is_not_comparable_never_a_regression():
    other = {**PROV, "gpu_name": "NVIDIA H100 80GB HBM3", "versions": {"torch": "2.11.0", "deepspeed": "0.19.7"}}
    base = [rec(0, r, tps=30_000 * f) for r, f in zip((1, 2, 3), NOISE)]
    cur = [rec(0, r, tps=15_000 * f, prov=other) for r, f in zip((1, 2, 3), NOISE)]  # half as fast
    cmp = run_cmp(base, cur)
    c = verdict(cmp)
    # Never a regression (1); compared nothing, so no pass (0) either: 3, compared too little.
    assert c.verdict == compare.NOT_COMPARABLE and cmp.exit_code == compare.EXIT_TOO_LITTLE
    assert {d[0] for d in c.environment_diff} == {"GPU", "DeepSpeed"}
    assert "not comparable" in comparetext.markdown(cmp)


def test_memory_growth_is_flagged_by_its_tight_bound():
    base = [rec(0, r, tps=30_000 * f) for r, f in zip((1, 2, 3), NOISE)]
    cur = [rec(0, r, tps=30_000 * f, alloc=20 * GiB * 1.05) for r, f in zip((1, 2, 3), NOISE)]
    c = verdict(run_cmp(base, cur))
    assert c.verdict == compare.REGRESSION and c.figures["torch_max_allocated_bytes"].verdict == stats.REGRESSION
    assert c.figures["tokens_per_s"].verdict == stats.NO_CHANGE
    # 0.5% more: inside the 1% bound.
    cur = [rec(0, r, tps=30_000 * f, alloc=20 * GiB * 1.005) for r, f in zip((1, 2, 3), NOISE)]
    assert verdict(run_cmp(base, cur)).verdict == compare.UNCHANGED


def test_final_loss_bound():
    base = [rec(0, r, tps=30_000, loss=6.60) for r in (1, 2, 3)]
    assert verdict(run_cmp(base, [rec(0, r, tps=30_000, loss=6.61) for r in (1, 2, 3)])).verdict == compare.UNCHANGED
    worse = verdict(run_cmp(base, [rec(0, r, tps=30_000, loss=6.68) for r in (1, 2, 3)]))
    assert worse.verdict == compare.REGRESSION and "final loss" in worse.reasons[0]


def test_old_records_without_a_repeat_are_repeat_one():
    old = rec(0, 1, tps=30_000)
    del old["repeat"]
    s = compare.samples(frame([old]))
    assert s["0000000000"].repeats == 1 and s["0000000000"].values["tokens_per_s"] == [30_000]


def test_last_record_of_a_repeat_stands_for_it():
    """An interrupted repeat re-run by --resume: the re-run is the sample, not both."""
    recs = [rec(0, 1, tps=30_000), rec(0, 2, tps=0, status="interrupted"), rec(0, 2, tps=31_000)]
    s = compare.samples(frame(recs))["0000000000"]
    assert s.repeats == 2 and s.status == "ok" and s.values["tokens_per_s"] == [30_000, 31_000]


# -- thresholds -------------------------------------------------------------------------------------


def test_thresholds_from_the_matrix_and_a_file(tmp_path):
    m = tmp_path / "m.yaml"
    m.write_text("model: llama-tiny\ncompare: {min_effect: 0.1, alpha: 0.1}\n")
    t = tmp_path / "t.yaml"
    t.write_text("alpha: 0.02\n")
    s, source = compare.settings([str(m)], str(t))
    assert (s.min_effect, s.alpha, s.memory_tolerance) == (0.1, 0.02, CompareSettings().memory_tolerance)
    assert source == f"defaults + {m} + {t}"
    t.write_text("min_efect: 0.1\n")
    with pytest.raises(MatrixError, match="min_efect"):
        compare.settings([], str(t))
    assert loads("compare: {min_effect: 0.1}\nrepeats: 3\n").repeats == 3
    with pytest.raises(MatrixError, match="repeats"):
        loads("repeats: 0\n")


# -- the command ------------------------------------------------------------------------------------


def _write(path: Path, recs) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_cli_exit_codes_and_markdown(tmp_path):
    base = _write(tmp_path / "base.jsonl", [rec(0, r, tps=30_000 * f) for r, f in zip((1, 2, 3), NOISE)])
    same = _write(tmp_path / "same.jsonl", [rec(0, r, tps=30_100 * f) for r, f in zip((1, 2, 3), NOISE)])
    slow = _write(tmp_path / "slow.jsonl", [rec(0, r, tps=26_000 * f) for r, f in zip((1, 2, 3), NOISE)])
    r = zerobench("compare", str(base), str(same), "--md", str(tmp_path / "aa.md"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = zerobench("compare", str(base), str(slow), "--md", str(tmp_path / "ab.md"), cwd=tmp_path)
    assert r.returncode == 1 and "regression: zero=0" in r.stdout
    md = (tmp_path / "ab.md").read_text()
    assert "**1 regression**" in md and "| 🔴 |" in md
    assert zerobench("compare", str(base), str(tmp_path / "nope.jsonl"), cwd=tmp_path).returncode == 2
    empty = _write(tmp_path / "empty.jsonl", [])
    assert zerobench("compare", str(base), str(empty), cwd=tmp_path).returncode == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("alpha: 2\n")
    r = zerobench("compare", str(base), str(slow), "--thresholds", str(bad), cwd=tmp_path)
    assert r.returncode == 2 and "alpha" in r.stderr


def test_committed_runs_on_two_machines_are_not_compared_raw():
    """The two committed runs of the 1.1B cells ran on two H200 machines (their GPUs' UUIDs differ) and share two
    cells: too few to tell the machines' difference from a change of one cell, so tokens/s is not compared;
    memory, which the machine's speed does not move, still is."""
    root = Path(__file__).resolve().parents[2] / "results"
    cmp = compare.compare(records_to_frame(read(root / "1b.jsonl")), records_to_frame(read(root / "1b-rerun.jsonl")))
    assert not cmp.machines.same and cmp.machines.anchors == 2 and cmp.machines.offset is None
    z0 = verdict_by_hash(cmp, "0a1eaba46b")
    assert z0.figures["tokens_per_s"].ratio == pytest.approx(30643 / 34910, rel=1e-3)
    assert z0.verdict == compare.NOT_COMPARABLE and "different machines" in z0.reasons[0]
    assert z0.figures["torch_max_allocated_bytes"].verdict == stats.NO_CHANGE
    assert "**The sides ran on different machines**" in comparetext.markdown(cmp)
    assert cmp.exit_code == compare.EXIT_TOO_LITTLE  # tokens/s compared in none of its cells: too little


def verdict_by_hash(cmp, h):
    return next(c for c in cmp.cells if c.key == h)


# -- statistics -------------------------------------------------------------------------------------


def test_mann_whitney_exact():
    assert stats.mann_whitney([4, 5, 6], [1, 2, 3], "greater") == pytest.approx(1 / 20)
    assert stats.mann_whitney([4, 5, 6], [1, 2, 3], "two-sided") == pytest.approx(2 / 20)
    assert stats.mann_whitney([1, 2, 3], [4, 5, 6], "greater") == pytest.approx(1.0)
    # U = 1 of 9 for x: P(U <= 1) = 2/20 under the null.
    assert stats.mann_whitney([1, 2.5, 3.5], [2, 4, 5], "less") == pytest.approx(0.2)
    # Ties enumerate the splits of the pooled values: [1,1] vs [1,2] -> U = 1; half the splits give 1, half 3.
    assert stats.mann_whitney([1, 1], [1, 2], "less") == pytest.approx(0.5)


def test_mann_whitney_normal_approximation_agrees_with_exact():
    x, y = [float(i) for i in range(0, 40, 2)], [float(i) + 0.5 for i in range(10, 50, 2)]
    exact = stats.mann_whitney(x, y, "less")  # distinct values: the exact path (20 x 20)
    n = 12
    big_x, big_y = x * 1 + [v + 100 for v in x[:n]], y + [v + 100 for v in y[:n]]
    assert 0 < exact < 0.01
    assert 0 < stats.mann_whitney(big_x, big_y, "less") < 0.5


def test_median_interval_coverage():
    lo, hi, conf = stats.median_ci(list(range(1, 21)))
    assert (lo, hi) == (6, 15) and conf == pytest.approx(0.9586, abs=1e-4)
    lo, hi, conf = stats.median_ci([3.0, 1.0, 2.0])
    assert (lo, hi) == (1.0, 3.0) and conf == pytest.approx(0.75)
    assert stats.median_ci([]) == (None, None, None)


def test_ratio_interval():
    est, lo, hi, conf = stats.ratio_ci([100, 101, 99], [90, 91, 89], conf=0.9)
    assert est == pytest.approx(0.9, abs=0.002) and lo < est < hi < 1 and conf == pytest.approx(0.9)
    assert stats.ratio_ci([100], [90])[1:] == (None, None, None)
    assert math.isclose(stats.median([1, 2, None, float("nan"), 3]), 2)


def test_t_quantiles_against_the_table():
    # Student's t, two-sided 95% (Abramowitz and Stegun's table 26.10); the normal's beyond 1000 df.
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 30: 2.042, 120: 1.980}
    for df, t in table.items():
        assert stats.t_quantile(0.95, df) == pytest.approx(t, abs=6e-4), df
    assert stats.t_quantile(0.99, 1) == pytest.approx(63.657, abs=1e-3)
    assert (
        stats.t_quantile(0.95, 5000) == pytest.approx(stats.normal_quantile(0.95)) == pytest.approx(1.95996, abs=1e-5)
    )
    est, lo, hi = stats.log_mean_ci([math.log(0.8), math.log(0.9)])
    assert est == pytest.approx(math.sqrt(0.72)) and lo < 0.8 and hi > 0.9
    assert stats.log_mean_ci([0.1]) is None


# -- reports use the same rule -------------------------------------------------------------------------


def _effect(recs) -> dict:
    from bench.report.analysis import analyse

    a = analyse(frame(recs))
    (section,) = a.sections
    (ab,) = [x for x in section.ablations if x.axis == "zero_stage"]
    return ab.effects[0], a


def test_report_says_no_significant_difference_inside_the_noise():
    recs = [rec(0, r, tps=30_000 * f) for r, f in zip((1, 2, 3), NOISE)]
    recs += [rec(1, r, tps=30_300 * f) for r, f in zip((1, 2, 3), (0.99, 1.0, 1.01))]  # 1% apart
    e, a = _effect(recs)
    t = e["tokens"]
    assert t.verdict == "no significant difference" and t.why == "the interval covers ×1"
    # The one rule: the two cells' noise over their repeats (1% apart is inside it), at 95%, said so.
    assert t.method == "1 pair: the two cells' noise, with repeats" and t.ci_conf == 0.95
    assert t.ci[0] < 1 < t.ci[1] and e["n"] == 1
    row = a.cells[a.cells["cell_hash"] == f"{0:010x}"].iloc[0]
    assert row["repeats"] == 3 and row["tokens_per_s"] == pytest.approx(30_000)
    # The cell's own interval: three repeats agreeing to 1% are not surer than three H200 measurements' noise.
    half = 1.959964 * quality.NOISE["gpu"] / math.sqrt(3)
    low, high = 30_000 * math.exp(-half), 30_000 * math.exp(half)
    assert (row["tokens_per_s_ci_low"], row["tokens_per_s_ci_high"]) == pytest.approx((low, high))
    from bench.report.markdown import render_analysis

    md = render_analysis(a)
    assert "no significant difference" in md and f"30,000 [{low:,.0f}–{high:,.0f}, 95%, n=3]" in md


def test_report_ranks_an_effect_beyond_the_noise():
    recs = [rec(0, r, tps=30_000 * f) for r, f in zip((1, 2, 3), NOISE)]
    recs += [rec(1, r, tps=24_000 * f) for r, f in zip((1, 2, 3), NOISE)]
    e, _ = _effect(recs)
    assert e["tokens"].verdict == "slower" and e["tokens"].ci[1] < 1


def test_report_single_runs_are_as_uncertain_as_two_measurements():
    e, a = _effect([rec(0, 1, tps=30_000), rec(1, 1, tps=32_000)])  # x1.07, one run each
    # Steady steps would give each run a zero-width interval; the noise of two H200 measurements covers x1.
    t = e["tokens"]
    half = 1.959964 * quality.NOISE["gpu"] * math.sqrt(2)
    assert t.ci == pytest.approx((32 / 30 * math.exp(-half), 32 / 30 * math.exp(half)))
    assert t.ci[0] < 1 and t.verdict == "no significant difference"
    from bench.report.markdown import render_analysis

    assert "| ZeRO stage | 1 vs 0 | 1 | ×1.07 [0.99–1.15, 95%] | no significant difference |" in render_analysis(a)


# -- the faults the gate is checked with --------------------------------------------------------------


def test_fault_spec():
    from bench.matrix.faults import FaultError, for_worker, parse

    text = "slow=12~abc,mem=512"
    assert str(for_worker(text, 0, "zero=0#abcdef0123")) == "slow=12@0", "the first spec naming this cell"
    assert str(for_worker(text, 0, "zero=1#ffff000000")) == "mem=512@0", "a spec without a cell applies to every cell"
    assert for_worker("raise@2#1,slow=10@3", 0, "x").value == 10.0, "rank 0 skips the rank-1 spec"
    assert str(for_worker("hang", 0, "x")) == "hang@1"
    for bad in ("slow", "mem=", "hang=3", "fast=2"):
        with pytest.raises(FaultError):
            parse(bad)
    assert for_worker("", 0, "x") is None


def test_a_flagged_measurement_counts_by_its_noise_not_as_much_as_a_clean_one():
    clean, flagged = quality.NOISE["gpu"], quality.NOISE["gpu_flagged"]
    logs, sds = [9.495, 9.455, 9.29], [clean, clean, flagged]  # two clean runs and one host-bound, far below
    mean, var = stats.log_mean(logs, sds)
    assert 9.455 < mean < 9.475  # the plain mean, 9.413, would put it behind a cell measured at 9.42
    assert var > clean**2  # values this far apart: their spread, not their noise
    floor = stats.log_mean([9.46] * 3, sds)[1]
    assert abs(floor - 1 / (2 / clean**2 + 1 / flagged**2)) < 1e-15 < clean**2 / 2 - floor  # surer than two clean
    assert stats.log_mean([1.0, 2.0], [0.1, 0.1]) == (1.5, max(0.01 / 2, 0.5 / 2))  # equal noise: the plain mean
    unknown = [stats.log_mean([1.0, 1.3, 0.7], sds)[0] for sds in ([0.1], [0.0, 0.1, 0.2])]  # noise not known for each
    assert unknown == [1.0, 1.0]  # the plain mean
    d, dvar = stats.log_diff([9.42], [clean], logs, sds)
    assert abs(d - (mean - 9.42)) < 1e-12 and dvar >= var + clean**2 - 1e-12


def _slower(r: dict, factor: float) -> dict:
    """A stored record's copy whose cell ran `factor` times as slow."""
    r = json.loads(json.dumps(r))
    if r.get("metrics"):
        r["metrics"]["tokens_per_s"] /= factor
        r["metrics"]["step_time_median_s"] *= factor
        r["step_times_s"] = [t * factor for t in r["step_times_s"]]
    return r


def test_a_record_that_does_not_name_its_machine_does_not_make_the_sides_one_machine(tmp_path):
    """The committed runs a1 and a3 ran on two H200s (their GPUs' UUIDs differ); a3 made 12% slower against a1 is
    judged across machines (its common slowdown is the machines' difference). One record of the 24 without its
    GPU's UUID names no machine: unknown, not the same machine, so the verdict stays the one across machines."""
    root = Path(__file__).resolve().parents[2] / "results"
    base = records_to_frame(read(root / "compare-h200-a1.jsonl"))
    lines = (root / "compare-h200-a3.jsonl").read_text().splitlines()
    slow = [_slower(json.loads(x), 1.12) for x in lines]  # as stored (schema v2): the machine from the UUIDs
    whole = compare.compare(base, records_to_frame(read(_write(tmp_path / "a.jsonl", slow))))
    assert not whole.machines.same and whole.machines.offset is not None and whole.exit_code == 0
    ok = next(i for i, r in enumerate(slow) if r["status"] == "ok")
    for g in slow[ok]["provenance"]["gpus"]:
        g.pop("uuid")
    cmp = compare.compare(base, records_to_frame(read(_write(tmp_path / "b.jsonl", slow))))
    assert None in cmp.machines.current and not cmp.machines.same
    assert cmp.machines.offset == pytest.approx(whole.machines.offset, abs=0.01)
    assert cmp.exit_code == 0 and not cmp.regressions
    assert "unknown" in comparetext.markdown(cmp)


def test_sides_that_never_name_a_machine_are_compared_directly():
    """Records from before machine ids name none on either side: nothing says they differ, so they compare directly."""
    cmp = run_cmp([rec(0, i + 1, tps=30_000 * f) for i, f in enumerate(NOISE)], [rec(0, 1, tps=30_000)])
    assert cmp.machines.same and cmp.machines.baseline == (None,) and cmp.machines.current == (None,)


def test_markdown_escapes_html_in_cell_names_and_driver_strings():
    """Names and environment strings are data: a pull-request comment shows them as text, never as markup."""
    evil = {**PROV, "driver": "<img src=x onerror=alert(1)>"}
    base = [rec(0, 1, tps=30_000), rec(1, 1, tps=30_000)]
    cur = [rec(0, 1, tps=30_000, prov=evil), rec(1, 1, tps=30_000)]
    for r in base + cur:
        if r["cell_hash"] == f"{1:010x}":
            r["cell_name"] = r["cell_id"] = "<script>alert(1)</script>|zero=1"
            r["cell_id"] += f"#{1:010x}"
    md = comparetext.markdown(run_cmp(base, cur))
    assert "<img" not in md and "<script" not in md
    assert "&lt;img src=x onerror=alert(1)&gt;" in md and "&lt;script&gt;alert(1)&lt;/script&gt;\\|zero=1" in md


def test_a_baseline_folder_of_two_runs_keeps_each_runs_repeats(tmp_path):
    """Two runs of the same cells (three repeats each, numbered 1-3 in both) in one folder: six samples of each
    cell, not the second file's three standing for both."""
    from bench.judge.results import load

    root = Path(__file__).resolve().parents[2] / "results"
    folder = tmp_path / "base"
    folder.mkdir()
    for name in ("compare-h200-a1.jsonl", "compare-h200-a2.jsonl"):
        (folder / name).write_bytes((root / name).read_bytes())
    cmp = compare.compare(load(folder), load(root / "compare-h200-a1.jsonl"))
    assert cmp.cells and all(c.base.repeats == 6 and len(c.base.values["tokens_per_s"]) == 6 for c in cmp.cells)
    assert all(c.cur.repeats == 3 for c in cmp.cells)
    # One file whose run was resumed keeps a repeat's last record: the resume replaced that attempt.
    one = compare.samples(load(root / "compare-h200-a1.jsonl"))
    assert all(s.repeats == 3 for s in one.values())
