"""Driving a real `zerobench run` from a test: start it, wait for a phase, signal it, and check what it
leaves behind (processes, temporary folders)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.conftest import ROOT


def wait_for(pred, timeout_s: float, every_s: float = 0.1):
    """pred's first truthy value within timeout_s, else None."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every_s)
    return None


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            out.append(str(p.pid))
    return out


# `python -m bench` with the report held: once the run calls bench.report.write_reports, it touches the file
# ZEROBENCH_TEST_HOLD names and waits there (up to 10 minutes) before writing, so a signal the test sends once the
# file exists lands inside the report whatever the machine's load (a printed line, then a report of seconds, was
# a race a loaded machine lost).
HOLD_REPORT = """
import os, pathlib, sys, time
import bench.report
write = bench.report.write_reports
def held(*args, **kwargs):
    pathlib.Path(os.environ["ZEROBENCH_TEST_HOLD"]).touch()
    time.sleep(600)  # a signal's handler raises out of the sleep
    return write(*args, **kwargs)
bench.report.write_reports = held
from bench.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


@dataclass
class Run:
    """One `python -m bench run ...` in its own session, its output in a file; hold: the file it touches once its
    report begins, where it then waits (HOLD_REPORT)."""

    args: list[str]
    cwd: Path
    env: dict[str, str]
    out_path: Path
    hold: Path | None = None
    proc: subprocess.Popen | None = None
    t_signal: float | None = None
    tree: list[psutil.Process] = field(default_factory=list)

    def start(self) -> Run:
        self.out_path.parent.mkdir(parents=True, exist_ok=True)
        how = ["-m", "bench"] if self.hold is None else ["-c", HOLD_REPORT]
        env = self.env if self.hold is None else {**self.env, "ZEROBENCH_TEST_HOLD": str(self.hold)}
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, *how, "run", *self.args],
                cwd=self.cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []

    def signal(self, sig: int) -> None:
        """Signal the orchestrator alone (as `kill PID` does), remembering what it had started."""
        self.tree = self.descendants()
        self.t_signal = time.time()
        os.kill(self.proc.pid, sig)

    def wait(self, timeout_s: float = 120) -> int:
        return self.proc.wait(timeout=timeout_s)

    def leftovers(self, within_s: float) -> list[str]:
        """What the orchestrator had started that still runs within_s after the signal."""
        left = wait_for(lambda: not alive(self.tree), max(0.0, self.t_signal + within_s - time.time()))
        return [] if left else describe(alive(self.tree))


def env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a test's run: this checkout's bench, no GPU, unbuffered output (the test reads
    it as it comes), its own TMPDIR (so its temporary folders can be counted)."""
    e = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "ZEROBENCH_NO_GPU": "1",
        "TMPDIR": str(tmp),
    }
    e.update(extra)
    tmp.mkdir(parents=True, exist_ok=True)
    return e


def attempt_dirs(tmp: Path) -> list[Path]:
    """zerobench's per-attempt folders left in a TMPDIR."""
    return sorted(tmp.glob("zerobench-*"))


def compiler_running(run: Run) -> bool:
    """A C++ compile of an op (not the short compiler probes DeepSpeed's builders run first)."""
    for p in run.descendants():
        try:
            if p.name() == "cc1plus" and "TORCH_EXTENSION_NAME" in " ".join(p.cmdline()):
                return True
        except psutil.Error:
            pass
    return False


def forkserver_running(run: Run) -> bool:
    for p in run.descendants():
        try:
            if "bench.worker.forkserver" in " ".join(p.cmdline()):
                return True
        except psutil.Error:
            pass
    return False


def cell_stepping(tmp: Path) -> bool:
    for d in attempt_dirs(tmp):
        try:
            if '"warmup"' in (d / "events.jsonl").read_text():
                return True
        except OSError:  # not written yet, or the attempt already ended
            pass
    return False


SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}
