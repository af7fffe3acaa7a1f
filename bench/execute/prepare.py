"""One-off costs before the cells, paid once per machine where they can be: DeepSpeed op builds, QLoRA
checkpoints (through bench.records.cache), and the fork servers' imports in the background."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..host import env, heartbeat
from ..matrix import spec
from ..matrix.axes import OPTIMIZERS, Offload
from ..records import cache
from . import launch
from .plan import Planned
from .progress import costs_line

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
    items: list[Planned],
    logs: Path,
    extra_env: dict | None,
    platform: env.Platform,
    printer,
    slots=None,
    forkservers: str | None = None,
) -> dict:
    """What runs once before the cells, for the cells that will run (items), paid once per machine where
    it can be: the ops and QLoRA checkpoints already in the machine's cache (bench.records.cache) are not built
    or loaded again; what is missing is built by helpers side by side, while the fork servers import in
    the background (one per GPU a single-GPU cell may run on; they import only: each forked cell loads
    its ops itself, after these are built; none where the executor's workers fork from servers elsewhere, as
    forkservers says). Prints one line of what was paid and returns it (the records' fixed_costs)."""
    t0 = time.time()
    costs: dict = {}
    if any(it.cell.ranks == 1 for it in items) and not forkservers:
        gpus = list(slots.ids) if slots is not None and slots.max_cells > 1 else [_first_gpu(platform)]
        for g in gpus if platform.cuda else [None]:
            launch.start_forkserver(extra_env, logs, gpus=None if g is None else [g])
    _run_jobs(
        _ops_jobs(items, logs, extra_env, platform, printer, costs)
        + _checkpoint_jobs(items, logs, extra_env, platform, printer, costs),
        printer,
    )
    if items:
        import_s, why = (None, f"none on this host: {forkservers}") if forkservers else launch.forkserver_ready()
        costs["forkserver_import_s"] = round(import_s, 1) if import_s is not None else None
        if why:
            costs["forkserver"] = why
        costs["setup_s"] = round(time.time() - t0, 1)
        printer(costs_line(costs))
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
    return _build_jobs(_needed_ops(items, platform), logs, extra_env, platform, printer, costs)


def _build_jobs(ops: list[str], logs: Path, extra_env, platform: env.Platform, printer, costs: dict) -> list[_Job]:
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


def build_ops(ops: list[str], logs: Path, extra_env: dict | None, platform: env.Platform, printer) -> dict:
    """Only these DeepSpeed ops, through the cache, as a run builds them (`zerobench probe --build-cpu-adam`);
    returns their fixed costs."""
    costs: dict = {}
    _run_jobs(_build_jobs(ops, logs, extra_env, platform, printer, costs), printer)
    return costs


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
            if it.cell.peft == "qlora" and it.cell.model in spec.PRESETS
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
