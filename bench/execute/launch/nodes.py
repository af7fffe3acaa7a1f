"""A cell over several nodes: torchrun on each node (`--nnodes N --node_rank r`), every node meeting at
the rendezvous on the first (its address, a port free there), each node's launch watched where it runs.

run_node(NodeLaunch) is one node's part, run where an executor placed it: that node's ranks started,
sampled and watched as on one host (bench.execute.launch.protocol: the wall-clock timeout; the watchdog, which
each node's first rank feeds), its documents and telemetry handed back in a NodeEnd; outcome.of_nodes
classifies the attempt from every node's. launch_here runs every node on this host at 127.0.0.1, each its own
torchrun with its own ranks: how one machine tests the multi-node path on CPU (a GPU host does not:
bench.matrix.rules "nodes-on-one-host"); bench.execute.launch.cell.run_cell calls it for a cell of several nodes.

A cluster executor runs each node's part where it placed it through take_part: the nodes meet on a Board
(wherever the executor lets them share a few facts: a folder on Slurm, an actor on Ray), where node 0
publishes its address and a port free on it and each node marks how its launch ended; a node whose peer
failed gets PEER_GRACE_S to end by itself, then a stop as "peer".
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...host import env as _env
from ...matrix.cells import Cell
from .folders import new_attempt_folder
from .outcome import NodeEnd, Outcome, of_nodes
from .ports import first_port
from .protocol import Launch, Rendezvous, StopRequest, run_launch

# How long the other nodes may take to end by themselves after one node's launch failed (their next
# collective fails, or torchrun stops them), before they are stopped: NCCL can wait far longer.
PEER_GRACE_S = 15.0
MEET_S = 300.0  # how long a node waits for node 0's rendezvous (a cell's nodes are placed together)
WATCH_S = 1.0  # how often a node looks at its board for a failed peer while its launch runs


@dataclass(frozen=True)
class NodeLaunch:
    """One node's part of a multi-node attempt: everything the node needs, as plain picklable values."""

    cell: Cell
    ds_config: dict | None
    launch: Launch
    """This node's launch: its own log (node_log) and its GPUs."""
    rdzv: Rendezvous
    """Where the cell's ranks meet (node 0's address, a port free there) and which node this is (rdzv.node:
    node 0 hosts the rendezvous and rank 0)."""
    again: bool = False
    """A relaunch of the attempt (its log is appended to, not started)."""


def node_log(log_path: Path, node: int) -> Path:
    """Node k's log beside the attempt's (node 0's is the attempt's own): name.node1.log, ..."""
    return log_path if node == 0 else log_path.with_name(f"{log_path.stem}.node{node}{log_path.suffix}")


def run_node(part: NodeLaunch, stop: StopRequest | None = None) -> NodeEnd:
    """This node's part of the attempt, to its end, whatever the end: never raises for the cell's sake. A stop
    (`stop`; in the main thread a Ctrl-C, or a SIGTERM: a scheduler's cancel, time limit or preemption)
    ends the node's launch and is recorded in the NodeEnd (killed_for interrupt, or peer), not raised."""
    cell, log_path, node = part.cell, part.launch.log_path, part.rdzv.node
    work = new_attempt_folder()
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with _sigterm_interrupts():
            out, watch = run_launch(cell, part.ds_config, part.launch, part.rdzv, work, part.again, stop)
        return NodeEnd(
            node=node,
            host=socket.gethostname(),
            addr=part.rdzv.addr,
            ranks=list(range(node * cell.gpus, (node + 1) * cell.gpus)),
            outcome=out,
            killed_for=watch.killed_for,
            provenance=_env.provenance(),
            log=str(log_path),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _sigterm_interrupts():
    """In the main thread, SIGTERM raises KeyboardInterrupt while the node's launch runs, as Ctrl-C does: a
    scheduler stops a job with SIGTERM (Slurm then SIGKILLs after KillWait; submitit's own handler only logs
    it), and the launch stops its workers and hands back what they wrote meanwhile."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def launch_here(
    cell: Cell, ds_config: dict | None, launch: Launch, port: int, again: bool, stop: StopRequest | None
) -> Outcome:
    """Every node of the cell on this host, at 127.0.0.1 on `port`, each node's launch in a thread of its
    own (launch.gpus, if any, split in node order; each node's log beside the attempt's, node_log): the attempt's
    Outcome, classified. A node whose launch fails leaves the others PEER_GRACE_S to end by themselves before
    they are stopped. A stop (`stop`, or a Ctrl-C in this thread) stops every node and is raised again once they
    have ended."""
    stops = [StopRequest() for _ in range(cell.nodes)]
    ends: list[NodeEnd | BaseException | None] = [None] * cell.nodes
    gpus = launch.gpus

    def node(k: int) -> None:
        mine = None if gpus is None else tuple(gpus[k * cell.gpus : (k + 1) * cell.gpus])
        here = dataclasses.replace(launch, log_path=node_log(launch.log_path, k), gpus=mine)
        part = NodeLaunch(cell, ds_config, here, Rendezvous(port, "127.0.0.1", cell.nodes, k), again)
        try:
            ends[k] = run_node(part, stops[k])
        except BaseException as e:  # noqa: BLE001 - handed to the coordinating thread, which raises it
            ends[k] = e

    threads = [
        threading.Thread(target=node, args=(k,), name=f"zerobench-node-{k}", daemon=True) for k in range(cell.nodes)
    ]
    for t in threads:
        t.start()
    stopped = _coordinate(threads, ends, stops, stop)
    failed = next((e for e in ends if isinstance(e, BaseException)), None)
    if failed is not None:
        raise failed
    if stopped is not None:
        raise stopped
    return of_nodes(cell, [e for e in ends if isinstance(e, NodeEnd)])


def _coordinate(threads, ends, stops: list[StopRequest], stop: StopRequest | None) -> BaseException | None:
    """Wait for every node's launch. Once one has failed, the others get PEER_GRACE_S, then a stop as
    "peer"; a stop of the attempt stops them all as "interrupt". Returns that stop, if there was one."""
    failed_at: float | None = None
    stopped: BaseException | None = None
    while any(t.is_alive() for t in threads):
        try:
            time.sleep(0.2)
            if stop is not None and stop.is_set() and stopped is None:
                stopped = stop.exc
                for s in stops:
                    s.request(copy.copy(stop.exc))
            if failed_at is None and any(_failed(e) for e in ends):
                failed_at = time.time()
            if failed_at is not None and time.time() - failed_at > PEER_GRACE_S:
                for s in stops:
                    if not s.is_set():
                        s.request(KeyboardInterrupt("another node of the cell ended first"), why="peer")
        except KeyboardInterrupt as e:  # Ctrl-C in this (the main) thread: stop every node, then raise it
            stopped = e
            for s in stops:
                s.request(e)
    for t in threads:
        t.join()
    return stopped


def _failed(end) -> bool:
    return isinstance(end, BaseException) or (isinstance(end, NodeEnd) and end.failed)


# -- one node's part, where a cluster executor placed it -------------------------------------------------


class Board(Protocol):
    """Where the nodes of one multi-node attempt meet, wherever they run: node 0's rendezvous, and how each
    node's launch ended. Each executor has its own (a folder its nodes share, a Ray actor)."""

    unmet: str
    """What to check when node 0's rendezvous never comes (said in the error)."""

    def publish(self, addr: str, port: int) -> None: ...

    def rendezvous(self) -> tuple[str, int] | None:
        """Node 0's address and port, once published."""
        ...

    def mark(self, node: int, failed: bool) -> None: ...

    def peer_failed(self, node: int) -> bool:
        """Whether another node than `node` marked its launch failed."""
        ...


def take_part(
    board: Board, node: int, part: Callable[[], NodeLaunch], addr: Callable[[], str], stop: StopRequest
) -> NodeEnd | None:
    """One node's part of an attempt: its launch built (part(), its rendezvous's address and port left to the
    meeting; it may raise, e.g. for the GPUs it was given), the other nodes met on the board (node 0 publishes
    addr() and a port free here), then the launch run with its peers watched (run_watched), and how it ended
    marked for them. None: stopped, or a peer failed, before the launch began. Raises only zerobench's own
    failure (or a stop raised here), marked failed first so the peers do not wait for this node."""
    try:
        nl = part()
        met = meet(board, node, nl.cell.nodes, addr, nl.launch.env(), stop)
        if met is None:
            board.mark(node, failed=True)
            return None
        rdzv = dataclasses.replace(nl.rdzv, addr=met[0], port=met[1])
        end = run_watched(dataclasses.replace(nl, rdzv=rdzv), board, stop)
    except BaseException:
        with contextlib.suppress(Exception):
            board.mark(node, failed=True)
        raise
    board.mark(node, failed=end.failed)
    return end


def meet(
    board: Board, node: int, nodes: int, addr: Callable[[], str], env: dict[str, str], stop: StopRequest
) -> tuple[str, int] | None:
    """Where the cell's ranks meet: one node's at 127.0.0.1 on a port free here; several nodes' on node 0, which
    publishes its address and a port free on it while the others wait for it (MEET_S at most). None: stopped
    (or a peer failed) while waiting."""
    if nodes == 1:
        return "127.0.0.1", first_port(env)
    if node == 0:
        met = addr(), first_port(env)
        board.publish(*met)
        return met
    deadline = time.time() + MEET_S
    while (met := board.rendezvous()) is None:
        if stop.is_set() or board.peer_failed(node):
            return None
        if time.time() > deadline:
            raise RuntimeError(f"node 0 published no rendezvous within {MEET_S:g} s: {board.unmet}")
        time.sleep(0.2)
    return met


def run_watched(nl: NodeLaunch, board: Board, stop: StopRequest) -> NodeEnd:
    """run_node in a thread; here, its peers watched on the board: once another node's launch has failed, this
    one gets PEER_GRACE_S to end by itself (its next collective fails), then a stop as "peer". A Ctrl-C here (a
    scheduler's cancel: Ray raises KeyboardInterrupt in a cancelled task's main thread) stops the launch as
    "interrupt", and its NodeEnd says so."""
    box: dict[str, Any] = {}

    def go():
        try:
            box["end"] = run_node(nl, stop)
        except BaseException as e:  # noqa: BLE001 - raised again in this thread
            box["error"] = e

    threading.Thread(target=go, name="zerobench-node", daemon=True).start()
    failed_at, look_at = None, 0.0
    # Until the launch has ended, whatever the end. Not Thread.join: a KeyboardInterrupt raised inside it (Ray's
    # cancel) can leave the thread marked stopped while it still runs (seen with Python 3.11 in a Ray task).
    while not box:
        try:
            time.sleep(0.2)
            if nl.cell.nodes > 1 and failed_at is None and time.time() >= look_at:
                look_at = time.time() + WATCH_S
                failed_at = time.time() if board.peer_failed(nl.rdzv.node) else None
            if failed_at is not None and time.time() - failed_at > PEER_GRACE_S and not stop.is_set():
                stop.request(KeyboardInterrupt("another node of the cell ended first"), why="peer")
        except KeyboardInterrupt as e:
            if not stop.is_set():
                stop.request(e)
    if "error" in box:
        raise box["error"]
    return box["end"]
