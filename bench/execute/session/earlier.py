"""What the results file held when the run began, read once (bench.records.store): the attempt numbers used, each
cell's last record, and on --resume the cell repeats with an outcome, the skips said and the starts a killed run
left open; and how long such a start ran, as far as the evidence tells."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ...matrix.rules import Skip
from ...records.record import Record
from ...records.status import Status
from ...records.store import Store
from ..plan import Planned

__all__ = ["Earlier", "ran_for", "read"]

_TIMES = ("started_at", "ended_at")


@dataclass
class Earlier:
    records: list[Record]
    attempts: dict[str, int]
    """Cell hash -> the last attempt number used."""
    last: dict[str, Record]
    """Cell hash -> its last record that is not a start."""
    stored: set[tuple[str, int]] = field(default_factory=set)
    """--resume: (cell hash, repeat) with an outcome."""
    stale: list[Record] = field(default_factory=list)
    """--resume: the starts whose attempt never ended (a killed run's)."""
    said_skips: dict[str, tuple] = field(default_factory=dict)
    """--resume: cell hash -> (rule, reason) of a last record that is a skip."""

    def unmeasured(self) -> dict[str, str]:
        """The cells whose last record is an unmeasured one (an earlier call's), with its reason."""
        return {h: r.reason for h, r in self.last.items() if r.status is Status.UNMEASURED}

    def left(self, units: list[tuple[Planned, int]], skip_of: Callable, implied_stand: bool) -> list:
        """The units (planned cell, repeat) this file holds no outcome of. On --resume a cell this plan skips whose last
        record is a skip for the same reason stands, not written again; a skip for another reason (another --gpu-mem,
        rule or memory model) is written anew, and a cell an earlier plan skipped that this one runs, runs: a skip is
        no attempt. implied_stand: an implied_oom record stands for every repeat of its cell (written once, as
        repeat 1)."""
        implied = {h for h, r in self.last.items() if r.status is Status.IMPLIED_OOM} if implied_stand else set()
        return [(it, r) for it, r in units if (it.cell.hash, r) not in self.stored and it.cell.hash not in implied
                and not self._skip_said(it, skip_of(it))]  # fmt: skip

    def _skip_said(self, it: Planned, skip: Skip | None) -> bool:
        said = self.said_skips.get(it.cell.hash)
        return said is not None and skip is not None and said == (skip.rule, skip.reason)


def read(store: Store, resume: bool) -> Earlier:
    records = store.records()
    ended = [r for r in records if r.status is not Status.STARTED]
    attempts: dict[str, int] = {}
    for rec in ended:
        attempts[rec.cell_hash] = max(attempts.get(rec.cell_hash, 0), rec.attempt)
    e = Earlier(records, attempts, {r.cell_hash: r for r in ended})
    if resume:
        e.stored, e.stale = store.resume_state(records)
        e.said_skips = {
            h: (r.skip.rule if r.skip else None, r.reason) for h, r in e.last.items() if r.status is Status.SKIPPED
        }
    return e


def _epoch(iso: str | None) -> float | None:
    """A record's ISO 8601 time as seconds since the epoch (None for none)."""
    return dt.datetime.fromisoformat(iso).timestamp() if iso else None


def ran_for(start: Record, records: list[Record], logs: Path) -> dict:
    """An attempt cut off by a kill: how long it ran, as far as the evidence tells (its log's last write, the last
    record its run wrote), with a warning saying so; {} when nothing tells."""
    t0 = _epoch(start.started_at)
    log = logs / f"{start.cell_hash}.{start.attempt}.log"
    seen = [(log.stat().st_mtime, f"its log's last write ({log})")] if log.is_file() else []
    same = [_epoch(getattr(r, k)) for r in records if r.run_id == start.run_id for k in _TIMES]
    if any(t is not None for t in same):
        seen.append((max(t for t in same if t is not None), f"the last record of run {start.run_id}"))
    t, how = max(seen, default=(None, ""))
    if t0 is None or t is None or t <= t0:
        return {}
    note = f"cut off by a kill: wall_s runs from its start to {how}, and counts against an answer's --budget"
    return {"wall_s": t - t0, "warnings": [note]}
