"""A run's settings: what it was asked (RunSettings, with its answer mode's AnswerSettings and its Shard), one
value from the command line to the plan, the dry run and the run; and the environment's (ZEROBENCH_*), checked
before the first cell: a bad value is the user's input (a clear error naming the variable and the range; exit 2),
never every cell's error."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..estimate import DEFAULT_MARGIN
from ..host import env
from ..judge.effects import RULE
from ..matrix.cells import Cell
from ..matrix.problems import ConfigError, InputError, Problem

__all__ = ["AnswerSettings", "RunSettings", "Shard", "check_settings", "stall_s"]


@dataclass(frozen=True)
class Shard:
    """One of `count` disjoint parts of a matrix's cells (`--shard index/count`, index from 1), by cell hash:
    a cell is in the same shard whatever the order the matrix lists it in, and the parts together are the
    whole matrix (each CI job runs one; --resume and reports take their results files together)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if not m or not 1 <= int(m[1]) <= int(m[2]):
            raise ValueError(f"{text!r}: i/N with 1 <= i <= N, e.g. 2/4")
        return cls(int(m[1]), int(m[2]))

    def holds(self, cell: Cell) -> bool:
        return int(cell.hash, 16) % self.count == self.index - 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class AnswerSettings:
    """How answer mode settles (each a `zerobench run` option)."""

    group_by: tuple[str, ...] = ("peft",)
    """Axes whose values split the cells into groups, each with its own fastest cell."""
    budget_s: float | None = None
    """Cell wall seconds to spend at most (None: until settled)."""
    pairs: int = 1
    """Measured pairs behind each knob value's effect (where the matrix has that many)."""
    memory_tolerance: float = 0.05
    """Peaks closer than this fraction count as the same memory (the frontier is drawn at this resolution)."""
    speed_tolerance: float = RULE.min_effect
    """The smallest speed-up that matters: a cell that cannot beat another by more (95%, one-sided) is not
    needed to settle it; compare's minimum effect, so the answer and the gate agree on what is noise."""
    halving: bool = True
    """First measurements on the short schedule (rung 0), the contenders again on the full one."""
    collapse: bool = False
    """Cells of a group that differ only in knob values measured within the speed tolerance share their own misfit in
    the stopping rule (bench.execute.answer.collapse)."""
    screen: int = 0
    """Pairs per knob value measured first, once each group has its leader, in the cheapest cells that pair
    (bench.execute.answer.picking); with collapse, a value then collapses in every group where those pairs, wherever
    measured, put its effect within the speed tolerance on the measurements' known noise
    (bench.execute.answer.collapse). 0: no screen."""
    frontier: bool = True
    """The frontier is one of the questions the answer settles (False: the stopping rule asks only who leads, and the
    frontier is given as measured, not settled)."""
    settle: float = 0.05
    """The answer is settled when the chance that some unmeasured cell beats its group's leader by more than the
    speed tolerance, and the chance that one adds a frontier point, are both below this
    (bench.execute.answer.settle)."""


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """What a run was asked (`zerobench run`'s options): built once, read alike by its dry run
    (bench.execute.plan.preview, bench.execute.run.answer_preview) and the run (bench.execute.run.run), which fills
    in what it resolves (the results file, the logs folder, the repeats, the platform, the executor) for its session
    (bench.execute.session.Run)."""

    matrix: str
    """The matrix file."""
    filters: tuple[str, ...] = ()
    """Only the cells whose name or id matches every one (bench.execute.plan.select)."""
    ds_configs: tuple[str, ...] | None = None
    """DeepSpeed config files run as the cells' ds_config axis, in place of the matrix's."""
    shard: Shard | None = None
    """Only this part of the cells, into its own results file by default."""
    results: str | None = None
    """The results file (default: results/local/<matrix name>.jsonl; a shard's and a replay's beside it)."""
    other_matrix: bool = False
    """Append to (or resume from) a results file whose records of this matrix were written from another version
    of the matrix file (by default an InputError: its cells and outcomes are not this matrix's)."""
    logs: str | None = None
    """The worker logs' folder (default: logs/<results name>/ beside the results file)."""
    resume: bool = False
    """Keep the outcomes the results file holds and run the rest; the cells a killed run left started are
    recorded interrupted."""
    repeats: int | None = None
    """Runs of every runnable cell, interleaved (default: the matrix's repeats)."""
    order: str = "early"
    """A name in bench.execute.schedule.ORDERS: early (bench.execute.schedule.order) or matrix (as it expands)."""
    prune: bool = True
    """Record without running the cells the memory model says cannot fit and those a lighter cell's out-of-memory
    end implies (False: run them)."""
    gpu_mem: int | None = None
    """GPU memory to judge cells against (default: NVML's total of the first GPU; with neither, none is pruned)."""
    host_mem: int | None = None
    """Host memory to judge cells against (default: the platform's)."""
    margin: float = DEFAULT_MARGIN
    """The memory model's margin: pruned beyond (1 + margin) of the memory, unsure within it."""
    executor: str = "local"
    """What runs the cells: a name in bench.execute.executors.registry.EXECUTORS (local, ray, slurm, replay)."""
    gpus_available: int | None = None
    """This host's first N GPUs (default: every GPU NVML shows); on a CPU host, N slots side by side (default 1)."""
    pack: bool | None = None
    """Cells side by side on disjoint GPU sets (default: with more than one GPU)."""
    address: str | None = None
    """A Ray cluster's head (default: RAY_ADDRESS, else a new local instance)."""
    slurm: Mapping[str, object] | None = None
    """The command line's Slurm options (bench.matrix.spec.SlurmSettings keys), over the matrix's slurm block."""
    platform: env.Platform | None = None
    """Judge the cells as on this platform instead of this host (a plan for assumed GPUs: --assume-gpus)."""
    answer: AnswerSettings | None = None
    """Answer mode (bench.execute.answer): measure only the cells that settle the answer; None: every cell."""
    replay: tuple[str, ...] = ()
    """Results files whose recorded ends are served as if the cells ran (bench.execute.executors.replay); nothing
    runs."""
    progress: bool = True
    """A progress bar (one line per cell is printed regardless)."""
    extra_env: Mapping[str, str] | None = None
    """Environment for every worker, over this process's."""


STALL_S = ("ZEROBENCH_STALL_S", 1.0, 7 * 24 * 3600.0, 600.0)  # name, lowest, highest, default
PORT = ("ZEROBENCH_PORT", 1024, 65000)  # room above for the next ports up (packed cells, relaunches)
FORKSERVER = ("ZEROBENCH_FORKSERVER", ("0", "1"))


def _number(environ: Mapping[str, str], name: str, lo: float, hi: float, kind) -> Problem | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    what = "seconds" if kind is float else "a whole number"
    try:
        value = kind(text)
    except ValueError:
        return Problem("environment", f"{name}={text!r}", f"not {what}", f"set {lo:g} to {hi:g}, or unset it")
    if not lo <= value <= hi:
        return Problem(
            "environment", f"{name}={text}", f"out of range {lo:g}-{hi:g}", f"set {lo:g} to {hi:g}, or unset it"
        )
    return None


def check_settings(environ: Mapping[str, str]) -> None:
    """Raise ConfigError naming every ZEROBENCH_* setting the run cannot use."""
    problems = [
        p
        for p in (
            _number(environ, STALL_S[0], STALL_S[1], STALL_S[2], float),
            _number(environ, PORT[0], PORT[1], PORT[2], int),
        )
        if p is not None
    ]
    fs = environ.get(FORKSERVER[0])
    if fs is not None and fs.strip() not in FORKSERVER[1]:
        problems.append(Problem("environment", f"{FORKSERVER[0]}={fs!r}", "not 0 or 1", "0 (spawn every worker) or 1"))
    if problems:
        raise ConfigError(problems)


def stall_s(environ: Mapping[str, str]) -> float:
    """The no-progress watchdog's limit (checked by check_settings before the run)."""
    text = environ.get(STALL_S[0], "").strip()
    return float(text) if text else STALL_S[3]


def check_folder(path: Path, what: str) -> None:
    """Before the first cell: a folder the run will write into must be a folder it can create or write
    (nothing is created here; a read-only mount, a file in its place, a name too long are said at once)."""
    try:
        above = next((a for a in (path, *path.parents) if a.exists()), None)
    except OSError as e:
        raise InputError(f"{what}: {e.strerror}; give a shorter path") from None
    if above is not None and not above.is_dir():
        raise InputError(f"{what}: {above} is a file, not a folder; give a folder path")
    if above is not None and not os.access(above, os.W_OK):
        why = "a read-only file system" if _read_only(above) else "no write permission"
        raise InputError(f"{what}: {above} is not writable ({why}); give a folder this user can write")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
