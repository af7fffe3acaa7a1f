"""`zerobench selfcheck`: does the harness measure what a plain script would, and what does it cost?

Each runnable cell is run three ways through the same child protocol, back to back:
  reference     a minimal hand-written DeepSpeed loop (bench/worker/reference.py), no telemetry
  zerobench     the worker as in any run, telemetry sampled as a run on this host samples it
  no-telemetry  the worker without the sampler
and recorded like any cell (with a `variant` field) in results/selfcheck-<matrix>.jsonl. The
comparison printed at the end is computed from those records alone:
  step time vs reference, tokens/s with vs without telemetry, and the fixed per-cell cost
  (wall time minus the steps and the model build).
"""

from __future__ import annotations

from pathlib import Path

from ..host import env
from ..judge.results import fixed_cost_s
from ..records.record import Record
from ..records.store import Store, check_writable
from . import launch
from .attempt import attempt, now
from .launch import telemetry
from .plan import plan
from .prepare import prepare
from .run import new_run_id

__all__ = ["selfcheck", "compare", "BARS"]

# What the harness promises about itself: its step time within 3% of a hand-written loop,
# telemetry costing under 1% of throughput, and at most 15 s per cell beyond the steps and the model build.
BARS = {"step_time_vs_reference": 0.03, "telemetry_cost": 0.01, "fixed_cost_s": 15.0}


def _verdict(value: float, bar: float) -> str:
    return "within the bar" if abs(value) <= bar else "OVER the bar"


VARIANTS = (
    ("reference", {"module": "bench.worker.reference", "sample_interval_s": None}),
    ("zerobench", {}),  # sampled as in a real run on this host (telemetry.interval_for)
    ("no-telemetry", {"sample_interval_s": None}),
)


def selfcheck(
    matrix_path: str, *, filters: list[str] | None = None, results: str | None = None, printer=print
) -> tuple[Path, list[Record]]:
    p = plan(matrix_path, filters)
    path = Path(results) if results else Path("results") / f"selfcheck-{p.matrix.name}.jsonl"
    check_writable(path)
    store = Store(path)
    logs = path.parent / "logs" / path.stem
    run_id = new_run_id()
    platform = env.probe()
    written = []
    with store.hold("zerobench selfcheck"):  # as a run: one writer per results file
        try:
            prepare(p.runnable, logs, None, platform, printer)
            written = _variants(p, matrix_path, store, logs, run_id, platform, printer)
        finally:
            launch.stop_forkserver()
    for line in compare(written):
        printer(line)
    return path, written


def _variants(p, matrix_path, store, logs, run_id, platform, printer) -> list[Record]:
    written = []
    for it in p.runnable:
        gpus = list(range(it.cell.gpus)) if platform.cuda else None
        for name, kw in VARIANTS:
            # No started record is stored: a selfcheck is not resumed.
            started = Record.started(it.cell, run_id=run_id, attempt=1, matrix_file=str(matrix_path), started_at=now())
            log = logs / f"{it.cell.hash}.{name}.log"
            kw = {"sample_interval_s": telemetry.interval_for(platform.cuda), **kw}
            rec = attempt(started, it.cell, it.ds_config, launch.Launch(log, gpus=gpus, **kw), variant=name)
            store.append(rec)
            written.append(rec)
            printer(f"{name:<13} {rec.status.value:<8} {it.cell.name}  {_median(rec) or 0:.4f} s/step")
    return written


def _median(rec: Record) -> float | None:
    return rec.metrics.step_time_median_s if rec.metrics else None


def compare(records: list[Record]) -> list[str]:
    """The three comparisons, per cell, from selfcheck records."""
    by_cell: dict[str, dict[str, Record]] = {}
    for r in records:
        if r.variant:
            by_cell.setdefault(r.cell_id, {})[r.variant] = r
    lines = []
    for cid, v in by_cell.items():
        zb, ref, nt = v.get("zerobench"), v.get("reference"), v.get("no-telemetry")
        parts = [cid]
        if zb and ref and _median(zb) and _median(ref):
            d = _median(zb) / _median(ref) - 1
            parts.append(
                f"step time vs hand-written loop: {d * 100:+.1f}% "
                f"({_verdict(d, BARS['step_time_vs_reference'])} of ±{BARS['step_time_vs_reference']:.0%})"
            )
        if zb and nt and _median(zb) and _median(nt):
            tz, tn = zb.metrics.tokens_per_s, nt.metrics.tokens_per_s
            d = 1 - tz / tn
            parts.append(
                f"telemetry cost: {d * 100:+.1f}% tokens/s "
                f"({_verdict(d, BARS['telemetry_cost'])} of ±{BARS['telemetry_cost']:.0%})"
            )
        fixed = fixed_cost_s(zb) if zb else None
        if fixed is not None:
            build = (zb.worker.model_build_s if zb.worker else None) or 0.0
            how = zb.started_by.mode if zb.started_by else "spawn"
            parts.append(
                f"fixed per-cell cost beyond model build: {fixed:.1f} s ({_verdict(fixed, BARS['fixed_cost_s'])} "
                f"of {BARS['fixed_cost_s']:g} s; model build {build:.2f} s, worker "
                f"{'forked from the pre-imported server' if how == 'fork' else 'started from scratch'})"
            )
        lines.append("  ".join(parts))
    return lines
