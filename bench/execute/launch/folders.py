"""Attempt folders in the temp dir (spec, events, result documents, a Trainer's output, NVMe swap
files), each with its owner, and the sweep of those a killed orchestrator left behind."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil

from ...host import env

_ATTEMPT_PREFIX = "zerobench-"
_OWNER = "owner"  # in an attempt folder: who made it (_owner_tag), as JSON under an exact marker
_MARKER = "zerobench attempt folder"
# A folder whose owner lives in another PID namespace (another container sharing the temp dir) cannot be
# proven dead from here: it is left alone unless it is older than this.
_FOREIGN_MAX_AGE_S = 7 * 24 * 3600


def _boot_id() -> str | None:
    return env.boot_id()


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _owner_tag(pid: int) -> str:
    """Who owns a folder, in terms that survive other PID namespaces: this host's boot, this process's
    PID namespace, and the PID with its start time (a PID reused by another process differs in that)."""
    try:
        created = round(psutil.Process(pid).create_time(), 2)
    except psutil.Error:
        created = 0.0
    tag = {"marker": _MARKER, "boot_id": _boot_id(), "pid_ns": _pid_namespace(), "pid": pid, "created": created}
    return json.dumps(tag, sort_keys=True)


def _owner_gone(tag: dict, age_s: float) -> bool:
    """Whether a folder's owner is provably dead from this process: another boot, or in our PID namespace
    a PID that is dead or now names another process. Another (or an unknown) namespace: only past the
    long bound, since its PIDs mean nothing here."""
    if tag.get("boot_id") and _boot_id() and tag["boot_id"] != _boot_id():
        return True  # made before this host last booted: nothing of that run lives
    if tag.get("pid_ns") is None or tag["pid_ns"] != _pid_namespace():
        return age_s > _FOREIGN_MAX_AGE_S
    pid = tag.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        return round(psutil.Process(pid).create_time(), 2) != tag.get("created")  # the PID names another now
    except psutil.Error:
        return True  # no such process in our namespace


def sweep_attempt_folders() -> None:
    """Remove attempt folders whose orchestrator is gone. A SIGKILLed run cannot clean up after itself;
    its folder (spec, events, a Trainer's output, NVMe swap files) would stay in the temp dir for good.
    Only folders whose owner file carries the exact marker are considered (anything else is not ours),
    and one is removed only when its owner is provably dead (_owner_gone)."""
    for d in Path(tempfile.gettempdir()).glob(_ATTEMPT_PREFIX + "*"):
        try:
            owner = d / _OWNER
            tag = json.loads(owner.read_text())
            age_s = time.time() - owner.stat().st_mtime
        except (OSError, ValueError):
            continue  # not ours, or a folder from before owners were written: leave it
        if isinstance(tag, dict) and tag.get("marker") == _MARKER and _owner_gone(tag, age_s):
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
