"""When answer mode's answer is settled: the joint stopping rule.

The answer per group is its fastest measured cell (the leader) and the measured cells the data cannot tell from
it; the frontier is the measured cells no other measured cell beats on both memory and speed. What could still
change them is a cell not yet measured, or a measured one whose measurements leave it room to be faster in truth
than the leader. Under the models corrected by the run (bench.estimate.planning.online: the
step-time model with its effects, pair effects and the misfit learned from the measured cells' residuals; the
memory model likewise), the unmeasured cells' speeds are drawn jointly, so cells that share settings rise and
fall together, beside the measured cells' levels (bench.judge.blocks.joint), DRAWS times. Each group's leader
is drawn with the unmeasured cells at its true speed as the model and its measurements say together
(bench.estimate.planning.online.Online.draws with its key): the fastest of near-equal measured cells is likelier
measured high than low, and its measured level alone would set the bar too high.

- lead: the chance that some cell, unmeasured or measured (`rivals`: drawn at their true speeds as the leader is;
  one the step-time model cannot read, at its measured level, apart from the leader's draw), beats its group's
  leader by more than the minimum effect; a measured cell that neither it nor the leader can be measured again
  for, to some purpose, is a tie the answer names, outside the chance;
- frontier: the chance that some unmeasured cell adds a frontier point: no measured cell of a tied block needs
  no more memory than it (within the memory tolerance) and is as fast within the frontier's resolution (the
  speed difference one measurement of each tells apart).

The search stops asking either question once its chance is below the level (Settings.settle, 5% unless
`--settle` says), and measures next the cells with the largest chance per predicted second. Each cell's own
chance (how often it beat the leader, or added a point, over the draws) is what it contributes. A cell whose
chance is below FLOOR by its own prediction alone (the normal tail, its level against the leader's true speed) is not
drawn; those cells' chances are added to the total, so the stated figure never leaves them out. Draws are
made from a fixed seed: the same records give the same figures.

Pure: numpy only. `chances(search)` reads a bench.execute.answer.Search.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ...judge import blocks
from . import collapse
from .candidate import State

__all__ = ["DRAWS", "FLOOR", "Chances", "chances", "exceed"]

DRAWS = 1000
"""Joint draws per evaluation: the chance near a 5% level is then known to about +-0.7%."""
FLOOR = 1e-6
"""A cell whose own chance, by its prediction alone, is below this is not drawn (its chance is still added)."""
_SEED = 20261203
LIGHTER = 1e6
"""The margin (log) of a cell lighter than every measured cell, before its own speed is added: past any real one."""


@dataclass(frozen=True)
class Chances:
    """What the unmeasured cells, and the measured ones that may still beat their leader, could still change, each a
    probability under the corrected models."""

    lead: float = 0.0
    """That some cell other than its leader, unmeasured or a rival, beats its group's leader by more than the minimum
    effect (every group)."""
    frontier: float = 0.0
    """That some unmeasured cell adds a point to the frontier at its resolution."""
    by_group: dict[tuple, float] = field(default_factory=dict)
    """lead, per group."""
    cell_lead: dict[str, float] = field(default_factory=dict)
    """Per unmeasured cell or rival (hash): its own chance of beating its group's leader by more than the minimum
    effect."""
    cell_frontier: dict[str, float] = field(default_factory=dict)
    """Per unmeasured cell (hash): its own chance of adding a frontier point."""
    share_lead: dict[str, float] = field(default_factory=dict)
    """Per unmeasured cell or rival (hash): its share of its group's lead chance: the draws in which it beats the leader
    by the most of all (a cell not drawn: its own chance)."""
    share_frontier: dict[str, float] = field(default_factory=dict)
    """The same of the frontier's chance: the draws in which it passes the measured frontier by the most."""


def _tail(z: np.ndarray) -> np.ndarray:
    """P(N(0, 1) > z), elementwise."""
    z = np.asarray(z, dtype=float)
    return np.array([0.5 * math.erfc(x / math.sqrt(2)) for x in z.ravel()]).reshape(z.shape)


def chances(s) -> Chances:
    """The chances of the search `s` (bench.execute.answer.Search) as its measurements stand."""
    open_ = [c for c in s.open() + s.parked() if c.base_tps is not None]
    unknown = [c for c in s.open() if c.base_tps is None]  # a model the step-time model cannot read: anything
    offs = s.offsets
    measured = [c for c in s.candidates if c.obs and set(c.obs) & offs.tied]
    leaders = {g: lead for g in s.groups() if (lead := s.leader(g)) is not None and lead in measured}
    lead_m, lead_sd = s.tps.marginals([(c.model, c.base_tps) for c in open_])
    levels = [blocks.level(c.obs, offs, s.cross) for c in measured]
    bars = _bars(s, leaders, levels, measured)
    thr = math.log(1 + s.s.speed_tolerance)
    z = np.full(len(open_), np.inf)  # a cell whose group has no leader yet: no chance of beating one
    at = {id(m): k for k, m in enumerate(measured)}
    for i, c in enumerate(open_):
        lead = leaders.get(c.group)
        if lead is not None:
            lm, lv = bars[id(lead)]
            z[i] = (lm + thr - lead_m[i]) / math.sqrt(lead_sd[i] ** 2 + lv)
    p_lead = _tail(z)
    mem_m, mem_sd, p_front, res = _frontier_bounds(s, open_, measured, levels, lead_m, lead_sd)
    drawn = [i for i in range(len(open_)) if p_lead[i] >= FLOOR or p_front[i] >= FLOOR]
    out = _drawn(s, [open_[i] for i in drawn], measured, at, leaders, res, rivals(s, leaders, measured))
    left = sorted(set(range(len(open_))) - set(drawn))  # not drawn: their own chances are added
    by_group = {}
    for g in s.groups():
        rest = sum(p_lead[i] for i in left if open_[i].group == g)
        waiting = g not in leaders and any(c.group == g for c in s.open())  # nothing measured to lead it yet
        by_group[g] = 1.0 if waiting else min(1.0, out["by_group"].get(g, 0.0) + rest)
    lead_all = min(1.0, out["lead"] + sum(p_lead[i] for i in left))
    lead_all = 1.0 if unknown or any(v >= 1.0 for v in by_group.values()) else lead_all
    front_all = 1.0 if unknown or not measured else min(1.0, out["frontier"] + sum(p_front[i] for i in left))
    cell_lead = {c.cell.hash: 1.0 for c in unknown} | out["cell_lead"]
    cell_front = {c.cell.hash: 1.0 for c in unknown} | out["cell_frontier"]
    share_lead = {c.cell.hash: 1.0 for c in unknown} | out.get("share_lead", {})
    share_front = {c.cell.hash: 1.0 for c in unknown} | out.get("share_frontier", {})
    return Chances(lead_all, front_all, by_group, cell_lead, cell_front, share_lead, share_front)


def rivals(s, leaders: dict, measured: list) -> list:
    """The measured cells of a led group, its leader aside, that it or the leader can still be measured again for
    (bench.execute.answer.Search.again) to some purpose (not a tie, Search.tie): each may in truth beat the leader,
    and measuring again tells. Once neither can be, or it is futile, the two are a tie the answer names, outside
    the chance."""
    return [
        m
        for m in measured
        if (lead := leaders.get(m.group)) is not None and m is not lead and s.again(m, lead) and not s.tie(m, lead)
    ]


def _bars(s, leaders: dict, levels: list, measured: list) -> dict[int, tuple[float, float]]:
    """Each leader's bar for a cell's own chance (mean, variance of log tokens/s), by id: its true speed as the
    model and its measurements say together, as the draws take it (a leader the step-time model cannot read: its
    measured level)."""
    known = _known(leaders.values())
    mean, sd = s.tps.marginals([(m.model, m.base_tps) for m in known], cells=[m.cell.hash for m in known])
    out = {id(m): levels[k] for k, m in enumerate(measured) if m in leaders.values()}
    return out | {id(m): (float(mu), float(x) ** 2) for m, mu, x in zip(known, mean, sd)}


def _known(cells) -> list:
    """These measured cells, once each, that the step-time model reads: their true speeds are drawn (Online.draws
    with their keys); the others' are their measured levels."""
    return [m for m in dict.fromkeys(cells) if m.base_tps is not None]


def _frontier_bounds(s, open_, measured, levels, tps_m, tps_sd):
    """Per open cell, a bound on its chance of adding a frontier point by its own prediction: against the best
    measured cell that surely needs no more memory (its memory taken 2.5 sd lighter than predicted). Also the
    memory predictions and each measured cell's resolution (log)."""
    mem_m, mem_sd = s.memory.marginals([(c.model, c.base_mem if c.base_mem is not None else 0.0) for c in open_])
    has_mem = np.array([c.base_mem is not None for c in open_], dtype=bool)
    res = np.array([math.log(1 + s.resolution(None, m)) for m in measured])
    heavy = [(m.mem, levels[i][0] + res[i], levels[i][1]) for i, m in enumerate(measured) if m.mem is not None]
    heavy.sort()
    mems = np.array([h[0] for h in heavy])
    best, best_var, top, top_var = [], [], -math.inf, 0.0
    for _, v, var in heavy:
        if v > top:
            top, top_var = v, var
        best.append(top)
        best_var.append(top_var)
    slack = math.log(1 + s.s.memory_tolerance)
    p = np.array([0.0 if c.state == State.PARKED else 1.0 for c in open_])  # a parked micro-batch is no frontier point
    if len(mems):
        j = np.searchsorted(mems, mem_m - 2.5 * mem_sd + slack, side="right") - 1
        i = np.nonzero((j >= 0) & has_mem & (p > 0))[0]
        best, best_var = np.array(best), np.array(best_var)
        p[i] = _tail((best[j[i]] - tps_m[i]) / np.sqrt(tps_sd[i] ** 2 + best_var[j[i]]))
    return mem_m, mem_sd, p, res


def _drawn(
    s, cells: Sequence, measured: Sequence, at: dict, leaders: dict, res: np.ndarray, rival: Sequence = ()
) -> dict:
    """The chances from joint draws of these open cells' speeds and memory, the measured cells' levels (`at`: a
    measured cell's column, by id) and the true speeds of the leaders and their rivals (measured cells that may
    still beat them: `rivals`), which count towards who leads as the open cells do."""
    out = {"lead": 0.0, "frontier": 0.0, "by_group": {}, "cell_lead": {}, "cell_frontier": {}}
    if not cells and not rival:
        return out
    rng = np.random.default_rng(_SEED)
    known = _known([*leaders.values(), *rival])
    shared = collapse.keys(s, collapse.collapses(s)) if s.s.collapse else {}  # a class's cells share their misfit
    both = s.tps.draws(
        [(c.model, c.base_tps) for c in cells + known],
        DRAWS,
        rng,
        [shared.get(c.cell.hash) for c in cells] + [m.cell.hash for m in known],
    )
    u, truth = both[:, : len(cells)], {id(m): both[:, len(cells) + k] for k, m in enumerate(known)}
    mem = s.memory.draws([(c.model, c.base_mem if c.base_mem is not None else 0.0) for c in cells], DRAWS, rng)
    mean, cov = blocks.joint([m.obs for m in measured], s.offsets, s.cross) if measured else (np.zeros(0), None)
    lv = mean + rng.standard_normal((DRAWS, len(mean))) @ np.linalg.cholesky(cov + 1e-12 * np.eye(len(mean))).T \
        if len(mean) else np.zeros((DRAWS, 0))  # fmt: skip
    thr = math.log(1 + s.s.speed_tolerance)
    speed = [u[:, i] for i in range(len(cells))] + [truth.get(id(m), lv[:, at[id(m)]]) for m in rival]
    contest = [*cells, *rival]
    over = np.full((DRAWS, len(contest)), -np.inf)  # by how much each cell beats its leader past the tolerance
    for i, c in enumerate(contest):
        lead = leaders.get(c.group)
        if lead is not None:
            over[:, i] = speed[i] - truth.get(id(lead), lv[:, at[id(lead)]]) - thr
    beats = over > 0
    margin = _adds(s, cells, measured, u, mem, lv, res) if cells else np.zeros((DRAWS, 0))
    adds = margin > 0
    out["lead"], out["frontier"] = exceed(over)[0], exceed(margin)[0]
    for g in {c.group for c in contest}:
        cols = [i for i, c in enumerate(contest) if c.group == g]
        out["by_group"][g] = float(beats[:, cols].any(axis=1).mean())
    out["cell_lead"] = {c.cell.hash: float(x) for c, x in zip(contest, beats.mean(axis=0))}
    out["cell_frontier"] = {c.cell.hash: float(x) for c, x in zip(cells, adds.mean(axis=0))}
    out["share_lead"] = _shares(contest, over, [c.group for c in contest])
    out["share_frontier"] = _shares(cells, margin, [None] * len(cells))
    return out


def exceed(margin: np.ndarray) -> tuple[float, np.ndarray]:
    """From joint draws (rows) of by how much each cell (column) passes its bar: the chance that any passes it,
    and each one's own. The first is what the search stops on: cells that each pass rarely may together pass
    often where they vary apart, and hardly more often than one where they vary together."""
    hit = margin > 0
    return (float(hit.any(axis=1).mean()) if hit.size else 0.0), hit.mean(axis=0)


def _shares(cells: Sequence, margin: np.ndarray, groups: Sequence) -> dict[str, float]:
    """Each cell's share of the chance: the draws in which it is the one that beats the bar by the most (per group
    where groups differ); the shares of a group sum to its chance."""
    out = dict.fromkeys((c.cell.hash for c in cells), 0.0)
    for g in dict.fromkeys(groups):
        cols = np.array([i for i, x in enumerate(groups) if x == g])
        sub = margin[:, cols]
        top = sub.argmax(axis=1)
        hit = sub[np.arange(len(sub)), top] > 0
        for k, n in zip(*np.unique(top[hit], return_counts=True)):
            out[cells[cols[k]].cell.hash] = n / len(sub)
    return out


def _adds(s, cells, measured, u, mem, lv, res) -> np.ndarray:
    """Per draw and open cell: by how much (log) it is faster than the fastest measured cell (of a tied block)
    that needs no more memory (within the tolerance), past that cell's resolution; positive: it adds a point.
    A cell no measured one is light enough for adds one surely: LIGHTER plus its own speed, so that of several
    such cells the fastest passes by the most (its share, and so the search's pick: measured, it leaves those of
    them that are slower and need no less memory dominated; a tie at +inf would hand the share to whichever comes
    first). A cell whose memory the model cannot read: +inf."""
    with_mem = [i for i, m in enumerate(measured) if m.mem is not None]
    parked = np.array([c.state == State.PARKED for c in cells], dtype=bool)
    known = np.array([c.base_mem is not None for c in cells], dtype=bool)
    if not with_mem:
        return np.where(parked[None, :], -np.inf, np.where(known[None, :], LIGHTER + u, np.inf))
    order = sorted(with_mem, key=lambda i: measured[i].mem)
    mems = np.array([measured[i].mem for i in order])
    reach = np.maximum.accumulate(lv[:, order] + res[order], axis=1)  # per draw: the fastest so far, lightest first
    slack = math.log(1 + s.s.memory_tolerance)
    j = np.searchsorted(mems, mem + slack, side="right") - 1  # the heaviest measured cell light enough
    rows = np.arange(u.shape[0])[:, None]
    margin = np.where(j >= 0, u - reach[rows, np.maximum(j, 0)], LIGHTER + u)
    return np.where(parked[None, :], -np.inf, np.where(known[None, :], margin, np.inf))
