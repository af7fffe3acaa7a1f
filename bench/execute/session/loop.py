"""The loop's state as an object: the queue of cell repeats left, the cells begun, drawn-but-waiting (pending) and
implied out of memory, the attempts in flight; every record goes through its ledger (bench.execute.session.ledger).

The session is the source of attempts (source: one generator per mode), writes each start when an executor has
placed it (admit) and each end when it comes back (done), all in this thread: only the session writes to the results
file. The executor (bench.execute.executors.registry) decides where and when each attempt's job runs."""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Iterator

from ...host.rates import Rates
from ...matrix.axes import AUTO
from ...matrix.cells import Cell
from ...matrix.rules import Skip
from ...records.record import AttemptContext, Record, Search
from ...records.status import Status
from ...records.store import Store
from .. import answer, launch, schedule
from ..attempt import ended, now
from ..executors.executor import WAIT, Attempt, Finished, Handle, dispatch
from ..executors.registry import executor_for
from ..plan import Plan, Planned, arrange, hardware, prediction, prune_skip
from ..progress import Progress
from ..signals import Stopped, stop_on_signals
from . import earlier, machine
from .answering import Answering
from .ledger import Ledger
from .microbatch import MicroBatches
from .units import Run, Unit, attempt_of

__all__ = ["Session"]


class Session:
    """One run of a plan into a store: resume state, queue, implications, attempts, records."""

    def __init__(self, p: Plan, store: Store, run: Run, run_id: str):
        s = run.settings
        self.p, self.store, self.run, self.run_id = p, store, run, run_id
        # The memory model's hardware; the machine's rates join it once probed (go), before any step time is predicted.
        self.hw = hardware(run.platform, s.gpu_mem, s.host_mem)
        self.rates: Rates | None = None
        self.earlier = earlier.read(store, s.resume)
        self.ledger = Ledger(store, run, run_id, dict(self.earlier.attempts), left=self.left)
        self.items, self.preds, self.free = arrange(p.items, self.hw, s.margin, s.prune, s.order)
        self.runnable = [it for it in self.items if it.skip is None and id(it) not in self.free]
        self.queue: deque[tuple[Planned, int]] = deque()  # the cell repeats left to draw
        self.begun: set[str] = set()  # cells that have begun: never implied, whatever ends later
        self.pending: dict[str, Planned] = {}  # drawn by the pool, not yet placed
        self.turned_away: set[str] = set()  # of those, implied out of memory meanwhile
        self.costs: dict | None = None
        self.eta = schedule.Eta()
        self.micro = MicroBatches(run, p.matrix.batch.size)
        self.running: dict[int, Record] = {}  # id(handle) -> the started record of each attempt in flight
        self.answering = Answering(run, self.runnable, self.hw, run.here(run_id), self.preds) if s.answer else None
        self.width = run.slots.max_cells  # how many cells run side by side (the executor's slots, once it is up)

    @property
    def search(self) -> answer.Search | None:
        return self.answering.search if self.answering is not None else None

    @property
    def written(self) -> list[Record]:
        return self.ledger.written

    def left(self) -> float | None:
        if self.search is not None:
            return self.search.left_s() / self.width
        serial = self.eta.remaining(it.cell for it, _ in self.queue if id(it) not in self.free)
        return None if serial is None else serial / self.width  # packed cells run side by side

    # -- what is left to do ---------------------------------------------------------------------------

    def load(self) -> None:
        """On --resume, the stale starts (recorded interrupted, with the time they ran) and what is done; then the
        queue of cell repeats to run."""
        resume, e = self.run.settings.resume, self.earlier
        if self.answering is not None and resume:
            self.answering.check_same_groups(e.records, self.store.path)  # before anything is written
        cut_off = [self._cut_off(start) for start in e.stale]
        self.queue = deque(self._todo())
        self.begun = {h for h, _ in e.stored}
        total = len(self.queue) + (len(self.search.candidates) if self.search is not None else 0)
        self.ledger.prog = Progress(total, enabled=self.run.settings.progress, printer=self.run.printer)
        if self.answering is not None and resume:
            self.begun |= self.answering.resume(e.records, cut_off, self.store.path)

    def _cut_off(self, start: Record) -> Record:
        """A start a killed run left: recorded interrupted, with the time it ran."""
        why = f"run {start.run_id} stopped while this cell ran (found by --resume)"
        ran = earlier.ran_for(start, self.earlier.records, self.run.logs)
        rec = self.ledger.save(Record.interrupted(start, why, ended_at=now(), **ran))
        h, attempts = start.cell_hash, self.ledger.attempts
        attempts[h] = max(attempts.get(h, 0), start.attempt)
        return rec

    def _todo(self) -> list[tuple[Planned, int]]:
        s, n = self.run.settings, self.run.settings.repeats
        # A cell recorded without running (a rule's skip or a pruned cell, `free`) is recorded once, as repeat 1.
        units = [(it, r) for r in range(1, n + 1) for it in self.items if id(it) not in self.free or r == 1]
        if self.search is not None:  # answer mode: the search draws the cells that run (source)
            units = [(it, r) for it, r in units if id(it) in self.free]
        todo = self.earlier.left(units, self.skip_of, implied_stand=s.resume and s.prune)
        if s.resume and len(todo) < len(units):
            what = "cells" if n == 1 else f"cell repeats ({n} per runnable cell)"
            self.run.printer(
                f"resume: {len(units) - len(todo)} of {len(units)} {what} already have a result in {self.store.path}"
            )
        return todo

    def skip_of(self, it: Planned) -> Skip | None:
        """Why this plan records the cell without running it (a rule's skip, or pruned), or None: it runs."""
        if id(it) not in self.free:
            return None
        return it.skip or prune_skip(self.preds[id(it)])

    # -- implied outcomes -----------------------------------------------------------------------------

    def imply(self, prover: Cell, status: str, run_of: str | None) -> None:
        """Record the cells left that an out-of-memory end of prover implies."""
        if not self.run.settings.prune:  # --no-prune runs every cell: the audit of what pruning and implying skip
            return
        # The queue left, and the units drawn but still waiting for their GPUs (admit turns those away); in
        # answer mode the cells the search has not measured yet.
        waiting = {it.cell.hash: it for it, _ in self.queue} | self.pending
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
        self.queue = deque(u for u in self.queue if u[0].cell.hash not in gone)
        by = {"cell_name": prover.name, "cell_hash": prover.hash, "status": status, "run_id": run_of}
        for c, how in hit:
            self.begun.add(c.hash)
            if c.hash in self.pending:
                self.turned_away.add(c.hash)
            ident = self.ledger.claim(c)
            i = self.ledger.next_index()
            if self.search is None:
                self.ledger.prog.total = i + len(self.queue)
            else:
                self.search.implied(c.hash)
            rec = self.ledger.save(Record.implied_oom(c, {**by, "how": how}, at=now(), **ident))
            self.ledger.recorded(i, rec)

    def imply_stored(self) -> None:
        """On --resume, out-of-memory ends already stored (the last outcome of a cell of this plan) imply as
        new ones do: a run stopped between an end and its implications, or cells added since."""
        if not self.run.settings.resume:
            return
        in_plan = {it.cell.hash: it.cell for it in self.p.items}
        for h, rec in self.earlier.last.items():
            if h in in_plan and rec.status.value in schedule.WHERE:
                self.imply(in_plan[h], rec.status.value, rec.run_id)

    # -- the attempts, as the executor asks for them ----------------------------------------------------

    def source(self) -> Iterator[Attempt | None]:
        """The attempts left, drawn by dispatch only when one could start, so what ends meanwhile may decide the
        next (a cell implied out of memory is no longer in the queue). WAIT while only what is in flight can decide
        what comes next."""
        return self._answered() if self.answering is not None else self._grid()

    def _grid(self) -> Iterator[Attempt | None]:
        """Every cell repeat in the queue, in turn; a micro-batch search's next probe before the next of them."""
        while self.micro.probes or self.queue or self.running:
            if self.micro.probes:
                yield self.micro.probes.pop(0)
            elif self.queue:
                if (a := self._draw(*self.queue.popleft())) is not None:
                    yield a
            else:
                yield WAIT

    def _answered(self) -> Iterator[Attempt | None]:
        """Answer mode: the queue's cells recorded without running, then what the search asks for until it asks for
        nothing and nothing is in flight; then the cells it left unmeasured, and the answer (settle)."""
        while self.queue:
            self.skip(Unit(self.ledger.next_index(), *self.queue.popleft()))
        while (req := self.search.next()) is not None or self.running:
            yield WAIT if req is None else self.answering.attempt(req, self.ledger.next_index)
        self.answering.settle(self.ledger, self.earlier.unmeasured())

    def _draw(self, it: Planned, repeat: int) -> Attempt | None:
        """A cell repeat from the queue: recorded without running (a rule's skip, pruned), a micro-batch search begun
        (its first probe next in line), or the attempt that runs it."""
        unit = Unit(self.ledger.next_index(), it, repeat)
        if it.skip is not None or id(it) in self.free:
            self.skip(unit)
            return None
        if it.cell.micro_batch == AUTO:
            self.micro.begin(unit, self.hw)
            return None
        if it.cell.hash not in self.begun:
            self.pending[it.cell.hash] = it
        return attempt_of(self.run, unit, it.cell, it.ds_config)

    def skip(self, unit: Unit) -> None:
        """A cell recorded without running: a rule's skip, or pruned (predicted not to fit)."""
        it = unit.planned
        pred = None if it.skip else self.preds[id(it)]  # a pruned cell's: why it did not run
        rec = Record.skipped(it.cell, self.skip_of(it), at=now(), predicted=pred, **self.ledger.claim(it.cell))
        self.ledger.recorded(unit.index, self.ledger.save(rec))

    def admit(self, handle: Handle) -> bool:
        """Placed (this thread): a cell implied out of memory while it waited for its GPUs does not run; any
        other has begun (no later outcome implies it), and its start is written before its job starts."""
        unit, cell = handle.attempt.key, handle.attempt.cell
        h = unit.planned.cell.hash
        self.pending.pop(h, None)
        if h in self.turned_away and unit.search is None:
            return False
        self.begun.add(h)
        pred = prediction(cell, handle.attempt.job.ds_config, self.hw, self.run.settings.margin)
        ident = self.ledger.claim(cell)
        log = self.run.logs / f"{cell.hash}.{ident['attempt']}.log"
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
        self.running[id(handle)] = self.ledger.save(started)
        self.ledger.prog.start(unit.index, cell)
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
        self.ledger.save(rec)
        if self.search is not None and unit.request is not None:
            self.search.observe(rec, unit.request.rung)
        if rec.status.ran and rec.wall_s is not None:
            self.eta.observe(unit.planned.cell, rec.wall_s)
        self.ledger.recorded(unit.index, rec)
        if rec.status.value in schedule.WHERE:
            self.imply(job.cell, rec.status.value, self.run_id)
        if unit.search is not None and rec.status is not Status.INTERRUPTED:
            self.micro.next(unit)

    # -- the loop ---------------------------------------------------------------------------------------

    def go(self) -> None:
        """Reach the run's executor; where anything is left to measure, probe the machine and prepare; then run
        every unit left on it. Stopped and StoreWriteError end it (each said), the executor is closed, the fork
        servers stopped and the summary printed whatever happens."""
        finished, ex = False, None
        self.ledger.t_run = time.time()
        try:
            with self.ledger.own_failures(), stop_on_signals():
                # First: a cluster that cannot be reached is said before anything is built.
                ex = executor_for(self.run.executor, self.run.slots, self.run.platform, **self.executor_options())
                self.width = ex.slots
                if getattr(ex, "prepares", True) and not self.nothing_to_measure():
                    self.use_rates(machine.probe(self.run, self.runnable))
                    if not self.nothing_to_measure():  # answer mode's budget, now with the machine's rates
                        self.costs = machine.prepare(self.run, self.will_run(), ex.forkservers)
                        if machine.cpu_adam_built(self.costs, self.rates):
                            self.use_rates(machine.probe(self.run, self.runnable))  # CPU Adam alone: the rest is cached
                self.imply_stored()
                dispatch(ex, self.source(), admit=self.admit, done=self.done)
                finished = True
        except Stopped as e:
            e.results_path = self.store.path
            if self.answering is not None:
                self.answering.settle(self.ledger, self.earlier.unmeasured(), stopped=True)
            raise
        finally:
            launch.stop_forkserver()
            if ex is not None:
                ex.close()
            self.ledger.close(finished)

    def executor_options(self) -> dict:
        """What the run's executor is built with beside its slots and platform (each takes its own); cells: those
        that may run, so a cluster executor refuses what it cannot place before any cell runs."""
        run = self.run
        return {
            "address": run.settings.address, "logs": run.logs, "printer": run.printer, "recording": run.recording,
            "settings": run.slurm, "cells": [it.cell for it in self.will_run() if it.skip is None],
        }  # fmt: skip

    def will_run(self) -> list[Planned]:
        """The planned cells this run may still run: not pruned (predicted not to fit); in answer mode, the search's
        candidates too."""
        will_run = {id(it): it for it, _ in self.queue if id(it) not in self.free}
        if self.search is not None:
            will_run |= {id(c.planned): c.planned for c in self.search.candidates}
        return list(will_run.values())

    def nothing_to_measure(self) -> bool:
        """Nothing will start, so nothing is probed or built for it (the machine's rates, the ops, the QLoRA
        checkpoints): no cell left to run, or in answer mode a --budget left that pays for no attempt (earlier calls
        spent it; said)."""
        if self.search is None:
            return not any(it.skip is None for it in self.will_run())
        if not self.search.unaffordable():
            return False
        self.run.printer("prepare: nothing built, the --budget left pays for no attempt (a larger --budget goes on)")
        return True

    def use_rates(self, rates: Rates | None) -> None:
        """The machine's probed rates join the hardware every step time is predicted on; answer mode's search is
        built again on them."""
        self.rates, self.hw = rates, dataclasses.replace(self.hw, rates=rates)
        if self.answering is not None and rates is not None:
            self.answering.with_hardware(self.hw)
