"""Append-only JSON Lines results: one record per cell attempt, flushed and fsynced.

A record is either whole on disk or reported lost: `Store.append` writes the whole line (a short write,
e.g. on a full disk, is continued) and, when the file system refuses, cuts the file back to where it was
and raises `StoreWriteError`. One run at a time writes a results file: `Store.hold()` takes a lock on
`<results>.lock` for the run (flock: the kernel drops it when the holder dies, so a killed run leaves no
lock that blocks the next), and a second run on the file gets `ResultsInUse`.

Readers tolerate a torn last line (a run killed mid-write); the writer seals such a line first so
the next record starts clean. Lines that are JSON but not records of zerobench (another tool's, a hand
edit, a field of the wrong type) are skipped and named in one warning, never read as a cell. Reading
upgrades every record to the current schema version (bench.record); writing writes that version.
Resume reads the same file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import types
import typing
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from .cells import Cell, Lora, Qlora
from .problems import InputError
from .record import SCHEMA_VERSION, Record, RecordVersionError, upgrade
from .status import Status

__all__ = ["Store", "read", "read_records", "SCHEMA_VERSION", "StoreWriteError", "ResultsInUse", "check_writable"]


def _json_types(cls) -> dict[str, tuple[type, ...]]:
    """What each field of a dataclass may be once written as JSON, from its annotations: a nested
    dataclass is an object, a tuple a list, a float also an int."""
    as_json = {float: [int, float], tuple: [list, tuple]}
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        allowed: list[type] = []
        for t in typing.get_args(hint) if union else (hint,):
            t = typing.get_origin(t) or t
            allowed += [dict] if dataclasses.is_dataclass(t) else as_json.get(t, [t])
        out[name] = tuple(allowed)
    return out


# A stored cell keeps its fields as a dict; each must be what bench.cells.Cell's annotation says (a plain
# isinstance per field: reading 10k records for a report must stay cheap).
_CELL_FIELDS = _json_types(Cell)
_NESTED = {"lora": _json_types(Lora), "qlora": _json_types(Qlora)}


def _field_problem(d: dict, fields: dict, at: str) -> str | None:
    for k, v in d.items():
        types = fields.get(k)
        if types is None:  # a field this zerobench does not know (a record from before it was removed)
            continue
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            return f"{at}{k}: expected {' or '.join(t.__name__ for t in types)}, got {v!r:.40}"
        if k in _NESTED and v is not None and at == "cell.":
            why = _field_problem(v, _NESTED[k], f"cell.{k}.")
            if why:
                return why
    return None


class StoreWriteError(OSError):
    """A record could not be written whole; the file was cut back to its previous end (or, where even that
    failed, ends in a torn line that readers skip)."""


class ResultsInUse(InputError):
    """Another process holds the results file's lock (a run, a --resume, a selfcheck)."""


def read(path: str | os.PathLike, *, warn=True) -> list[dict]:
    """All records of a results file, as the current schema version (bench.record.upgrade), skipping
    lines that are not complete JSON objects and JSON that is not a zerobench record (named in a warning)."""
    return [r.to_dict() for r in read_records(path, warn=warn)]


def read_records(path: str | os.PathLike, *, warn=True) -> Iterator[Record]:
    """As read(), as bench.record.Record values one at a time (each line is validated once, here; a
    report of 10k records keeps only its rows, not 10k models, alive)."""
    p = Path(path)
    if not p.exists():
        return
    lines = p.read_bytes().decode(errors="replace").split("\n")
    foreign: list[str] = []
    for i, line in enumerate(lines):
        if not line.strip("\0 \t\r"):  # a crash can leave a zero-filled tail
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            if warn and i < len(lines) - 1 and any(x.strip("\0 \t\r") for x in lines[i + 1 :]):
                print(f"zerobench: {path}:{i + 1}: skipping a line that is not JSON", file=sys.stderr)
            continue
        if not isinstance(rec, dict):
            foreign.append(f"line {i + 1} (a JSON {type(rec).__name__}, not an object)")
            continue
        try:
            parsed = Record.model_validate(upgrade(rec))
        except RecordVersionError as e:
            raise RecordVersionError(f"{path}:{i + 1}: {e}") from None
        except ValidationError as e:
            err = e.errors()[0]
            foreign.append(f"line {i + 1} ({'.'.join(map(str, err['loc'])) or 'record'}: {err['msg']})")
            continue
        why = _field_problem(
            parsed.cell, _CELL_FIELDS, "cell."
        )  # the record keeps the cell as a dict; its fields are typed
        if why:
            foreign.append(f"line {i + 1} ({why})")
            continue
        yield parsed
    if foreign and warn:
        n = len(foreign)
        more = f"; and {n - 5} more" if n > 5 else ""
        print(
            f"zerobench: {path}: {n} line{'s' if n != 1 else ''} not zerobench records, skipped: "
            + "; ".join(foreign[:5])
            + more,
            file=sys.stderr,
        )


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written: a write may be short (a full disk, a file size limit)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # not expected from a regular file; never loop on it
            raise OSError(errno.EIO, "the file system took no bytes")
        view = view[n:]


def check_writable(path: str | os.PathLike) -> None:
    """Raise InputError (with what to do) when the results file cannot be created or appended to."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"results file {p} is a folder; give a file path, e.g. {p / 'results.jsonl'}")
    above = next((a for a in p.parents if a.exists()), None)
    if above is not None and not above.is_dir():
        raise InputError(f"results file {p}: {above} is a file, not a folder; give --results a path in a folder")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    except OSError as e:
        raise InputError(
            f"cannot write the results file {p}: {e.strerror}; give --results a path in a writable folder"
        ) from None


class Store:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        # Cells packed side by side (bench.execute.local) append from their threads: one append at a time, or a
        # failed one's cut back to "its" previous end would cut off a neighbour's record.
        self._lock = threading.Lock()

    def append(self, record: Record | dict) -> dict:
        """Append one record (a bench.record.Record; a plain dict is written as it is); return what was written.
        Safe to call from several threads: appends are serialized.

        Raises StoreWriteError when the whole line cannot be written (disk full, file too large, I/O error):
        the file is then cut back to its size before this call, so no torn record is left behind."""
        if isinstance(record, Record):
            record = record.to_dict()
        data = (json.dumps(record, default=str, separators=(",", ":")) + "\n").encode()
        with self._lock:
            return self._append(record, data)

    def _append(self, record: dict, data: bytes) -> dict:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as e:
            raise StoreWriteError(
                e.errno, f"cannot open {self.path} to append a record: {e.strerror}", str(self.path)
            ) from None
        try:
            size = os.fstat(fd).st_size
            try:
                if size:
                    with open(self.path, "rb") as f:
                        f.seek(size - 1)
                        sealed = f.read(1) == b"\n"
                    if not sealed:
                        _write_all(fd, b"\n")  # seal a torn line left by a killed run
                _write_all(fd, data)
                os.fsync(fd)
            except OSError as e:
                try:
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                    left = f"the file is back to its {size} bytes before this record"
                except OSError:
                    left = "it may end in a torn line, which readers skip"
                raise StoreWriteError(
                    e.errno,
                    f"could not write a record ({len(data)} bytes) to {self.path}: {e.strerror}; {left}",
                    str(self.path),
                ) from None
        finally:
            os.close(fd)
        return record

    @contextlib.contextmanager
    def hold(self, what: str = "zerobench run"):
        """Hold the results file for one run (a lock on <results>.lock); raise ResultsInUse when another
        process holds it. The lock file says who holds it, for that message; it is removed at the end."""
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"cannot create the results folder {self.path.parent}: {e.strerror}") from None
        while True:
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise InputError(
                    f"cannot write beside the results file {self.path} ({lock}: {e.strerror}); "
                    "give --results a path in a writable folder"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                    os.close(fd)
                    raise
                holder = _holder(fd)
                os.close(fd)
                raise ResultsInUse(
                    f"results file {self.path} is in use by {holder}; wait for it to end, "
                    "or give this run another --results"
                ) from None
            # The previous holder may have removed the file between our open and our lock: then we hold a
            # lock on a file nobody else can find, so start again on the one at the path.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(lock))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "what": what,
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
            yield self
        finally:
            with contextlib.suppress(OSError):
                os.unlink(lock)  # while still holding it, so no one takes a lock on a file being removed
            os.close(fd)

    def records(self) -> list[dict]:
        return read(self.path)

    def latest(self) -> dict[str, dict]:
        """The last record of each cell (by hash)."""
        out: dict[str, dict] = {}
        for rec in self.records():
            out[rec["cell_hash"]] = rec
        return out

    def resume_state(self, records: list[dict] | None = None) -> tuple[set[tuple[str, int]], list[dict]]:
        """((cell hash, repeat) pairs with an outcome, start records whose attempt never ended), from the file
        or these records. A record without a repeat index (written before repeats existed) is repeat 1."""
        done, open_starts = set(), {}
        for rec in self.records() if records is None else records:
            key = (rec.get("cell_hash"), rec.get("repeat", 1))
            st = Status(rec.get("status", "error"))
            if st is Status.STARTED:
                open_starts[key] = rec
            else:
                open_starts.pop(key, None)
                if st.is_outcome:
                    done.add(key)
                else:
                    done.discard(key)
        return done, list(open_starts.values())


def _holder(fd: int) -> str:
    """Who holds the lock, from what the holder wrote in the lock file (it may not have written it yet)."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode())
        where = "" if info.get("host") == socket.gethostname() else f" on {info.get('host')}"
        return f"pid {info['pid']}{where} ({info.get('what', 'zerobench')}, started at {info.get('started_at')})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "another process (it has not said which yet)"
