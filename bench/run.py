"""The orchestrator: validate everything, then run each cell in its own process and record it.

Never imports torch. No exception escapes for a cell that failed: every end is a record.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import cache, dsconfig, env, faults, heartbeat, hostmem, launch, matrix, pool, rules, schedule, telemetry
from .axes import AUTO, OPTIMIZERS, Offload
from .cells import Cell
from .estimate import DEFAULT_MARGIN, Hardware, Verdict, predict, short_of, verdict
from .estimate.search import search_micro_batch, seed_micro_batch
from .problems import ConfigError, InputError, Problem
from .record import Record, Search, parse
from .status import Status
from .store import Store, StoreWriteError, check_writable

__all__ = [
    "Plan",
    "Stopped",
    "plan",
    "run",
    "prepare",
    "stop_on_signals",
    "default_results_path",
    "new_run_id",
    "now",
]


class Stopped(KeyboardInterrupt):
    """The run was stopped by SIGINT (Ctrl-C) or SIGTERM (`kill`, a job scheduler): the running cell's
    worker was stopped and recorded as interrupted; `results_path` holds what finished."""

    def __init__(self, signum: int, results_path: Path | None = None):
        super().__init__(signum)
        self.signum, self.results_path = signum, results_path

    @property
    def signame(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal ended: 130, 143."""
        return 128 + self.signum

    @property
    def reason(self) -> str:
        return "stopped by the user (SIGINT)" if self.signum == signal.SIGINT else f"stopped by {self.signame}"


_stopping: list[int] = []  # while stop_on_signals() is active: the signal that stopped the run, once one did
_active = False


@contextlib.contextmanager
def stop_on_signals():
    """SIGTERM stops a run the way Ctrl-C does: the first SIGINT or SIGTERM raises Stopped where the
    run is, so the worker is stopped, the cell recorded and the report written; repeats while that
    cleanup runs are ignored (it is bounded; SIGKILL still ends everything). Nests: the outermost wins."""
    global _active
    if _active or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        if not _stopping:
            _stopping.append(signum)
            raise Stopped(signum)

    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in old:
        signal.signal(sig, handler)
    _active = True
    _stopping.clear()
    try:
        yield
    finally:
        _active = False
        for sig, h in old.items():
            signal.signal(sig, h)


@dataclass(frozen=True)
class Planned:
    cell: Cell
    skip: rules.Skip | None
    ds_config: dict | None


@dataclass(frozen=True)
class Plan:
    matrix: matrix.Matrix
    source: str
    items: tuple[Planned, ...]

    @property
    def runnable(self) -> list[Planned]:
        return [p for p in self.items if p.skip is None]


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def select(cells: list[Cell], filters: list[str] | None) -> list[Cell]:
    """Keep cells whose id matches every filter (a regular expression or plain text, e.g. zero=3)."""
    for f in filters or []:
        try:
            rx = re.compile(f)
        except re.error as e:
            raise ConfigError(
                [
                    Problem(
                        "--filter",
                        repr(f),
                        f"not a regular expression: {e}",
                        "put a backslash before ( ) [ ] + * ? to match them as text, e.g. --filter 'peft=lora'",
                    )
                ]
            ) from None
        cells = [c for c in cells if rx.search(c.id)]
    return cells


def plan(
    matrix_path: str,
    filters: list[str] | None = None,
    platform: env.Platform | None = None,
    ds_configs: list[str] | None = None,
) -> Plan:
    """Load, validate and expand a matrix, and decide for each cell: run (with its config) or skip (why).

    ds_configs replaces the matrix's ds_config axis with these user DeepSpeed files."""
    m = matrix.load(matrix_path, ds_configs=ds_configs)
    platform = platform or env.probe()
    items = []
    for cell in select(matrix.expand(m), filters):
        skip = rules.check(cell, platform)
        # micro_batch: auto is a search: each probe gets its own config when it runs.
        items.append(Planned(cell, skip, None if skip or cell.micro_batch == AUTO else dsconfig.build(cell)))
    return Plan(m, str(matrix_path), tuple(items))


def hardware(platform: env.Platform, gpu_mem: int | None = None) -> Hardware:
    """What predictions are judged against: the first GPU's memory (NVML's total at the run's start) or
    gpu_mem, and the host's memory. No GPU and no gpu_mem: nothing to judge a GPU cell against."""
    gpu = gpu_mem or (platform.gpus[0].memory_bytes if platform.cuda and platform.gpus else None)
    return Hardware(
        gpu_memory_bytes=gpu or None,
        host_memory_bytes=(platform.host_memory_bytes or None) if gpu else None,
        gpu_name=platform.gpus[0].name if platform.cuda and platform.gpus else None,
    )


def prediction(cell: Cell, ds_config: dict | None, hw: Hardware, margin: float) -> dict | None:
    """The record's `predicted` for a cell, where a GPU is known and the model can read the cell."""
    if not hw.gpu_memory_bytes:
        return None
    try:
        e = predict(cell, ds_config, hw)
    except ValueError:
        return None  # a model without a known shape
    return {
        **e.to_dict(),
        "gpu_memory_bytes": hw.gpu_memory_bytes,
        "host_memory_bytes": hw.host_memory_bytes,
        "margin": margin,
        "gpu_verdict": verdict(e.gpu_bytes, hw.gpu_memory_bytes, margin),
        "host_verdict": verdict(e.host_bytes, hw.host_memory_bytes, margin),
    }


def prune_skip(pred: dict | None) -> rules.Skip | None:
    """A Skip when the prediction says the cell cannot fit (GPU or host), beyond the margin."""
    if not pred:
        return None
    GiB = 2**30
    for where, need, have, v in (
        ("GPU", pred["gpu_bytes"], pred["gpu_memory_bytes"], pred["gpu_verdict"]),
        ("host", pred["host_bytes"], pred["host_memory_bytes"], pred["host_verdict"]),
    ):
        if v == Verdict.PRUNE:
            return rules.Skip(
                rules.PRUNED,
                f"predicted OOM: needs {need / GiB:.1f} of {have / GiB:.1f} GiB ({where} memory, "
                f"more than {1 + pred['margin']:.0%} of it)",
                "run it anyway with --no-prune; or a smaller micro_batch, gradient checkpointing, a higher "
                "ZeRO stage or offload",
                "bench.estimate, the memory model (reports/memory-model.md)",
            )
    return None


def new_run_id() -> str:
    """Sortable and unique: UTC start time plus a random suffix."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]


def default_results_path(p: Plan) -> Path:
    return Path("results") / f"{p.matrix.name}.jsonl"


def _fmt_bytes(b) -> str:
    return "-" if not b else f"{b / 2**30:.2f} GiB"


def _line(i: int, n: int, rec: dict) -> str:
    m = rec.get("metrics") or {}
    mem = rec.get("memory") or {}
    peak = mem.get("nvml_proc_peak_bytes") or mem.get("host_rss_peak_bytes")
    bits = [f"[{i}/{n}]", f"{rec['status']:<11}", rec["cell_name"]]
    if rec.get("repeat", 1) > 1:
        bits.append(f"(repeat {rec['repeat']})")
    if rec["status"] == "ok":
        losses = rec.get("losses") or []
        bits += [
            f"{rec.get('wall_s', 0):.1f}s",
            f"{m.get('tokens_per_s', 0):,.0f} tok/s",
            f"loss {losses[0]:.2f}->{losses[-1]:.2f}" if losses else "",
            f"peak {_fmt_bytes(peak)}",
        ]
    elif rec.get("reason"):
        bits.append(f"- {rec['reason'][:160]}")
    return "  ".join(b for b in bits if b)


def run(
    matrix_path: str,
    *,
    results: str | None = None,
    filters: list[str] | None = None,
    resume: bool = False,
    logs_dir: str | None = None,
    progress: bool = True,
    extra_env: dict[str, str] | None = None,
    ds_configs: list[str] | None = None,
    printer=print,
    on_record=None,
    prune: bool = True,
    gpu_mem: int | None = None,
    margin: float = DEFAULT_MARGIN,
    repeats: int | None = None,
    order: str = "early",
    gpus_available: int | None = None,
    pack: bool | None = None,
) -> tuple[Plan, Path, list[dict]]:
    """Run a matrix; return the plan, the results path and the records written by this call.

    repeats (default: the matrix's `repeats`) runs every runnable cell that many times, interleaved:
    each cell's first repeat, then each one's second, so a drift of the machine over the run (clocks,
    temperature, a neighbour) spreads over all cells instead of landing on the last ones. A skipped
    cell is recorded once. order (bench.schedule.ORDERS): "early" runs cells in bench.schedule.order's
    order, "matrix" in the matrix's. With prune, a cell that runs out of memory implies the cells not yet
    run that need at least as much in every respect (bench.schedule): each recorded once as implied_oom,
    naming it. on_record(record) is called with each outcome as it is stored (live export,
    e.g. to W&B); a failure there is printed and the run goes on. Where a GPU is known (NVML at the
    start, or gpu_mem), each record carries the memory model's prediction, and with prune a cell
    predicted not to fit (beyond the margin) is recorded as skipped instead of run. Raises InputError
    before anything runs when the results file cannot be written or another run holds it, and
    StoreWriteError when a record could not be written whole (a full disk): the run stops there, having
    printed what it wrote and what it lost. SIGINT and SIGTERM raise Stopped (with the results path)
    after the running cell is recorded as interrupted.

    gpus_available (default: every GPU NVML shows, as CUDA_VISIBLE_DEVICES limits them; 1 slot on a CPU
    host) is how many GPUs the run uses; on a CPU host, N slots run N CPU cells side by side. pack
    (default: when more than one) runs cells side by side on disjoint GPU sets (bench.pool), else one
    at a time."""
    if order not in schedule.ORDERS:
        raise ValueError(f"order {order!r}: one of {', '.join(schedule.ORDERS)}")
    platform = _platform(gpus_available)
    p = plan(matrix_path, filters, platform=platform, ds_configs=ds_configs)
    _check_faults(p, {**os.environ, **(extra_env or {})}.get("ZEROBENCH_FAULT"))
    n_repeats = repeats or p.matrix.repeats
    results_path = Path(results) if results else default_results_path(p)
    check_writable(results_path)
    store = Store(results_path)
    # One run per results file: a second run (or a --resume) beside this one would measure every cell
    # twice, number both attempts 1, share their log files and take each other's started cells for dead.
    slots = _slots(platform, gpus_available, pack)
    with store.hold("zerobench run --resume" if resume else "zerobench run"):
        return _run(
            p, store, matrix_path, resume, logs_dir, progress, extra_env, printer, on_record, prune, gpu_mem, margin,
            n_repeats, order, platform, slots,
        )  # fmt: skip


def _platform(gpus_available: int | None) -> env.Platform:
    """This host as the run sees it: on a GPU host, its first gpus_available GPUs (the rules skip a cell
    that needs more)."""
    platform = env.probe()
    if platform.cuda and gpus_available is not None:
        if gpus_available > len(platform.gpus):
            raise InputError(
                f"--gpus-available {gpus_available}: this host shows {len(platform.gpus)} GPU(s) "
                f"({', '.join(str(g.index) for g in platform.gpus)}); give at most that many"
            )
        import dataclasses

        platform = dataclasses.replace(platform, gpus=platform.gpus[:gpus_available])
    return platform


def _slots(platform: env.Platform, gpus_available: int | None, pack: bool | None) -> pool.Slots:
    """What cells are placed on: the GPUs' physical indexes, or on a CPU host slots 0..N-1."""
    ids = [g.index for g in platform.gpus] if platform.cuda else list(range(gpus_available or 1))
    return pool.Slots(ids, max_cells=None if (len(ids) > 1 if pack is None else pack) else 1)


def _run(
    p, store, matrix_path, resume, logs_dir, progress, extra_env, printer, on_record, prune, gpu_mem, margin, n_repeats,
    order, platform, slots,
):  # fmt: skip
    results_path = store.path
    logs = Path(logs_dir) if logs_dir else results_path.parent / "logs" / results_path.stem
    run_id = new_run_id()
    launch.sweep_attempt_folders()  # what a SIGKILLed run before this one could not remove
    if platform.cuda and not platform.nvml:
        printer(
            "warning: this GPU host has no NVML (pip install nvidia-ml-py): records will "
            "carry the torch allocator's memory only, not NVML's process and device memory, power or utilisation"
        )
    written: list[dict] = []
    hw = hardware(platform, gpu_mem)
    if hw.gpu_memory_bytes:
        printer(
            f"memory model: judging cells against {hw.gpu_memory_bytes / 2**30:.1f} GiB of GPU memory"
            + (f" and {hw.host_memory_bytes / 2**30:.1f} GiB of host memory" if hw.host_memory_bytes else "")
            + (f", margin {margin:.0%}; cells predicted not to fit are skipped (--no-prune runs them)" if prune else "")
        )

    def save(rec: Record) -> dict:
        try:
            return store.append(rec)
        except StoreWriteError as e:
            e.record = rec.to_dict()  # what is lost, for the message that stops the run
            raise

    done: set[tuple[str, int]] = set()
    attempts: dict[str, int] = {}
    existing = store.records()
    for rec in existing:
        if rec.get("status") != Status.STARTED.value:
            attempts[rec["cell_hash"]] = max(attempts.get(rec["cell_hash"], 0), rec.get("attempt", 1))
    if resume:
        done, stale = store.resume_state(existing)
        for s in stale:
            with launch.holding_signals():
                save(
                    Record.interrupted(
                        parse(s), f"run {s['run_id']} stopped while this cell ran (found by --resume)", ended_at=now()
                    )
                )
            attempts[s["cell_hash"]] = max(attempts.get(s["cell_hash"], 0), s.get("attempt", 1))
    items, preds, free = arrange(p.items, hw, margin, prune, order)
    # A cell recorded without running (a rule's skip or a pruned cell, `free`) is recorded once, as repeat 1.
    units = [(it, r) for r in range(1, n_repeats + 1) for it in items if id(it) not in free or r == 1]
    todo = [(it, r) for it, r in units if (it.cell.hash, r) not in done]
    if resume and prune:
        # An implied_oom record stands for every repeat of its cell (it is written once, as repeat 1).
        ended = {r["cell_hash"]: r["status"] for r in existing if r.get("status") != Status.STARTED.value}
        todo = [(it, r) for it, r in todo if ended.get(it.cell.hash) != Status.IMPLIED_OOM.value]
    if resume and len(todo) < len(units):
        what = "cells" if n_repeats == 1 else f"cell repeats ({n_repeats} per runnable cell)"
        printer(f"resume: {len(units) - len(todo)} of {len(units)} {what} already have a result in {results_path}")

    prog = _Progress(len(todo), enabled=progress, printer=printer)
    eta = schedule.Eta()
    # Cells that have begun (a repeat ran, or any outcome is stored): never implied, whatever ends later.
    begun = {h for h, _ in done}
    pending: dict[str, Planned] = {}  # drawn by the pool, not yet placed
    turned_away: set[str] = set()  # of those, implied out of memory meanwhile
    queue = list(todo)
    k = 0  # queue[k:] is what is left

    def left() -> float | None:
        serial = eta.remaining(it.cell for it, _ in queue[k:] if id(it) not in free)
        return None if serial is None else serial / slots.max_cells  # packed cells run side by side

    def _done(i: int, rec: dict) -> None:
        written.append(rec)
        prog.done(i, rec, elapsed=time.time() - t_run, eta=left())
        if on_record is not None:
            try:
                on_record(rec)
            except Exception as e:  # noqa: BLE001 - an exporter must not stop a measurement
                printer(f"warning: exporting the record of {rec['cell_name']} failed: {type(e).__name__}: {e}")

    def imply(i: int, prover: Cell, status: str, run_of: str | None) -> int:
        """Record the cells left that an out-of-memory end of prover implies; returns the last index used."""
        nonlocal queue
        if not prune:  # --no-prune runs every cell: the audit of what pruning and implying skip
            return i
        # The queue left, and the units drawn but still waiting for their GPUs (admit turns those away).
        waiting = {it.cell.hash: it for it, _ in queue[k:]} | pending
        candidates = [
            it.cell for it in waiting.values() if it.skip is None and id(it) not in free and it.cell.hash not in begun
        ]
        hit = schedule.implied(prover, status, candidates)
        if not hit:
            return i
        gone = {c.hash for c, _ in hit}
        queue = queue[:k] + [u for u in queue[k:] if u[0].cell.hash not in gone]
        for c, how in hit:
            begun.add(c.hash)
            if c.hash in pending:
                turned_away.add(c.hash)
            attempts[c.hash] = attempts.get(c.hash, 0) + 1
            ident = {"run_id": run_id, "attempt": attempts[c.hash], "matrix_file": str(matrix_path)}
            i += 1
            prog.total = i + len(queue) - k
            by = {"cell_name": prover.name, "cell_hash": prover.hash, "status": status, "how": how, "run_id": run_of}
            with launch.holding_signals():
                rec = save(Record.implied_oom(c, by, at=now(), predicted=preds[id(waiting[c.hash])], **ident))
            _done(i, rec)
        return i

    t_run = time.time()
    finished = False
    i = 0
    try:
        with stop_on_signals():
            # Only for the cells that will run: not for those skipped or predicted not to fit.
            will_run = {id(it): it for it, _ in todo if id(it) not in free}  # `free`: skipped or pruned (arrange)
            if slots.max_cells > 1:
                where = "GPUs" if platform.cuda else "CPU slots"
                printer(f"packing: up to {slots.max_cells} cells side by side on {where} {list(slots.ids)}")
            costs = prepare(list(will_run.values()), logs, extra_env, platform, printer, slots) or None

            def attempt_cell(i: int, cell: Cell, ds_config: dict | None, search_after=None, repeat: int = 1) -> dict:
                """Run one cell (or record why not); returns its stored record. A probe of a micro-batch search
                (search_after) is never pruned: the search settles by real runs."""
                return _run_one(
                    cell, ds_config, i, attempts, run_id, matrix_path, save, logs, platform, extra_env, prog, written,
                    pred=prediction(cell, ds_config, hw, margin), prune=prune and search_after is None,
                    search_after=search_after, repeat=repeat, fixed_costs=costs,
                )  # fmt: skip

            # On --resume, out-of-memory ends already stored (the last outcome of a cell of this plan) imply
            # as new ones do: a run stopped between an end and its implications, or cells added since.
            in_plan = {it.cell.hash: it.cell for it in p.items}
            last = {r["cell_hash"]: r for r in existing if r.get("status") != Status.STARTED.value} if resume else {}
            for rec in last.values():
                if rec["cell_hash"] in in_plan and rec["status"] in schedule.WHERE:
                    i = imply(i, in_plan[rec["cell_hash"]], rec["status"], rec.get("run_id"))

            def draw():
                """The units left, drawn by the pool only when it can place one: a cell implied by an
                outcome that came in meanwhile (imply, in this thread) is no longer in the queue."""
                nonlocal i, k
                while k < len(queue):
                    it, repeat = queue[k]
                    k += 1
                    i += 1
                    if it.cell.hash not in begun:
                        pending[it.cell.hash] = it
                    yield i, (it, repeat)

            def admit(u) -> bool:
                """At placement (this thread): a unit implied out of memory while it waited for its GPUs
                does not run; any other has begun, and no later outcome implies it."""
                h = u[1][0].cell.hash
                pending.pop(h, None)
                if h in turned_away:
                    return False
                begun.add(h)
                return True

            def unit(u) -> tuple[list[dict], float | None]:
                """One unit of work: a cell (or a micro-batch search) run, or a skip recorded; its records and,
                for a cell that ran, its wall seconds (for the ETA, kept in this thread by unit_done)."""
                n, (it, repeat) = u
                cell = it.cell
                if it.skip is not None:
                    ident = {
                        "run_id": run_id,
                        "attempt": attempts.get(cell.hash, 0) + 1,
                        "matrix_file": str(matrix_path),
                        "fixed_costs": costs,
                    }
                    with launch.holding_signals():
                        return [save(Record.skipped(cell, it.skip, at=now(), **ident))], None
                t0 = time.time()
                if cell.micro_batch == AUTO:
                    recs = _search(n, cell, hw, margin, attempt_cell, printer)
                else:
                    recs = [attempt_cell(n, cell, it.ds_config, repeat=repeat)]
                return recs, (time.time() - t0 if Status(recs[-1]["status"]).ran else None)

            def unit_done(u, ended: tuple[list[dict], float | None]) -> None:
                nonlocal i
                n, (it, _) = u
                recs, seconds = ended
                if seconds is not None:
                    eta.observe(it.cell, seconds)
                for rec in recs:
                    _done(n, rec)
                for rec in recs:
                    if rec["status"] in schedule.WHERE and (prover := _cell_of(rec, it.cell)) is not None:
                        i = imply(i, prover, rec["status"], run_id)

            def width(u) -> int:
                it = u[1][0]  # a CPU cell's ranks are not devices: it takes at most every slot
                if it.skip is not None or id(it) in free:
                    return 0  # a record to write (a rule's skip, or pruned), here: no GPU to wait for
                return it.cell.gpus if platform.cuda else min(it.cell.gpus, len(slots.ids))

            pool.run_units(draw(), slots, need=width, work=unit, done=unit_done, admit=admit)
            finished = True
    except Stopped as e:
        e.results_path = results_path
        raise
    except StoreWriteError as e:
        e.reported = True
        lost = getattr(e, "record", None)
        printer(f"zerobench: stopped: {e.strerror}")
        if lost is not None and lost.get("status") != Status.STARTED.value:
            printer(f"  lost: {_line(i, len(todo), lost)}")
        elif lost is not None:
            printer(f"  not started: {lost['cell_name']} (its start could not be recorded)")
        printer(
            f"  written to {results_path} by this run: {len(written)} outcome(s), each whole; "
            "once there is room, `--resume` runs the cells that have none"
        )
        raise
    finally:
        launch.stop_forkserver()
        prog.close(time.time() - t_run, len(written), finished)
    return p, results_path, written


def arrange(
    items: list[Planned], hw: Hardware, margin: float, prune: bool, order: str
) -> tuple[list[Planned], dict[int, dict | None], set[int]]:
    """The plan's cells in the order they run, with what the memory model says of each before anything
    runs (by id(item): for the order, the records and the ETA) and the cells recorded without running
    (by id(item): a rule's skip, or pruned)."""
    preds = {
        id(it): None if it.skip or it.cell.micro_batch == AUTO else prediction(it.cell, it.ds_config, hw, margin)
        for it in items
    }
    free = {id(it) for it in items if it.skip is not None or (prune and prune_skip(preds[id(it)]) is not None)}
    items = list(items)
    if order == "early":
        items = [
            items[j]
            for j in schedule.order(
                [it.cell for it in items],
                free=[id(it) in free for it in items],
                risky=[_risky(preds[id(it)], prune) for it in items],
                mem=[(preds[id(it)] or {}).get("gpu_bytes") for it in items],
            )
        ]
    return items, preds, free


def preview(
    matrix_path: str,
    *,
    filters: list[str] | None = None,
    ds_configs: list[str] | None = None,
    gpu_mem: int | None = None,
    margin: float = DEFAULT_MARGIN,
    prune: bool = True,
    order: str = "early",
    gpus_available: int | None = None,
    platform: env.Platform | None = None,
    recorded: frozenset[str] = frozenset(),
) -> list[str]:
    """What `zerobench run` would do, without running anything: each cell in the order it would run, and
    whether it would run, be pruned (the memory model: it cannot fit) or skipped (a rule); a cell the
    model is unsure of is marked so (it may run out of memory and then imply the heavier ones)."""
    platform = platform or _platform(gpus_available)  # as the run would see this host (or an assumed one)
    p = plan(matrix_path, filters, platform=platform, ds_configs=ds_configs)
    hw = hardware(platform, gpu_mem)
    items, preds, free = arrange(p.items, hw, margin, prune, order)
    items = [it for it in items if it.cell.hash not in recorded]  # --resume: cells with an outcome stay as they are
    GiB = 2**30
    judged = f"{hw.gpu_memory_bytes / GiB:.1f} GiB of GPU memory" if hw.gpu_memory_bytes else "no GPU known"
    lines = [f"run order ({order}), judged against {judged} (margin {margin:.0%}):"]
    counts: dict[str, int] = {}
    for n, it in enumerate(items, 1):
        pred = preds[id(it)] or {}
        what = (
            "skip"
            if it.skip is not None
            else "pruned"
            if id(it) in free
            else "run?"
            if _risky(pred or None, prune) and hw.gpu_memory_bytes
            else "run"
        )
        counts[what] = counts.get(what, 0) + 1
        mem = f"{pred['gpu_bytes'] / GiB:6.1f} GiB" if pred.get("gpu_bytes") else " " * 10
        lines.append(
            f"  {n:5d}  {what:6s} {mem}  " + (f"({short_of(pred)})  " if what == "pruned" else "") + it.cell.id
        )
    legend = {"run": "to run", "run?": "to run, may not fit", "pruned": "pruned", "skip": "skipped by a rule"}
    lines.append("  " + ", ".join(f"{counts[k]} {legend[k]}" for k in legend if k in counts))
    return lines


def _risky(pred: dict | None, prune: bool) -> bool:
    """Might run out of GPU memory: the model is uncertain, knows no GPU to judge against, or (not pruning)
    says it will not fit."""
    v = (pred or {}).get("gpu_verdict")
    return v in (None, Verdict.UNCERTAIN, Verdict.UNKNOWN) or (v == Verdict.PRUNE and not prune)


def _cell_of(rec: dict, cell: Cell) -> Cell | None:
    """The cell a record ran: `cell`, or the probe of a micro-batch search whose record this is."""
    if rec["cell_hash"] == cell.hash:
        return cell
    import dataclasses

    probe = dataclasses.replace(cell, micro_batch=rec["cell"]["micro_batch"])
    return probe if probe.hash == rec["cell_hash"] else None


def _search(i: int, template: Cell, hw: Hardware, margin: float, attempt_cell, printer) -> list[dict]:
    """micro_batch: auto: probe micro-batches (each probe a real cell, recorded) for the largest that runs,
    starting from the memory model's largest that fits; out of memory is an answer, not a failure."""
    import dataclasses

    seed = seed_micro_batch(template, hw)
    records: list[dict] = []

    def probe(mb: int, search_after) -> tuple[str, str]:
        cell = dataclasses.replace(template, micro_batch=mb)
        rec = attempt_cell(i, cell, dsconfig.build(cell), search_after)
        records.append(rec)
        return rec["status"], cell.hash

    result = search_micro_batch(probe, seed=seed, template=template.name)
    printer(
        f"micro_batch auto for {template.name}: "
        + (f"largest that ran: {result.largest_ok}" if result.largest_ok else "none ran")
        + f" ({len(result.probes)} probes from the model's {seed}; {result.ended})"
    )
    return records


def _run_one(
    cell, ds_config, i, attempts, run_id, matrix_path, save, logs, platform, extra_env, prog, written,
    *, pred, prune: bool, search_after=None, repeat: int = 1, fixed_costs: dict | None = None,
) -> dict:  # fmt: skip
    """One cell: its records (started, then its outcome, or interrupted when the run is stopped); or skipped
    when the memory model predicts it does not fit and prune is on."""
    with _attempts_lock:  # repeats of one cell may run side by side
        attempt = attempts.get(cell.hash, 0) + 1
        attempts[cell.hash] = attempt
    ident = {"run_id": run_id, "attempt": attempt, "matrix_file": str(matrix_path), "fixed_costs": fixed_costs}
    skip = prune_skip(pred) if prune else None
    if skip is not None:
        with launch.holding_signals():
            return save(Record.skipped(cell, skip, at=now(), predicted=pred, **ident))
    lane = pool.lane()  # where the pool placed this cell (None: called outside a pool)
    slots = list(lane.slots) if lane else list(range(cell.gpus))
    gpus = slots if platform.cuda else None
    placement = {"gpus": gpus} if platform.cuda else {"cpu_slots": slots}
    started = Record.started(cell, started_at=now(), predicted=pred, repeat=repeat, placement=placement, **ident)
    log_path = logs / f"{cell.hash}.{attempt}.log"
    stage = "before"  # -> "started" once its start is on disk -> "ended" once its outcome is
    try:
        # A stop held while a record is written lands right after it, inside this try.
        with launch.holding_signals():
            save(started)
            stage = "started"
        prog.start(i, cell)
        token = lane.neighbours.enter(cell.hash, time.time()) if lane else None
        try:
            try:
                out = launch.run_cell(
                    cell,
                    ds_config,
                    log_path=log_path,
                    gpus=gpus,
                    stall_s=float(os.environ.get("ZEROBENCH_STALL_S", 600)),
                    extra_env=extra_env,
                    sample_interval_s=telemetry.interval_for(platform.cuda),
                    stop=lane.stop if lane else None,
                )
            finally:
                if lane:
                    lane.neighbours.leave(token, time.time())
            beside = lane.neighbours.during(token, *out.window) if lane and out.window else None
            # Inside the try: a record that cannot be built is an error record, not a lost run
            # (seen on the H200: GPU-indexed figures the record model once refused).
            rec = Record.from_outcome(
                started, out, ds_config=ds_config, log=str(log_path), ended_at=now(), beside=beside
            )
        except Exception as e:  # noqa: BLE001 - a bug of ours in one cell must not lose the others
            import traceback

            rec = Record.error(
                started,
                f"zerobench failed around this cell: {type(e).__name__}: {e}",
                ended_at=now(),
                traceback=traceback.format_exc()[-6000:],
                log=str(log_path),
            )
        if search_after is not None:
            rec = rec.model_copy(update={"search": Search.model_validate(search_after(rec.status.value, cell.hash))})
        with launch.holding_signals():
            rec = save(rec)
            stage = "ended"
        return rec
    except KeyboardInterrupt as e:
        if stage == "started":
            reason = getattr(e, "reason", None) or "stopped by the user"  # Stopped, pool.Halted: theirs
            with launch.holding_signals():
                written.append(save(Record.interrupted(started, reason, ended_at=now(), log=str(log_path))))
        raise


_attempts_lock = threading.Lock()


def _check_faults(p: Plan, text: str | None) -> None:
    """A fault the suite injects (ZEROBENCH_FAULT) that would never fire is an input error, not a silent pass."""
    if not text:
        return
    limit, total = hostmem.cgroup_limit(), hostmem.host_memory()
    problems = faults.check(
        text, [it.cell for it in p.runnable], memory_limited=bool(limit and total and limit < total)
    )
    if problems:
        raise ConfigError([Problem(file="ZEROBENCH_FAULT", where=spec, what=what) for spec, what in problems])


# DeepSpeed JIT op builders each optimizer needs (compiled on first use, ~30-60 s each).
_OPS = {name: spec.jit_op for name, spec in OPTIMIZERS.items() if spec.jit_op}


@dataclass
class _Job:
    """A helper process that prepare() runs, and what to make of its end (exit code, wall seconds)."""

    args: list[str]
    log: Path
    env: dict[str, str]
    done: Callable[[int, float], None]
    timeout_s: float = 1800


def _run_jobs(jobs: list[_Job], printer=print) -> None:
    ends = launch.run_tools([(j.args, j.log, j.env, j.timeout_s) for j in jobs], heartbeat.printing(printer))
    for job, (code, s) in zip(jobs, ends):
        job.done(code, s)


def prepare(
    items: list[Planned], logs: Path, extra_env: dict | None, platform: env.Platform, printer, slots=None
) -> dict:
    """What runs once before the cells, for the cells that will run (items), paid once per machine where
    it can be: the ops and QLoRA checkpoints already in the machine's cache (bench.cache) are not built
    or loaded again; what is missing is built by helpers side by side, while the fork servers import in
    the background (one per GPU a single-GPU cell may run on; they import only: each forked cell loads
    its ops itself, after these are built). Prints one line of what was paid and returns it (the
    records' fixed_costs)."""
    t0 = time.time()
    costs: dict = {}
    if any(it.cell.gpus == 1 for it in items):
        gpus = list(slots.ids) if slots is not None and slots.max_cells > 1 else [_first_gpu(platform)]
        for g in gpus if platform.cuda else [None]:
            launch.start_forkserver(extra_env, logs, gpus=None if g is None else [g])
    _run_jobs(
        _ops_jobs(items, logs, extra_env, platform, printer, costs)
        + _checkpoint_jobs(items, logs, extra_env, platform, printer, costs),
        printer,
    )
    if items:
        import_s, why = launch.forkserver_ready()
        costs["forkserver_import_s"] = round(import_s, 1) if import_s is not None else None
        if why:
            costs["forkserver"] = why
        costs["setup_s"] = round(time.time() - t0, 1)
        printer(_costs_line(costs))
    return costs


def _first_gpu(platform: env.Platform) -> int:
    return platform.gpus[0].index if platform.cuda else 0


def _tool_env(extra_env: dict | None, gpus: list[int] | None) -> dict[str, str]:
    return launch.child_env({**os.environ, **(extra_env or {})}, port=launch.free_port(), gpus=gpus)


def _needed_ops(items: list[Planned], platform: env.Platform) -> list[str]:
    return sorted(
        {_OPS[it.cell.optimizer] for it in items if it.cell.optimizer in _OPS}
        | {"AsyncIOBuilder" for it in items if it.cell.offload == Offload.NVME}
        # On CPU, DeepSpeed's first init_distributed compiles its shared-memory comm op.
        | ({"ShareMemCommBuilder"} if items and not platform.cuda else set())
    )


def _ops_jobs(items, logs: Path, extra_env: dict | None, platform: env.Platform, printer, costs: dict) -> list[_Job]:
    """The prebuild of the ops the cells need that the machine's cache does not vouch for, so no cell's
    setup time includes a compile; none when every op checks out."""
    ops = _needed_ops(items, platform)
    if not ops:
        return []
    tool_env = _tool_env(extra_env, None)
    key = cache.ops_key(tool_env, cuda=platform.cuda, gpus=[g.name for g in platform.gpus])
    missing = cache.ops_missing(key, ops, tool_env)
    costs["ops"] = {op: "cached" for op in ops if op not in missing}
    if not missing:
        return []
    logs.mkdir(parents=True, exist_ok=True)
    log, report = logs / "prebuild.log", logs / "prebuild.json"
    report.unlink(missing_ok=True)
    why = "; ".join(sorted({w for w in missing.values()}))
    printer(f"building DeepSpeed ops once for this machine: {', '.join(missing)} ({why}; log: {log})")

    def done(code: int, s: float) -> None:
        try:
            rep = json.loads(report.read_text())
        except (OSError, ValueError):
            rep = {}
        cache.record_ops(key, rep, tool_env)
        for op in missing:
            r = rep.get(op) or {}
            costs["ops"][op] = (
                "failed"
                if not r.get("ok")
                else "unavailable"
                if r.get("unavailable")
                else "built"
                if r.get("built")
                else "loaded"
            )
        costs["ops_s"] = round(s, 1)
        status = "done" if code == 0 else "some failed (the cells that need them will say why)"
        printer(f"ops {status} in {s:.0f} s")

    return [_Job(["-m", "bench.worker", "--prebuild", *missing, "--report", str(report)], log, tool_env, done)]


def _prebuild(items: list[Planned], logs: Path, extra_env: dict | None, platform: env.Platform, printer) -> dict:
    """Only the op prebuild (through the cache); returns its fixed costs."""
    costs: dict = {}
    _run_jobs(_ops_jobs(items, logs, extra_env, platform, printer, costs))
    return costs


def _checkpoint_jobs(
    items, logs: Path, extra_env: dict | None, platform: env.Platform, printer, costs: dict
) -> list[_Job]:
    """QLoRA quantizes from a checkpoint: each preset's not yet in the machine's cache is built once, in
    one process, before the cells (a multi-GPU cell's ranks must not build it themselves)."""
    jobs = []
    environ = {**os.environ, **(extra_env or {})}
    for model, precision in sorted(
        {
            (it.cell.model, it.cell.precision)
            for it in items
            if it.cell.peft == "qlora" and it.cell.model in matrix.PRESETS
        }
    ):
        name = f"{model} {precision}"
        costs.setdefault("checkpoints", {})
        why = cache.checkpoint_problem(
            cache.checkpoint_dir(model, precision, environ), cache.checkpoint_key(model, precision)
        )
        if why is None:
            costs["checkpoints"][name] = "cached"
            continue
        log = logs / f"checkpoint-{model}-{precision}.log"

        def done(code: int, s: float, name=name, log=log) -> None:
            costs["checkpoints"][name] = "built" if code == 0 else "failed"
            costs["checkpoints_s"] = max(costs.get("checkpoints_s") or 0.0, round(s, 1))
            status = "ready" if code == 0 else f"failed (exit {code}; the QLoRA cells will say why; log: {log})"
            printer(f"QLoRA checkpoint of {name}: {status} ({s:.0f} s)")

        printer(f"building the QLoRA checkpoint of {name} once for this machine ({why})")
        jobs.append(
            _Job(
                ["-m", "bench.worker", "--checkpoint", model, precision],
                log,
                _tool_env(extra_env, [_first_gpu(platform)] if platform.cuda else None),
                done,
            )
        )
    return jobs


def _checkpoints(items: list[Planned], logs: Path, extra_env: dict | None, platform: env.Platform, printer) -> dict:
    """Only the QLoRA checkpoints (through the cache); returns their fixed costs."""
    costs: dict = {}
    _run_jobs(_checkpoint_jobs(items, logs, extra_env, platform, printer, costs))
    return costs


def _costs_line(c: dict) -> str:
    """The run's fixed costs in one line: what was cached, what was built and in how long."""
    bits = []
    ops = c.get("ops") or {}
    if ops:
        by: dict[str, list[str]] = {}
        for op, how in ops.items():
            by.setdefault(how, []).append(op)
        took = f" in {c['ops_s']:.0f} s" if c.get("ops_s") is not None else ""
        bits.append("ops: " + "; ".join(f"{how} {', '.join(names)}" for how, names in by.items()) + took)
    for name, how in (c.get("checkpoints") or {}).items():
        took = f" in {c['checkpoints_s']:.0f} s" if how != "cached" and c.get("checkpoints_s") is not None else ""
        bits.append(f"checkpoint {name}: {how}{took}")
    if c.get("forkserver_import_s") is not None:
        bits.append(f"fork server import {c['forkserver_import_s']:.1f} s (in the background)")
    else:
        bits.append(f"fork server: {c.get('forkserver') or 'none'}")
    return f"fixed costs: {'; '.join(bits)}; setup {c['setup_s']:.1f} s in all"


class _Progress:
    """A bar over the matrix (current cell, ETA) on a terminal; one line per finished cell always."""

    def __init__(self, total: int, enabled: bool, printer):
        self.total, self.printer = total, printer
        self.counts: dict[str, int] = {}  # outcomes by status, for the summary
        self.bar = None
        if enabled and total:
            try:
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )

                self.bar = Progress(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TextColumn("ETA"),
                    TimeRemainingColumn(),
                )
                if not self.bar.console.is_terminal:
                    self.bar = None
                else:
                    self.task = self.bar.add_task("starting", total=total)
                    self.bar.start()
            except ImportError:
                self.bar = None

    def start(self, i: int, cell: Cell) -> None:
        if self.bar:
            self.bar.update(self.task, description=f"cell {i}/{self.total}: {cell.name}")

    def done(self, i: int, rec: dict, elapsed: float | None = None, eta: float | None = None) -> None:
        line = _line(i, self.total, rec)
        if elapsed is not None:
            line += f"  [{schedule.duration(elapsed)} elapsed, ETA {schedule.duration(eta)}]"
        self.counts[rec["status"]] = self.counts.get(rec["status"], 0) + 1
        if self.bar:
            self.bar.update(self.task, total=self.total)
            self.bar.console.print(line, markup=False, highlight=False)
            self.bar.advance(self.task)
        else:
            self.printer(line)

    def close(self, seconds: float, recorded: int, finished: bool) -> None:
        if self.bar:
            self.bar.stop()
        ran = sum(n for st, n in self.counts.items() if Status(st).ran)
        parts = [f"{ran} ran"] + [
            f"{self.counts[st.value]} {st.value}" for st in Status if not st.ran and self.counts.get(st.value)
        ]
        what = ", ".join(parts)
        if finished:
            self.printer(f"matrix done: {self.total} cells in {seconds:.0f} s ({what})")
        else:
            self.printer(f"matrix stopped after {recorded} of {self.total} cells ({seconds:.0f} s; {what})")
