"""What a run decides before anything runs: the cells and their configs, rule skips, the memory model's
predictions and prunes, the order; and the preview of it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..estimate import Hardware, Verdict, predict, short_of, verdict
from ..estimate.planning.frontier import frontier_lines
from ..estimate.steptime import run_seconds, run_time_line
from ..host import env, hostmem
from ..host.rates import Rates
from ..matrix import dsconfig, faults, rules, spec
from ..matrix.axes import AUTO
from ..matrix.cells import Cell
from ..matrix.problems import ConfigError, InputError, Problem
from . import schedule
from .settings import RunSettings, Shard


@dataclass(frozen=True)
class Planned:
    cell: Cell
    skip: rules.Skip | None
    ds_config: dict | None
    family: str | None = None
    """Answer mode with batch.size: its configuration (bench.execute.run.family_of), shared by the cells that
    differ from it in micro-batch and accumulation alone; None without batch.size."""


@dataclass(frozen=True)
class Plan:
    matrix: spec.Matrix
    source: str
    items: tuple[Planned, ...]
    shard: Shard | None = None

    @property
    def runnable(self) -> list[Planned]:
        return [p for p in self.items if p.skip is None]

    def part(self, shard: Shard | None) -> Plan:
        """The plan of this shard's cells (all of them for None)."""
        if shard is None:
            return self
        return Plan(self.matrix, self.source, tuple(it for it in self.items if shard.holds(it.cell)), shard)


def select(cells: list[Cell], filters: list[str] | None) -> list[Cell]:
    """Keep cells whose name or id (name#hash) matches every filter (a regular expression or plain text, e.g.
    zero=3): `mb=8$` ends the name, as before ids carried their hash, and `#HASH$` the id."""
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
        cells = [c for c in cells if rx.search(c.name) or rx.search(c.id)]
    return cells


def plan(
    matrix_path: str,
    filters: list[str] | None = None,
    platform: env.Platform | None = None,
    ds_configs: list[str] | None = None,
    shard: Shard | None = None,
) -> Plan:
    """Load, validate and expand a matrix, and decide for each cell: run (with its config) or skip (why).

    ds_configs replaces the matrix's ds_config axis with these user DeepSpeed files; shard keeps its part."""
    return decide(spec.load(matrix_path, ds_configs=ds_configs), str(matrix_path), filters, platform, shard)


def decide(
    m: spec.Matrix,
    source: str,
    filters: list[str] | None = None,
    platform: env.Platform | None = None,
    shard: Shard | None = None,
    cells: list[Cell] | None = None,
) -> Plan:
    """plan() of a matrix already loaded from source: each of its cells (those filters and shard keep) run or
    skipped, as the rules judge it on platform (default: this host). cells: the matrix's cells, already expanded
    and filtered (a matrix of a million cells is expanded once)."""
    platform = platform or env.probe()
    items = []
    for cell in select(spec.expand(m), filters) if cells is None else cells:
        if shard is not None and not shard.holds(cell):
            continue
        skip = rules.check(cell, platform)
        # micro_batch: auto is a search: each probe gets its own config when it runs.
        items.append(Planned(cell, skip, None if skip or cell.micro_batch == AUTO else dsconfig.build(cell)))
    return Plan(m, source, tuple(items), shard)


def hardware(
    platform: env.Platform, gpu_mem: int | None = None, host_mem: int | None = None, rates: Rates | None = None
) -> Hardware:
    """What predictions are judged against: the first GPU's memory (NVML's total at the run's start) or
    gpu_mem, and the host's memory or host_mem; the machine's probed rates. No GPU and no gpu_mem: nothing to
    judge a GPU cell's memory against."""
    gpu = gpu_mem or (platform.gpus[0].memory_bytes if platform.cuda and platform.gpus else None)
    return Hardware(
        gpu_memory_bytes=gpu or None,
        host_memory_bytes=(host_mem or platform.host_memory_bytes or None) if gpu else None,
        gpu_name=platform.gpus[0].name if platform.cuda and platform.gpus else None,
        rates=rates,
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


LOCAL = "local"
"""The default results' and reports' own folder under results/ and reports/ (git-ignored in this repository):
what a user's run writes is theirs, never appended to the repository's committed results beside it, and the
repository's checks never read it."""


def default_results_path(p: Plan | str, shard: Shard | None = None) -> Path:
    """results/local/<matrix name>.jsonl; a shard's: results/local/<matrix name>.shard-<i>-of-<N>.jsonl (of a
    plan, or of a matrix name and shard)."""
    name, shard = (p, shard) if isinstance(p, str) else (p.matrix.name, p.shard)
    part = f".shard-{shard.index}-of-{shard.count}" if shard else ""
    return Path("results") / LOCAL / f"{name}{part}.jsonl"


def default_report_path(results: Path) -> Path:
    """reports/<results name>; for a results file in results/local/, reports/local/<results name>."""
    local = results.parent.name == LOCAL and results.parent.parent.name == "results"
    return Path("reports") / (LOCAL if local else "") / results.stem


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
    p: Plan, s: RunSettings, platform: env.Platform, recorded: frozenset[str] = frozenset(), verbose: bool = False
) -> list[str]:
    """What `zerobench run` would do with plan p (judged on platform) as s asks, without running anything; its
    summary last: how many cells would run, may not fit (the memory model is unsure: it may run out of memory and
    then imply the heavier ones), be pruned (the memory model: it cannot fit) or skipped (a rule), what it would
    cost in GPU time, and its predicted frontier. recorded: the hashes of the cells with an outcome, left as they
    are (--resume). verbose: first every cell in the order it would run, one line each."""
    hw = hardware(platform, s.gpu_mem, s.host_mem)
    items, preds, free = arrange(p.items, hw, s.margin, s.prune, s.order)
    items = [it for it in items if it.cell.hash not in recorded]
    whats = [_what(it, preds[id(it)], free, s.prune, hw) for it in items]
    lines = [f"run order ({s.order}), one line per cell:"] if verbose else []
    if verbose:
        lines += [_cell_line(n, it, what, preds[id(it)] or {}) for n, (it, what) in enumerate(zip(items, whats), 1)]
    counts = {k: whats.count(k) for k in _LEGEND if k in whats}
    lines.append(f"memory model: {_judged(hw)}, margin {s.margin:.0%}")
    lines.append(
        ", ".join(f"{n} {_LEGEND[k]}" for k, n in counts.items())
        + ("" if verbose or not items else " (--verbose lists each cell in run order)")
    )
    runnable = [it for it, what in zip(items, whats) if what in ("run", "run?")]
    lines.append(run_time_line([it.cell for it in runnable], hw, max(len(platform.gpus), 1)))
    lines += frontier_lines([(it.cell, it.ds_config, (preds[id(it)] or {}).get("gpu_bytes")) for it in runnable], hw)
    return lines


def run_seconds_of(p: Plan, s: RunSettings, platform: env.Platform, recorded: frozenset[str] = frozenset()) -> float:
    """Predicted GPU-seconds (one GPU) of the cells a run of plan p would run as s asks: preview's time line."""
    hw = hardware(platform, s.gpu_mem, s.host_mem)
    items, preds, free = arrange(p.items, hw, s.margin, s.prune, s.order)
    cells = [
        it.cell
        for it in items
        if it.cell.hash not in recorded and _what(it, preds[id(it)], free, s.prune, hw) in ("run", "run?")
    ]
    return run_seconds(cells, hw, 1)[0]


_LEGEND = {"run": "to run", "run?": "to run that may not fit", "pruned": "pruned", "skip": "skipped by a rule"}


def _what(it: Planned, pred: dict | None, free: set[int], prune: bool, hw: Hardware) -> str:
    """A cell's fate in the plan, as _LEGEND names it."""
    if it.skip is not None:
        return "skip"
    if id(it) in free:
        return "pruned"
    return "run?" if _risky(pred, prune) and hw.gpu_memory_bytes else "run"


def _cell_line(n: int, it: Planned, what: str, pred: dict) -> str:
    mem = f"{pred['gpu_bytes'] / 2**30:6.1f} GiB" if pred.get("gpu_bytes") else " " * 10
    why = f"({short_of(pred)})  " if what == "pruned" else ""
    rule = f"  ({it.skip.rule})" if it.skip is not None else ""
    return f"  {n:5d}  {what:6s} {mem}  {why}{it.cell.id}{rule}"


def _judged(hw: Hardware) -> str:
    """What the memory model judges cells against, in words."""
    if not hw.gpu_memory_bytes:
        return "no GPU memory known (--gpu-mem SIZE gives it), nothing pruned"
    gpu = f"judged against {hw.gpu_memory_bytes / 2**30:.1f} GiB of GPU memory"
    if hw.host_memory_bytes:
        return f"{gpu} and {hw.host_memory_bytes / 2**30:.1f} GiB of host memory"
    return f"{gpu}, host memory not judged (--host-mem SIZE judges it)"


def _risky(pred: dict | None, prune: bool) -> bool:
    """Might run out of GPU memory: the model is uncertain, knows no GPU to judge against, or (not pruning)
    says it will not fit."""
    v = (pred or {}).get("gpu_verdict")
    return v in (None, Verdict.UNCERTAIN, Verdict.UNKNOWN) or (v == Verdict.PRUNE and not prune)


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


def placed_by(platform: env.Platform, executor: str) -> env.Platform:
    """The platform the rules judge cells by under `executor`: under `ray`, a cell's nodes are nodes of a cluster
    the plan does not count (hosts None), and the executor refuses, before any cell, what its cluster cannot
    place (bench.execute.executors.ray)."""
    if executor != "ray":
        return platform
    import dataclasses

    return dataclasses.replace(platform, hosts=None)


def host_platform(gpus_available: int | None) -> env.Platform:
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
