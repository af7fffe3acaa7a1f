"""Attempt folders in the temp dir (spec, events, result documents, a Trainer's output, NVMe swap
files), each with its owner, and the sweep of those a killed orchestrator left behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psutil

_ATTEMPT_PREFIX = "zerobench-"
_OWNER = "owner"  # in an attempt folder: "PID CREATE_TIME" of the orchestrator that made it


def _owner_tag(pid: int) -> str:
    try:
        return f"{pid} {psutil.Process(pid).create_time():.2f}"
    except psutil.Error:
        return f"{pid} 0"


def sweep_attempt_folders() -> None:
    """Remove attempt folders whose orchestrator is gone. A SIGKILLed run cannot clean up after itself;
    its folder (spec, events, a Trainer's output, NVMe swap files) would stay in the temp dir for good.
    A folder is removed only when its owner's PID is dead or now names another process (create time)."""
    for d in Path(tempfile.gettempdir()).glob(_ATTEMPT_PREFIX + "*"):
        try:
            pid, created = (d / _OWNER).read_text().split()
        except (OSError, ValueError):
            continue  # not ours, or a folder from before owners were written: leave it
        if pid.isdigit() and _owner_tag(int(pid)) != f"{pid} {created}":
            shutil.rmtree(d, ignore_errors=True)


def new_attempt_folder() -> Path:
    """A fresh attempt folder in the temp dir, owned by this process (the sweep leaves it while we live)."""
    work = Path(tempfile.mkdtemp(prefix=_ATTEMPT_PREFIX))
    (work / _OWNER).write_text(_owner_tag(os.getpid()))
    return work


def clear_attempt_folder(work: Path) -> None:
    """Remove a previous launch's documents (and the Trainer's folder): they are not the next launch's."""
    for old in work.iterdir():
        if old.name == _OWNER:
            continue
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
