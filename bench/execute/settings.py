"""The run's settings from the environment, checked before the first cell: a bad value is the user's
input (a clear error naming the variable and the range; exit 2), never every cell's error."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ..matrix.problems import ConfigError, InputError, Problem

__all__ = ["check_settings", "stall_s"]

STALL_S = ("ZEROBENCH_STALL_S", 1.0, 7 * 24 * 3600.0, 600.0)  # name, lowest, highest, default
PORT = ("ZEROBENCH_PORT", 1024, 65000)  # room above for the next ports up (packed cells, relaunches)
FORKSERVER = ("ZEROBENCH_FORKSERVER", ("0", "1"))


def _number(environ: Mapping[str, str], name: str, lo: float, hi: float, kind) -> Problem | None:
    text = environ.get(name, "").strip()
    if not text:
        return None
    what = "seconds" if kind is float else "a whole number"
    try:
        value = kind(text)
    except ValueError:
        return Problem("environment", f"{name}={text!r}", f"not {what}", f"set {lo:g} to {hi:g}, or unset it")
    if not lo <= value <= hi:
        return Problem(
            "environment", f"{name}={text}", f"out of range {lo:g}-{hi:g}", f"set {lo:g} to {hi:g}, or unset it"
        )
    return None


def check_settings(environ: Mapping[str, str]) -> None:
    """Raise ConfigError naming every ZEROBENCH_* setting the run cannot use."""
    problems = [
        p
        for p in (
            _number(environ, STALL_S[0], STALL_S[1], STALL_S[2], float),
            _number(environ, PORT[0], PORT[1], PORT[2], int),
        )
        if p is not None
    ]
    fs = environ.get(FORKSERVER[0])
    if fs is not None and fs.strip() not in FORKSERVER[1]:
        problems.append(Problem("environment", f"{FORKSERVER[0]}={fs!r}", "not 0 or 1", "0 (spawn every worker) or 1"))
    if problems:
        raise ConfigError(problems)


def stall_s(environ: Mapping[str, str]) -> float:
    """The no-progress watchdog's limit (checked by check_settings before the run)."""
    text = environ.get(STALL_S[0], "").strip()
    return float(text) if text else STALL_S[3]


def check_folder(path: Path, what: str) -> None:
    """Before the first cell: a folder the run will write into must be a folder it can create or write
    (nothing is created here; a read-only mount, a file in its place, a name too long are said at once)."""
    try:
        above = next((a for a in (path, *path.parents) if a.exists()), None)
    except OSError as e:
        raise InputError(f"{what}: {e.strerror}; give a shorter path") from None
    if above is not None and not above.is_dir():
        raise InputError(f"{what}: {above} is a file, not a folder; give a folder path")
    if above is not None and not os.access(above, os.W_OK):
        why = "a read-only file system" if _read_only(above) else "no write permission"
        raise InputError(f"{what}: {above} is not writable ({why}); give a folder this user can write")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False
