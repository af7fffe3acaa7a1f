"""The joint stopping rule (bench.execute.settle) and what it stands on: the online model's misfit learned from
the measured cells' residuals, and its joint draws (bench.estimate.online)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.cli import main as cli
from bench.estimate.online import Online
from bench.execute.settle import exceed
from bench.judge import results
from bench.records.store import Store
from bench.report import markdown

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


def _near_equal(rng, n: int = 30):
    """n cells of three axes whose truths differ by axis a's effect (0, -0.03 or +0.03) and a misfit of 0.02 each,
    every other one measured once and the rest three times (noise 0.026): the highest level is likelier a cell
    measured once and high than the fastest."""
    on = Online(prior_sd=0.05, offset_sd=0.1, noise_sd=0.026, misfit_sd=0.02, pair_sd=0.01, learn_misfit=True)
    cells = [{"a": i % 3, "b": (i // 3) % 5, "c": i // 15} for i in range(n)]
    on.declare(cells)
    effect = {0: 0.0, 1: -0.03, 2: 0.03}
    truth = np.array([effect[f["a"]] + 0.02 * rng.standard_normal() for f in cells])
    level = []
    for k, (f, t) in enumerate(zip(cells, truth)):
        logs = t + 0.026 * rng.standard_normal(1 + 2 * (k % 2))
        for y in logs:
            on.observe(f, 0.0, float(y), cell=k)
        level.append(logs.mean())
    return on, cells, truth, np.array(level)


def test_a_measured_cell_is_believed_between_its_measurements_and_what_its_settings_say():
    # One cell measured three times, the effects known (their prior narrow): its posterior is the normal one, the
    # misfit's prior (0.02) against the mean of its measurements (noise 0.026 each).
    on = Online(prior_sd=1e-6, offset_sd=1e-6, noise_sd=0.026, misfit_sd=0.02)
    for y in (0.05, 0.07, 0.06):
        on.observe({"a": 0}, 0.0, y, cell="x")
    (mean,), (sd,) = on.measured([({"a": 0}, 0.0)], ["x"])
    prec = 1 / 0.02**2 + 3 / 0.026**2
    assert mean == pytest.approx(0.06 * 3 / 0.026**2 / prec, rel=1e-4) and sd == pytest.approx(prec**-0.5, rel=1e-4)
    # Named as another cell (or none), the same settings carry a misfit of their own: what the effects say.
    (other,), (wide,) = on.measured([({"a": 0}, 0.0)], ["y"])
    assert other == pytest.approx(0.0, abs=1e-6) and wide == pytest.approx(0.02, rel=1e-3)
    # Among thirty near-equal cells, the one measured highest is believed below its level.
    on, cells, _, level = _near_equal(np.random.default_rng(3))
    believed, _ = on.measured([(f, 0.0) for f in cells], list(range(len(cells))))
    top = int(level.argmax())
    assert believed[top] < level[top]


def test_the_cell_believed_fastest_is_truly_faster_than_the_one_measured_fastest_more_often():
    # Over many trials of thirty near-equal cells: how far below the truly fastest is the cell with the highest
    # measured level, and the one the measurements and the model together put first (Online.measured)?
    rng = np.random.default_rng(5)
    raw, believed = [], []
    for _ in range(60):
        on, cells, truth, level = _near_equal(rng)
        mean, _ = on.measured([(f, 0.0) for f in cells], list(range(len(cells))))
        raw.append(truth.max() - truth[level.argmax()])
        believed.append(truth.max() - truth[mean.argmax()])
    assert np.mean(believed) < 0.9 * np.mean(raw)


def test_the_answer_states_the_chance_that_an_unmeasured_cell_beats_the_leader(tmp_path, capsys):
    out = tmp_path / "a.jsonl"
    argv = ["run", "matrices/compare-h200.yaml", "--answer", "--settle", "10%", "--replay", *COMPARE]
    assert cli([*argv, "--results", str(out), "--no-report", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    line = next(ln for ln in printed.splitlines() if ln.startswith("  settled: the chance that one of the"))
    assert "(the search stops asking each below 10%: both below)" in line, line
    left = [r for r in Store(out).records() if r["status"] == "unmeasured"]
    assert left
    for r in left:
        p_group, p_front, level = r["answer"]["settled"]
        assert level == 0.1 and p_group < 0.1 and p_front < 0.1 and len(r["answer"]["chance"]) == 2
        assert not r["answer"]["needed"] and "of every cell left together" in r["answer"]["why"]
    text = markdown.render(results.load(out), title="replay")
    assert "that one adds a frontier point: " in text and "(the search stops asking each below 10%)" in text
    bad = ["run", "matrices/compare-h200.yaml", "--answer", "--settle", "1.5", "--replay", *COMPARE]
    assert cli([*bad, "--results", str(tmp_path / "b.jsonl")]) == 2
    assert "--settle 1.5: a chance between 0 and 1" in capsys.readouterr().err
