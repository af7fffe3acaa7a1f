"""The console: one line per outcome, a bar with the ETA on a terminal, the summary and the fixed costs."""

from __future__ import annotations

from ..matrix.cells import Cell
from ..records import quality
from ..records.record import Record
from ..records.status import Status
from . import schedule


def _fmt_bytes(b) -> str:
    return "-" if not b else f"{b / 2**30:.2f} GiB"


def line(i: int, n: int, rec: Record) -> str:
    m, mem = rec.metrics, rec.memory
    peak = mem and (mem.nvml_proc_peak_bytes or mem.host_rss_peak_bytes)
    bits = [f"[{i}/{n}]", f"{rec.status.value:<11}", rec.cell_name]
    if rec.repeat > 1:
        bits.append(f"(repeat {rec.repeat})")
    if rec.status is Status.OK:
        losses = rec.losses or []
        bits += [
            f"{rec.wall_s or 0:.1f}s",
            f"{(m and m.tokens_per_s) or 0:,.0f} tok/s",
            f"loss {losses[0]:.2f}->{losses[-1]:.2f}" if losses else "",
            f"peak {_fmt_bytes(peak)}",
            _weak(rec),
        ]
    elif rec.reason:
        bits.append(f"- {rec.reason[:160]}")
    return "  ".join(b for b in bits if b)


def _weak(rec: Record) -> str:
    """The flags that make a measurement weaker evidence (bench.records.quality), by name; "" for a clean one."""
    flags = quality.flags(rec)
    return f"({', '.join(f.split(':')[0] for f in flags)})" if flags else ""


def costs_line(c: dict) -> str:
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


def not_run_group(rec: Record) -> str | None:
    """What a record of a cell that did not run shares with others like it ("skipped by RULE", "unmeasured: ...",
    the cell an implied_oom names); None for an attempt."""
    st = rec.status
    if st is Status.SKIPPED:
        return f"skipped by {rec.skip.rule if rec.skip else 'a rule'}"
    if st is Status.IMPLIED_OOM:
        return f"implied out of memory by {rec.implied_by.cell_name if rec.implied_by else 'a cell'}"
    if st is Status.UNMEASURED:
        return f"unmeasured: {rec.reason}"
    return None


class Progress:
    """A bar over the matrix (current cell, ETA) on a terminal; one line per attempt always, one line for the first
    cell of each group of cells that did not run (a rule's skips; their count at the end)."""

    def __init__(self, total: int, enabled: bool, printer):
        self.total, self.printer = total, printer
        self.counts: dict[str, int] = {}  # outcomes by status, for the summary
        self.not_run: dict[str, int] = {}  # cells that did not run, by group (not_run_group)
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

    def done(self, i: int, rec: Record, elapsed: float | None = None, eta: float | None = None) -> None:
        self.counts[rec.status.value] = self.counts.get(rec.status.value, 0) + 1
        group = not_run_group(rec)
        if group is not None:
            self.not_run[group] = self.not_run.get(group, 0) + 1
        text = None
        if group is None or self.not_run[group] == 1:
            text = line(i, self.total, rec) + ("  (others like it are counted, not listed)" if group else "")
            if elapsed is not None:
                text += f"  [{schedule.duration(elapsed)} elapsed, ETA {schedule.duration(eta)}]"
        if self.bar:
            self.bar.update(self.task, total=self.total)
            if text:
                self.bar.console.print(text, markup=False, highlight=False)
            self.bar.advance(self.task)
        elif text:
            self.printer(text)

    def close(self, seconds: float, recorded: int, finished: bool) -> None:
        if self.bar:
            self.bar.stop()
        ran = sum(n for st, n in self.counts.items() if Status(st).ran)
        parts = [f"{ran} ran"] + [
            f"{self.counts[st.value]} {st.value}" for st in Status if not st.ran and self.counts.get(st.value)
        ]
        what = ", ".join(parts)
        for group, n in sorted(self.not_run.items(), key=lambda kv: -kv[1]):
            if n > 1:
                self.printer(f"  {n:6d} cells {group}")
        if finished:
            self.printer(f"matrix done: {self.total} cells in {seconds:.0f} s ({what})")
        else:
            self.printer(f"matrix stopped after {recorded} of {self.total} cells ({seconds:.0f} s; {what})")
