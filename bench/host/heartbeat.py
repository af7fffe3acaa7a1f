"""A line every so often while helper programs run (the op build, checkpoint helpers), so a first run
that compiles for minutes says what it is doing instead of printing nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["EVERY_S", "last_line", "line", "printing"]

EVERY_S = 20.0
"""How often a running helper is reported: well inside the 30 s a silent terminal starts to look hung."""


def last_line(log: Path, tail_bytes: int = 4096) -> str:
    """The log's last non-empty line (ninja's [12/40] or a compiler's), read from its end only."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    return lines[-1][:160] if lines else ""


def line(what: str, elapsed_s: float, log: Path) -> str:
    last = last_line(log)
    return f"  still {what}: {elapsed_s:.0f} s, log {log}" + (f"; last: {last}" if last else "")


def printing(printer: Callable[[str], None]) -> Callable[[Path, float], None]:
    """A heartbeat for launch.run_tools: names each helper by its log file (prebuild.log: prebuild)."""
    return lambda log, elapsed_s: printer(line(f"running {log.stem}", elapsed_s, log))
