"""tools/answer_sim.py on a small matrix: synthetic truths served through the replay path, scored, and its last
line in the stated form."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

from bench.execute.plan import hardware
from bench.matrix.cells import Cell
from tools import answer_sim, worlds

ROOT = Path(__file__).resolve().parents[2]
LAST = re.compile(
    r"answer_sim: wrong leader in (\d+) of (\d+); wrong effect sign in (\d+) of (\d+); "
    r"cell time to settle median ([\d.]+) min, p90 ([\d.]+) min; not settled in (\d+) of (\d+)"
)
H100_RUN = ROOT.parent / "shared" / "records" / "7b-answer-h100-2026-12-07.jsonl.gz"
"""The real H100 answer (`zerobench run matrices/7b.yaml --answer --budget 20m`: docs/answer-mode.md), where a copy
of the shared records sits beside the checkout."""


def test_the_simulator_answers_synthetic_truths_and_prints_its_figures(tmp_path, capsys):
    a = answer_sim.trial("matrices/compare-h200.yaml", 0, tmp_path)
    (tmp_path / "again").mkdir()
    b = answer_sim.trial("matrices/compare-h200.yaml", 0, tmp_path / "again")
    assert a.spent_s > 0 and a.calls in (1, 2) and a == b  # one seed, one truth, one answer
    assert answer_sim.main(["matrices/compare-h200.yaml", "--trials", "2", "--seed", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    m = LAST.fullmatch(lines[-1])
    assert m, lines[-1]
    assert int(m[2]) == 2 and int(m[1]) <= 2 and int(m[3]) <= int(m[4]) and int(m[8]) == 2 and int(m[7]) <= 2
    assert float(m[5]) <= float(m[6]) and len(lines) == 6  # a line per trial, time, calibration, misses, figures
    # Where the time went: every attempt's seconds under its role, the leaders measured first among them.
    assert sum(a.roles.values()) == pytest.approx(a.spent_s) and a.roles.get("leader", 0) > 0
    assert set(a.attempts) == set(a.roles) and all(n >= 1 for n in a.attempts.values())
    assert lines[-4].startswith("cell seconds per trial by role (mean; attempts x seconds each): ")
    assert re.search(r"leader \d+ \([\d.]+ x [\d.]+ s\)", lines[-4]), lines[-4]
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


def test_a_family_takes_its_own_residuals_and_a_coarser_familys_where_it_has_too_few():
    step = {"lora/none/adam": [0.1, 0.3], "lora/none/8-bit": [0.0], "none/none/paged adam": [-1.0, -1.1, -0.9, -1.0]}
    # The mean is the family's own, on as few as one cell; one the GPU never ran takes its coarser family's.
    assert worlds.center(step, ("lora", "none", "8-bit")) == (0.0, 1)
    assert worlds.center(step, ("lora", "none", "adam")) == (pytest.approx(0.2), 2)
    assert worlds.center(step, ("lora", "none", "paged adam")) == (pytest.approx(0.1), 0)  # (0.2 + 0.0) / 2
    assert worlds.center(step, ("qlora", "none", "adam")) == (pytest.approx((0.2 + 0.0 - 1.0) / 3), 0)
    # The spread about a family's mean, from families of two or more, the family's own where it has MIN_FAMILY.
    assert sorted(worlds.deviations(step, ("none", "none", "paged adam"))) == pytest.approx(
        [x * math.sqrt(4 / 3) for x in (-0.1, 0.0, 0.0, 0.1)]
    )
    assert sorted(worlds.deviations(step, ("lora", "none", "adam"))) == pytest.approx(
        sorted([x * math.sqrt(2) for x in (-0.1, 0.1)] + [x * math.sqrt(4 / 3) for x in (-0.1, 0.0, 0.0, 0.1)])
    )  # two of its own: the GPU's whole table
    assert worlds.pool({"lora/none/adam": [1, 0, 1], "lora/none/8-bit": [0]}, ("lora", "none", "8-bit")) == [1, 0, 1, 0]
    assert worlds.family({"peft": "none", "offload": "none", "optimizer": "paged_adamw_8bit"}) == (
        "none", "none", "paged 8-bit"
    )  # fmt: skip


def test_a_cells_own_miss_is_its_spread_on_one_machine_less_its_measurements_noise():
    """The truth's own miss leaves out what the simulator adds itself: the machines' offsets (deviations are taken
    within one machine and model) and the measurement's noise (each deviation's square less its noise's variance)."""
    k = {"zero_stage": 0}  # one knob value throughout: the fit is the level alone
    alike = {
        ("lora/none/adam", "m1", "llama-7b"): [(0.10, 0.0025, k), (0.10, 0.0025, k), (-0.20, 0.0025, k)],
        ("lora/none/adam", "m2", "llama-7b"): [(0.50, 0.0007, k)],  # alone on its machine: no deviation to take
        ("lora/none/adam", "m1", "llama-1b"): [(0.02, 0.001, k), (-0.02, 0.001, k)],
    }
    own = worlds._own(alike)["lora/none/adam"]  # the groups in order: the 1b's, then the 7b's on m1
    k3, k2 = math.sqrt(3 / 2), math.sqrt(2)
    assert [d for d, _ in own] == pytest.approx([0.02 * k2, -0.02 * k2, 0.1 * k3, 0.1 * k3, -0.2 * k3], abs=1e-4)
    drawn = worlds.own({"lora/none/adam": own}, ("lora", "none", "adam"))
    # Within its noise (0.028 against sd 0.032): nothing of its own; far out (-0.245): its size less the noise's.
    assert drawn[:2] == [0.0, 0.0]
    assert drawn[4] == pytest.approx(-math.sqrt((0.2 * k3) ** 2 - 0.0025), abs=1e-3) and -0.245 < drawn[4] < -0.235
    assert worlds.own({}, ("qlora", "none", "adam")) == [0.0]


def test_a_knobs_effect_is_what_cells_that_differ_in_it_alone_show_less_their_noise_and_own_misses():
    """Pairs of cells of one family, machine and model that differ in one knob (micro-batch and accumulation as one)
    give that knob's half-differences; a pair that differs in two knobs gives none; the main effects' fit leaves
    each cell's own."""
    k = {"zero_stage": 0, "optimizer": "adamw", "batch": (4, 1)}
    alike = {
        ("lora/none/adam", "m1", "7b"): [
            (0.10, 0.0001, k),
            (0.30, 0.0001, {**k, "zero_stage": 2}),
            (-0.10, 0.0001, {**k, "batch": (1, 4)}),
            (0.00, 0.0001, {**k, "zero_stage": 2, "batch": (1, 4)}),  # two knobs from the first: no pair with it
        ],
    }
    got = worlds._knobs(alike)["lora"]
    s2 = math.sqrt(2)
    assert sorted(d for d, _ in got["zero_stage"]) == pytest.approx(sorted([-0.2 / s2, -0.1 / s2]), abs=1e-4)
    assert sorted(d for d, _ in got["batch"]) == pytest.approx(sorted([0.2 / s2, 0.3 / s2]), abs=1e-4)
    assert all(w == pytest.approx(0.0001) for xs in got.values() for _, w in xs)
    # Additive but for an interaction of -0.1: one df left, each cell's own +-0.025, times sqrt(4 / 1).
    own = worlds._own(alike)["lora/none/adam"]
    assert [abs(d) for d, _ in own] == pytest.approx([0.05] * 4, abs=1e-4)
    table = {"lora": {**got, "zero_stage": [*got["zero_stage"], [0.01, 0.0001]]}}  # MIN_FAMILY entries
    drawn = worlds.knob(table, "lora", "zero_stage", own_var=0.001)
    d = sorted(d for d, _ in got["zero_stage"])
    assert drawn == pytest.approx([-math.sqrt(d[0] ** 2 - 0.0011), -math.sqrt(d[1] ** 2 - 0.0011), 0.0], abs=1e-4)
    # A knob with fewer pairs than MIN_FAMILY in any mode takes every knob's entries.
    assert len(worlds.knob(table, "lora", "batch", 0.0)) == 5
    assert worlds.knob({}, "qlora", "precision", 0.0) == [0.0]
    assert worlds.knobs_of(Cell(micro_batch=2, grad_accum=2))["batch"] == (2, 2)


def test_a_users_deepspeed_file_is_a_knob_not_a_cells_own():
    """Two ZeRO stages, each with and without a DeepSpeed file of other bucket sizes, on one machine: the file moves
    both stages alike, so the main effects hold it and nothing is left as the cells' own (as a family axis it was
    their own: +-0.05 each, the file's 0.1 apart split between them, times sqrt(4 / 2))."""
    cells = [Cell(zero_stage=z, ds_config=f) for z in (1, 2) for f in (None, "buckets.json")]
    knobs = [worlds.knobs_of(c) for c in cells]
    assert [k["ds_config"] for k in knobs] == [None, "buckets.json", None, "buckets.json"]
    miss = {(1, None): 0.0, (1, "buckets.json"): 0.1, (2, None): 0.2, (2, "buckets.json"): 0.3}
    alike = {("none/none/adam", "m1", "1b"): [(miss[c.zero_stage, c.ds_config], 0.0, k) for c, k in zip(cells, knobs)]}
    assert all(abs(d) < 1e-9 for d, _ in worlds._own(alike)["none/none/adam"])
    assert sorted(worlds._knobs(alike)["none"]) == ["ds_config", "zero_stage"]


def test_the_measured_world_moves_a_family_by_what_its_records_show():
    """The H100's paged AdamW full fine-tunes: the measured world draws each cell's miss about its family's mean
    held-out residual on that GPU, within the family's spread; a table whose records showed that family missing by
    x0.37 moves the family's truths by as much, where the model's world stays about its prediction."""
    ok, _, _ = answer_sim._templates("H100")
    hw = hardware(answer_sim._platform(ok))
    assert "H100" in hw.gpu_name and ok["provenance"]["gpus"][0]["name"] == hw.gpu_name
    items = answer_sim._runnable("matrices/7b.yaml", answer_sim._platform(ok), hw)
    fam = ("none", "none", "paged adam")
    paged = [it.cell for it in items if worlds.family(it.cell) == fam][:20]
    assert paged
    h100 = worlds.load()["gpus"]["H100"]
    slow = {**h100, "step": {**h100["step"], "/".join(fam): [x - 1.0 for x in h100["step"]["/".join(fam)]]}}
    for table in (h100, slow):
        mean, n = worlds.center(table["step"], fam)
        assert n >= 3
        for seed in range(3):
            measured = answer_sim.World(seed, hw, ok, ["paged_adamw"], "measured", table, [it.cell for it in items])
            misses = [measured.base(c)[0] - answer_sim._model(c, hw)[0] for c in paged]
            # About the family's mean, spread by the knobs' effects and the cells' own (sd about 0.1).
            assert abs(sum(misses) / len(misses) - mean) < 0.1 and max(misses) - min(misses) < 0.6, misses
            assert measured.machines[0].host == 0.0 and measured.flag_rate(paged[0], measured.machines[0]) > 0
    model = answer_sim.World(0, hw, ok, ["paged_adamw"], "model")
    assert all(abs(model.base(c)[0] - answer_sim._model(c, hw)[0]) < 0.5 for c in paged)


@pytest.mark.skipif(not H100_RUN.exists(), reason="the shared records are not beside this checkout")
def test_the_committed_table_is_what_the_h100_records_give():
    """The table's H100 part is made from the H100 answer and the H100 files of results/held-out/ (neighbour runs,
    repeats, the ten-cell check), as `python -m tools.worlds` made it."""
    h100 = [str(H100_RUN), *map(str, sorted((ROOT / "results" / "held-out").glob("*h100*.jsonl")))]
    got = worlds.derive(h100)
    assert got["gpus"]["H100"] == worlds.load()["gpus"]["H100"]
    assert set(map(os.path.basename, h100)) <= set(worlds.load()["made_from"])


@pytest.mark.slow
def test_the_measured_h100_world_ends_unsettled_at_the_real_runs_cell_time_as_the_real_run_did(tmp_path):
    """The real H100 answer spent its 20-minute budget and did not settle (docs/answer-mode.md). The same search and
    prior in the measured H100 world, with the same budget on one machine, ends so too."""
    done = []
    for seed in range(2):
        (tmp_path / str(seed)).mkdir()
        done.append(
            answer_sim.trial(
                "matrices/7b.yaml", seed, tmp_path / str(seed), 1200.0, 1200.0, gpu="H100", calls=1, score=False
            )
        )
    spent = [t.spent_s for t in done]
    assert all(1000 < x <= 1260 for x in spent) and all(t.calls == 1 for t in done), spent  # the budget, give or take
    assert not any(t.settled for t in done), done


def test_a_trial_whose_answer_states_a_chance_above_the_level_is_not_settled(tmp_path):
    """A measured cell that may still beat its leader keeps the lead chance up while no unmeasured cell is needed:
    the answer's own line says whether it settled."""
    line = (
        "  {}: the chance that one of the 3 unmeasured cell(s), or of the 1 measured one(s) that may still be "
        "measured again, beats its group's fastest by more than 5% is {}, that one adds a frontier point 0.0% (the "
        "search stops asking each below 5%: {})"
    )
    assert not answer_sim._settled(tmp_path / "absent.jsonl", [line.format("not settled", "23.3%", "not both below")])
    assert not answer_sim._settled(tmp_path / "absent.jsonl", [])
    assert answer_sim.STATED.search(line.format("not settled", "23.3%", "not both below"))
    # Both chances below, yet a block no anchor ties: the console's verdict says not settled, and so does the trial.
    untied = line.format("not settled", "0.1%", "both below") + "; not settled against the 2 measured cell(s) of B2"
    assert not answer_sim._settled(tmp_path / "absent.jsonl", [untied])


def test_a_trial_without_the_frontier_is_settled_by_who_leads_alone(tmp_path):
    """Settings.frontier off: the answer's line says who leads is below the level and the frontier is not asked."""
    s = tmp_path / "a.jsonl"
    s.write_text(Path("results/compare-h200-a1.jsonl").read_text())  # a run that left no cell unmeasured
    line = (
        "  {}: the chance that one of the 3 unmeasured cell(s) beats its group's fastest by more than 5% is {}, "
        "that one adds a frontier point 40.0% (the search stops asking who leads below 5%: {}; the frontier is not "
        "asked)"
    )
    assert not answer_sim._settled(s, [line.format("not settled", "23.3%", "not below")])
    assert answer_sim._settled(s, [line.format("settled", "2.0%", "below")])


def test_misses_split_into_the_knobs_main_effects_and_each_cells_own():
    """tools.misses on one machine's neighbouring cells: the level and one effect per axis value take out what the
    cells that share a value share (least squares: each value's cells' own misses sum to nothing), and what is left
    is each cell's own, set against the measurements' noise."""
    from tools import misses

    s = misses.split("results/held-out/neighbours-7b-h100.jsonl")
    assert s.df == len(s.misses) - len(s.effects) > 0 and len(s.cells) == len(s.misses)
    assert abs(s.own.sum()) < 1e-9
    for name in s.effects:
        if name != "level":
            axis, value = name.split("=")
            holding = [i for i, c in enumerate(s.cells) if str(c[axis]) == value]
            assert holding and abs(s.own[holding].sum()) < 1e-9, name
    assert 0 < s.own_sd < s.misses.std(ddof=1) and s.noise > 0 and s.own_beyond_noise >= 0
