"""The orchestrator: validate everything, then run each cell in its own process and record it.

Never imports torch. No exception escapes for a cell that failed: every end is a record.
"""
from __future__ import annotations

import datetime as dt
import os
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import dsconfig, env, launch, matrix, rules, telemetry
from .cells import Cell
from .results import STEP_PARTS
from .status import Status
from .store import SCHEMA_VERSION, Store

__all__ = ["Plan", "plan", "run", "prepare", "default_results_path", "record_outcome", "new_run_id", "now"]


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
        rx = re.compile(f)
        cells = [c for c in cells if rx.search(c.id)]
    return cells


def plan(matrix_path: str, filters: list[str] | None = None, platform: env.Platform | None = None,
         ds_configs: list[str] | None = None) -> Plan:
    """Load, validate and expand a matrix, and decide for each cell: run (with its config) or skip (why).

    ds_configs replaces the matrix's ds_config axis with these user DeepSpeed files."""
    m = matrix.load(matrix_path, ds_configs=ds_configs)
    platform = platform or env.probe()
    items = []
    for cell in select(matrix.expand(m), filters):
        skip = rules.check(cell, platform)
        items.append(Planned(cell, skip, None if skip else dsconfig.build(cell)))
    return Plan(m, str(matrix_path), tuple(items))


def new_run_id() -> str:
    """Sortable and unique: UTC start time plus a random suffix."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + uuid.uuid4().hex[:6]


def default_results_path(p: Plan) -> Path:
    return Path("results") / f"{p.matrix.name}.jsonl"


def _base_record(cell: Cell, run_id: str, attempt: int, source: str) -> dict:
    return {"schema_version": SCHEMA_VERSION, "run_id": run_id, "attempt": attempt, "matrix": cell.matrix,
            "matrix_file": source, "cell_id": cell.id, "cell_hash": cell.hash, "cell_name": cell.name,
            "cell": cell.to_dict()}


def record_outcome(cell: Cell, planned: Planned, out: launch.Outcome, run_id: str, attempt: int, source: str,
            log_path: Path, started_at: str) -> dict:
    rank0 = next((d for d in out.ranks if d.get("rank") == 0), out.ranks[0] if out.ranks else {})
    tel = out.telemetry
    ph = tel.get("phases", {})
    setup, measured = ph.get("setup", {}), ph.get("measured", {})
    mem: dict = {
        "host_rss_peak_bytes": tel.get("all", {}).get("host_rss_peak_bytes"),
        "host_rss_peak_setup_bytes": setup.get("host_rss_peak_bytes"),
        "host_rss_peak_measured_bytes": measured.get("host_rss_peak_bytes"),
    }
    if tel.get("nvml"):
        for name, w in (("setup", setup), ("measured", measured)):
            mem[f"nvml_used_peak_{name}_bytes"] = w.get("nvml_used_peak_bytes")
            mem[f"nvml_proc_peak_{name}_bytes"] = w.get("nvml_proc_peak_bytes")
        mem["nvml_used_peak_bytes"] = tel["all"].get("nvml_used_peak_bytes")
        mem["nvml_proc_peak_bytes"] = tel["all"].get("nvml_proc_peak_bytes")
        mem["nvml_proc_peak_per_gpu"] = tel["all"].get("nvml_proc_peak_per_gpu")
    alloc_m = [d["memory_measured"] for d in out.ranks if d.get("memory_measured")]
    alloc_s = [d["memory_setup"] for d in out.ranks if d.get("memory_setup")]
    if alloc_m:
        mem["torch_max_allocated_bytes"] = max(a["torch_max_allocated_bytes"] for a in alloc_m)
        mem["torch_max_reserved_bytes"] = max(a["torch_max_reserved_bytes"] for a in alloc_m)
        mem["torch_max_allocated_per_gpu"] = [a["torch_max_allocated_bytes"] for a in alloc_m]
        for part in STEP_PARTS:
            v = [a[f"torch_max_allocated_{part}_bytes"] for a in alloc_m if a.get(f"torch_max_allocated_{part}_bytes")]
            if v:
                mem[f"torch_max_allocated_{part}_bytes"] = max(v)
        between = [a["torch_allocated_between_steps_bytes"] for a in alloc_m if a.get("torch_allocated_between_steps_bytes")]
        if between:
            mem["torch_allocated_between_steps_bytes"] = max(between)
            mem["torch_allocated_between_steps_per_gpu"] = between
    if alloc_s:
        mem["torch_max_allocated_setup_bytes"] = max(a["torch_max_allocated_bytes"] for a in alloc_s)
        mem["torch_max_reserved_setup_bytes"] = max(a["torch_max_reserved_bytes"] for a in alloc_s)
    metrics = dict(rank0.get("metrics") or {}) or None
    if metrics and measured.get("energy_j") and measured.get("duration_s"):
        metrics["energy_j_per_token"] = measured["energy_j"] / (metrics["tokens_per_s"] * measured["duration_s"])
        metrics["gpu_util_mean_pct"] = measured.get("gpu_util_mean_pct")
        metrics["power_mean_w"] = measured.get("power_mean_w")
    foreign = {i: [p for p in s["procs"]] for i, s in out.gpu_before.items() if s.get("procs")}
    rec = _base_record(cell, run_id, attempt, source)
    rec.update({
        "status": out.status.value, "reason": out.reason, "started_at": started_at, "ended_at": now(),
        "wall_s": out.wall_s, "exit_code": out.exit_code, "phase_at_end": out.phase_at_end, "metrics": metrics,
        "memory": mem, "losses": rank0.get("losses"), "step_times_s": rank0.get("step_times_s"),
        "world_size": len(out.ranks) or None,
        # Every rank's own end, so a multi-rank failure can be traced to the rank that caused it.
        "ranks": [{"rank": d.get("rank"), "status": d.get("status"), "reason": (d.get("reason") or "")[:600]}
                  for d in sorted(out.ranks, key=lambda d: d.get("rank", 0))] if len(out.ranks) > 1 else None,
        "worker": {k: rank0.get(k) for k in ("optimizer_class", "zero_optimizer_class", "params_total",
                                              "params_trainable", "params_embedding", "model_build_s",
                                              "engine_init_s", "setup_s", "fp16_skipped_steps", "gpu_name",
                                              "nvme_swap_bytes", "train_mode", "compiled", "kernels",
                                              "versions", "fault_injected", "allocator_at_failure")},
        "telemetry": tel, "ds_config": planned.ds_config, "foreign_gpu_processes": foreign or None,
        "gpu_after": out.gpu_after or None, "started_by": out.started_by or None,
        "provenance": env.provenance(), "log": str(log_path),
        "log_tail": out.log_tail[-6000:], "traceback": rank0.get("traceback"),
    })
    return rec


def _fmt_bytes(b) -> str:
    return "-" if not b else f"{b / 2**30:.2f} GiB"


def _line(i: int, n: int, rec: dict) -> str:
    m = rec.get("metrics") or {}
    mem = rec.get("memory") or {}
    peak = mem.get("nvml_proc_peak_bytes") or mem.get("host_rss_peak_bytes")
    bits = [f"[{i}/{n}]", f"{rec['status']:<11}", rec["cell_name"]]
    if rec["status"] == "ok":
        losses = rec.get("losses") or []
        bits += [f"{rec.get('wall_s', 0):.1f}s", f"{m.get('tokens_per_s', 0):,.0f} tok/s",
                 f"loss {losses[0]:.2f}->{losses[-1]:.2f}" if losses else "", f"peak {_fmt_bytes(peak)}"]
    elif rec.get("reason"):
        bits.append(f"- {rec['reason'][:160]}")
    return "  ".join(b for b in bits if b)


def run(matrix_path: str, *, results: str | None = None, filters: list[str] | None = None, resume: bool = False,
        logs_dir: str | None = None, progress: bool = True, extra_env: dict[str, str] | None = None,
        ds_configs: list[str] | None = None, printer=print) -> tuple[Plan, Path, list[dict]]:
    """Run a matrix; return the plan, the results path and the records written by this call."""
    p = plan(matrix_path, filters, ds_configs=ds_configs)
    results_path = Path(results) if results else default_results_path(p)
    store = Store(results_path)
    logs = Path(logs_dir) if logs_dir else results_path.parent / "logs" / results_path.stem
    run_id = new_run_id()
    platform = env.probe()
    written: list[dict] = []

    done: set[str] = set()
    attempts: dict[str, int] = {}
    for rec in store.records():
        if rec.get("status") != Status.STARTED.value:
            attempts[rec["cell_hash"]] = max(attempts.get(rec["cell_hash"], 0), rec.get("attempt", 1))
    if resume:
        done, stale = store.resume_state()
        for s in stale:
            rec = {**s, "status": Status.INTERRUPTED.value, "ended_at": now(),
                   "reason": f"run {s['run_id']} stopped while this cell ran (found by --resume)"}
            store.append(rec)
            attempts[s["cell_hash"]] = max(attempts.get(s["cell_hash"], 0), s.get("attempt", 1))
    todo = [it for it in p.items if it.cell.hash not in done]
    if resume and len(todo) < len(p.items):
        printer(f"resume: {len(p.items) - len(todo)} of {len(p.items)} cells already have a result in {results_path}")

    prog = _Progress(len(todo), enabled=progress, printer=printer)
    t_run = time.time()
    finished = False
    try:
        prepare([it for it in todo if it.skip is None], logs, extra_env, platform, printer)
        for i, it in enumerate(todo, 1):
            cell = it.cell
            attempt = attempts.get(cell.hash, 0) + 1
            base = _base_record(cell, run_id, attempt, str(matrix_path))
            if it.skip is not None:
                rec = {**base, "status": Status.SKIPPED.value, "reason": it.skip.text(),
                       "skip": {"rule": it.skip.rule, "fix": it.skip.fix, "source": it.skip.source},
                       "started_at": now(), "ended_at": now(), "provenance": env.provenance()}
                store.append(rec)
                written.append(rec)
                prog.done(i, rec)
                continue
            started_at = now()
            store.append({**base, "status": Status.STARTED.value, "started_at": started_at})
            prog.start(i, cell)
            log_path = logs / f"{cell.hash}.{attempt}.log"
            gpus = list(range(cell.gpus)) if platform.cuda else None
            try:
                out = launch.run_cell(cell, it.ds_config, log_path=log_path, gpus=gpus,
                                      stall_s=float(os.environ.get("ZEROBENCH_STALL_S", 600)), extra_env=extra_env,
                                      sample_interval_s=telemetry.interval_for(platform.cuda))
            except KeyboardInterrupt:
                rec = {**base, "status": Status.INTERRUPTED.value, "reason": "stopped by the user",
                       "started_at": started_at, "ended_at": now(), "log": str(log_path)}
                store.append(rec)
                written.append(rec)
                raise
            except Exception as e:  # noqa: BLE001 - a bug of ours in one cell must not lose the others
                import traceback

                rec = {**base, "status": Status.ERROR.value, "started_at": started_at, "ended_at": now(),
                       "reason": f"zerobench failed around this cell: {type(e).__name__}: {e}",
                       "traceback": traceback.format_exc()[-6000:], "log": str(log_path)}
                store.append(rec)
                written.append(rec)
                prog.done(i, rec)
                continue
            rec = record_outcome(cell, it, out, run_id, attempt, str(matrix_path), log_path, started_at)
            store.append(rec)
            written.append(rec)
            prog.done(i, rec)
        finished = True
    finally:
        launch.stop_forkserver()
        prog.close(time.time() - t_run, len(written), finished)
    return p, results_path, written


# DeepSpeed JIT op builders each optimizer needs (compiled on first use, ~30-60 s each).
_OPS = {"fusedadam": "FusedAdamBuilder", "cpuadam": "CPUAdamBuilder", "fusedlamb": "FusedLambBuilder"}


def prepare(items: list[Planned], logs: Path, extra_env: dict | None, platform: env.Platform, printer) -> None:
    """What runs once before the cells: the fork server's imports start in the background, and the ops
    the cells need are built meanwhile, so neither is charged to a cell."""
    if items:
        launch.start_forkserver(extra_env, logs, gpus=[0] if platform.cuda else None)
    _prebuild(items, logs, extra_env, platform, printer)
    _checkpoints(items, logs, extra_env, platform, printer)


def _tool_env(extra_env: dict | None, gpus: list[int] | None) -> dict[str, str]:
    return launch.child_env({**os.environ, **(extra_env or {})}, port=launch.free_port(), gpus=gpus)


def _prebuild(items: list[Planned], logs: Path, extra_env: dict | None, platform: env.Platform, printer) -> None:
    """Build the ops the matrix needs once, up front, so no cell's setup time includes a compile."""
    ops = sorted({_OPS[it.cell.optimizer] for it in items if it.cell.optimizer in _OPS}
                 | {"AsyncIOBuilder" for it in items if it.cell.offload == "nvme"}
                 # On CPU, DeepSpeed's first init_distributed compiles its shared-memory comm op.
                 | ({"ShareMemCommBuilder"} if items and not platform.cuda else set()))
    if not ops:
        return
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "prebuild.log"
    printer(f"building DeepSpeed ops once for this run: {', '.join(ops)} (log: {log})")
    t0 = time.time()
    code = launch.run_tool(["-m", "bench.worker", "--prebuild", *ops], log_path=log, env=_tool_env(extra_env, None),
                           timeout_s=1800)
    status = "done" if code == 0 else "some failed (the cells that need them will say why)"
    printer(f"ops {status} in {time.time() - t0:.0f} s")


def _checkpoints(items: list[Planned], logs: Path, extra_env: dict | None, platform: env.Platform, printer) -> None:
    """QLoRA quantizes from a checkpoint: build each preset's once, in one process, before the cells."""
    for model, precision in sorted({(it.cell.model, it.cell.precision) for it in items
                                    if it.cell.peft == "qlora" and it.cell.model in matrix.PRESETS}):
        log = logs / f"checkpoint-{model}-{precision}.log"
        t0 = time.time()
        code = launch.run_tool(["-m", "bench.worker", "--checkpoint", model, precision], log_path=log,
                               env=_tool_env(extra_env, [0] if platform.cuda else None), timeout_s=1800)
        status = "ready" if code == 0 else f"failed (exit {code}; the QLoRA cells will say why; log: {log})"
        printer(f"QLoRA checkpoint of {model} in {precision}: {status} ({time.time() - t0:.0f} s)")


class _Progress:
    """A bar over the matrix (current cell, ETA) on a terminal; one line per finished cell always."""

    def __init__(self, total: int, enabled: bool, printer):
        self.total, self.printer = total, printer
        self.bar = None
        if enabled and total:
            try:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
                    TimeRemainingColumn

                self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
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

    def done(self, i: int, rec: dict) -> None:
        line = _line(i, self.total, rec)
        if self.bar:
            self.bar.console.print(line, markup=False, highlight=False)
            self.bar.advance(self.task)
        else:
            self.printer(line)

    def close(self, seconds: float, recorded: int, finished: bool) -> None:
        if self.bar:
            self.bar.stop()
        if finished:
            self.printer(f"matrix done: {self.total} cells in {seconds:.0f} s")
        else:
            self.printer(f"matrix stopped after {recorded} of {self.total} cells ({seconds:.0f} s)")
