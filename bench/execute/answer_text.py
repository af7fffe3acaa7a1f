"""Answer mode's answer as the console prints it when the search ends: the blocks the measurements came from
and how anchors tie them, per group the fastest cell and the cells not told apart from it (the 95% interval
of their ratio to it reaches within the minimum effect) or not compared with it (no block or anchor ties them),
the frontier, each knob's effect (pairs measured in one block), the measurements flagged as weaker evidence,
the errors that teach it (bench.execute.failures) and the cost. Every interval says its confidence (95%);
every verdict follows from its interval (bench.judge.effects). Pure: the text of a Search."""

from __future__ import annotations

import collections
import math

from ..matrix.axes import AXIS
from . import collapse
from .answer import Candidate, Search, _group, _hms, _mem, _tps

__all__ = ["summary"]


def summary(s: Search) -> list[str]:
    """The answer, line by line."""
    names = _block_names(s)
    lines = [
        f"answer (95% intervals; {len(s.candidates)} runnable cells, grouped by {', '.join(s.s.group_by)}; "
        f"measured in {len(names)} block(s), each one run part on one machine):"
    ]
    lines += _blocks(s, names) if len(names) > 1 else []
    for g in s._groups():
        lines.append(_fastest(s, g, names))
    lines.append(
        "  frontier (lightest first; a cell is off it only where a cell of a block tied to its own beats it): "
        + "; ".join(f"{c.cell.name} {_mem(s, c)} {_tps(s, c)}" for c in s.frontier())
        if len(names) > 1
        else "  frontier (lightest first): "
        + "; ".join(f"{c.cell.name} {_mem(s, c)} {_tps(s, c)}" for c in s.frontier())
    )
    lines += _effects(s)
    lines += [f"  {collapse.line(s, c)}" for c in collapse.collapses(s)] if s.s.collapse else []
    lines.append(_settled(s))
    lines += _flagged(s)
    expected = collections.Counter(s.lessons.expected(c.features) for c in s.candidates if c.state == "expected")
    lines += s.lessons.summary(expected)
    measured = [c for c in s.candidates if c.tries]
    rest = [c for c in s.candidates if c.state in ("open", "expected")]
    lines.append(
        f"  cost: {s.spent_s:.0f} s of cell time for {len(measured)} of {len(s.candidates)} runnable cells; "
        f"measuring the other {len(rest)} once would add about {_hms(s.full_run_s(rest))} (predicted)"
    )
    if s.spent_at_start:
        lines.append("  the budget left afforded no attempt: this call measured nothing (a larger --budget goes on)")
    return lines


def _settled(s: Search) -> str:
    """The joint stopping rule's figures (bench.execute.settle): what the cells left unmeasured, and the measured ones
    that may still beat their leader, could change."""
    ch, level = s.chances, s.s.settle
    left = len(s.open() + s.parked())
    rivals = sum(1 for c in s.candidates if c.obs and c.cell.hash in ch.cell_lead)  # bench.execute.settle.rivals
    also = f", or of the {rivals} measured one(s) that may still be measured again," if rivals else ""
    lead, front = s.settled()
    return (
        f"  settled: the chance that one of the {left} unmeasured cell(s){also} beats its group's fastest by more than "
        f"{s.s.speed_tolerance:.0%} is {ch.lead:.1%}, that one adds a frontier point {ch.frontier:.1%} (the search "
        f"stops asking each below {level:.0%}: "
        + ("both below" if lead and front else "not both below")
        + ")"
        + _untied(s)
    )


def _untied(s: Search) -> str:
    """The measured cells the chances leave out: those of blocks no anchor ties to the reference block, whose speeds
    compare with none of its cells (a cell there may be faster than the fastest by any amount)."""
    apart = s.untied()
    if not apart:
        return ""
    names = _block_names(s)
    where = sorted({b for c in apart for b in c.obs}, key=list(names).index)
    return (
        f"; not settled against the {len(apart)} measured cell(s) of {', '.join(names[b] for b in where)}, which no "
        f"anchor ties to {names[s.offsets.ref]}: no chance above counts them and the answer does not compare them "
        "(a cell measured in both would tie them)"
    )


def _block_names(s: Search) -> dict[str, str]:
    return {b: f"B{i}" for i, b in enumerate(s.order, 1)}


def _blocks(s: Search, names: dict[str, str]) -> list[str]:
    """Each block: its run and machine, its measurements, and its offset from the reference block."""
    offs = s.offsets
    out = []
    for b, name in names.items():
        run = b.split("@")[0]
        n = sum(len(c.obs.get(b, ())) for c in s.candidates)
        head = f"  block {name}: run {run} on {s.where.get(b, 'an unknown machine')}, {n} measurement(s)"
        if b == offs.ref:
            out.append(head + "; the reference block")
        elif b in offs.tied:
            lo, hi = (math.exp(offs.mean[b] + k * 1.96 * offs.sd(b)) for k in (-1, 1))
            anchors = offs.anchors.get(b, 0)
            out.append(
                f"{head}; speed x{math.exp(offs.mean[b]):.2f} [{lo:.2f}, {hi:.2f}] at 95% of {names[offs.ref]}'s "
                f"({anchors} anchor cell(s))"
            )
        else:
            out.append(f"{head}; not tied to {names[offs.ref]}: no cell measured in both, so none of its cells is "
                       "compared with theirs")  # fmt: skip
    return out


def _fastest(s: Search, g: tuple, names: dict[str, str]) -> str:
    lead = s.leader(g)
    if lead is None:
        return f"  {_group(s.s, g)}: no cell ran ok"
    tied, apart = s.ties(lead)
    among = ""
    if apart:  # the fastest of the blocks anchors tie together, not of the group
        part = s._parts()
        tied_blocks = sorted((b for b in names if part[b] == min(part[x] for x in lead.obs)), key=list(names).index)
        among = f" among the cells of {', '.join(names[b] for b in tied_blocks)}"
    where = ", ".join(names.get(b, b) for b in lead.obs) if len(names) > 1 else ""
    text = f"  fastest, {_group(s.s, g)}{among}: {lead.cell.name}: {_tps(s, lead)}, {len(lead.logs)} measurement(s)"
    text += f" in {where}" if where else ""
    if tied:
        text += f"; not told apart from it (within {s.s.speed_tolerance:.0%}): {', '.join(m.cell.name for m in tied)}"
    if apart:
        shown = ", ".join(_named(m, names) for m in apart)
        text += f"; not compared with it (no block or anchor ties theirs to its): {shown}"
    return text


def _named(c: Candidate, names: dict[str, str]) -> str:
    return f"{c.cell.name} ({', '.join(names.get(b, b) for b in c.obs)})"


def _effects(s: Search) -> list[str]:
    out = []
    for axis, value, ref, e in s.effects():
        short = AXIS[axis].short
        head = f"  effect {short}={value} vs {short}={ref}: "
        if not e.n:
            out.append(head + "no pair measured in one block")
            continue
        out.append(
            head + f"tokens/s x{e.ratio:.2f} [{e.ci[0]:.2f}, {e.ci[1]:.2f}] at {e.ci_conf:.0%}, {e.verdict} "
            f"({e.n} pair(s) measured in one block)"
        )
    return out


def _flagged(s: Search) -> list[str]:
    """The cells whose measurements were host-bound, unstable or throttled (bench.records.quality): weaker evidence."""
    weak = [c for c in s.candidates if c.flags]
    if not weak:
        return []
    shown = "; ".join(f"{c.cell.name}: {', '.join(c.flags)}" for c in weak)
    return [f"  weaker evidence ({len(weak)} cell(s), their noise taken about three times wider): {shown}"]
