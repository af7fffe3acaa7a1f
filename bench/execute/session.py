"""The loop's state as an object: the queue of cell repeats left, the attempts per cell, the cells begun,
drawn-but-waiting (pending) and implied out of memory, and the Records written. Only the session writes
to the results file; the executor (bench.execute.local) decides where and when each unit runs.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import dsconfig, env, schedule, telemetry
from ..axes import AUTO
from ..cells import Cell
from ..estimate import Hardware
from ..estimate.search import search_micro_batch, seed_micro_batch
from ..record import Record, Search, parse
from ..status import Status
from ..store import Store, StoreWriteError
from . import launch, local
from .attempt import HARNESS_ERRNOS, HarnessError, attempt, now
from .executor import Attempt, Shape, dispatch
from .plan import Plan, Planned, arrange, hardware, prediction, prune_skip
from .prepare import prepare
from .progress import Progress, line
from .registry import executor_for
from .settings import stall_s
from .signals import Stopped, stop_on_signals

__all__ = ["Options", "Session"]

Unit = tuple[int, tuple[Planned, int]]  # (progress index, (planned cell, repeat))


@dataclass
class Options:
    """How a run goes, as `run()` was asked (bench.execute.run documents each)."""

    matrix_path: str
    resume: bool
    logs: Path
    progress: bool
    extra_env: dict[str, str] | None
    printer: Callable
    on_record: Callable | None
    prune: bool
    gpu_mem: int | None
    margin: float
    repeats: int
    order: str
    platform: env.Platform
    slots: local.Slots
    executor: str = "local"  # a name in bench.execute.registry.EXECUTORS


class Session:
    """One run of a plan into a store: resume state, queue, implications, attempts, records."""

    def __init__(self, p: Plan, store: Store, o: Options, run_id: str):
        self.p, self.store, self.o, self.run_id = p, store, o, run_id
        self.hw: Hardware = hardware(o.platform, o.gpu_mem)
        self.written: list[Record] = []  # the outcomes this run stored, in order
        self.attempts: dict[str, int] = {}  # cell hash -> the last attempt number used
        self.existing = store.records()
        self.stored: set[tuple[str, int]] = set()  # (cell hash, repeat) with an outcome (--resume)
        self.items, self.preds, self.free = arrange(p.items, self.hw, o.margin, o.prune, o.order)
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
        self._attempts_lock = threading.Lock()  # repeats of one cell may run side by side

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
        return str(self.o.matrix_path)

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
        serial = self.eta.remaining(it.cell for it, _ in self.queue[self.k :] if id(it) not in self.free)
        return None if serial is None else serial / self.o.slots.max_cells  # packed cells run side by side

    # -- what is left to do ---------------------------------------------------------------------------

    def load(self) -> None:
        """The attempts so far, and on --resume the stale starts (recorded interrupted) and what is done;
        then the queue of cell repeats to run."""
        for rec in self.existing:
            if rec.get("status") != Status.STARTED.value:
                self.attempts[rec["cell_hash"]] = max(self.attempts.get(rec["cell_hash"], 0), rec.get("attempt", 1))
        if self.o.resume:
            self.stored, stale = self.store.resume_state(self.existing)
            for s in stale:
                why = f"run {s['run_id']} stopped while this cell ran (found by --resume)"
                with launch.holding_signals():
                    self.save(Record.interrupted(parse(s), why, ended_at=now()))
                self.attempts[s["cell_hash"]] = max(self.attempts.get(s["cell_hash"], 0), s.get("attempt", 1))
        self.queue = self._todo()
        self.begun = {h for h, _ in self.stored}
        self.prog = Progress(len(self.queue), enabled=self.o.progress, printer=self.o.printer)

    def _todo(self) -> list[tuple[Planned, int]]:
        o, n = self.o, self.o.repeats
        # A cell recorded without running (a rule's skip or a pruned cell, `free`) is recorded once, as repeat 1.
        units = [(it, r) for r in range(1, n + 1) for it in self.items if id(it) not in self.free or r == 1]
        todo = [(it, r) for it, r in units if (it.cell.hash, r) not in self.stored]
        if o.resume and o.prune:
            # An implied_oom record stands for every repeat of its cell (it is written once, as repeat 1).
            ended = {r["cell_hash"]: r["status"] for r in self.existing if r.get("status") != Status.STARTED.value}
            todo = [(it, r) for it, r in todo if ended.get(it.cell.hash) != Status.IMPLIED_OOM.value]
        if o.resume and len(todo) < len(units):
            what = "cells" if n == 1 else f"cell repeats ({n} per runnable cell)"
            o.printer(
                f"resume: {len(units) - len(todo)} of {len(units)} {what} already have a result in {self.store.path}"
            )
        return todo

    # -- implied outcomes -----------------------------------------------------------------------------

    def imply(self, prover: Cell, status: str, run_of: str | None) -> None:
        """Record the cells left that an out-of-memory end of prover implies."""
        if not self.o.prune:  # --no-prune runs every cell: the audit of what pruning and implying skip
            return
        # The queue left, and the units drawn but still waiting for their GPUs (admit turns those away).
        waiting = {it.cell.hash: it for it, _ in self.queue[self.k :]} | self.pending
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
            self.prog.total = self.i + len(self.queue) - self.k
            pred = self.preds[id(waiting[c.hash])]
            with launch.holding_signals():
                rec = self.save(Record.implied_oom(c, {**by, "how": how}, at=now(), predicted=pred, **ident))
            self.recorded(self.i, rec)

    def imply_stored(self) -> None:
        """On --resume, out-of-memory ends already stored (the last outcome of a cell of this plan) imply as
        new ones do: a run stopped between an end and its implications, or cells added since."""
        if not self.o.resume:
            return
        in_plan = {it.cell.hash: it.cell for it in self.p.items}
        last = {r["cell_hash"]: r for r in self.existing if r.get("status") != Status.STARTED.value}
        for rec in last.values():
            if rec["cell_hash"] in in_plan and rec["status"] in schedule.WHERE:
                self.imply(in_plan[rec["cell_hash"]], rec["status"], rec.get("run_id"))

    # -- the units, as the executor asks for them -----------------------------------------------------

    def draw(self):
        """The units left, drawn by the pool only when it can place one: a cell implied by an outcome
        that came in meanwhile (imply, in this thread) is no longer in the queue."""
        while self.k < len(self.queue):
            it, repeat = self.queue[self.k]
            self.k += 1
            self.i += 1
            if it.cell.hash not in self.begun:
                self.pending[it.cell.hash] = it
            yield self.i, (it, repeat)

    def attempts_left(self):
        """The units left as the executor's attempts (drawn as the executor asks for them)."""
        for u in self.draw():
            it, repeat = u[1]
            shape = Shape(gpus_per_node=self.width(u))
            yield Attempt(key=u, cell=it.cell, ds_config=it.ds_config, repeat=repeat, shape=shape, run=self._runner(u))

    def _runner(self, u: Unit):
        return lambda _placement: self.unit(u)

    def admit(self, u: Unit) -> bool:
        """At placement (this thread): a unit implied out of memory while it waited for its GPUs does not
        run; any other has begun, and no later outcome implies it."""
        h = u[1][0].cell.hash
        self.pending.pop(h, None)
        if h in self.turned_away:
            return False
        self.begun.add(h)
        return True

    def width(self, u: Unit) -> int:
        it = u[1][0]  # a CPU cell's ranks are not devices: it takes at most every slot
        if it.skip is not None or id(it) in self.free:
            return 0  # a record to write (a rule's skip, or pruned), here: no GPU to wait for
        return it.cell.gpus if self.o.platform.cuda else min(it.cell.gpus, len(self.o.slots.ids))

    def unit(self, u: Unit) -> tuple[list[Record], float | None]:
        """One unit of work: a cell (or a micro-batch search) run, or a skip recorded; its records and, for
        a cell that ran, its wall seconds (for the ETA, kept in this thread by unit_done)."""
        n, (it, repeat) = u
        cell = it.cell
        if it.skip is not None:
            ident = {**self.ident(cell), "fixed_costs": self.costs}
            with launch.holding_signals():
                return [self.save(Record.skipped(cell, it.skip, at=now(), **ident))], None
        t0 = time.time()
        if cell.micro_batch == AUTO:
            recs = self.search(n, cell)
        else:
            recs = [self.attempt_cell(n, cell, it.ds_config, repeat=repeat)]
        return recs, (time.time() - t0 if recs[-1].status.ran else None)

    def unit_done(self, u: Unit, ended: tuple[list[Record], float | None]) -> None:
        n, (it, _) = u
        recs, seconds = ended
        if seconds is not None:
            self.eta.observe(it.cell, seconds)
        for rec in recs:
            self.recorded(n, rec)
        for rec in recs:
            if rec.status.value in schedule.WHERE and (prover := _cell_of(rec, it.cell)) is not None:
                self.imply(prover, rec.status.value, self.run_id)

    # -- attempts ---------------------------------------------------------------------------------------

    def attempt_cell(self, i: int, cell: Cell, ds_config: dict | None, search_after=None, repeat: int = 1) -> Record:
        """One cell: its records (started, then its outcome, or interrupted when the run is stopped); or
        skipped when the memory model predicts it does not fit and prune is on. A probe of a micro-batch
        search (search_after) is never pruned: the search settles by real runs."""
        o = self.o
        pred = prediction(cell, ds_config, self.hw, o.margin)
        with self._attempts_lock:
            ident = {**self.ident(cell), "fixed_costs": self.costs}
            self.attempts[cell.hash] = ident["attempt"]
        skip = prune_skip(pred) if o.prune and search_after is None else None
        if skip is not None:
            with launch.holding_signals():
                return self.save(Record.skipped(cell, skip, at=now(), predicted=pred, **ident))
        lane = local.lane()  # where the pool placed this cell (None: called outside a pool)
        slots = list(lane.slots) if lane else list(range(cell.gpus))
        gpus = slots if o.platform.cuda else None
        placement = {"gpus": gpus} if o.platform.cuda else {"cpu_slots": slots}
        started = Record.started(cell, started_at=now(), predicted=pred, repeat=repeat, placement=placement, **ident)
        log_path = o.logs / f"{cell.hash}.{ident['attempt']}.log"
        stage = "before"  # -> "started" once its start is on disk
        try:
            # A stop held while a record is written lands right after it, inside this try.
            with launch.holding_signals():
                self.save(started)
                stage = "started"
            self.prog.start(i, cell)
            rec = attempt(
                started, cell, ds_config, log_path=log_path, gpus=gpus, lane=lane,
                stall_s=stall_s({**os.environ, **(o.extra_env or {})}), extra_env=o.extra_env,
                sample_interval_s=telemetry.interval_for(o.platform.cuda),
            )  # fmt: skip
            if search_after is not None:
                found = Search.model_validate(search_after(rec.status.value, cell.hash))
                rec = rec.model_copy(update={"search": found})
            with launch.holding_signals():
                rec = self.save(rec)
                stage = "ended"
            return rec
        except KeyboardInterrupt as e:
            if stage == "started":
                reason = getattr(e, "reason", None) or "stopped by the user"  # Stopped, local.Halted: theirs
                with launch.holding_signals():
                    self.written.append(
                        self.save(Record.interrupted(started, reason, ended_at=now(), log=str(log_path)))
                    )
            raise

    def search(self, i: int, template: Cell) -> list[Record]:
        """micro_batch: auto: probe micro-batches (each probe a real cell, recorded) for the largest that
        runs, starting from the memory model's largest that fits; out of memory is an answer, not a failure."""
        seed = seed_micro_batch(template, self.hw)
        records: list[Record] = []

        def probe(mb: int, search_after) -> tuple[str, str]:
            cell = dataclasses.replace(template, micro_batch=mb)
            rec = self.attempt_cell(i, cell, dsconfig.build(cell), search_after)
            records.append(rec)
            return rec.status.value, cell.hash

        result = search_micro_batch(probe, seed=seed, template=template.name)
        self.o.printer(
            f"micro_batch auto for {template.name}: "
            + (f"largest that ran: {result.largest_ok}" if result.largest_ok else "none ran")
            + f" ({len(result.probes)} probes from the model's {seed}; {result.ended})"
        )
        return records

    # -- the loop ---------------------------------------------------------------------------------------

    def go(self) -> None:
        """Prepare, then run every unit left on the local executor; Stopped and StoreWriteError end it
        (each said), the fork servers are stopped and the summary printed whatever happens."""
        o, finished = self.o, False
        self.t_run = time.time()
        try:
            with stop_on_signals():
                # Only for the cells that will run: not for those skipped or predicted not to fit.
                will_run = {id(it): it for it, _ in self.queue if id(it) not in self.free}
                if o.slots.max_cells > 1:
                    where = "GPUs" if o.platform.cuda else "CPU slots"
                    o.printer(f"packing: up to {o.slots.max_cells} cells side by side on {where} {list(o.slots.ids)}")
                self.costs = (
                    prepare(list(will_run.values()), o.logs, o.extra_env, o.platform, o.printer, o.slots) or None
                )
                self.imply_stored()
                dispatch(
                    executor_for(o.executor, o.slots),
                    self.attempts_left(),
                    done=lambda a, ended: self.unit_done(a.key, ended),
                    admit=lambda a: self.admit(a.key),
                )
                finished = True
        except Stopped as e:
            e.results_path = self.store.path
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
            self.prog.close(time.time() - self.t_run, len(self.written), finished)

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


def _cell_of(rec: Record, cell: Cell) -> Cell | None:
    """The cell a record ran: `cell`, or the probe of a micro-batch search whose record this is."""
    if rec.cell_hash == cell.hash:
        return cell
    probe = dataclasses.replace(cell, micro_batch=rec.cell["micro_batch"])
    return probe if probe.hash == rec.cell_hash else None
