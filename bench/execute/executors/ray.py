"""Cells on a Ray cluster: one Ray task per attempt and node, on nodes that hold the attempt's GPUs.

session -> ray (which nodes, through a placement group; one task per node of the attempt) -> launch (on each)

Each attempt first holds its resources in a placement group of one bundle per node of the cell (STRICT_SPREAD:
each bundle on a node of its own), then runs in Ray tasks inside that group. A cell of one node runs its Job in
one task: the same launcher as on one host (the worker in its own process group, the watchdog, an explicit
CUDA_VISIBLE_DEVICES from the GPUs Ray gave the task, a free rendezvous port on the node), run at the
raylet's CPU priority; each Ray worker process keeps a fork server for the cells after its first
(FORKSERVERS). A cell of several nodes runs one task per node, bundle k on node k, each its node's part
(launch.take_part): the nodes meet on a small actor of the attempt (_Meeting: node 0 publishes its address as
Ray knows it and a port free there, the others wait for it; a node whose launch failed marks it there, and its
peers are stopped as "peer" PEER_GRACE_S later), and the attempt's Outcome is classified from every node's end
(launch.of_nodes). An actor, not a file: a Ray cluster need not share storage between its nodes (the logs
folder is only checked), and the actor reaches every node over Ray's own connections. The Outcome comes back
with the node(s) it ran on and their provenance; the orchestrator writes every record. A task is never retried
(max_retries=0): a crashed or killed cell is recorded once, as what happened to it. On a cluster without GPUs,
CPU cells are placed on a custom resource (SLOT) each node declares.

Attempts are placed first come first served as on one host (bench.execute.executors.executor.dispatch): the first
that cannot be placed waits in its placement group, and none behind it is drawn meanwhile.

Signals: Ray turns an exception that a signal handler raises inside its calls into a plain KeyboardInterrupt,
so the orchestrator calls Ray with SIGINT and SIGTERM held (launch.holding_signals, briefly: every wait is
short): the run's own handler then raises its stop (bench.execute.signals.Stopped) in Python, and every
record says which signal stopped it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import pickle
import signal
import socket
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from ...host import env
from ...matrix.problems import InputError
from ...records.status import Status
from .. import launch
from .executor import Attempt, Finished, Halted, Handle, Job, Neighbours, stop_for

__all__ = ["RayExecutor", "SLOT", "FORKSERVERS"]

SLOT = "zerobench_slot"
"""The custom resource a node of a cluster without GPUs declares: how many CPU cells it runs at once."""
FORKSERVERS = (
    "one per Ray worker process (Ray reuses one for task after task), started by the first single-rank cell it "
    "runs, which starts a fresh interpreter meanwhile; the cells after it there fork from it"
)
_WARMING = "Ray executor: this Ray worker's fork server is importing (the cells after this one here fork from it)"
PROBE_S = 120.0  # how long a node may take to answer the start-up check (a worker process to start)
CANCEL_S = 60.0  # how long cancelled tasks get to stop their workers (each kills its tree within ~10 s)
# What the orchestrator's environment hands each task, over the node's own: the run's settings (checked
# before the run) and the thread count a cell gets (Ray sets OMP_NUM_THREADS=1 in its workers).
_FORWARDED = ("OMP_NUM_THREADS",)


@dataclass
class _Held:
    """An attempt's placement group: asked for (ready is its readiness), then held (node_ids, one per node of the
    cell) and running (one task per node, refs in node order; a cell of several nodes meets on board)."""

    pg: PlacementGroup
    width: int
    """GPUs (or slots) on each node."""
    nodes: int = 1
    ready: Any = None
    node_ids: list[str] = dataclasses.field(default_factory=list)
    refs: list = dataclasses.field(default_factory=list)
    t0: float = 0.0
    tokens: list[int] = dataclasses.field(default_factory=list)
    board: Any = None

    @property
    def node_id(self) -> str | None:
        """The first node's (rank 0's)."""
        return self.node_ids[0] if self.node_ids else None


@dataclass
class _NodeEnd:
    """What a task hands back: the Outcome (a node's part of a multi-node attempt: its launch.NodeEnd, None where
    it stopped before its launch began), or the exception its job raised (with the traceback text), and the node
    it ran on."""

    node: dict
    value: launch.Outcome | launch.NodeEnd | None = None
    error: BaseException | None = None
    traceback: str = ""


@dataclass
class _Node:
    host: str
    capacity: int
    provenance: dict | None = None


# -- on the node ---------------------------------------------------------------------------------------


def _here() -> dict:
    """This node: its host name, Ray's node id and its provenance (taken here, by this process)."""
    return {
        "host": socket.gethostname(),
        "node_id": ray.get_runtime_context().get_node_id(),
        "provenance": env.provenance(),
    }


def _gpus(gpu: bool, width: int) -> list[int] | None:
    """The GPUs Ray gave this task, as indexes (None for a CPU cell)."""
    if not gpu:
        return None
    ids = ray.get_gpu_ids()
    try:
        gpus = sorted(int(i) for i in ids)
    except (TypeError, ValueError):
        raise RuntimeError(
            f"Ray gave this task the GPUs {ids}, not indexes: start the node's raylet with CUDA_VISIBLE_DEVICES "
            "unset or as indexes"
        ) from None
    if len(gpus) != width:
        raise RuntimeError(f"Ray gave this task {len(gpus)} GPUs ({ids}); the cell holds {width}")
    return gpus


def _renice() -> str | None:
    """Ray starts its worker processes at a lower CPU priority than its raylet (niceness 15 under Ray 2.60),
    which a cell's worker would inherit: any other busy process on the node would take the CPU from it. Back
    to the raylet's priority; where that is not allowed, the warning the record carries."""
    try:
        want = psutil.Process(int(os.environ["RAY_RAYLET_PID"])).nice()
    except (KeyError, ValueError, psutil.Error):
        return None
    have = os.getpriority(os.PRIO_PROCESS, 0)
    if have <= want:
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, want)  # this thread's, which the worker it starts inherits
    except OSError as e:
        return f"the cell ran at CPU niceness {have}, Ray's for its workers (its raylet's is {want}): {e.strerror}"
    return None


def _settle(job: Job, cwd: str) -> str | None:
    """This task's process made ready for a cell: the orchestrator's working directory, the cell's threads, the
    raylet's CPU priority (_renice's warning, if it could not)."""
    if Path(cwd).is_dir():
        os.chdir(cwd)  # relative paths of the run (a local model's folder) mean what they mean to the orchestrator
    if "OMP_NUM_THREADS" not in (job.launch.extra_env or {}):
        os.environ.pop("OMP_NUM_THREADS", None)  # Ray's 1 thread per worker is not the cell's setting
    return _renice()


def _failure(node: dict, e: Exception) -> _NodeEnd:
    """zerobench's own failure around the cell, handed back as data (an exception that does not pickle: its words)."""
    try:
        pickle.dumps(e)
    except Exception:  # noqa: BLE001 - an exception that does not travel: its words do
        e = RuntimeError(f"{type(e).__name__}: {e}")
    return _NodeEnd(node, error=e, traceback=traceback.format_exc()[-6000:])


def _run_job(job: Job, gpu: bool, width: int, cwd: str) -> _NodeEnd:
    """A Ray task: run the attempt's job on this node. A cancel (ray.cancel: KeyboardInterrupt here) stops
    the worker tree as Ctrl-C does and is raised again, so Ray records the task cancelled."""
    node = _here()
    niceness = _settle(job, cwd)
    try:
        gpus = _gpus(gpu, width)
        node["gpus"] = gpus
        if job.cell.gpus == 1 and job.launch.module == "bench.worker":
            if not launch.warm_forkserver(job.launch.extra_env, job.launch.log_path.parent, gpus):
                job = job.with_launch(spawn_why=_WARMING)
        out = job(gpus)
        out.warnings += [niceness] if niceness else []
        return _NodeEnd(node, value=out)
    except Exception as e:  # noqa: BLE001 - zerobench's own failure around the cell: handed back as data
        return _failure(node, e)


class _Meeting:
    """The board a multi-node attempt's nodes meet on (launch.Board's facts), as a Ray actor of the attempt: node
    0's rendezvous, and how each node's launch ended (the orchestrator marks a node whose Ray worker died)."""

    def __init__(self):
        self.met: tuple[str, int] | None = None
        self.ended: dict[int, bool] = {}

    def publish(self, addr: str, port: int) -> None:
        self.met = (addr, port)

    def rendezvous(self) -> tuple[str, int] | None:
        return self.met

    def mark(self, node: int, failed: bool) -> None:
        self.ended[node] = self.ended.get(node, False) or failed

    def peer_failed(self, node: int) -> bool:
        return any(failed for k, failed in self.ended.items() if k != node)


class _Board:
    """launch.Board over the attempt's _Meeting, as a node's task reaches it. A question it cannot answer (the
    actor gone) reads as nothing new: the launch then ends by itself (its collectives, the watchdog)."""

    unmet = "node 0's task did not start or could not reach the attempt's meeting actor"
    ASK_S = 30.0

    def __init__(self, actor):
        self.actor = actor

    def _ask(self, method: str, *args, default=None):
        try:
            return ray.get(getattr(self.actor, method).remote(*args), timeout=self.ASK_S)
        except ray.exceptions.RayError:
            return default

    def publish(self, addr: str, port: int) -> None:
        # Its peers wait for it, so it must land: as long as they wait (the actor's process may still be starting).
        ray.get(self.actor.publish.remote(addr, port), timeout=launch.MEET_S)

    def rendezvous(self) -> tuple[str, int] | None:
        met = self._ask("rendezvous")
        return (met[0], int(met[1])) if met else None

    def mark(self, node: int, failed: bool) -> None:
        self._ask("mark", node, failed)

    def peer_failed(self, node: int) -> bool:
        return bool(self._ask("peer_failed", node, default=False))


def _run_part(job: Job, node: int, actor, gpu: bool, width: int, cwd: str) -> _NodeEnd:
    """A Ray task: node `node`'s part of a multi-node attempt (launch.take_part, meeting the other nodes on the
    attempt's _Meeting; its rendezvous is this node's address as Ray knows it). A cancel (KeyboardInterrupt here)
    stops the node's launch and is raised again, as in _run_job."""
    here = _here()
    niceness = _settle(job, cwd)
    stop = launch.StopRequest()
    try:
        end = launch.take_part(
            _Board(actor), node, lambda: _node_launch(job, node, _gpus(gpu, width)), ray.util.get_node_ip_address, stop
        )
        here["gpus"] = _gpus(gpu, width)
    except Exception as e:  # noqa: BLE001 - zerobench's own failure around the node's launch: handed back as data
        return _failure(here, e)
    if stop.is_set() and stop.why == "interrupt":
        raise stop.exc  # the cancel, once the node's launch has stopped: Ray records the task cancelled
    if end is not None and niceness:
        end.outcome.warnings.append(niceness)
    return _NodeEnd(here, value=end)


def _node_launch(job: Job, node: int, gpus: list[int] | None) -> launch.NodeLaunch:
    """A node's launch of a multi-node attempt, its rendezvous's address and port left to launch.take_part."""
    here = dataclasses.replace(job.launch, log_path=launch.node_log(job.launch.log_path, node), gpus=gpus)
    return launch.NodeLaunch(job.cell, job.ds_config, here, launch.Rendezvous(0, "", job.cell.nodes, node))


def _probe_node(logs: str) -> dict:
    """A Ray task on one node before the run: who it is, and whether it can write the logs folder (a mark
    file the orchestrator then looks for: found, the folder is shared)."""
    node = _here()
    try:
        Path(logs).mkdir(parents=True, exist_ok=True)
        mark = Path(logs) / f".zerobench-node-{node['node_id']}"
        mark.write_text(node["host"])
        node["mark"] = str(mark)
    except OSError as e:
        node["logs_error"] = f"{e.strerror} ({e.filename or logs})"
    return node


_run_task = ray.remote(_run_job)
_part_task = ray.remote(_run_part)
_meeting = ray.remote(_Meeting)
_probe_task = ray.remote(_probe_node)


# -- on the orchestrator -------------------------------------------------------------------------------


def connect(address: str | None, cpu_slots: int | None) -> bool:
    """Connect this process to a Ray cluster: `address` (host:port; "auto": one started on this host with
    `ray start`; ray://...), else RAY_ADDRESS, else a new local Ray instance for this run (on a CPU host, with
    cpu_slots SLOTs). True when this call connected (close() disconnects)."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    if ":" in address and not address.startswith("ray://"):
        _reachable(address)
    kw: dict = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address == "local":
        kw.update(include_dashboard=False, resources={SLOT: cpu_slots} if cpu_slots else None)
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        with launch.holding_signals():
            ray.init(address=address, **kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise InputError(f"--executor ray: cannot connect to the Ray cluster at {address}: {e}") from None
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)  # ray.init sets its own SIGTERM handler (sys.exit): the run's stop is SIGTERM's
    return True


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """A clear error at once where nothing answers (ray.init would retry for minutes)."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        raise InputError(
            f"--address {address}: no Ray cluster answers there ({why}); start one with `ray start --head` "
            "on that host, or give the head's address (host:6379)"
        ) from None


def _resource(cuda: bool) -> str:
    """What a cell's GPUs are on this cluster: Ray's GPU resource, or on a cluster without GPUs the SLOTs
    its nodes declare. The host that plans the run must be like the nodes (its rules judge the cells)."""
    total = ray.cluster_resources()
    if cuda and not total.get("GPU"):
        raise InputError(
            "--executor ray: this host has GPUs but the Ray cluster declares none; start its nodes with their GPUs"
        )
    if total.get("GPU") and not cuda:
        raise InputError(
            "--executor ray: the Ray cluster has GPUs but this host, which plans the run, has none (the rules judge "
            "every cell against it): run zerobench on a host with the nodes' GPUs and software"
        )
    if not cuda and not total.get(SLOT):
        raise InputError(
            f"--executor ray: the Ray cluster declares no GPUs and no {SLOT} resource: start each node that "
            f"runs CPU cells with `ray start ... --resources '{{\"{SLOT}\": N}}'` (N cells at once)"
        )
    return "GPU" if cuda else SLOT


def _nodes(resource: str) -> dict[str, _Node]:
    """The alive nodes that can run cells (with at least one of `resource`), by node id."""
    nodes = {
        n["NodeID"]: _Node(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "?", int(cap))
        for n in ray.nodes()
        if n.get("Alive") and (cap := n.get("Resources", {}).get(resource, 0)) >= 1
    }
    if not nodes:
        raise InputError(f"--executor ray: no node of the Ray cluster has a whole {resource} to run a cell on")
    return nodes


def _check_nodes(nodes: dict[str, _Node], logs: Path, printer) -> None:
    """Before any cell: every node runs zerobench and can write the logs folder (an error saying which cannot);
    a warning where the folder is not shared with this host, or a node runs other zerobench source."""
    on = {nid: NodeAffinitySchedulingStrategy(nid, soft=False) for nid in nodes}
    refs = {nid: _probe_task.options(num_cpus=0, scheduling_strategy=on[nid]).remote(str(logs)) for nid in nodes}
    here, not_shared, other_source = env.provenance(), [], []
    for nid, ref in refs.items():
        name = f"{nodes[nid].host} ({nid[:8]})"
        try:
            info = ray.get(ref, timeout=PROBE_S)
        except ray.exceptions.GetTimeoutError:
            raise InputError(f"--executor ray: node {name} did not answer within {PROBE_S:g} s") from None
        except ray.exceptions.RayError as e:
            why = str(getattr(e, "cause", None) or e).strip().splitlines()[-1][:300]
            raise InputError(
                f"--executor ray: node {name} cannot run zerobench ({why}): install the same zerobench, with "
                "its extras, on every node"
            ) from None
        if info.get("logs_error"):
            raise InputError(
                f"--executor ray: node {name} cannot write the logs folder {logs}: {info['logs_error']}; put "
                "--logs on storage every node can write"
            )
        nodes[nid].provenance = info["provenance"]
        mark = Path(info["mark"])
        if mark.exists():
            mark.unlink()
        else:
            not_shared.append(name)
        if info["provenance"].get("source_sha256") != here.get("source_sha256"):
            other_source.append(name)
    if not_shared:
        printer(
            f"warning: the logs folder {logs} is not shared with node(s) {', '.join(not_shared)}: the logs of "
            "their cells stay on them (each record carries its log's tail)"
        )
    if other_source:
        printer(
            f"warning: node(s) {', '.join(other_source)} run other zerobench source than this host: each record "
            "carries the provenance of the node that ran it"
        )


def _group(resource: str, per_node: int, nodes: int) -> PlacementGroup:
    """An attempt's placement group: a bundle of `per_node` GPUs (or slots) on each of `nodes` nodes, each bundle
    whole on one node (STRICT_SPREAD puts each on a node of its own; one bundle is one node's)."""
    return placement_group([{resource: per_node}] * nodes, strategy="STRICT_PACK" if nodes == 1 else "STRICT_SPREAD")


def _per_node(nodes: dict[str, _Node], resource: str, name: str, gpus: int, count: int) -> int:
    """What an attempt of `count` nodes of `gpus` GPUs (CPU ranks) each holds on each of its nodes; InputError
    where too few nodes of the cluster can hold it (its placement group would wait for them forever)."""
    caps = sorted((n.capacity for n in nodes.values()), reverse=True)
    if count > len(caps):
        what = "GPUs" if resource == "GPU" else f"a {resource}"
        raise InputError(
            f"{name} spans {count} nodes; the Ray cluster has {len(caps)} node(s) with {what} (each node of a cell "
            "is a Ray node of its own): leave it out (--filter), or add nodes to the cluster"
        )
    if resource == SLOT:
        return min(gpus, caps[count - 1])  # CPU ranks are not devices: a node's slots bound only how many cells
    if gpus > caps[count - 1]:
        where = "one node" if count == 1 else f"each of {count} nodes"
        have = sum(c >= gpus for c in caps)
        raise InputError(
            f"{name} needs {gpus} GPUs on {where}; {have} node(s) of the Ray cluster have that many (the largest "
            f"has {caps[0]}): leave it out (--filter), or add nodes that have them"
        )
    return gpus


def _refuse(nodes: dict[str, _Node], resource: str, cells) -> None:
    """Before any cell: the cells the cluster cannot place, together (InputError), each with what to do."""
    problems = []
    for cell in cells:
        try:
            _per_node(nodes, resource, cell.name, cell.gpus, cell.nodes)
        except InputError as e:
            problems.append(str(e))
    if problems:
        more = f"\n(and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise InputError("--executor ray: " + "\n".join(problems[:5]) + more)


def _forwarded() -> dict[str, str]:
    """The orchestrator's settings each task gets over its node's environment."""
    return {
        k: v
        for k, v in os.environ.items()
        if (k.startswith("ZEROBENCH_") and k != "ZEROBENCH_PARENT_PID") or k in _FORWARDED
    }


class RayExecutor:
    """Attempts as Ray tasks on a cluster (the module's rules). slots: how many 1-GPU (or 1-slot) cells the
    cluster's nodes hold at once. cells: those the run may start; the executor refuses at once (InputError) those
    the cluster cannot place."""

    forkservers = FORKSERVERS

    def __init__(
        self, slots, cuda: bool = True, *, address: str | None = None, logs: Path | None = None, printer=print,
        cells=(),
    ):  # fmt: skip
        self._owns = connect(address, None if cuda else len(slots.ids))
        try:
            with launch.holding_signals():  # the module's rule on signals
                self.resource = _resource(cuda)
                self.nodes = _nodes(self.resource)
                _refuse(self.nodes, self.resource, cells)
                if logs is not None:
                    _check_nodes(self.nodes, Path(logs).absolute(), printer)
        except BaseException:
            self.close()
            raise
        self.slots = sum(n.capacity for n in self.nodes.values())
        self._pending: dict[int, _Held] = {}  # id(attempt) -> its placement group, asked for
        self._running: dict[Any, Handle] = {}  # task ref -> the handle it runs, until that task ends
        self._live: dict[int, Handle] = {}  # id(handle) -> handle: the attempts in flight
        self._held = 0  # GPUs (slots) held by placed attempts
        self._neighbours: dict[str | None, Neighbours] = defaultdict(Neighbours)  # per node
        self._cwd = os.getcwd()
        printer(
            f"ray: {len(self.nodes)} node(s), {self.slots} {'GPUs' if cuda else SLOT + 's'}: "
            + ", ".join(f"{n.host} ({nid[:8]}) {n.capacity}" for nid, n in self.nodes.items())
        )

    def room(self) -> bool:
        return not self._pending and self._held < self.slots

    def running(self) -> int:
        return len(self._live)

    def place(self, attempt: Attempt) -> Handle | None:
        """Its placement group, once Ray has reserved it (None until then: asked for on the first call, looked at
        on the next)."""
        held = self._pending.get(id(attempt))
        if held is None:
            shape = attempt.shape
            width = _per_node(self.nodes, self.resource, attempt.cell.name, shape.gpus_per_node, shape.nodes)
            if self._held + width * shape.nodes > self.slots:
                return None
            with launch.holding_signals():
                pg = _group(self.resource, width, shape.nodes)
                held = self._pending[id(attempt)] = _Held(pg, width, shape.nodes, ready=pg.ready())
        with launch.holding_signals():
            if not ray.wait([held.ready], timeout=0)[0]:
                return None
            bundles = placement_group_table(held.pg)["bundles_to_node_id"]
            held.node_ids = [bundles[k] for k in range(held.nodes)]
        del self._pending[id(attempt)]
        self._held += held.width * held.nodes
        node = self.nodes.get(held.node_id)
        return Handle(attempt, held, {"node": node.host if node else None, "node_id": held.node_id})

    def release(self, handle: Handle) -> None:
        held = handle.placement
        self._held -= held.width * held.nodes
        with launch.holding_signals():
            remove_placement_group(held.pg)
            if held.board is not None:
                ray.kill(held.board)

    def start(self, handle: Handle) -> None:
        """The attempt's task (a cell of several nodes: a task per node, bundle k on node k, and its meeting)."""
        held, job = handle.placement, handle.attempt.job
        job = job.with_launch(
            log_path=job.launch.log_path.absolute(), extra_env={**_forwarded(), **(job.launch.extra_env or {})}
        )
        gpu = self.resource == "GPU"
        holds = {"num_gpus": held.width} if gpu else {"resources": {self.resource: held.width}}
        with launch.holding_signals():
            if held.nodes > 1:
                held.board = _meeting.options(num_cpus=0, max_restarts=0).remote()
            for k in range(held.nodes):
                on = PlacementGroupSchedulingStrategy(held.pg, placement_group_bundle_index=k)
                # max_retries=0: a crashed cell is an outcome, recorded once
                opts = {"num_cpus": 0, "max_retries": 0, "scheduling_strategy": on, **holds}
                if held.nodes == 1:
                    ref = _run_task.options(**opts).remote(job, gpu, held.width, self._cwd)
                else:
                    ref = _part_task.options(**opts).remote(job, k, held.board, gpu, held.width, self._cwd)
                held.refs.append(ref)
        held.t0 = time.time()
        held.tokens = [self._neighbours[nid].enter(job.cell.hash, held.t0) for nid in held.node_ids]
        self._running.update((ref, handle) for ref in held.refs)
        self._live[id(handle)] = handle

    def collect(self, timeout_s: float) -> list[Finished]:
        """The next attempt to end, within timeout_s (one at a time: the next placement sees its outcome). A node
        of a multi-node attempt whose task ended before the others is marked on its board where it failed."""
        deadline = time.time() + timeout_s
        while self._running:
            with launch.holding_signals():
                ready, _ = ray.wait(list(self._running), num_returns=1, timeout=max(0.0, deadline - time.time()))
                if not ready:
                    return []
                handle = self._running.pop(ready[0])
                if not any(ref in self._running for ref in handle.placement.refs):
                    return [self._end(handle)]
                _node_ended(handle.placement, ready[0])
        time.sleep(max(0.0, deadline - time.time()))
        return []

    def _end(self, handle: Handle, stop: KeyboardInterrupt | None = None) -> Finished:
        """The attempt whose tasks ended: its Outcome with its node(s) and neighbours, or what ended it (stop: the
        cancel under way, for a task Ray cancelled)."""
        held = handle.placement
        for ref in held.refs:
            self._running.pop(ref, None)
        self._live.pop(id(handle), None)
        t1 = time.time()
        for nid, token in zip(held.node_ids, held.tokens):
            self._neighbours[nid].leave(token, t1)
        ends: list[_NodeEnd | ray.exceptions.RayError] = []
        for ref in held.refs:
            try:
                ends.append(ray.get(ref))
            except ray.exceptions.RayError as e:
                ends.append(e)
        f = self._finished(handle, ends, t1 - held.t0, stop)
        if f.value is not None and f.value.window:
            f.value.beside = self._beside(held, *f.value.window)
        self.release(handle)
        return f

    def _beside(self, held: _Held, a: float, b: float) -> list[str]:
        """The cells that ran on any of the attempt's nodes at some time in [a, b)."""
        return sorted({c for nid, t in zip(held.node_ids, held.tokens) for c in self._neighbours[nid].during(t, a, b)})

    def _finished(self, handle: Handle, ends: list, wall_s: float, stop) -> Finished:
        """An attempt's end from its tasks' (in node order): what Ray raised for one, zerobench's own failure in
        one, else the Outcome (a cell of several nodes: classified from every node's launch, launch.of_nodes)."""
        held = handle.placement
        failed = [(k, e) for k, e in enumerate(ends) if isinstance(e, ray.exceptions.RayError)]
        if failed:
            k, e = failed[0]
            return _ray_failure(handle, e, wall_s, self.nodes.get(held.node_id), stop, k)
        if (bad := next((e for e in ends if e.error is not None), None)) is not None:
            return Finished(handle, error=bad.error, traceback=bad.traceback)
        if held.nodes == 1:
            ends[0].value.node = ends[0].node
            return Finished(handle, value=ends[0].value)
        out = _of_nodes(handle.attempt.cell, ends)
        first = ends[0].node
        out.node = {k: first.get(k) for k in ("host", "node_id", "gpus", "provenance")}
        return Finished(handle, value=out)

    def cancel(self, why: BaseException) -> list[Finished]:
        """Stop every task (ray.cancel: each stops its worker tree as Ctrl-C does) and wait for them; a task
        still running after CANCEL_S is ended by force (its Ray worker killed; the cell's worker, which
        watches its parent, stops itself). Each ends as `why` says (bench.execute.executors.executor.stop_for), or
        with its Outcome where it finished whole meanwhile."""
        exc = stop_for(why)
        with launch.holding_signals():  # a second Ctrl-C waits for this cleanup (bench.execute.signals)
            for held in self._pending.values():
                remove_placement_group(held.pg)
            self._pending.clear()
            refs = list(self._running)
            for ref in refs:
                ray.cancel(ref, recursive=False)  # not its calls to its meeting: the node still marks its end
            ended, _ = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_S) if refs else ([], [])
            for ref in refs:
                if ref not in ended:
                    ray.cancel(ref, force=True)
            return [self._end(handle, copy.copy(exc)) for handle in list(self._live.values())]

    def close(self) -> None:
        """Give back the placement groups asked for, and disconnect where this executor connected."""
        with launch.holding_signals():
            for held in getattr(self, "_pending", {}).values():
                remove_placement_group(held.pg)
            if self._owns:
                ray.shutdown()


def _node_ended(held: _Held, ref) -> None:
    """A node's task that ended before the other nodes': where Ray raised for it (its Ray worker died, it was
    cancelled), it could not mark its end itself, so its peers learn it here (they are then stopped as "peer")."""
    try:
        ray.get(ref, timeout=0)
    except ray.exceptions.RayError:
        held.board.mark.remote(held.refs.index(ref), True)


def _of_nodes(cell, ends: list[_NodeEnd]) -> launch.Outcome:
    """A multi-node attempt's Outcome from its nodes' ends, each node named with its Ray node id; an error where a
    node began no launch (stopped as its peer failed before the rendezvous)."""
    missing = [k for k, e in enumerate(ends) if e.value is None]
    if missing:
        return launch.Outcome(
            Status.ERROR,
            f"node(s) {', '.join(map(str, missing))} of the cell began no launch: another node failed before they met",
        )
    out = launch.of_nodes(cell, [e.value for e in ends])
    for run, e in zip(out.nodes, ends):
        run["node_id"] = e.node["node_id"]
    return out


_WORKER_DIED = (ray.exceptions.OutOfMemoryError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)


def _ray_failure(handle: Handle, e: BaseException, wall_s: float, node: _Node | None, stop, part: int = 0) -> Finished:
    """A task that did not hand back an end of its own (part: the node of the cell it ran): cancelled (by the run's
    stop, or through Ray by someone else), or its Ray worker died (killed, or by Ray's memory monitor): a killed
    Outcome, with Ray's words."""
    if isinstance(e, ray.exceptions.TaskCancelledError) or stop is not None:
        return Finished(handle, error=stop or Halted("cancelled through Ray (ray.cancel), not by zerobench"))
    if isinstance(e, _WORKER_DIED):
        return Finished(handle, value=_killed(handle, e, wall_s, node, part))
    cause = getattr(e, "cause", None)
    return Finished(handle, error=cause if isinstance(cause, BaseException) else e, traceback=str(e)[-6000:])


def _killed(handle: Handle, e: BaseException, wall_s: float, node: _Node | None, part: int = 0) -> launch.Outcome:
    """The Outcome of a cell whose Ray worker died under it (part: which node's, of a cell of several): killed
    (never retried), with Ray's message. Ray's memory monitor is no measured out-of-memory of this cell: it kills
    by policy when the node runs low, not the cell that used the most, so a host_oom (which implies heavier
    cells) would not be honest. node: the cell's first node, which the record's placement names."""
    ray_says = " ".join(str(e).split())[:800]
    held = handle.placement
    what, it = ("the cell", "the cell") if held.nodes == 1 else (f"node {part} of the cell", "its launch")
    if isinstance(e, ray.exceptions.OutOfMemoryError):
        why = (
            f"Ray's memory monitor killed the Ray worker that ran {what}, and {it} with it: the node ran low on memory"
        )
    else:
        why = f"the Ray worker that ran {what} died ({type(e).__name__}); Ray did not retry it (max_retries=0)"
    log = launch.node_log(handle.attempt.job.launch.log_path, part)
    placed = {"host": node.host, "provenance": node.provenance} if node else {}
    return launch.Outcome(
        status=Status.KILLED,
        reason=f"{why}. Ray: {ray_says}",
        wall_s=wall_s,
        log_tail=launch.log_tail(log) if log.is_file() else "",
        node={**placed, "node_id": held.node_id},
    )
