"""Knob values that make no difference within a group, treated as one (`--answer`, Settings.collapse).

A group's cells often differ in knobs worth a percent or two: hundreds of cells that each could, by their own
misfit drawn apart, beat the leader by a little more than the tolerance. Where the run measured it, a value
collapses with its axis's reference within a group: the pairs measured in that group (cells of the group that differ
in that axis alone, both measured in one block: bench.judge.effects.knob_effect) put the effect's 95% interval
inside the speed tolerance either way. Cells of the group that differ only in collapsed values form a class: the
stopping rule (bench.execute.answer.settle) draws one own misfit per class (the model's effects stay in the draws, each
collapsed value's effect with its posterior width), and a class with a measured cell takes that cell's misfit as its
measurements say (bench.estimate.planning.online.Online.draws with its key). Two cells of one class differ by less
than the tolerance in the pairs that were measured; the class assumes the same of the pairs that were not.

Pure: reads a bench.execute.answer.Search.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

from ...judge import blocks, effects
from ...matrix.axes import AXIS

__all__ = ["Collapse", "collapses", "keys", "line", "within"]

Z95 = 1.959964


@dataclass(frozen=True)
class Collapse:
    group: tuple
    axis: str
    values: tuple  # the reference first
    within: float  # how far (a fraction) the farthest interval's edge lies from no effect


def collapses(s) -> list[Collapse]:
    """Per group and axis, the values measured within the speed tolerance of the axis's reference in that group; with
    a screen (Settings.screen), every group's values whose screen pairs, wherever measured, put the effect within it
    (`screened`)."""
    tol = math.log(1 + s.settings.speed_tolerance)
    found: dict[tuple, list] = {}
    for axis, value, ref, pairs, _ in s.effect_pairs():
        screened = within(pairs, s.cross, s.settings.screen) if s.settings.screen else None
        for g in s.groups() if screened is not None else {a.group for a, _ in pairs}:
            if screened is not None:
                edge = screened
            else:
                e = effects.knob_effect([(a.obs, b.obs) for a, b in pairs if a.group == g and b.group == g], s.cross)
                if e.ci is None:
                    continue
                edge = max(abs(math.log(e.ci[0])), abs(math.log(e.ci[1])))
            if edge >= tol:
                continue
            got = found.setdefault((g, axis), [ref, 0.0])
            got += [value]
            got[1] = max(got[1], edge)
    return [
        Collapse(g, axis, (got[0], *got[2:]), math.exp(got[1]) - 1) for (g, axis), got in sorted(found.items(), key=str)
    ]


def within(pairs: list, cross: float, least: int) -> float | None:
    """How far (log) the 95% interval's farther edge lies from no effect, for a knob value's effect over its measured
    pairs on the measurements' known noise (each pair's gap and variance in the blocks both ran in:
    bench.judge.blocks.gap; pooled by inverse variance), not the spread of the pairs: three clean pairs put it within
    about 4%. None with fewer than `least` pairs."""
    none = blocks.Offsets(ref=None)
    gaps = [blocks.gap(b.obs, a.obs, none, cross) for a, b in pairs if set(a.obs) & set(b.obs)]
    if len(gaps) < max(least, 1):
        return None
    weight = sum(1 / g.var for g in gaps)
    mean = sum(g.d / g.var for g in gaps) / weight
    return abs(mean) + Z95 * math.sqrt(1 / weight)


def keys(s, found: list[Collapse]) -> dict[str, Hashable]:
    """Per unmeasured cell (hash) of a class of two or more: the key its own misfit is drawn under, the hash of the
    class's measured cell with the most measurements (in a block tied to the reference) where it has one, else the
    class itself (one draw shared by its cells)."""
    by = {(c.group, c.axis): set(c.values) for c in found}
    if not by:
        return {}
    tied = s.offsets.tied
    classes: dict[tuple, list] = {}
    for c in s.candidates:
        if c.base_tps is None:
            continue
        cls = tuple((k, "*" if v in by.get((c.group, k), ()) else v) for k, v in sorted(c.features.items(), key=_first))
        classes.setdefault((c.group, cls), []).append(c)
    out: dict[str, Hashable] = {}
    for key, cells in classes.items():
        if len(cells) < 2:
            continue
        measured = [c for c in cells if c.obs and set(c.obs) & tied]
        rep = max(measured, key=lambda c: len(c.logs)).cell.hash if measured else ("class", key)
        out |= {c.cell.hash: rep for c in cells if not c.obs}
    return out


def line(s, c: Collapse) -> str:
    """'optimizer: adamw, fusedadam within 2% for peft=lora, treated as one'."""
    names = ", ".join(str(v) for v in c.values)
    group = s.group_of(next(m for m in s.candidates if m.group == c.group))
    return f"{AXIS[c.axis].short}: {names} within {c.within:.0%} for {group}, treated as one"


def _first(t: tuple):
    return t[0]
