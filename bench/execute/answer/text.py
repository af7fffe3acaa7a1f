"""Answer mode's answer as the console prints it when the search ends: the blocks the measurements came from
and how anchors tie them, per group the fastest cell and the cells not told apart from it (the 95% interval
of their ratio to it reaches within the minimum effect) or not compared with it (no block or anchor ties them),
the frontier, each knob's effect (pairs measured in one block), the measurements flagged as weaker evidence,
the errors that teach it (bench.execute.answer.failures) and the cost. Every interval says its confidence (95%);
every verdict follows from its interval (bench.judge.effects). Pure: the text of a Search."""

from __future__ import annotations

import collections
import math
from typing import TYPE_CHECKING

from ...judge import blocks, compare
from ...matrix.axes import AXIS
from ...records.record import Record
from ..settings import AnswerSettings as Settings
from . import collapse
from .candidate import Candidate, State, Z

if TYPE_CHECKING:
    from .search import Search

__all__ = ["summary"]


def summary(s: Search) -> list[str]:
    """The answer, line by line."""
    names = _block_names(s)
    lines = [
        f"answer (95% intervals; {len(s.candidates)} runnable cells, grouped by {', '.join(s.s.group_by)}; "
        f"measured in {len(names)} block(s), each one run part on one machine):"
    ]
    lines.append(_settled(s))
    lines += _blocks(s, names) if len(names) > 1 else []
    for g in s.groups():
        lines.append(_fastest(s, g, names))
    asked = "" if s.s.frontier else "; not settled: the frontier of the cells measured for who leads"
    tied = "; a cell is off it only where a cell of a block tied to its own beats it" if len(names) > 1 else ""
    lines.append(
        f"  frontier (lightest first{tied}{asked}): "
        + "; ".join(f"{c.cell.name} {memory_text(s, c)} {speed_text(s, c)}" for c in s.frontier())
    )
    lines += _effects(s)
    lines += [f"  {collapse.line(s, c)}" for c in collapse.collapses(s)] if s.settings.collapse else []
    lines += _flagged(s)
    expected = collections.Counter(s.lessons.expected(c.features) for c in s.candidates if c.state == State.EXPECTED)
    lines += s.lessons.summary(expected)
    measured = [c for c in s.candidates if c.tries]
    rest = [c for c in s.candidates if c.state in (State.OPEN, State.EXPECTED)]
    lines.append(
        f"  cost: {s.spent_s:.0f} s of cell time for {len(measured)} of {len(s.candidates)} runnable cells; "
        f"measuring the other {len(rest)} once would add about {hms(s.full_run_s(rest))} (predicted)"
    )
    if s.spent_at_start:
        lines.append("  the budget left afforded no attempt: this call measured nothing (a larger --budget goes on)")
    return lines


def _settled(s: Search) -> str:
    """The verdict, first: settled, or not settled and about how much more cell time would settle it; then the joint
    stopping rule's figures (bench.execute.answer.settle): what the cells left unmeasured, and the measured ones
    that may still beat their leader, could change."""
    ch, level = s.chances, s.s.settle
    left = len(s.open() + s.parked())
    rivals = sum(1 for c in s.candidates if c.obs and c.cell.hash in ch.cell_lead)  # bench.execute.answer.settle.rivals
    also = f", or of the {rivals} measured one(s) that may still be measured again," if rivals else ""
    lead, front = s.settled()
    untied = _untied(s)
    verdict = "settled" if lead and front and not untied else "not settled"
    more = "" if verdict == "settled" else _more(s)
    return (
        f"  {verdict}: the chance that one of the {left} unmeasured cell(s){also} beats its group's fastest by more "
        f"than {s.s.speed_tolerance:.0%} is {ch.lead:.1%}, that one adds a frontier point {ch.frontier:.1%} "
        + _stops(s, lead, front, level)
        + untied
        + more
    )


def _more(s: Search) -> str:
    """About how much more cell time measuring, once each, the unmeasured cells that could still change the answer
    would take (predicted): a floor of what settling it costs, not a promise."""
    needed = s.needed_s()
    if not needed:
        return ""
    amount = f"{needed / 60:.0f} more minutes" if needed >= 90 else f"{needed:.0f} more seconds"
    return f"; to settle, about {amount} of cell time (predicted)"


def _stops(s: Search, lead: bool, front: bool, level: float) -> str:
    """Which chances the search stops on, and whether they are below the level."""
    if not s.s.frontier:
        below = "below" if lead else "not below"
        return f"(the search stops asking who leads below {level:.0%}: {below}; the frontier is not asked)"
    return (
        f"(the search stops asking each below {level:.0%}: "
        + ("both below" if lead and front else "not both below")
        + ")"
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
        return f"  {group_name(s.s, g)}: no cell ran ok"
    tied, apart = s.ties(lead)
    among = ""
    if apart:  # the fastest of the blocks anchors tie together, not of the group
        part = s.parts()
        tied_blocks = sorted((b for b in names if part[b] == min(part[x] for x in lead.obs)), key=list(names).index)
        among = f" among the cells of {', '.join(names[b] for b in tied_blocks)}"
    where = ", ".join(names.get(b, b) for b in lead.obs) if len(names) > 1 else ""
    text = f"  fastest, {group_name(s.s, g)}{among}: {lead.cell.name}: "
    text += f"{speed_text(s, lead)}, {len(lead.logs)} measurement(s)"
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


def machine_text(rec: Record) -> str:
    """The machine of a record, in a few words: its GPUs (UUIDs shortened) or its host."""
    m = rec.machine
    if m is None:
        return "an unknown machine"
    gpus = ", ".join(u[:12] for u in m.gpus)
    host = compare.clip(m.host, 60)
    return f"{gpus} (host {host})" if gpus else f"host {host} ({m.cpu_count} CPUs)"


def group_name(s: Settings, g: tuple) -> str:
    return ",".join(f"{AXIS[a].short}={v}" for a, v in zip(s.group_by, g)) or "all cells"


def speed_text(search: Search, c: Candidate) -> str:
    """Its tokens/s with the interval at 95%: measured (on the reference block's scale, where anchors tie its
    block to it; else as its own block measured it, which that block's name says), or predicted."""
    lo, hi = search.interval(c)
    mid = search.speed(c)[0]
    if c.obs and not set(c.obs) & search.offsets.tied:
        block = max(c.obs, key=lambda b: len(c.obs[b]))
        mid, var = blocks.mean_var(c.obs[block])
        lo, hi = mid - Z * math.sqrt(var), mid + Z * math.sqrt(var)
        where = f" in B{search.order.index(block) + 1}"
    else:
        where = ""
    if not math.isfinite(mid):
        return "tokens/s unknown"
    if not c.obs and c.band and not any(o.obs for o in search.candidates):
        # Nothing measured yet: the prediction's band is the model's held-out error for its family (a slower step
        # than predicted is fewer tokens/s).
        lo, hi = c.base_tps - c.band[1], c.base_tps - c.band[0]
    how = "measured" if c.obs else "predicted"
    return f"{how} {kilo(math.exp(mid))} tok/s [{kilo(math.exp(lo))}, {kilo(math.exp(hi))}] at 95%{where}"


def memory_text(search: Search, c: Candidate) -> str:
    lo, hi = search.memory_interval(c)
    if not math.isfinite(lo):
        return "memory unknown"
    how = "measured" if c.mem is not None else "predicted"
    return f"{how} {math.exp((lo + hi) / 2) / 2**30:.1f} GiB"


def kilo(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def hms(seconds: float) -> str:
    m, sec = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"
