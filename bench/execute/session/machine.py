"""What a run pays on this machine before its cells, where anything is left to measure: the probe of its rates
(bench.execute.probe) and the one-off costs (bench.execute.prepare). The probe runs first, undisturbed by the builds;
where the prebuild then builds CPU Adam, which the probe could not time (it compiles nothing), it times that alone."""

from __future__ import annotations

from ...host.rates import Rates
from ..plan import Planned
from ..prepare import prepare as prepare_
from ..probe import probe_machine, run_shape
from .units import Run

__all__ = ["cpu_adam_built", "prepare", "probe"]


def probe(run: Run, runnable: list[Planned]) -> Rates | None:
    """The machine's rates (cached per machine) at the shape of every cell the plan may run (the same each call of
    a --resume); none where the cells run elsewhere (a cluster's nodes, a replay's recording)."""
    if run.executor != "local" or not runnable:
        return None
    s = run.settings
    shape = run_shape(it.cell for it in runnable)
    rates, _ = probe_machine(shape, extra_env=s.extra_env, logs=run.logs, printer=run.printer, platform=run.platform)
    return rates


def prepare(run: Run, items: list[Planned], forkservers: str | None) -> dict | None:
    """The one-off costs, for the cells that will run (not those skipped or predicted not to fit): what was paid
    (the records' fixed_costs), None for nothing."""
    if run.slots.max_cells > 1 and run.executor == "local":
        where = "GPUs" if run.platform.cuda else "CPU slots"
        run.printer(f"packing: up to {run.slots.max_cells} cells side by side on {where} {list(run.slots.ids)}")
    s = run.settings
    return prepare_(items, run.logs, s.extra_env, run.platform, run.printer, run.slots, forkservers) or None


def cpu_adam_built(costs: dict | None, rates: Rates | None) -> bool:
    """The prebuild has just made CPU Adam loadable, and the probe before it had no figure for it."""
    made = ((costs or {}).get("ops") or {}).get("CPUAdamBuilder") in ("built", "loaded")
    return made and rates is not None and rates.cpu_adam is None
