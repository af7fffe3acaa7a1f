"""Every record a run writes goes through its Ledger: stored in the results file whole (signals held while it is
written), counted, printed with its progress index and handed to the exporter; the attempt number each cell is at;
and, where the run stops on a failure of its own, what it wrote and what --resume does next."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from ...matrix.cells import Cell
from ...records.record import Record
from ...records.status import Status
from ...records.store import Store, StoreWriteError
from .. import launch
from ..attempt import HARNESS_ERRNOS, HarnessError
from ..progress import Progress, line
from .units import Run

__all__ = ["Ledger"]


class Ledger:
    def __init__(self, store: Store, run: Run, run_id: str, attempts: dict[str, int], left: Callable):
        self.store, self.run, self.run_id = store, run, run_id
        self.attempts = attempts  # cell hash -> the last attempt number used
        self.left = left  # the seconds left, for the ETA
        self.written: list[Record] = []  # the outcomes this run stored, in order
        self.i = 0  # the progress index of the last unit drawn or record written without one
        self.prog: Progress | None = None
        self.t_run = time.time()

    def next_index(self) -> int:
        self.i += 1
        return self.i

    def ident(self, cell: Cell) -> dict:
        attempt = self.attempts.get(cell.hash, 0) + 1
        return {"run_id": self.run_id, "attempt": attempt, "matrix_file": str(self.run.settings.matrix)}

    def claim(self, cell: Cell) -> dict:
        """The ident of the cell's next attempt, its number now taken."""
        ident = self.ident(cell)
        self.attempts[cell.hash] = ident["attempt"]
        return ident

    def save(self, rec: Record) -> Record:
        """Store a record whole: no signal stops the run between its first byte and its last."""
        with launch.holding_signals():
            try:
                self.store.append(rec)
            except StoreWriteError as e:
                e.record = rec  # what is lost, for the message that stops the run
                raise
        return rec

    def recorded(self, i: int, rec: Record) -> None:
        """An outcome is stored: count it, print it, hand it to the exporter."""
        self.written.append(rec)
        self.prog.done(i, rec, elapsed=time.time() - self.t_run, eta=self.left())
        if self.run.on_record is not None:
            try:
                self.run.on_record(rec)
            except Exception as e:  # noqa: BLE001 - an exporter must not stop a measurement
                self.run.printer(f"warning: exporting the record of {rec.cell_name} failed: {type(e).__name__}: {e}")

    def close(self, finished: bool) -> None:
        self.prog.close(time.time() - self.t_run, len(self.written), finished)

    @contextlib.contextmanager
    def own_failures(self) -> Iterator[None]:
        """A failure of the run's own (a record that could not be written whole, its files that could not be) said,
        with what this run wrote and what --resume does; an OSError writing its own files before any cell is raised
        as HarnessError."""
        try:
            yield
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

    def say_harness_error(self, e: HarnessError) -> None:
        """The run stops on a failure of zerobench's own (not a cell's): say it, and what --resume does."""
        e.results_path = self.store.path
        self.run.printer(f"zerobench: stopped: {e}")
        self.run.printer(
            f"  written to {self.store.path} by this run: {len(self.written)} outcome(s); the cell it stopped in "
            "has none: once the folder can be written, `--resume` runs it again"
        )

    def say_write_error(self, e: StoreWriteError) -> None:
        e.reported = True
        lost, printer = getattr(e, "record", None), self.run.printer
        printer(f"zerobench: stopped: {e.strerror}")
        if lost is not None and lost.status is not Status.STARTED:
            printer(f"  lost: {line(self.i, self.prog.total, lost)}")
        elif lost is not None:
            printer(f"  not started: {lost.cell_name} (its start could not be recorded)")
        printer(
            f"  written to {self.store.path} by this run: {len(self.written)} outcome(s), each whole; "
            "once there is room, `--resume` runs the cells that have none"
        )
