"""The loop's state as an object: the queue of cell repeats left, the attempts per cell, the cells begun,
drawn-but-waiting (pending) and implied out of memory, the attempts in flight and the Records written.

The session is the source of attempts (source), writes each start when an executor has placed it (admit)
and each end when it comes back (done), all in this thread: only the session writes to the results file.
The executor (bench.execute.registry) decides where and when each attempt's job runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..estimate import Hardware
from ..estimate.planning.search import SearchResult, ladder, seed_micro_batch
from ..host import env
from ..host.rates import Rates
from ..matrix import dsconfig
from ..matrix.axes import AUTO, AXES
from ..matrix.cells import Cell
from ..matrix.problems import InputError
from ..matrix.rules import Skip
from ..records import quality
from ..records.record import AttemptContext, Record, Search, machine_of, parse
from ..records.status import Status
from ..records.store import Store, StoreWriteError
from . import answer, answer_text, launch, local, schedule
from .attempt import HARNESS_ERRNOS, HarnessError, ended, now
from .executor import WAIT, Attempt, Finished, Handle, Job, Shape, dispatch
from .launch import telemetry
from .plan import Plan, Planned, arrange, hardware, prediction, prune_skip
from .prepare import prepare
from .probe import probe_machine, run_shape
from .progress import Progress, line
from .registry import executor_for
from .replay import Recording
from .settings import RunSettings, stall_s
from .signals import Stopped, stop_on_signals

__all__ = ["Options", "Session"]

_TIMES = ("started_at", "ended_at")


def _epoch(iso: str | None) -> float | None:
    """A record's ISO 8601 time as seconds since the epoch (None for none)."""
    return dt.datetime.fromisoformat(iso).timestamp() if iso else None


@dataclass(eq=False)
class Unit:
    """A cell repeat as drawn: its progress index, the planned cell and the repeat; a micro-batch search
    (micro_batch: auto) runs its probes under one unit."""

    index: int
    planned: Planned
    repeat: int
    search: SearchResult | None = None
    request: answer.Request | None = None  # answer mode: why it is measured, and at which rung


@dataclass
class Options:
    """How a run goes: what it was asked (`s`, its RunSettings) and what run() made of it (the logs folder, the
    repeats, the platform, the slots, the executor, the recording, the Slurm settings)."""

    s: RunSettings
    logs: Path
    printer: Callable
    on_record: Callable | None
    repeats: int
    platform: env.Platform
    slots: local.Slots
    executor: str = "local"  # a name in bench.execute.registry.EXECUTORS ("replay" for a recording)
    replay: Recording | None = None  # the replay executor's recorded ends (bench.execute.replay)
    slurm: Any = None  # the slurm executor's settings (bench.execute.slurm.Settings)


class Session:
    """One run of a plan into a store: resume state, queue, implications, attempts, records."""

    def __init__(self, p: Plan, store: Store, o: Options, run_id: str):
        self.p, self.store, self.o, self.run_id = p, store, o, run_id
        self.hw: Hardware = hardware(o.platform, o.s.gpu_mem, o.s.host_mem)
        self.written: list[Record] = []  # the outcomes this run stored, in order
        self.attempts: dict[str, int] = {}  # cell hash -> the last attempt number used
        self.existing = store.records()
        self.stored: set[tuple[str, int]] = set()  # (cell hash, repeat) with an outcome (--resume)
        self.said_skips: dict[str, tuple] = {}  # --resume: cell hash -> (rule, reason) of a last record that is a skip
        self.items, self.preds, self.free = arrange(p.items, self.hw, o.s.margin, o.s.prune, o.s.order)
        # The memory model needs no rates: the probe times only the cells that may run (none pruned).
        self.rates = self._probe([it.cell for it in self.items if it.skip is None and id(it) not in self.free])
        self.hw = dataclasses.replace(self.hw, rates=self.rates)
        self.queue: list[tuple[Planned, int]] = []
        self.k = 0  # queue[k:] is what is left
        self.i = 0  # the progress index of the last unit drawn or record implied
        self.begun: set[str] = set()  # cells that have begun: never implied, whatever ends later
        self.pending: dict[str, Planned] = {}  # drawn by the pool, not yet placed
        self.turned_away: set[str] = set()  # of those, implied out of memory meanwhile
        self.costs: dict | None = None
        self.eta = schedule.Eta()
        self.prog: Progress | None = None
        self.t_run = time.time()
        self.probes: list[Attempt] = []  # micro-batch searches' next probes: drawn before the queue
        self.searching: set[int] = set()  # id() of the search units with a probe to come
        self.running: dict[int, Record] = {}  # id(handle) -> the started record of each attempt in flight
        runnable = [it for it in self.items if it.skip is None and id(it) not in self.free]
        ends = o.replay.ends if o.replay else None
        self.search = (
            answer.Search(runnable, self.hw, o.s.answer, o.platform.cuda, ends, self.here(), self.preds)
            if o.s.answer
            else None
        )
        self.index_of: dict[str, int] = {}  # answer mode: a cell's progress index, kept across its rungs
        self.cut_off: list[Record] = []  # --resume: the attempts a killed run left started, now recorded interrupted
        self.width = o.slots.max_cells  # how many cells run side by side (the executor's slots, once it is up)

    def _probe(self, cells: list[Cell]) -> Rates | None:
        """The machine's rates (bench.execute.probe: cached per machine), before any step time is predicted; none
        where the cells run elsewhere (a cluster's nodes, a replay's recording) or none is to run."""
        o = self.o
        if o.replay is not None or o.executor != "local" or not cells:
            return None
        rates, _ = probe_machine(
            run_shape(cells), extra_env=o.s.extra_env, logs=o.logs, printer=o.printer, platform=o.platform
        )
        return rates

    def here(self) -> str | None:
        """The block this run's attempts measure in (bench.records.record.Record.block), where it is known before any
        runs: this host under the local executor. A replay's records keep the block they were measured in, and
        a cluster's nodes are each a machine: there each record says."""
        if self.o.replay is not None:
            return self.o.replay.here(self.run_id)
        if self.o.executor != "local":
            return None
        m = machine_of(env.provenance())
        return f"{self.run_id}@{m.id if m is not None else 'unknown'}"

    # -- records --------------------------------------------------------------------------------------

    def save(self, rec: Record) -> Record:
        try:
            self.store.append(rec)
        except StoreWriteError as e:
            e.record = rec.to_dict()  # what is lost, for the message that stops the run
            raise
        return rec

    def ident(self, cell: Cell) -> dict:
        return {"run_id": self.run_id, "attempt": self.attempts.get(cell.hash, 0) + 1, "matrix_file": self.matrix_file}

    @property
    def matrix_file(self) -> str:
        return str(self.o.s.matrix)

    def recorded(self, i: int, rec: Record) -> None:
        """An outcome is stored: count it, print it, hand it to the exporter."""
        self.written.append(rec)
        d = rec.to_dict()
        self.prog.done(i, d, elapsed=time.time() - self.t_run, eta=self.left())
        if self.o.on_record is not None:
            try:
                self.o.on_record(d)
            except Exception as e:  # noqa: BLE001 - an exporter must not stop a measurement
                self.o.printer(f"warning: exporting the record of {rec.cell_name} failed: {type(e).__name__}: {e}")

    def left(self) -> float | None:
        if self.search is not None:
            return self.search.left_s() / self.width
        serial = self.eta.remaining(it.cell for it, _ in self.queue[self.k :] if id(it) not in self.free)
        return None if serial is None else serial / self.width  # packed cells run side by side

    # -- what is left to do ---------------------------------------------------------------------------

    def load(self) -> None:
        """The attempts so far, and on --resume the stale starts (recorded interrupted, with the time they ran)
        and what is done; then the queue of cell repeats to run."""
        if self.search is not None and self.o.s.resume:
            self._check_same_groups()  # before anything is written
        for rec in self.existing:
            if rec.get("status") != Status.STARTED.value:
                self.attempts[rec["cell_hash"]] = max(self.attempts.get(rec["cell_hash"], 0), rec.get("attempt", 1))
        if self.o.s.resume:
            self.stored, stale = self.store.resume_state(self.existing)
            last = {r["cell_hash"]: r for r in self.existing if r.get("status") != Status.STARTED.value}
            self.said_skips = {
                h: ((r.get("skip") or {}).get("rule"), r.get("reason"))
                for h, r in last.items()
                if r["status"] == Status.SKIPPED.value
            }
            for s in stale:
                why = f"run {s['run_id']} stopped while this cell ran (found by --resume)"
                with launch.holding_signals():
                    self.cut_off.append(
                        self.save(Record.interrupted(parse(s), why, ended_at=now(), **self._ran_for(s)))
                    )
                self.attempts[s["cell_hash"]] = max(self.attempts.get(s["cell_hash"], 0), s.get("attempt", 1))
        self.queue = self._todo()
        self.begun = {h for h, _ in self.stored}
        total = len(self.queue) if self.search is None else len(self.queue) + len(self.search.candidates)
        self.prog = Progress(total, enabled=self.o.s.progress, printer=self.o.printer)
        if self.search is not None and self.o.s.resume:
            self._resume_search()

    def _resume_search(self) -> None:
        """Answer mode on --resume: what the earlier part measured counts (attempts a kill cut off too), and its
        cells keep their outcome. A skip is no attempt: a cell the earlier plan skipped (predicted not to fit another
        --gpu-mem) is open here. The budget is the whole search's: said, with what is left."""
        no_attempt = (Status.STARTED.value, Status.UNMEASURED.value, Status.SKIPPED.value)
        ended = [parse(r) for r in self.existing if r.get("status") not in no_attempt]
        for r in ended + self.cut_off:
            self.search.earlier(r)
            self.begun.add(r.cell_hash)
            if self.o.replay is not None and r.replay is not None:  # its next attempt gets the next end
                self.o.replay.served[r.cell_hash] = self.o.replay.served.get(r.cell_hash, 0) + 1
        done = [c for c in self.search.candidates if c.state != "open"]
        budget, spent = self.o.s.answer.budget_s, self.search.spent_s
        self.search.resumed = True
        if budget is None:
            left = "no --budget: it measures until the answer is settled"
        elif spent < budget:
            left = f"--budget {budget:.0f} s is the whole search's, {budget - spent:.0f} s of it left"
        else:
            left = f"the --budget ({budget:.0f} s, the whole search's) is already spent: nothing more is measured"
        self.o.printer(
            f"resume: answer mode goes on from {len(done)} cell(s) already measured or failed in {self.store.path} "
            f"({spent:.0f} s of cell time spent); {left}"
        )

    def _check_same_groups(self) -> None:
        """InputError when --group-by groups the cells otherwise than the answer being resumed did (its records'
        answer notes): the earlier measurements were chosen to settle its groups, not these."""
        for rec in self.existing:
            group, c = (rec.get("answer") or {}).get("group"), self.search.by_hash.get(rec.get("cell_hash"))
            if group is None or c is None or group == self.search.group_of(c):
                continue
            short = {a.short: a.name for a in AXES}
            was = ",".join(short.get(k, k) for k in re.findall(r"(?:^|,)(\w+)=", group)) or "nothing (one group)"
            raise InputError(
                f"--group-by {','.join(self.o.s.answer.group_by) or 'nothing'}: the answer in {self.store.path} was "
                f"grouped by {was} ({rec['cell_name']} in {group!r}, now {self.search.group_of(c)!r}); resume with "
                f"--group-by {was}, or give a new --results to start another answer"
            )

    def _ran_for(self, start: dict) -> dict:
        """An attempt cut off by a kill: how long it ran, as far as the evidence tells (its log's last write, the
        last record its run wrote), with a warning saying so; {} when nothing tells."""
        t0 = _epoch(start.get("started_at"))
        log = self.o.logs / f"{start['cell_hash']}.{start.get('attempt', 1)}.log"
        seen = [(log.stat().st_mtime, f"its log's last write ({log})")] if log.is_file() else []
        same = [_epoch(r.get(k)) for r in self.existing if r.get("run_id") == start.get("run_id") for k in _TIMES]
        if any(t is not None for t in same):
            seen.append((max(t for t in same if t is not None), f"the last record of run {start.get('run_id')}"))
        t, how = max(seen, default=(None, ""))
        if t0 is None or t is None or t <= t0:
            return {}
        note = f"cut off by a kill: wall_s runs from its start to {how}, and counts against an answer's --budget"
        return {"wall_s": t - t0, "warnings": [note]}

    def _todo(self) -> list[tuple[Planned, int]]:
        o, n = self.o, self.o.repeats
        # A cell recorded without running (a rule's skip or a pruned cell, `free`) is recorded once, as repeat 1.
        units = [(it, r) for r in range(1, n + 1) for it in self.items if id(it) not in self.free or r == 1]
        if self.search is not None:  # answer mode: the search draws the cells that run (source)
            units = [(it, r) for it, r in units if id(it) in self.free]
        todo = [(it, r) for it, r in units if (it.cell.hash, r) not in self.stored and not self._skip_said(it)]
        if o.s.resume and o.s.prune:
            # An implied_oom record stands for every repeat of its cell (it is written once, as repeat 1).
            ended = {r["cell_hash"]: r["status"] for r in self.existing if r.get("status") != Status.STARTED.value}
            todo = [(it, r) for it, r in todo if ended.get(it.cell.hash) != Status.IMPLIED_OOM.value]
        if o.s.resume and len(todo) < len(units):
            what = "cells" if n == 1 else f"cell repeats ({n} per runnable cell)"
            o.printer(
                f"resume: {len(units) - len(todo)} of {len(units)} {what} already have a result in {self.store.path}"
            )
        return todo

    def _skip_said(self, it: Planned) -> bool:
        """On --resume, a cell this plan skips whose last record is a skip for the same reason: it stands, not
        written again. A skip for another reason (another --gpu-mem, rule or memory model) is written anew, and a cell
        an earlier plan skipped that this one runs, runs: a skip is no attempt."""
        said, skip = self.said_skips.get(it.cell.hash), self.skip_of(it)
        return said is not None and skip is not None and said == (skip.rule, skip.reason)

    def skip_of(self, it: Planned) -> Skip | None:
        """Why this plan records the cell without running it (a rule's skip, or pruned), or None: it runs."""
        if id(it) not in self.free:
            return None
        return it.skip or prune_skip(self.preds[id(it)])

    # -- implied outcomes -----------------------------------------------------------------------------

    def imply(self, prover: Cell, status: str, run_of: str | None) -> None:
        """Record the cells left that an out-of-memory end of prover implies."""
        if not self.o.s.prune:  # --no-prune runs every cell: the audit of what pruning and implying skip
            return
        # The queue left, and the units drawn but still waiting for their GPUs (admit turns those away); in
        # answer mode the cells the search has not measured yet.
        waiting = {it.cell.hash: it for it, _ in self.queue[self.k :]} | self.pending
        if self.search is not None:
            waiting |= {c.cell.hash: c.planned for c in self.search.waiting()}
        candidates = [
            it.cell
            for it in waiting.values()
            if it.skip is None and id(it) not in self.free and it.cell.hash not in self.begun
        ]
        hit = schedule.implied(prover, status, candidates)
        if not hit:
            return
        gone = {c.hash for c, _ in hit}
        self.queue = self.queue[: self.k] + [u for u in self.queue[self.k :] if u[0].cell.hash not in gone]
        by = {"cell_name": prover.name, "cell_hash": prover.hash, "status": status, "run_id": run_of}
        for c, how in hit:
            self.begun.add(c.hash)
            if c.hash in self.pending:
                self.turned_away.add(c.hash)
            ident = self.ident(c)
            self.attempts[c.hash] = ident["attempt"]
            self.i += 1
            if self.search is None:
                self.prog.total = self.i + len(self.queue) - self.k
            else:
                self.search.implied(c.hash)
            with launch.holding_signals():
                rec = self.save(Record.implied_oom(c, {**by, "how": how}, at=now(), **ident))
            self.recorded(self.i, rec)

    def imply_stored(self) -> None:
        """On --resume, out-of-memory ends already stored (the last outcome of a cell of this plan) imply as
        new ones do: a run stopped between an end and its implications, or cells added since."""
        if not self.o.s.resume:
            return
        in_plan = {it.cell.hash: it.cell for it in self.p.items}
        last = {r["cell_hash"]: r for r in self.existing if r.get("status") != Status.STARTED.value}
        for rec in last.values():
            if rec["cell_hash"] in in_plan and rec["status"] in schedule.WHERE:
                self.imply(in_plan[rec["cell_hash"]], rec["status"], rec.get("run_id"))

    # -- the attempts, as the executor asks for them ----------------------------------------------------

    def source(self):
        """The attempts left, drawn by dispatch only when one could start: a cell implied by an outcome that
        came in meanwhile (imply, in this thread) is no longer in the queue. A cell recorded without running
        (a rule's skip, pruned) is written here, in its turn. A micro-batch search's next probe comes first;
        in answer mode the search decides what runs once the queue (its skips) is done. WAIT while only
        what is in flight can decide what comes next."""
        while True:
            if self.probes:
                yield self.probes.pop(0)
            elif self.k < len(self.queue):
                it, repeat = self.queue[self.k]
                self.k += 1
                self.i += 1
                unit = Unit(self.i, it, repeat)
                if it.skip is not None or id(it) in self.free:
                    self.skip(unit)
                elif it.cell.micro_batch == AUTO:
                    size = self.p.matrix.batch.size
                    unit.search = SearchResult(
                        template=it.cell.name,
                        seed=seed_micro_batch(it.cell, self.hw),
                        ladder=ladder(size) if size else (),
                    )
                    self.probe(unit)
                else:
                    if it.cell.hash not in self.begun:
                        self.pending[it.cell.hash] = it
                    yield self.attempt_of(unit, it.cell, it.ds_config)
            elif self.search is not None and (req := self.search.next()) is not None:
                yield self.answer_attempt(req)
            elif self.running:
                yield WAIT
            else:
                if self.search is not None:
                    self.settle()
                return

    def answer_attempt(self, req: answer.Request) -> Attempt:
        """Answer mode: the attempt the search asked for; its record keeps the matrix's cell, its job runs the
        rung's schedule."""
        c = req.candidate
        if c.cell.hash not in self.index_of:
            self.i += 1
            self.index_of[c.cell.hash] = self.i
        unit = Unit(self.index_of[c.cell.hash], c.planned, c.tries + 1, request=req)
        self.search.started(c, req.rung, req)
        run_as = answer.rung_cell(c.cell, req.rung) if self.o.s.answer.halving else c.cell
        a = self.attempt_of(unit, run_as, c.planned.ds_config)
        a.cell = c.cell
        return a

    def settle(self, stopped: bool = False) -> None:
        """Answer mode's end: a record for every cell it did not measure, saying why; then the answer. On a stop
        too (the cells in flight recorded interrupted first), so every cell of the matrix has a record. A cell
        whose last record already says it was left unmeasured for the same reason (an earlier call of a
        --resume) gets no second one: a record is written when what it says changes."""
        said = self.unmeasured_before()
        for c, note in self.search.unmeasured(stopped):
            rec = Record.unmeasured(c.cell, note, at=now(), spent=self.search.spent_at_start, **self.ident(c.cell))
            if said.get(c.cell.hash) == rec.reason:
                continue
            self.i += 1
            self.attempts[c.cell.hash] = rec.attempt
            with launch.holding_signals():
                self.save(rec)
            self.recorded(self.i, rec)
        for text in answer_text.summary(self.search) + (
            self.against_recording() if self.o.replay and self.o.replay.ends else []
        ):
            self.o.printer(text)

    def unmeasured_before(self) -> dict[str, str]:
        """The cells whose last record in the results file (an earlier call's) is an unmeasured one, with its reason."""
        last = {r["cell_hash"]: r for r in self.existing if r.get("status") != Status.STARTED.value}
        return {h: r["reason"] for h, r in last.items() if r["status"] == Status.UNMEASURED.value}

    def against_recording(self) -> list[str]:
        """A replayed answer against the answer of every recorded end of the same cells (the full grid)."""
        o = self.o
        full = answer.Search([c.planned for c in self.search.candidates], self.hw, o.s.answer, o.platform.cuda)
        for ends in o.replay.ends.values():
            for rec, _ in ends:
                full.observe(parse(rec))
        a = answer.agreement(self.search, full)
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
            lines.append(f"  cost: {self.search.spent_s:.0f} s, {a['cost']:.0%} of the grid's {full.spent_s:.0f} s")
        return lines

    def attempt_of(self, unit: Unit, cell: Cell, ds_config: dict | None) -> Attempt:
        o = self.o
        how = launch.Launch(
            Path(),  # the log's name has the attempt's number, taken when it starts (admit)
            stall_s=stall_s({**os.environ, **(o.s.extra_env or {})}), extra_env=o.s.extra_env,
            sample_interval_s=telemetry.interval_for(o.platform.cuda),
        )  # fmt: skip
        job = Job(cell, ds_config, how)
        return Attempt(key=unit, cell=cell, shape=Shape(gpus_per_node=cell.gpus, nodes=cell.nodes), job=job)

    def probe(self, unit: Unit) -> None:
        """The search's next probe, first in line; or, once it has ended, say what it found."""
        mb = unit.search.next()
        if mb is not None:
            size = self.p.matrix.batch.size  # held: the accumulation makes up the rest of the batch
            cell = dataclasses.replace(
                unit.planned.cell, micro_batch=mb, **({"grad_accum": size // mb} if size else {})
            )
            self.probes.append(self.attempt_of(unit, cell, dsconfig.build(cell)))
            self.searching.add(id(unit))
            return
        self.searching.discard(id(unit))
        res = unit.search
        self.o.printer(
            f"micro_batch auto for {res.template}: "
            + (f"largest that ran: {res.largest_ok}" if res.largest_ok else "none ran")
            + f" ({len(res.probes)} probes from the model's {res.seed}; {res.ended})"
        )

    def skip(self, unit: Unit) -> None:
        """A cell recorded without running: a rule's skip, or pruned (predicted not to fit)."""
        it = unit.planned
        pred = None if it.skip else self.preds[id(it)]  # a pruned cell's: why it did not run
        ident = self.ident(it.cell)
        self.attempts[it.cell.hash] = ident["attempt"]
        skip = self.skip_of(it)
        with launch.holding_signals():
            rec = self.save(Record.skipped(it.cell, skip, at=now(), predicted=pred, **ident))
        self.recorded(unit.index, rec)

    def admit(self, handle: Handle) -> bool:
        """Placed (this thread): a cell implied out of memory while it waited for its GPUs does not run; any
        other has begun (no later outcome implies it), and its start is written before its job starts."""
        unit, cell = handle.attempt.key, handle.attempt.cell
        h = unit.planned.cell.hash
        self.pending.pop(h, None)
        if h in self.turned_away and unit.search is None:
            return False
        self.begun.add(h)
        pred = prediction(cell, handle.attempt.job.ds_config, self.hw, self.o.s.margin)
        ident = self.ident(cell)
        self.attempts[cell.hash] = ident["attempt"]
        log = self.o.logs / f"{cell.hash}.{ident['attempt']}.log"
        handle.attempt.job = handle.attempt.job.with_launch(log_path=log)
        req = unit.request
        note = {"role": req.role, "why": req.why, "rung": req.rung, "group": req.group} if req else None
        context = AttemptContext(
            predicted=pred,
            fixed_costs=self.costs,
            placement=handle.where or None,
            answer=note,
            rates=self.rates.to_dict() if self.rates else None,
        )
        started = Record.started(cell, started_at=now(), repeat=unit.repeat, context=context, **ident)
        with launch.holding_signals():
            self.save(started)
        self.running[id(handle)] = started
        self.prog.start(unit.index, cell)
        return True

    def done(self, f: Finished) -> None:
        """An attempt ended (this thread): its record, the ETA, what its out-of-memory end implies, and a
        search's next probe."""
        unit, job = f.handle.attempt.key, f.handle.attempt.job
        started = self.running.pop(id(f.handle))
        rec = ended(started, job, value=f.value, error=f.error, tb=f.traceback)
        if unit.search is not None:
            found = unit.search.add(job.cell.micro_batch, rec.status.value, job.cell.hash)
            rec = rec.model_copy(update={"search": Search.model_validate(found)})
        with launch.holding_signals():
            self.save(rec)
        if self.search is not None and unit.request is not None:
            self.search.observe(rec, unit.request.rung)
        if rec.status.ran and rec.wall_s is not None:
            self.eta.observe(unit.planned.cell, rec.wall_s)
        self.recorded(unit.index, rec)
        if rec.status.value in schedule.WHERE:
            self.imply(job.cell, rec.status.value, self.run_id)
        if unit.search is not None and rec.status is not Status.INTERRUPTED:
            self.probe(unit)

    # -- the loop ---------------------------------------------------------------------------------------

    def go(self) -> None:
        """Reach the run's executor, prepare, then run every unit left on it; Stopped and StoreWriteError end
        it (each said), the executor is closed, the fork servers stopped and the summary printed whatever
        happens."""
        o, finished, ex = self.o, False, None
        self.t_run = time.time()
        try:
            with stop_on_signals():
                # First: a cluster that cannot be reached is said before anything is built.
                ex = executor_for(o.executor, o.slots, o.platform, **self.executor_options())
                self.width = ex.slots
                if getattr(ex, "prepares", True) and not self.nothing_to_measure():
                    self.prepare(ex)
                self.imply_stored()
                dispatch(ex, self.source(), admit=self.admit, done=self.done)
                finished = True
        except Stopped as e:
            e.results_path = self.store.path
            if self.search is not None:
                self.settle(stopped=True)
            raise
        except StoreWriteError as e:
            self.say_write_error(e)
            raise
        except HarnessError as e:
            self.say_harness_error(e)
            raise
        except OSError as e:
            if e.errno not in HARNESS_ERRNOS:
                raise
            err = HarnessError(None, e)  # before any cell: writing the run's own files (logs, helpers)
            self.say_harness_error(err)
            raise err from e
        finally:
            launch.stop_forkserver()
            if ex is not None:
                ex.close()
            self.prog.close(time.time() - self.t_run, len(self.written), finished)

    def executor_options(self) -> dict:
        """What the run's executor is built with beside its slots and platform (each takes its own); cells: those
        that may run, so a cluster executor refuses what it cannot place before any cell runs."""
        o = self.o
        return {
            "address": o.s.address, "logs": o.logs, "printer": o.printer, "recording": o.replay, "settings": o.slurm,
            "cells": [it.cell for it in self.will_run() if it.skip is None],
        }  # fmt: skip

    def will_run(self) -> list[Planned]:
        """The planned cells this run may still run: not pruned (predicted not to fit); in answer mode, the search's
        candidates too."""
        will_run = {id(it): it for it, _ in self.queue if id(it) not in self.free}
        if self.search is not None:
            will_run |= {id(c.planned): c.planned for c in self.search.candidates}
        return list(will_run.values())

    def nothing_to_measure(self) -> bool:
        """Answer mode whose --budget left pays for no attempt (earlier calls spent it): none will start, so nothing is
        built for one (the ops, the QLoRA checkpoints); said."""
        if self.search is None or not self.search.unaffordable():
            return False
        self.o.printer("prepare: nothing built, the --budget left pays for no attempt (a larger --budget goes on)")
        return True

    def prepare(self, ex) -> None:
        """The one-off costs, for the cells that will run (not those skipped or predicted not to fit)."""
        o = self.o
        if o.slots.max_cells > 1 and o.executor == "local":
            where = "GPUs" if o.platform.cuda else "CPU slots"
            o.printer(f"packing: up to {o.slots.max_cells} cells side by side on {where} {list(o.slots.ids)}")
        items = self.will_run()
        self.costs = prepare(items, o.logs, o.s.extra_env, o.platform, o.printer, o.slots, ex.forkservers) or None

    def say_harness_error(self, e: HarnessError) -> None:
        """The run stops on a failure of zerobench's own (not a cell's): say it, and what --resume does."""
        e.results_path = self.store.path
        self.o.printer(f"zerobench: stopped: {e}")
        self.o.printer(
            f"  written to {self.store.path} by this run: {len(self.written)} outcome(s); the cell it stopped in "
            "has none: once the folder can be written, `--resume` runs it again"
        )

    def say_write_error(self, e: StoreWriteError) -> None:
        e.reported = True
        lost, printer = getattr(e, "record", None), self.o.printer
        printer(f"zerobench: stopped: {e.strerror}")
        if lost is not None and lost.get("status") != Status.STARTED.value:
            printer(f"  lost: {line(self.i, self.prog.total, lost)}")
        elif lost is not None:
            printer(f"  not started: {lost['cell_name']} (its start could not be recorded)")
        printer(
            f"  written to {self.store.path} by this run: {len(self.written)} outcome(s), each whole; "
            "once there is room, `--resume` runs the cells that have none"
        )


def _flagged_resolution(search: answer.Search) -> float:
    """The resolution of two measurements, one of them flagged (bench.records.quality): what 'the same' allows there."""
    flagged = quality.NOISE["gpu_flagged" if search.cuda else "cpu"]
    return math.exp(answer.Z * math.hypot(search.noise, flagged)) - 1
