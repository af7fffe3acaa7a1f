"""The child-process protocol, written once, whichever executor places the cell.

The parent picks the spec, events and result paths, starts the worker in its own process group
(forked from the pre-imported fork server for one GPU, a fresh interpreter otherwise, torchrun for
several GPUs) with a free rendezvous port, samples its telemetry, enforces the wall-clock timeout and a
no-progress watchdog, and classifies the end from the exit code, the result documents and the log
tail. Whatever happens to the cell, an Outcome comes back.

Layered as the work flows, each module importing only those below it: cell: one attempt (run_cell, given the
cell, its DeepSpeed config and its Launch, how it is launched); nodes: one node's part of a multi-node attempt
(run_node; take_part where a cluster executor placed it, meeting the other nodes on its Board), and every node
on this host (run_cell does that for a cell of several nodes); protocol: one launch on one node (run_launch);
outcome: the classifier (of_nodes for a cell of several nodes); procs: process trees and held signals;
forkserver: the pre-imported parent; ports: rendezvous ports and the child's environment; folders: attempt
folders and their sweep.
"""

from .cell import run_cell
from .folders import sweep_attempt_folders
from .forkserver import ForkServer, forkserver_ready, start_forkserver, stop_forkserver, warm_forkserver
from .nodes import MEET_S, PEER_GRACE_S, Board, NodeLaunch, node_log, run_node, take_part
from .outcome import NodeEnd, Outcome, ended_where, of_nodes
from .ports import child_env, first_port, free_port
from .procs import holding_signals, run_tool, run_tools
from .protocol import Launch, Rendezvous, StopRequest, log_tail

__all__ = [
    "Board",
    "ForkServer",
    "Launch",
    "NodeEnd",
    "NodeLaunch",
    "Outcome",
    "Rendezvous",
    "StopRequest",
    "MEET_S",
    "PEER_GRACE_S",
    "child_env",
    "ended_where",
    "first_port",
    "forkserver_ready",
    "free_port",
    "holding_signals",
    "log_tail",
    "node_log",
    "of_nodes",
    "run_cell",
    "run_node",
    "run_tool",
    "run_tools",
    "start_forkserver",
    "stop_forkserver",
    "sweep_attempt_folders",
    "take_part",
    "warm_forkserver",
]
