"""tools/answer_sim.py on a small matrix: synthetic truths served through the replay path, scored, and its last
line in the stated form."""

from __future__ import annotations

import re

import pytest

from tools import answer_sim

LAST = re.compile(
    r"answer_sim: wrong leader in (\d+) of (\d+); wrong effect sign in (\d+) of (\d+); "
    r"cell time to settle median ([\d.]+) min, p90 ([\d.]+) min"
)


def test_the_simulator_answers_synthetic_truths_and_prints_its_figures(tmp_path, capsys):
    a = answer_sim.trial("matrices/compare-h200.yaml", 0, tmp_path)
    (tmp_path / "again").mkdir()
    b = answer_sim.trial("matrices/compare-h200.yaml", 0, tmp_path / "again")
    assert a.spent_s > 0 and a.calls in (1, 2) and a == b  # one seed, one truth, one answer
    assert answer_sim.main(["matrices/compare-h200.yaml", "--trials", "2", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    m = LAST.fullmatch(lines[-1])
    assert m, lines[-1]
    assert int(m[2]) == 2 and int(m[1]) <= 2 and int(m[3]) <= int(m[4])
    assert float(m[5]) <= float(m[6]) and len(lines) == 6  # a line per trial, time, calibration, misses, figures
    # Where the time went: every attempt's seconds under its role, the leaders measured first among them.
    assert sum(a.roles.values()) == pytest.approx(a.spent_s) and a.roles.get("leader", 0) > 0
    assert lines[-4].startswith("cell seconds per trial by role (mean): ") and "leader" in lines[-4]
    # The lead chance each answer states (its settled: line), and their sum beside the wrong leaders the truths found.
    assert a.chance is not None and 0.0 <= a.chance <= 1.0
    each = [float(x) / 100 for x in re.findall(r"\(lead chance ([\d.]+)%\)", "\n".join(lines[:2]))]
    stated = re.fullmatch(
        r"lead chance the answers state, summed over 2 trial\(s\): ([\d.]+) \(wrong leaders the truths found in them: "
        r"(\d+)\)",
        lines[-3],
    )
    assert len(each) == 2 and stated and stated[2] == m[1], lines
    assert float(stated[1]) == pytest.approx(sum(each), abs=0.006)  # each printed to 0.1%, the sum to 0.01


def test_the_predictions_tails_are_pooled_per_group_beside_how_far_one_trials_cells_moved_together(tmp_path, capsys):
    a = answer_sim.trial("matrices/compare-h200.yaml", 1, tmp_path)
    for n, two, three, mean in a.misses.values():  # the unmeasured cells that run, at the trial's end
        assert n > 0 and n >= two >= three >= 0 and abs(mean) < 10
    base = dict(wrong_leaders=[], effects=0, wrong_effects=[], spent_s=60.0, settled=True, calls=1)
    done = [
        answer_sim.Trial(seed=1, **base, misses={"peft=none": (100, 2, 0, 0.1), "peft=lora": (50, 1, 0, -0.2)}),
        answer_sim.Trial(seed=2, **base, misses={"peft=none": (300, 30, 6, 1.9)}),
    ]
    line = answer_sim.misses(done)
    assert line.endswith(
        "peft=lora: 50 cells, 2.0% past 2, 0.00% past 3; a trial's mean z sd 0.00, farthest -0.20 (trial 1); "
        "peft=none: 400 cells, 8.0% past 2, 1.50% past 3; a trial's mean z sd 0.90, farthest +1.90 (trial 2)"
    ), line


def test_no_trials_print_a_last_line_that_says_so(capsys):
    assert answer_sim.main(["matrices/compare-h200.yaml", "--trials", "0"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "answer_sim: no trial ran (--trials 0)"


@pytest.mark.parametrize(
    "bad, says",
    [(["--trials", "-1"], "--trials takes 0 or more"), (["--jobs", "0"], "--jobs 1 or more"),
     (["--settle", "0"], "--settle 0: a chance from 0.1% to 50%"), (["--settle", "5"], "such as 5% or 0.05")],
)  # fmt: skip
def test_a_negative_trial_count_no_jobs_or_a_level_outside_0_1_is_refused(bad, says, capsys):
    with pytest.raises(SystemExit) as e:
        answer_sim.main(["matrices/compare-h200.yaml", *bad])
    assert e.value.code == 2 and says in capsys.readouterr().err
