"""The joint stopping rule (bench.execute.answer.settle) and what it stands on: the online model's misfit learned from
the measured cells' residuals, and its joint draws (bench.estimate.planning.online)."""

from __future__ import annotations

import re

import numpy as np

from bench.cli import main as cli
from bench.estimate.planning.online import Online
from bench.execute import answer
from bench.execute.answer import text
from bench.execute.answer.settle import exceed
from bench.judge import results
from bench.report import markdown
from tests.conftest import GRIDS, as_written, full_search, led_search

COMPARE = ["results/compare-h200-a1.jsonl", "results/compare-h200-a2.jsonl", "results/compare-h200-a3.jsonl"]


def test_many_cells_each_unlikely_to_lead_together_keep_the_answer_open_unless_they_vary_together():
    rng = np.random.default_rng(0)
    z = 1.645 + 0.4  # each cell passes the bar in about 2% of draws
    apart = rng.standard_normal((4000, 100)) - z
    p_any, own = exceed(apart)
    assert own.max() < 0.05 and p_any > 0.5  # one by one each is settled; together they are not
    together = np.repeat(rng.standard_normal((4000, 1)), 100, axis=1) - z
    p_any, own = exceed(together)
    assert p_any < 0.05 and abs(p_any - own.mean()) < 1e-9  # cells that vary as one are one chance


def _cells(rng, interaction: float, n: int = 40):
    """Cells of three axes; log speed = effects + an interaction of this size, each measured once (noise 2%)."""
    a, b, c = rng.normal(0, 0.2, 4), rng.normal(0, 0.2, 4), rng.normal(0, 0.2, 4)
    out = []
    for _ in range(n):
        i, j, k = rng.integers(0, 4, 3)
        truth = a[i] + b[j] + c[k] + interaction * rng.standard_normal()
        out.append(({"a": int(i), "b": int(j), "c": int(k)}, truth + 0.02 * rng.standard_normal()))
    return out


def test_the_misfit_is_learned_from_the_residuals_small_where_effects_hold_and_large_where_they_do_not():
    rng = np.random.default_rng(1)
    for interaction, lo, hi in ((0.0, 0.0, 0.03), (0.2, 0.1, 0.4)):
        on = Online(prior_sd=0.3, offset_sd=1.0, noise_sd=0.02, misfit_sd=0.05, learn_misfit=True)
        for f, y in _cells(rng, interaction):
            on.observe(f, 0.0, y)
        assert lo <= on.misfit <= hi, (interaction, on.misfit)


def test_the_learned_misfit_never_falls_below_its_floor_and_the_floor_does_not_cap_it():
    rng = np.random.default_rng(1)
    for interaction, floor, low, high in ((0.0, 0.04, 0.04, 0.04), (0.2, 0.04, 0.1, 0.4)):
        on = Online(prior_sd=0.3, offset_sd=1.0, noise_sd=0.02, misfit_sd=0.05, learn_misfit=True, misfit_floor=floor)
        for f, y in _cells(rng, interaction):
            on.observe(f, 0.0, y)
        assert low <= on.misfit <= high, (interaction, on.misfit)  # cells that follow the effects: the floor


def test_joint_draws_move_together_where_cells_share_an_unmeasured_value():
    on = Online(prior_sd=0.3, offset_sd=0.01, noise_sd=0.02, misfit_sd=0.01)
    on.declare([{"a": 0, "b": 0}, {"a": 0, "b": 1}, {"a": 1, "b": 2}])
    on.observe({"a": 0, "b": 0}, 0.0, 0.1)
    items = [({"a": 1, "b": 1}, 0.0), ({"a": 1, "b": 2}, 0.0), ({"a": 0, "b": 2}, 0.0)]
    u = on.draws(items, 4000, np.random.default_rng(2))
    corr = np.corrcoef(u.T)
    assert corr[0, 1] > 0.3 and abs(corr[0, 2]) < corr[0, 1]  # a=1 is shared by the first two alone
    mean, cov = on.posterior(items)
    assert np.allclose(u.mean(axis=0), mean, atol=0.03) and np.allclose(np.cov(u.T), cov, atol=0.01)


def test_the_answer_states_the_chance_that_an_unmeasured_cell_beats_the_leader(tmp_path, capsys):
    out = tmp_path / "a.jsonl"
    argv = ["run", "matrices/compare-h200.yaml", "--answer", "--settle", "10%", "--replay", *COMPARE]
    assert cli([*argv, "--results", str(out), "--no-report", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    line = next(ln for ln in printed.splitlines() if ln.startswith("  settled: the chance that one of the"))
    assert "(the search stops asking each below 10%: both below)" in line, line
    left = [r for r in as_written(out) if r["status"] == "unmeasured"]
    assert left
    for r in left:
        p_group, p_front, level = r["answer"]["settled"]
        assert level == 0.1 and p_group < 0.1 and p_front < 0.1 and len(r["answer"]["chance"]) == 2
        assert not r["answer"]["needed"] and "of every cell left together" in r["answer"]["why"]
    text = markdown.render(results.load(out), title="replay")
    verdict = next(line for line in text.splitlines() if "Answer mode: settled" in line)
    assert "that one adds a frontier point " in verdict and "each below 10%" in verdict, verdict
    bad = ["run", "matrices/compare-h200.yaml", "--answer", "--settle", "1.5", "--replay", *COMPARE]
    assert cli([*bad, "--results", str(tmp_path / "b.jsonl")]) == 2
    assert "--settle 1.5: a chance from 0.1% to 50%" in capsys.readouterr().err


def test_a_measured_cells_drawn_truth_is_its_measurement_pulled_towards_the_model_against_the_winners_curse():
    rng = np.random.default_rng(3)
    raw, drawn = [], []
    for _ in range(20):
        on = Online(prior_sd=0.3, offset_sd=1.0, noise_sd=0.03, misfit_sd=0.03, learn_misfit=True)
        a, b = rng.normal(0, 0.05, 4), rng.normal(0, 0.05, 4)  # near-equal cells, as in a group's lead
        truths = {}
        for k in range(30):
            i, j = (int(x) for x in rng.integers(0, 4, 2))
            truths[k] = a[i] + b[j] + 0.03 * rng.standard_normal()
            on.observe({"a": i, "b": j}, 0.0, truths[k] + 0.03 * rng.standard_normal(), cell=k)
        rows = {r.cell: r for r in on._rows}
        top = max(rows, key=lambda k: rows[k].log)  # the fastest as measured: likelier measured high than low
        u = on.draws([(rows[top].features, 0.0)], 2000, np.random.default_rng(4), [top])
        mean, sd = on.marginals([(rows[top].features, 0.0)], cells=[top])  # the same truth, in closed form
        assert abs(mean[0] - u.mean()) < 0.004 and abs(sd[0] - u.std()) < 0.004
        raw.append(rows[top].log - truths[top])
        drawn.append(float(u.mean()) - truths[top])
    assert np.mean(raw) > 0.02  # the winner's curse
    assert abs(np.mean(drawn)) < np.mean(raw) / 2  # the draws pull it back
    sure = Online(prior_sd=0.3, offset_sd=1.0, noise_sd=1e-4, misfit_sd=0.05)
    sure.observe({"a": 0}, 0.0, 0.2, cell="x")
    sure.observe({"a": 0}, 0.0, 0.0, cell="y")
    u = sure.draws([({"a": 0}, 0.0), ({"a": 0}, 0.0)], 500, np.random.default_rng(5), ["x", None])
    assert abs(u[:, 0].mean() - 0.2) < 1e-3 and u[:, 0].std() < 1e-3  # a sure measurement is its own truth
    assert u[:, 1].std() > 0.02  # a cell not measured keeps the misfit's width


def test_a_measured_cell_that_may_still_beat_its_leader_counts_and_is_measured_again_until_neither_can_be():
    full = full_search(
        "matrices/compare-h200.yaml", GRIDS["compare-h200"], answer.Settings(speed_tolerance=0.001, settle=0.01)
    )
    lead = full.leader(("none",))
    rival = max((c for c in full.candidates if c.obs and c is not lead), key=lambda c: full.gap(c, lead)[0])
    assert full.gap(rival, lead)[0] > -2.5 * full.gap(rival, lead)[1]  # measured below the leader, within the noise
    ch = full.chances
    assert ch.lead >= ch.cell_lead[rival.cell.hash] > 0.01 and not full.settled()[0]
    req = full.next()  # nothing is left unmeasured: the contest is between measured cells
    assert req.role == "contender" and req.candidate in (rival, lead) and rival.cell.name in req.why
    for c in full.candidates:
        c.tries = c.limit  # measured as often as they may be: a tie the answer names, outside the chance
    full.forget()
    assert full.chances.lead == 0.0 and rival.cell.hash not in full.chances.cell_lead


def test_without_the_frontier_the_search_asks_only_who_leads_and_says_the_frontier_is_not_settled():
    asked = led_search("matrices/compare-h200.yaml", GRIDS["compare-h200"], answer.Settings())
    assert asked.chances.frontier >= asked.s.settle and not asked.settled()[1]  # one cell per group: the frontier open
    assert next(asked._frontier(), None) is not None
    s = led_search("matrices/compare-h200.yaml", GRIDS["compare-h200"], answer.Settings(frontier=False))
    assert s.chances.frontier == asked.chances.frontier and s.settled() == (asked.settled()[0], True)
    assert next(s._frontier(), None) is None  # nothing measured for it
    lines = text.summary(s)
    assert any(ln.startswith("  frontier (lightest first; not settled:") for ln in lines), lines
    line = lines[1]  # the verdict leads, under the header
    assert line.startswith("  not settled: the chance that one of the"), lines
    assert "(the search stops asking who leads below 5%: not below; the frontier is not asked)" in line, line
    assert re.search(r"; to settle, about \d+ more (minutes|seconds) of cell time \(predicted\)$", line), line
