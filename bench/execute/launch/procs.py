"""The process tree of a worker or helper: its own group, stopped with every descendant; signals held
while a process starts or a record is written; one-off helper programs run under the same rules."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from ...host import heartbeat
from ...host.safefile import safe_open_new


def _signal_group(pid: int, sig: int) -> bool:
    """Signal the worker's process group; False if nothing is left to signal."""
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        try:  # a forked worker that has not reached setsid() yet has no group of its own
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False


def _tree(pid: int) -> dict[int, psutil.Process]:
    try:
        root = psutil.Process(pid)
        return {p.pid: p for p in (root, *root.children(recursive=True))}
    except psutil.Error:
        return {}


def _signal_all(procs: dict[int, psutil.Process], sig: int) -> None:
    for p in procs.values():
        try:
            p.send_signal(sig)  # psutil refuses a pid that now belongs to another process
        except psutil.Error:
            pass


def _kill_tree(proc, grace_s: float = 10.0) -> None:
    """Stop a worker or helper with everything it started: its process group, and the descendants
    that live in groups of their own (ninja starts each compiler in one). Descendants are collected
    before and while it stops: a killed parent's children are adopted by init and no longer its."""
    tree = _tree(proc.pid)
    _signal_group(proc.pid, signal.SIGTERM)
    _signal_all(tree, signal.SIGTERM)
    deadline = time.time() + grace_s
    while proc.poll() is None and time.time() < deadline:
        tree |= _tree(proc.pid)
        time.sleep(0.1)
    tree |= _tree(proc.pid)
    _signal_group(proc.pid, signal.SIGKILL)  # stragglers in the group, too
    _signal_all(tree, signal.SIGKILL)
    proc.wait()


# -- the fork server: a pre-imported parent for single-rank workers (bench/worker/forkserver.py) --
# Environment variables the worker reads only at run time: a request may differ from the server's
# environment in these and still be served; any other difference means a fresh interpreter.


@contextlib.contextmanager
def holding_signals():
    """Hold SIGINT and SIGTERM until the block ends, then deliver them: a process half-started or a
    record half-written would otherwise be lost to a Ctrl-C that lands inside it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in old:
        signal.signal(sig, lambda n, _f: held.append(n))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for n in dict.fromkeys(held):
            signal.raise_signal(n)


def run_tool(args: list[str], *, log_path: Path, env: dict[str, str], timeout_s: float) -> int:
    """Run a one-off helper program (e.g. the op prebuild) under the same rules as a worker: its own
    process group, stopped with its children on timeout or Ctrl-C, and stopping itself with them if
    this process dies (ZEROBENCH_PARENT_PID). Returns its exit code."""
    return run_tools([(args, log_path, env, timeout_s)])[0][0]


def run_tools(
    tools: list[tuple[list[str], Path, dict[str, str], float]], on_progress=None, every_s: float = heartbeat.EVERY_S
) -> list[tuple[int, float]]:
    """Run helper programs side by side (args, log path, env, timeout each), each as run_tool runs one;
    a Ctrl-C stops them all. Returns (exit code, wall seconds) for each, in order. on_progress(log path,
    elapsed s) is called for each helper still running every every_s seconds."""
    running: list[tuple[subprocess.Popen, float, float]] = []
    ends: dict[int, tuple[int, float]] = {}
    beat = time.time() + every_s
    try:
        for args, log_path, env, timeout_s in tools:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with os.fdopen(safe_open_new(log_path), "wb") as log, holding_signals():
                proc = subprocess.Popen(
                    [sys.executable, *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**env, "ZEROBENCH_PARENT_PID": str(os.getpid())},
                    cwd=os.getcwd(),
                    start_new_session=True,
                )
                running.append((proc, time.time(), timeout_s))  # before a held Ctrl-C lands: it stops this one too
        while len(ends) < len(running):
            for i, (proc, t0, timeout_s) in enumerate(running):
                if i in ends:
                    continue
                if proc.poll() is None and time.time() - t0 > timeout_s:
                    _kill_tree(proc)
                if proc.poll() is not None:
                    ends[i] = (proc.returncode, time.time() - t0)
            if on_progress is not None and time.time() >= beat and len(ends) < len(running):
                beat = time.time() + every_s
                for i, (_, t0, _) in enumerate(running):
                    if i not in ends:
                        on_progress(tools[i][1], time.time() - t0)
            time.sleep(0.05)
    except KeyboardInterrupt:
        with holding_signals():
            for proc, _, _ in running:
                if proc.poll() is None:
                    _kill_tree(proc)
        raise
    return [ends[i] for i in range(len(running))]
