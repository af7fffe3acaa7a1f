"""Knob values measured within the tolerance, collapsed: their cells share one misfit in the stopping rule."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from bench.estimate.planning.online import Online
from bench.execute import answer
from bench.execute.answer import collapse, picking
from bench.judge import effects
from bench.judge.blocks import Obs
from tests.conftest import GRIDS, full_search, led_search


def test_cells_drawn_under_one_key_share_their_misfit_and_a_measured_keys_is_its_measurements():
    on = Online(prior_sd=0.05, offset_sd=0.01, noise_sd=1e-4, misfit_sd=0.05)
    on.observe({"a": 0}, 0.0, 0.2, cell="x")
    items = [({"a": 1}, 0.0)] * 4
    u = on.draws(items, 2000, np.random.default_rng(1), [("class", 1), ("class", 1), None, "x"])
    assert np.allclose(u[:, 0], u[:, 1])  # one class: one misfit
    assert abs(np.corrcoef(u[:, 0], u[:, 2])[0, 1]) < 0.9  # no key: its own
    assert abs(u[:, 2].mean()) < 0.01 and u[:, 3].mean() > 0.07  # the measured cell's misfit (0.2, half of it
    # put on a=0's effect), where a cell of its own takes none


def test_a_value_collapses_in_a_group_where_its_pairs_there_lie_within_the_tolerance():
    # One pair's 95% interval is about 7% wide either way (two measurements' noise): a wide tolerance collapses some.
    s = full_search(
        "matrices/compare-h200.yaml", GRIDS["compare-h200"], answer.Settings(collapse=True, speed_tolerance=0.3)
    )
    found = collapse.collapses(s)
    tol = math.log(1 + s.s.speed_tolerance)
    checked = 0
    for axis, value, ref, pairs, _ in s.effect_pairs():
        for g in {a.group for a, _ in pairs}:
            e = effects.knob_effect([(a.obs, b.obs) for a, b in pairs if a.group == g], s.cross)
            inside = e.ci is not None and -tol < math.log(e.ci[0]) and math.log(e.ci[1]) < tol
            got = any(c.group == g and c.axis == axis and value in c.values and ref == c.values[0] for c in found)
            assert got == inside, (axis, value, g, e.ci)
            checked += 1
    assert checked and found
    line = collapse.line(s, found[0])
    assert line.endswith("treated as one") and " within " in line and "=" in line, line
    assert collapse.keys(s, found) == {}  # every cell measured: none takes a class's key
    s.s = answer.Settings(collapse=True)  # the 5% tolerance: no single pair's interval lies within it
    assert collapse.collapses(s) == []


def _pair(block: str, gap: float, sd: float = 0.026) -> tuple:
    """A knob's pair measured once each in `block`: the reference cell and the value's, `gap` apart (log)."""
    ref = SimpleNamespace(obs={block: [Obs(10.0, sd)]}, group=("lora",))
    value = SimpleNamespace(obs={block: [Obs(10.0 + gap, sd)]}, group=("lora",))
    return ref, value


def test_a_screen_judges_a_value_on_the_known_noise_and_needs_its_pairs():
    three = [_pair(f"b{k}", 0.0) for k in range(3)]
    edge = collapse.within(three, 0.0, 3)
    assert math.isclose(edge, collapse.Z95 * math.sqrt(2 * 0.026**2 / 3))  # three clean pairs: about 4%
    assert edge < math.log(1.05)
    assert collapse.within(three[:2], 0.0, 3) is None  # short of the screen's pairs: not judged
    assert collapse.within([_pair("b0", 0.0)], 0.0, 1) > math.log(1.05)  # one pair: about 7%, wider than 5%
    spread = [_pair("b0", 0.04), _pair("b1", -0.04), _pair("b2", 0.0)]  # pairs apart: the known noise, not their spread
    assert math.isclose(collapse.within(spread, 0.0, 3), edge, abs_tol=1e-9)
    assert collapse.within([_pair(f"b{k}", 0.03) for k in range(3)], 0.0, 3) > math.log(1.05)  # an effect of 3%


def test_a_screened_value_collapses_in_every_group():
    s = full_search(
        "matrices/compare-h200.yaml",
        GRIDS["compare-h200"],
        answer.Settings(collapse=True, screen=1, speed_tolerance=0.12),
    )
    found = collapse.collapses(s)
    tol = math.log(1 + s.s.speed_tolerance)
    for axis, value, _ref, pairs, _ in s.effect_pairs():
        edge = collapse.within(pairs, s.cross, 1)
        for g in s.groups():
            got = any(c.group == g and c.axis == axis and value in c.values for c in found)
            assert got == (edge is not None and edge < tol), (axis, value, g, edge)
    assert found and {c.group for c in found} == set(s.groups())


def test_the_screen_measures_pairs_of_cheap_cells_once_each_group_has_its_leader():
    s = led_search("matrices/compare-h200.yaml", GRIDS["compare-h200"], answer.Settings(screen=3))
    req = s.next()
    assert req.role == "effect" and req.why.startswith("a screen's pair"), req.why
    assert s.cost_s(req.candidate, 0) <= picking.SCREEN_COST * s._median_cost()
    req = led_search("matrices/compare-h200.yaml", GRIDS["compare-h200"], answer.Settings()).next()
    assert not req.why.startswith("a screen's pair"), req.why
