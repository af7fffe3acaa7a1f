"""One attempt of one cell, to its end: its rendezvous port (another, and a relaunch, where that port was taken
before any step ran), every node's launch (one here: bench.execute.launch.protocol; several on this host:
bench.execute.launch.nodes.launch_here), and the Outcome, classified.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ...host.safefile import open_append
from ...matrix.cells import Cell
from ...records.status import Status
from .folders import new_attempt_folder
from .nodes import launch_here, node_log
from .outcome import Outcome, _classify
from .ports import _LAUNCHES, _PORT_TAKEN_RE, _hold_port, _release_port
from .protocol import Launch, Rendezvous, StopRequest, run_launch


def run_cell(cell: Cell, ds_config: dict | None, launch: Launch, stop: StopRequest | None = None) -> Outcome:
    """Run one cell attempt to its end, whatever that end is. A Ctrl-C (or the orchestrator's SIGTERM,
    as KeyboardInterrupt) stops the worker and is raised again after cleaning up; so is stop.exc once
    another thread sets `stop` (a cell run beside others, bench.execute.executors.local). A cell of several nodes runs
    every node here, at 127.0.0.1 (bench.execute.launch.nodes.launch_here)."""
    if stop is not None and stop.is_set():
        raise stop.exc  # nothing started yet: nothing to stop
    launch.log_path.parent.mkdir(parents=True, exist_ok=True)
    if cell.nodes > 1:

        def here(port: int, again: bool) -> Outcome:
            return launch_here(cell, ds_config, launch, port, again, stop)

        return _relaunching(here, launch.env(), [node_log(launch.log_path, k) for k in range(cell.nodes)])
    work = new_attempt_folder()
    try:

        def one(port: int, again: bool) -> Outcome:
            return _one_node(cell, ds_config, launch, Rendezvous(port), work, again, stop)

        return _relaunching(one, launch.env(), [launch.log_path])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _relaunching(launch: Callable[[int, bool], Outcome], env: dict[str, str], logs: list[Path]) -> Outcome:
    """launch(port, again) on a rendezvous port held while it runs, again on another port (noted in each
    of `logs`) when the port was taken before any step ran: nothing of the cell was measured then."""
    port = _hold_port(env, first=True)
    try:
        notes: list[str] = []
        for n in range(_LAUNCHES):
            out = launch(port, n > 0)
            if not (
                out.status is Status.ERROR
                and out.last_step is None
                and _PORT_TAKEN_RE.search(out.reason + "\n" + out.log_tail)
                and n + 1 < _LAUNCHES
            ):
                break
            new = _hold_port(env, first=False)
            _release_port(port)
            notes.append(f"the rendezvous port {port} was in use; relaunched on port {new}")
            for log_path in logs:
                with os.fdopen(open_append(log_path), "ab") as log:
                    log.write(f"\n--- zerobench: port {port} was in use; relaunching on port {new} ---\n".encode())
            port = new
        out.warnings = notes + out.warnings
        out.port = port
        return out
    finally:
        _release_port(port)


def _one_node(
    cell: Cell, ds_config: dict | None, launch: Launch, rdzv: Rendezvous, work: Path, again: bool,
    stop: StopRequest | None,
) -> Outcome:  # fmt: skip
    """One launch of a cell of one node, classified; a stop is raised once it is cleaned up."""
    out, watch = run_launch(cell, ds_config, launch, rdzv, work, again, stop)
    out.status, out.reason = _classify(out, watch.killed_for, cell)
    if watch.stop is not None:
        raise watch.stop
    return out
