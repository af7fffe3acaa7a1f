"""Answer mode's part of a run (bench.execute.answer decides; this applies): the search over the runnable cells, built
again once the machine's rates are known; on --resume what the earlier calls measured; the attempt each request
runs; at the end the answer, and a replay's against the full grid of its recorded ends."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path

from ...estimate import Hardware
from ...matrix.axes import AXES
from ...matrix.problems import InputError
from ...records import quality
from ...records.record import Record, parse
from ...records.status import Status
from .. import answer
from ..answer import text as answer_text
from ..attempt import now
from ..executors.executor import Attempt
from ..plan import Planned
from .ledger import Ledger
from .units import Run, Unit, attempt_of

__all__ = ["Answering"]


class Answering:
    def __init__(self, run: Run, runnable: list[Planned], hw: Hardware, here: str | None, preds: dict):
        self.run, self.runnable, self.here, self.preds = run, runnable, here, preds
        self.search = self._search(hw)
        self.index_of: dict[str, int] = {}  # a cell's progress index, kept across its rungs
        self.before: list[Record] = []  # --resume: what the earlier calls measured (and a kill cut off)

    def _search(self, hw: Hardware) -> answer.Search:
        ends = self.run.recording.ends if self.run.recording else None
        s = self.run.settings
        return answer.Search(self.runnable, hw, s.answer, self.run.platform.cuda, ends, self.here, self.preds)

    def with_hardware(self, hw: Hardware) -> None:
        """The search built again for this hardware (the machine's probed rates), with what --resume found."""
        resumed, self.search = self.search.resumed, self._search(hw)
        for r in self.before:
            self.search.earlier(r)
        self.search.resumed = resumed

    def check_same_groups(self, records: list[Record], path: Path) -> None:
        """InputError when --group-by groups the cells otherwise than the answer being resumed did (its records'
        answer notes): the earlier measurements were chosen to settle its groups, not these."""
        search = self.search
        for rec in records:
            group, c = rec.answer.group if rec.answer else None, search.by_hash.get(rec.cell_hash)
            if group is None or c is None or group == search.group_of(c):
                continue
            short = {a.short: a.name for a in AXES}
            was = ",".join(short.get(k, k) for k in re.findall(r"(?:^|,)(\w+)=", group)) or "nothing (one group)"
            raise InputError(
                f"--group-by {','.join(self.run.settings.answer.group_by) or 'nothing'}: the answer in {path} was "
                f"grouped by {was} ({rec.cell_name} in {group!r}, now {search.group_of(c)!r}); resume with "
                f"--group-by {was}, or give a new --results to start another answer"
            )

    def resume(self, records: list[Record], cut_off: list[Record], path: Path) -> set[str]:
        """--resume: what the earlier part measured counts (attempts a kill cut off too), and its cells keep their
        outcome; returns their hashes (begun). A skip is no attempt: a cell the earlier plan skipped (predicted not to
        fit another --gpu-mem) is open here. The budget is the whole search's: said, with what is left."""
        no_attempt = (Status.STARTED, Status.UNMEASURED, Status.SKIPPED)
        self.before = [r for r in records if r.status not in no_attempt] + cut_off
        recording = self.run.recording
        for r in self.before:
            self.search.earlier(r)
            if recording is not None and r.replay is not None:  # its next attempt gets the next end
                recording.served[r.cell_hash] = recording.served.get(r.cell_hash, 0) + 1
        self.search.resumed = True
        self.run.printer(self._resumed_line(path))
        return {r.cell_hash for r in self.before}

    def _resumed_line(self, path: Path) -> str:
        done = [c for c in self.search.candidates if c.state != answer.State.OPEN]
        budget, spent = self.run.settings.answer.budget_s, self.search.spent_s
        if budget is None:
            left = "no --budget: it measures until the answer is settled"
        elif spent < budget:
            left = f"--budget {budget:.0f} s is the whole search's, {budget - spent:.0f} s of it left"
        else:
            left = f"the --budget ({budget:.0f} s, the whole search's) is already spent: nothing more is measured"
        return (
            f"resume: answer mode goes on from {len(done)} cell(s) already measured or failed in {path} "
            f"({spent:.0f} s of cell time spent); {left}"
        )

    def attempt(self, req: answer.Request, next_index) -> Attempt:
        """The attempt the search asked for: its record keeps the matrix's cell, its job runs the rung's schedule.
        next_index: the ledger's, for a cell's first rung."""
        c = req.candidate
        if c.cell.hash not in self.index_of:
            self.index_of[c.cell.hash] = next_index()
        unit = Unit(self.index_of[c.cell.hash], c.planned, c.tries + 1, request=req)
        self.search.started(c, req.rung, req)
        run_as = answer.rung_cell(c.cell, req.rung) if self.run.settings.answer.halving else c.cell
        a = attempt_of(self.run, unit, run_as, c.planned.ds_config)
        a.cell = c.cell
        return a

    def settle(self, ledger: Ledger, said: dict[str, str], stopped: bool = False) -> None:
        """Answer mode's end: a record for every cell it did not measure, saying why; then the answer. On a stop
        too (the cells in flight recorded interrupted first), so every cell of the matrix has a record. A cell
        whose last record already says it was left unmeasured for the same reason (said: an earlier call's of a
        --resume) gets no second one: a record is written when what it says changes."""
        search = self.search
        for c, note in search.unmeasured(stopped):
            rec = Record.unmeasured(c.cell, note, at=now(), spent=search.spent_at_start, **ledger.ident(c.cell))
            if said.get(c.cell.hash) == rec.reason:
                continue
            i = ledger.next_index()
            ledger.attempts[c.cell.hash] = rec.attempt
            ledger.recorded(i, ledger.save(rec))
        recording = self.run.recording
        for text in answer_text.summary(search) + (
            self._against(recording.ends) if recording and recording.ends else []
        ):
            self.run.printer(text)

    def _against(self, ends: dict[str, Iterable]) -> list[str]:
        """A replayed answer against the answer of every recorded end of the same cells (the full grid)."""
        search, s = self.search, self.run.settings
        full = answer.Search([c.planned for c in search.candidates], search.hw, s.answer, self.run.platform.cuda)
        for recorded in ends.values():
            for rec, _ in recorded:
                full.observe(parse(rec))
        a = answer.agreement(search, full)
        lines = [
            "against the full grid (every recorded end; 'the same' within the resolution of one measurement each: "
            f"{full.resolution():.0%}, {_flagged_resolution(full):.0%} where one is host-bound or unstable):"
        ]
        for group, (mine, theirs, same) in a["leaders"].items():
            verdict = "the same" if mine == theirs else "the same within the resolution" if same else "DIFFERENT"
            lines.append(f"  fastest, {group}: {verdict} (answer: {mine}; grid: {theirs})")
        found, total = a["frontier"]
        lines.append(f"  frontier: {found} of the grid's {total} points measured")
        if a["cost"] is not None:
            lines.append(f"  cost: {search.spent_s:.0f} s, {a['cost']:.0%} of the grid's {full.spent_s:.0f} s")
        return lines


def _flagged_resolution(search: answer.Search) -> float:
    """The resolution of two measurements, one of them flagged (bench.records.quality): what 'the same' allows there."""
    flagged = quality.NOISE["gpu_flagged" if search.cuda else "cpu"]
    return math.exp(answer.Z * math.hypot(search.noise, flagged)) - 1
