"""Adaptive steps (`steps: {warmup: auto, measured: auto}`): the settle and stop rules on known step-time
sequences (bench/records/adaptive.py), the matrix syntax and its errors, the identity of cells with fixed steps,
the record's `steps`, losses compared at a common step, and real cells run through `zerobench run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.judge import compare
from bench.judge.results import records_to_frame
from bench.matrix.cells import Adaptive, Cell
from bench.matrix.spec import MatrixError, expand, load, loads
from bench.records import adaptive
from bench.records.adaptive import Schedule
from bench.records.record import parse
from bench.report import analysis
from tests.conftest import TINY, write_matrix, zerobench

ROOT = Path(__file__).resolve().parents[2]


def feed(schedule: Schedule, times) -> int:
    """Step times into a schedule until it is done, as the worker does; how many steps ran."""
    for n, t in enumerate(times, 1):
        schedule.observe(t)
        if schedule.done:
            return n
    return len(times)


# -- the rules ------------------------------------------------------------------------------------


def test_warmup_settles_after_five_steps_then_measurement_converges():
    s = Schedule(20, 40, Adaptive())
    # compile, allocator growth, then steady: the last 3 of the first 5 lie within 5% of their median
    warm = [3.0, 1.8, 1.0, 1.02, 0.99]
    for t in warm[:4]:
        s.observe(t)
        assert not s.measuring
    s.observe(warm[4])
    assert s.measuring and s.warmup_taken == 5 and s.warmup_ended == "settled"
    steady = [1.0, 1.01, 0.99, 1.0, 1.005, 0.995, 1.0, 1.0]
    ran = feed(s, steady)
    # 6 measured steps: the range [0.99, 1.01] covers the median with 96.9% >= 95%, half-width 1% <= 2%
    assert ran == 6 and s.done and s.ended == "converged"
    out = s.summary()
    assert out["warmup"] == 5 and out["measured"] == 6
    assert (out["ci_low_s"], out["ci_high_s"]) == (0.99, 1.01)
    assert (
        out["ci_level"] == pytest.approx(1 - 2 / 64)
        and out["half_width"] == pytest.approx(0.01)
        and out["median_s"] == 1.0
    )
    assert out["tolerance"] == 0.02 and out["steps_s"] == pytest.approx(sum(warm) + sum(steady[:6]))


def test_noisy_steps_hit_the_step_cap():
    s = Schedule(2, 12, Adaptive(warmup=False))
    ran = feed(s, [5.0, 5.0] + [1.0, 1.5] * 20)
    assert s.warmup_ended == "fixed" and s.warmup_taken == 2
    assert ran == 14 and s.ended == "step cap"
    out = s.summary()
    assert out["measured"] == 12 and out["half_width"] > 0.02 and out["ci_level"] >= 0.95


def test_steps_that_take_no_time_end_at_the_step_cap():
    s = Schedule(2, 6, Adaptive(warmup=False))  # a median of 0 s has no relative width: it never converges
    assert feed(s, [0.0] * 20) == 8 and s.ended == "step cap"


def test_slow_steps_hit_the_time_cap_warmup_at_half_of_it():
    s = Schedule(20, 40, Adaptive(max_seconds=60))
    feed(s, [10.0, 12.0, 9.0, 11.0, 10.0, 12.0, 9.0, 11.0])
    # warmup never settles (12 is 20% above 10); it ends once the steps took 30 s (half the cap): 10+12+9
    assert s.warmup_taken == 3 and s.warmup_ended == "time cap"
    # 31 + 11 + 10 + 12 = 64 s >= 60 with 3 measured steps (the fewest under a time cap)
    assert s.ended == "time cap" and len(s.measured) == 3
    assert s.summary()["max_seconds"] == 60


def test_a_step_longer_than_the_time_cap_still_measures_the_fewest_steps():
    s = Schedule(1, 40, Adaptive(warmup=False, max_seconds=5))
    ran = feed(s, [100.0] * 10)
    assert ran == 1 + adaptive.MIN_MEASURED and s.ended == "time cap"


def test_fixed_steps_end_as_they_always_did():
    s = Schedule(2, 8)
    assert feed(s, [1.0] * 20) == 10
    out = s.summary()
    assert (out["warmup"], out["measured"], out["warmup_ended"], out["ended"]) == (2, 8, "fixed", "fixed")
    assert out["tolerance"] is None and out["ci_level"] == pytest.approx(1 - 2 / 256)
    s0 = Schedule(0, 3)
    assert s0.measuring and feed(s0, [1.0] * 5) == 3


def test_a_diverged_cell_says_its_steps_stopped():
    s = Schedule(2, 8)
    feed(s, [1.0])
    out = s.summary()
    assert (out["warmup"], out["measured"], out["ended"]) == (1, 0, "stopped")


def test_ranks_take_rank_0s_decision():
    rank0, rank1 = Schedule(20, 40, Adaptive()), Schedule(20, 40, Adaptive())
    for t0, t1 in [(3.0, 3.0), (1.0, 1.0), (1.0, 1.5), (1.0, 1.0)]:
        rank0.observe(t0)
        rank1.observe(t1)
        rank1.impose(rank0.state())
        assert (rank1.phase, rank1.warmup_taken) == (rank0.phase, rank0.warmup_taken)
    assert rank1.measuring and rank1.warmup_ended == "settled"
    rank1.observe(1.0)  # rank 1 alone would go on; rank 0 stops at its cap
    rank0.phase, rank0.ended = "done", "step cap"
    rank1.impose(rank0.state())
    assert rank1.done and rank1.ended == "step cap"


# -- the matrix -----------------------------------------------------------------------------------


def test_auto_steps_become_caps_and_settings():
    m = loads("steps: {warmup: auto, measured: auto, tolerance: 0.03, max_steps: 40, max_seconds: 60}\n")
    c = expand(m)[0]
    assert (c.warmup_steps, c.measured_steps) == (20, 40)
    assert c.adaptive == Adaptive(tolerance=0.03, max_seconds=60.0)
    mixed = expand(loads("steps: {warmup: 3, measured: auto}\n"))[0]
    assert (mixed.warmup_steps, mixed.measured_steps) == (3, 50) and mixed.adaptive == Adaptive(warmup=False)
    assert Cell.from_dict(json.loads(json.dumps(c.to_dict()))) == c


@pytest.mark.parametrize(
    "steps,where,what",
    [
        ("{warmup: 2, measured: 8, tolerance: 0.02}", "steps.tolerance", "tunes `measured: auto`"),
        ("{warmup: 2, measured: auto, max_warmup: 5}", "steps.max_warmup", "tunes `warmup: auto`"),
        ("{warmup: 2, measured: 8, max_seconds: 30}", "steps.max_seconds", "both counts are fixed"),
        ("{measured: auto, min_steps: 60}", "steps.min_steps", "above max_steps 50"),
        ("{warmup: auto, max_warmup: 2}", "steps.settle_window", "more warmup steps than max_warmup 2"),
        ("{measured: auto, max_seconds: 900}", "steps.max_seconds", "not below timeout_s 600"),
        ("{measured: automatic}", "steps.measured", "'automatic' is not allowed"),
        ("{measured: auto, tolerance: 2}", "steps.tolerance", "less than 1"),
    ],
)
def test_step_settings_are_validated(steps, where, what):
    with pytest.raises(MatrixError) as e:
        loads(f"timeout_s: 600\nsteps: {steps}\n", "m.yaml")
    text = str(e.value)
    assert f"m.yaml:2: {where}:" in text and what in text, text
    assert "fix:" in text


def test_fixed_step_cells_keep_their_committed_hashes():
    """Expanded through the new schedule code, a fixed-steps matrix gives the cells results/1b.jsonl holds."""
    stored = {
        json.loads(line)["cell_hash"] for line in (ROOT / "results" / "1b.jsonl").read_text().splitlines() if line
    }
    cells = expand(load(ROOT / "matrices" / "1b.yaml"))
    assert all(c.adaptive is None and "adaptive" not in c.canonical() for c in cells)
    assert {c.hash for c in cells} & stored == {c.hash for c in cells}
    for line in (ROOT / "results" / "1b.jsonl").read_text().splitlines()[:20]:
        rec = json.loads(line)
        assert Cell.from_dict(rec["cell"]).hash == rec["cell_hash"]
    auto = Cell(**{**cells[0].to_dict(), "lora": None, "qlora": None, "adaptive": Adaptive()})
    assert auto.hash != Cell.from_dict({**cells[0].to_dict(), "lora": None, "qlora": None}).hash


# -- losses at a common step ------------------------------------------------------------------------


def _rec(zero: int, losses: list[float], *, repeat: int = 1, cell_hash: str | None = None) -> dict:
    warm = 2
    return {
        "schema_version": 2,
        "run_id": "fixture",
        "attempt": repeat,
        "repeat": repeat,
        "matrix": "m",
        "cell_id": f"zero={zero}#{zero:010x}",
        "cell_hash": cell_hash or f"{zero:010x}",
        "cell_name": f"zero={zero}",
        "cell": {
            "zero_stage": zero,
            "precision": "bf16",
            "warmup_steps": 20,
            "measured_steps": 40,
            "adaptive": {"warmup": True, "measured": True, "tolerance": 0.02},
        },
        "status": "ok",
        "reason": "",
        "started_at": "2027-02-01T00:00:00+00:00",
        "provenance": {"host": "fixture"},
        "metrics": {
            "tokens_per_s": 1000.0,
            "step_time_median_s": 1.0,
            "loss_first": losses[0],
            "loss_final": losses[-1],
        },
        "losses": losses,
        "step_times_s": [1.0] * len(losses),
        "steps": {"warmup": warm, "measured": len(losses) - warm, "warmup_ended": "settled", "ended": "converged"},
    }


CURVE = [10.0 - 0.5 * i for i in range(12)]


def test_loss_parity_compares_at_the_last_step_both_ran():
    short, long = _rec(1, CURVE[:8]), _rec(2, CURVE[:12])
    df = records_to_frame(map(parse, [short, long]))
    assert list(df["measured_steps"]) == [6, 10] and list(df["warmup_steps"]) == [2, 2]
    pairs = analysis.analyse(df).loss_parity
    assert len(pairs) == 1
    p = pairs[0]
    # final losses differ by 2.0 (steps 8 and 12); at step 8 both are 6.5: no difference, no flag
    assert p["step"] == 8 and p["loss_final"] == (6.5, 6.5) and p["difference"] == 0.0 and not p["flag"]


def test_compare_judges_the_final_loss_at_the_common_step():
    base = [_rec(1, CURVE[:8]), _rec(1, CURVE[:9], repeat=2)]
    cur = [_rec(1, CURVE[:12])]
    cmp = compare.compare(records_to_frame(map(parse, base)), records_to_frame(map(parse, cur)))
    j = cmp.cells[0].figures["loss_final"]
    assert j.verdict == compare.stats.NO_CHANGE and j.cur == 6.5 and "at step 8" in j.why
    # with the same steps on both sides, the recorded final loss stands
    same = compare.compare(records_to_frame([parse(_rec(1, CURVE[:8]))]), records_to_frame([parse(_rec(1, CURVE[:8]))]))
    assert "at step" not in same.cells[0].figures["loss_final"].why


def test_a_cap_is_said_in_the_report_notes():
    r = _rec(1, CURVE[:8])
    r["steps"].update(ended="time cap", ci_level=0.75, half_width=0.08, tolerance=0.02, max_seconds=60.0)
    notes = analysis.analyse(records_to_frame([parse(r)])).notes
    assert notes == [
        (
            "zero=1",
            "measurement ended at the time cap (60 s) after 6 steps, the median step time known to ±8.0% at 75%, "
            "not the 2% asked",
        )
    ]
    assert parse(r).steps.ended == "time cap"


# -- real cells -----------------------------------------------------------------------------------


def _check_record(rec: dict, engine: str) -> None:
    assert rec["status"] == "ok", rec.get("reason")
    st, times, losses = rec["steps"], rec["step_times_s"], rec["losses"]
    assert rec["cell"]["engine"] == engine and rec["cell"]["adaptive"]["measured"]
    assert st["warmup"] + st["measured"] == len(times) == len(losses)
    assert st["warmup_ended"] in ("settled", "step cap", "time cap") and st["ended"] in (
        "converged",
        "step cap",
        "time cap",
    )
    measured = times[st["warmup"] :]
    iv = adaptive.interval(measured, 0.95)
    assert st["median_s"] == pytest.approx(rec["metrics"]["step_time_median_s"]) == pytest.approx(iv["median_s"])
    assert (st["ci_low_s"], st["ci_high_s"]) == (iv["ci_low_s"], iv["ci_high_s"])
    assert st["steps_s"] == pytest.approx(sum(times))
    if st["ended"] == "converged":
        assert st["measured"] >= 3 and st["half_width"] <= 0.5 and st["ci_level"] >= 0.95
    if st["ended"] == "step cap":
        assert st["measured"] == rec["cell"]["measured_steps"]
    if st["ended"] == "time cap":
        assert sum(times) >= 2.0 and st["measured"] >= adaptive.MIN_MEASURED
    assert st["warmup"] <= rec["cell"]["warmup_steps"]
    assert rec["metrics"]["loss_measured_first"] == losses[st["warmup"]]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["deepspeed", "hf_trainer"])
def test_adaptive_cell_runs_end_to_end(tmp_path, engine):
    # A wide tolerance so a 2-core CPU's steps can converge; the caps bound the run either way.
    steps = (
        "steps: {warmup: auto, measured: auto, max_warmup: 6, max_steps: 12, min_steps: 3, tolerance: 0.5, "
        "settle_within: 0.5, max_seconds: 2}"
    )
    body = TINY.replace("steps: {warmup: 1, measured: 4}", steps)
    assert steps in body
    m = write_matrix(
        tmp_path / "m.yaml", f"name: adaptive-{engine}\n{body}axes: {{zero_stage: [1], engine: [{engine}]}}\n"
    )
    r = zerobench("run", str(m), "--results", str(tmp_path / "r.jsonl"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    recs = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    _check_record(recs[-1], engine)
