"""Append-only JSON Lines results: one record per cell attempt, flushed and fsynced.

Readers tolerate a torn last line (a run killed mid-write); the writer seals such a line first so
the next record starts clean. Resume reads the same file.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .status import Status

__all__ = ["Store", "read", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1


def read(path: str | os.PathLike, *, warn=True) -> list[dict]:
    """All records of a results file, skipping lines that are not complete JSON objects."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    lines = p.read_bytes().decode(errors="replace").split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if warn and i < len(lines) - 1 and any(x.strip() for x in lines[i + 1:]):
                print(f"zerobench: {path}:{i + 1}: skipping a line that is not JSON", file=sys.stderr)
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


class Store:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict) -> None:
        data = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size:
                with open(self.path, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        os.write(fd, b"\n")  # seal a torn line left by a killed run
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def records(self) -> list[dict]:
        return read(self.path)

    def latest(self) -> dict[str, dict]:
        """The last record of each cell (by hash)."""
        out: dict[str, dict] = {}
        for rec in self.records():
            out[rec["cell_hash"]] = rec
        return out

    def resume_state(self) -> tuple[set[str], list[dict]]:
        """(hashes with an outcome, start records whose attempt never ended)."""
        done, open_starts = set(), {}
        for rec in self.records():
            h, st = rec.get("cell_hash"), Status(rec.get("status", "error"))
            if st is Status.STARTED:
                open_starts[h] = rec
            else:
                open_starts.pop(h, None)
                if st.is_outcome:
                    done.add(h)
                else:
                    done.discard(h)
        return done, list(open_starts.values())
