"""The child-process protocol, written once, whichever executor places the cell.

The parent picks the spec, events and result paths, starts the worker in its own process group
(forked from the pre-imported fork server for one GPU, a fresh interpreter otherwise, torchrun for
several GPUs) with a free rendezvous port, samples its telemetry, enforces the wall-clock timeout and a
no-progress watchdog, and classifies the end from the exit code, the result documents and the log
tail. Whatever happens to the cell, an Outcome comes back.

protocol: one attempt (run_cell); outcome: the classifier; procs: process trees and held signals;
forkserver: the pre-imported parent; ports: rendezvous ports and the child's environment; folders:
attempt folders and their sweep.
"""

from .folders import sweep_attempt_folders
from .forkserver import ForkServer, forkserver_ready, start_forkserver, stop_forkserver
from .outcome import Outcome
from .ports import child_env, first_port, free_port
from .procs import holding_signals, run_tool, run_tools
from .protocol import StopRequest, run_cell

__all__ = [
    "ForkServer",
    "Outcome",
    "StopRequest",
    "child_env",
    "first_port",
    "forkserver_ready",
    "free_port",
    "holding_signals",
    "run_cell",
    "run_tool",
    "run_tools",
    "start_forkserver",
    "stop_forkserver",
    "sweep_attempt_folders",
]
