"""Append-only JSON Lines results: one record per cell attempt, flushed and fsynced.

A record is either whole on disk or reported lost: `Store.append` writes the whole line (a short write,
e.g. on a full disk, is continued) and, when the file system refuses, cuts the file back to where it was
and raises `StoreWriteError`. One run at a time writes a results file: `Store.hold()` takes an flock on
the results file itself for the run (the kernel drops it when the holder dies, so a killed run leaves no
lock that blocks the next; and it is the file that is locked, not its name, so a second run through a
symlink or a hard link is refused too), and a second run on the file gets `ResultsInUse`. The run appends through
the descriptor it locked, so a file deleted mid-run cannot let a second run's records in beside its own: its next
append is refused instead. No figure is
written as NaN or Infinity (JSON has neither): such a value is written as null, with a warning.

Readers skip a torn last line (a run killed mid-write) and name it; the writer seals such a line first so
the next record starts clean. Lines that are JSON but not records of zerobench (another tool's, a hand
edit, a field of the wrong type or out of range, a record that contradicts itself: tokens/s that its step
times and tokens per step do not give, a measurement on a cell that never ran, a name of megabytes) are
skipped and named with their line numbers in one warning, never read as a cell; lines that are not JSON
are counted in one warning, and so are lines that repeat an earlier record byte for byte (one attempt, read once).
The file is read a line at a time. A path that is not a regular file (a device, a FIFO) is refused before a byte
is read. Reading
upgrades every record to the current schema version (bench.records.record); writing writes that version.
Resume reads the same file.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import datetime as dt
import errno
import fcntl
import gzip
import hashlib
import json
import math
import os
import socket
import statistics
import sys
import threading
import types
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path

from pydantic import ValidationError

from ..host.safefile import NotRegularFile, check_regular, open_append, open_regular, safe_open_new
from ..matrix.axes import AXES
from ..matrix.cells import Cell, Lora, Qlora
from ..matrix.problems import InputError
from .record import SCHEMA_VERSION, Record, RecordVersionError, upgrade
from .status import Status

__all__ = [
    "Store",
    "read",
    "read_records",
    "numbered_records",
    "SCHEMA_VERSION",
    "StoreWriteError",
    "ResultsInUse",
    "check_writable",
]


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


# A stored cell keeps its fields as a dict; each must be what bench.matrix.cells.Cell's annotation says (a plain
# isinstance per field: reading 10k records for a report must stay cheap).
_CELL_FIELDS = _json_types(Cell)
# A searched axis (micro_batch: auto) reads "auto" in the records of a cell not run as a probe (a rule's skip).
_CELL_FIELDS |= {a.name: (*_CELL_FIELDS[a.name], str) for a in AXES if a.auto}
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


# Fields of the right type whose value the reports still cannot use: bounds checked on read, so one
# hand-edited or damaged record is skipped with a warning instead of crashing a report or a compare.
_CELL_MIN = {"seq_len": 1, "micro_batch": 1, "grad_accum": 1, "gpus": 1, "warmup_steps": 0, "measured_steps": 0}
_FINITE_METRICS = ("tokens_per_s", "samples_per_s", "step_time_median_s", "step_time_p90_s", "step_time_mean_s")


# How large a record's parts may be. A record is a few KB (the longest committed line is 19 KB: a traceback of
# 8,000 characters and a log tail of 6,000); a name of megabytes made the report's charts lay out text for
# minutes. Names (and every value of the cell, paths included) are at most PATH_MAX; other text, 64 KiB.
MAX_LINE_CHARS = 4 * 2**20
MAX_NAME_CHARS = 4096
MAX_TEXT_CHARS = 65536
_NAMES = frozenset(("run_id", "matrix", "matrix_file", "cell_id", "cell_hash", "cell_name", "cell", "variant", "log"))
# Statuses whose worker never trained: a record of one carries no measurement.
_NEVER_RAN = frozenset(s.value for s in Status if not s.ran)
# tokens/s is tokens per step over the median measured step time (bench.worker.metrics.summarize); a record
# whose figures disagree by more than this was not written by a worker.
METRIC_TOLERANCE = 0.01
_PER_STEP = ("micro_batch", "grad_accum", "seq_len", "gpus", "nodes")  # their product: tokens per step


def _size_problem(rec: dict) -> str | None:
    """A string of the record longer than its part allows (names and cell values MAX_NAME_CHARS, the rest
    MAX_TEXT_CHARS), as `key: N characters; ...`."""
    stack = [(k, v, k in _NAMES) for k, v in rec.items()]
    while stack:
        at, v, name = stack.pop()
        limit = MAX_NAME_CHARS if name else MAX_TEXT_CHARS
        if isinstance(v, str) and len(v) > limit:
            return f"{at}: {len(v):,} characters; {'a name' if name else 'text'} here is at most {limit:,}"
        if isinstance(v, dict):
            for k, x in v.items():
                if len(k) > MAX_NAME_CHARS:
                    return f"{at}: a key of {len(k):,} characters"
                stack.append((f"{at}.{k}", x, name))
        elif isinstance(v, list):
            stack += [(f"{at}[{i}]", x, name) for i, x in enumerate(v)]
    return None


def _metrics_problem(rec: Record) -> str | None:
    """Figures that contradict each other or the status: tokens/s that the recorded step times and the cell's
    tokens per step do not give (either way), none on a cell measured ok, or a measurement on a cell whose worker
    never trained."""
    m = rec.metrics
    if m is not None and m.tokens_per_s == 0 and rec.status is Status.OK:
        return "metrics.tokens_per_s: 0 on an ok record: a cell measured ok trained at a positive rate"
    if m is None or not m.tokens_per_s:
        return None
    if rec.status.value in _NEVER_RAN:
        return f"metrics.tokens_per_s: {m.tokens_per_s:g} on a {rec.status.value} record, whose cell never ran"
    cell = rec.cell
    # A worker's record names its micro-batch and sequence length; grad_accum, gpus and nodes default to 1.
    per_step = [cell.get(k, None if k in ("micro_batch", "seq_len") else 1) for k in _PER_STEP]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in per_step):
        return None  # not a worker's (micro_batch: auto's template: its probes' records carry their own)
    tokens = math.prod(per_step)
    n = rec.steps.measured if rec.steps is not None else cell.get("measured_steps")
    times = rec.step_times_s or []
    measured = times[-n:] if isinstance(n, int) and 0 < n <= len(times) else []
    median = statistics.median(measured) if measured and all(t is not None for t in measured) else None
    step = m.step_time_median_s or median
    if median and m.step_time_median_s and abs(m.step_time_median_s / median - 1) > METRIC_TOLERANCE:
        return f"metrics.step_time_median_s: {m.step_time_median_s:g} s is not its step_times_s' median ({median:g} s)"
    if step and abs(m.tokens_per_s * step / tokens - 1) > METRIC_TOLERANCE:
        return (
            f"metrics.tokens_per_s: {m.tokens_per_s:,.6g} is not its {tokens:,} tokens per step over its median step "
            f"time {step:.4g} s ({tokens / step:,.6g})"
        )
    return None


def _range_problem(rec: Record) -> str | None:
    cell = rec.cell or {}
    if cell.get("zero_stage", 0) not in (0, 1, 2, 3):
        return f"cell.zero_stage: {cell['zero_stage']!r:.20} is not a ZeRO stage (0-3)"
    for k, low in _CELL_MIN.items():
        if isinstance(cell.get(k), int) and cell[k] < low:
            return f"cell.{k}: {cell[k]} is below {low}"
    for k in ("started_at", "ended_at"):
        v = getattr(rec, k)
        try:
            v is None or dt.datetime.fromisoformat(v)
        except ValueError:
            return f"{k}: {v!r:.40} is not an ISO 8601 time"
    for k in _FINITE_METRICS:
        v = getattr(rec.metrics, k, None) if rec.metrics else None
        if v is not None and not (math.isfinite(v) and v >= 0):
            return f"metrics.{k}: {v} is not a finite figure of 0 or more"
    if rec.wall_s is not None and not (math.isfinite(rec.wall_s) and rec.wall_s >= 0):
        return f"wall_s: {rec.wall_s} is not a finite time"
    return _metrics_problem(rec)


class StoreWriteError(OSError):
    """A record could not be written whole; the file was cut back to its previous end (or, where even that
    failed, ends in a torn line that readers skip)."""


GZIP_MAGIC = b"\x1f\x8b"


class ResultsInUse(InputError):
    """Another process holds the results file's lock (a run, a --resume, a selfcheck)."""


def read(path: str | os.PathLike, *, warn=True) -> list[Record]:
    """All records of a results file, as the current schema version (bench.records.record.upgrade), skipping
    lines that are not complete JSON objects and JSON that is not a zerobench record (named in a warning)."""
    return list(read_records(path, warn=warn))


def read_records(path: str | os.PathLike, *, warn=True) -> Iterator[Record]:
    """As read(), as bench.records.record.Record values one at a time (each line is validated once, here; a
    report of 10k records keeps only its rows, not 10k models, alive). A path that is not a regular
    file (a device, a FIFO) is an InputError before a byte is read."""
    for _, rec in numbered_records(path, warn=warn):
        yield rec


def numbered_records(path: str | os.PathLike, *, warn=True) -> Iterator[tuple[int, Record]]:
    """As read_records(), each record with its line number in the file (for messages that point at it). The file
    is read a line at a time (a file of a GB is not held whole); a line that repeats an earlier record byte for
    byte is the same attempt written again (a file appended to itself, a copy pasted twice): skipped, counted
    in one warning, never a second attempt."""
    f = _open_results(path)
    if f is None:
        return
    foreign: list[str] = []
    not_json: list[int] = []
    repeated: list[int] = []
    seen: set[bytes] = set()
    pending = None  # a line that is not JSON: the torn end of a killed run's write if no line follows it
    with f:
        for i, raw in enumerate(_lines(f, path), 1):
            if i == 1 and raw.startswith(codecs.BOM_UTF8):  # an editor's byte-order mark: the first record stands
                raw = raw[len(codecs.BOM_UTF8) :]
            if not raw.strip(b"\0 \t\r\n"):  # a crash can leave a zero-filled tail
                continue
            if pending is not None:
                not_json.append(pending)
                pending = None
            if len(raw) > MAX_LINE_CHARS:  # not parsed: a record is a few KB
                foreign.append(f"line {i} ({len(raw) / 2**20:.1f} MiB; a record is at most {MAX_LINE_CHARS >> 20} MiB)")
                continue
            digest = hashlib.blake2b(raw.rstrip(b"\r\n"), digest_size=16).digest()
            if digest in seen:
                repeated.append(i)
                continue
            line = raw.decode("utf-8", errors="replace")
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                pending = i
                continue
            parsed = _parse_line(rec, path, i, foreign, checked=len(line) <= MAX_NAME_CHARS)
            if parsed is not None:
                seen.add(digest)
                yield i, parsed
    if warn:
        _warn_skipped(path, not_json, foreign, pending, repeated)


def _open_results(path: str | os.PathLike) -> typing.BinaryIO | None:
    """A results file open to read; None when it does not exist."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return None
    except NotRegularFile as e:
        raise InputError(f"results file {path} {e.strerror}; give a results .jsonl file") from None
    except OSError as e:
        raise InputError(
            f"cannot read the results file {path}: {e.strerror}; give a readable results .jsonl file"
        ) from None
    f = os.fdopen(fd, "rb")
    if f.peek(2)[:2] != GZIP_MAGIC:
        return f
    gz = gzip.GzipFile(fileobj=f)  # a gzipped results file (records carried between machines are kept so)
    gz.myfileobj = f  # closed with it
    return gz


def _lines(f: typing.BinaryIO, path) -> Iterator[bytes]:
    """The file's lines; a gzipped file cut short is an InputError naming it."""
    try:
        yield from f
    except (EOFError, gzip.BadGzipFile) as e:
        raise InputError(f"results file {path} is gzip but cannot be read ({e}); give a whole .jsonl.gz") from None


def _parse_line(rec, path, line: int, foreign: list[str], checked: bool = False) -> Record | None:
    """One line's record, or None (and why, added to foreign) when it is not a zerobench record. checked: the
    line is too short to hold a string over the size limits (the walk over it is spared)."""
    if not isinstance(rec, dict):
        foreign.append(f"line {line} (a JSON {type(rec).__name__}, not an object)")
        return None
    why = None if checked else _size_problem(rec)
    if why:
        foreign.append(f"line {line} ({why})")
        return None
    try:
        parsed = Record.model_validate(upgrade(rec))
    except RecordVersionError as e:
        if "newer" in str(e):  # a newer zerobench wrote it: this one must not guess what it means
            raise RecordVersionError(f"{path}:{line}: {e}") from None
        foreign.append(f"line {line} ({e})")
        return None
    except ValidationError as e:
        err = e.errors()[0]
        foreign.append(f"line {line} ({'.'.join(map(str, err['loc'])) or 'record'}: {err['msg']})")
        return None
    # The record keeps the cell as a dict; its fields are typed and bounded here.
    why = _field_problem(parsed.cell or {}, _CELL_FIELDS, "cell.") or _range_problem(parsed)
    if why:
        foreign.append(f"line {line} ({why})")
        return None
    return parsed


def _warn_skipped(
    path, not_json: list[int], foreign: list[str], torn: int | None = None, repeated: list[int] | None = None
) -> None:
    """One warning per kind of skipped line, with a count and the first few line numbers."""
    if repeated:
        n, first = len(repeated), ", ".join(map(str, repeated[:5]))
        print(
            f"zerobench: {path}: skipping {n:,} line{'s' if n != 1 else ''} that repeat{'' if n != 1 else 's'} an "
            f"earlier record byte for byte (line{'s' if n != 1 else ''} {first}{', ...' if n > 5 else ''}): the same "
            "attempt written again, counted once; remove the repeats (the file may have been appended to itself)",
            file=sys.stderr,
        )
    if torn is not None:
        print(
            f"zerobench: {path}: skipping its last line ({torn}): it is cut short, not a whole record (a run killed "
            "while writing it); a run that appends to the file seals it first",
            file=sys.stderr,
        )
    if not_json:
        n, first = len(not_json), ", ".join(map(str, not_json[:5]))
        print(
            f"zerobench: {path}: skipping {n} line{'s' if n != 1 else ''} that {'are' if n != 1 else 'is'} "
            f"not JSON (line{'s' if n != 1 else ''} {first}{', ...' if n > 5 else ''})",
            file=sys.stderr,
        )
    if foreign:
        n = len(foreign)
        more = f"; and {n - 5} more" if n > 5 else ""
        print(
            f"zerobench: {path}: {n} line{'s' if n != 1 else ''} not zerobench records, skipped: "
            + "; ".join(foreign[:5])
            + more,
            file=sys.stderr,
        )


def _finite(record: dict) -> dict:
    """The record with every NaN or infinity as null (JSON has neither; other readers refuse them), and
    a warning saying which fields were so; losses are left out of the warning (a diverged cell's NaN loss
    is what its status says)."""
    where: list[str] = []

    def fix(v, at: str):
        if isinstance(v, float) and not math.isfinite(v):
            if not at.startswith("losses"):
                where.append(f"{at} was {v}")
            return None
        if isinstance(v, dict):
            return {k: fix(x, f"{at}.{k}" if at else str(k)) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [fix(x, f"{at}[{i}]") for i, x in enumerate(v)]
        return v

    out = fix(record, "")
    if where:
        note = (
            "not finite, written as null: "
            + ", ".join(where[:5])
            + (f" and {len(where) - 5} more" if len(where) > 5 else "")
        )
        out["warnings"] = [*(out.get("warnings") or []), note]
    return out


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written: a write may be short (a full disk, a file size limit)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:  # not expected from a regular file; never loop on it
            raise OSError(errno.EIO, "the file system took no bytes")
        view = view[n:]


def _short(p) -> str:
    """A path for a message: a name of thousands of characters is cut."""
    s = str(p)
    return s if len(s) <= 80 else s[:60] + "..." + s[-17:]


def check_writable(path: str | os.PathLike) -> None:
    """Raise InputError (with what to do) when the results file cannot be created or appended to."""
    p = Path(path)
    try:
        check_regular(p, missing_ok=True)  # before anything is created beside it
    except NotRegularFile as e:
        if p.is_dir():
            raise InputError(f"results file {p} is a folder; give a file path, e.g. {p / 'results.jsonl'}") from None
        raise InputError(f"results file {p} {e.strerror}; give --results a .jsonl file path") from None
    except OSError as e:
        if e.errno != errno.ENOTDIR:  # a file above it: said below
            raise InputError(f"--results {_short(p)}: {e.strerror}; give a shorter path") from None
    above = next((a for a in p.parents if a.exists()), None)
    if above is not None and not above.is_dir():
        raise InputError(f"results file {p}: {above} is a file, not a folder; give --results a path in a folder")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        _refuse_gzip(p)
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o644))
    except OSError as e:
        raise InputError(
            f"cannot write the results file {p}: {e.strerror}; give --results a path in a writable folder"
        ) from None


def _refuse_gzip(path) -> None:
    """A gzipped results file is read, never appended to: a run's plain lines after the compressed data would leave
    a file no reader takes."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:  # absent, or unreadable: what opening it to append says
        return
    if head == GZIP_MAGIC:
        raise InputError(
            f"results file {path} is gzip-compressed: runs append plain lines; `gunzip -k` it and give --results "
            "the .jsonl (or a new file)"
        )


class Store:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        # Cells packed side by side (bench.execute.executors.local) append from their threads: one append at a time,
        # or a failed one's cut back to "its" previous end would cut off a neighbour's record.
        self._lock = threading.Lock()
        self._held: int | None = None
        """While held (hold()), the locked descriptor every append writes through."""

    def append(self, record: Record | dict) -> dict:
        """Append one record (a bench.records.record.Record; a plain dict is written as it is); return what was written.
        Safe to call from several threads: appends are serialized.

        Raises StoreWriteError when the whole line cannot be written (disk full, file too large, I/O error):
        the file is then cut back to its size before this call, so no torn record is left behind."""
        if isinstance(record, Record):
            record = record.stored()
        record = _finite(record)
        data = (json.dumps(record, default=str, separators=(",", ":"), allow_nan=False) + "\n").encode()
        with self._lock:
            return self._append(record, data)

    def _append(self, record: dict, data: bytes) -> dict:
        fd = self._held if self._held is not None else self._open()
        try:
            if self._held is not None:
                self._check_held()
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
            if fd != self._held:
                os.close(fd)
        return record

    def _open(self) -> int:
        """A descriptor to append one record (the file is not held)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as e:
            raise StoreWriteError(
                e.errno, f"cannot open {self.path} to append a record: {e.strerror}", str(self.path)
            ) from None

    def _check_held(self) -> None:
        """The results path still names the file this run holds: deleted or replaced, the name may be another
        run's file now, and writing there would interleave two runs in one file."""
        held = os.fstat(self._held)
        try:
            now = os.stat(self.path)
        except OSError:
            now = None
        if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            gone = "it was deleted" if now is None else "it was deleted or replaced"
            raise StoreWriteError(
                errno.ENOENT,
                f"{self.path} no longer names the file this run holds ({gone} while the run wrote it); this run "
                "stops rather than write beside another run; rerun with --results naming a file no run holds",
                str(self.path),
            )

    @contextlib.contextmanager
    def hold(self, what: str = "zerobench run"):
        """Hold the results file for one run; raise ResultsInUse when another process holds it. The lock is
        an flock on the results file itself, so a second run through a symlink or a hard link to the same
        file is refused too. <results>.lock says who holds it, for that message; it is removed at the end.
        While held, every append writes through the locked descriptor; one made after the path stopped naming
        that file (deleted or replaced: a second run may hold the name now) raises StoreWriteError."""
        fd = self._open_for_lock()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                    raise
                raise ResultsInUse(
                    f"results file {self.path} is in use by {self._holder()}; wait for it to end, "
                    "or give this run another --results"
                ) from None
            lock = self._lock_info_path()
            info = json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "what": what,
                }
            )
            try:
                # Created new (a link planted at the name is replaced, never written through).
                info_fd = safe_open_new(lock)
            except OSError as e:
                raise InputError(
                    f"cannot write beside the results file {self.path} ({lock}: {e.strerror}); "
                    "give --results a path in a writable folder"
                ) from None
            try:
                _write_all(info_fd, (info + "\n").encode())
            finally:
                os.close(info_fd)
            self._held = fd
            try:
                yield self
            finally:
                self._held = None
                with contextlib.suppress(OSError):
                    os.unlink(lock)  # while still holding the lock, so no one reads a stale holder
        finally:
            os.close(fd)

    def _open_for_lock(self) -> int:
        """A descriptor of the results file (created when absent) to lock; refused unless a regular file."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"cannot create the results folder {self.path.parent}: {e.strerror}") from None
        try:
            check_regular(self.path, missing_ok=True)
            _refuse_gzip(os.path.realpath(self.path))
            return open_append(os.path.realpath(self.path))  # --results may be a link the user made
        except NotRegularFile as e:
            raise InputError(f"results file {self.path} {e.strerror}; give --results a .jsonl file path") from None
        except OSError as e:
            raise InputError(
                f"cannot write the results file {self.path}: {e.strerror}; give --results a path in a writable folder"
            ) from None

    def _lock_info_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def _holder(self) -> str:
        """Who holds the lock, from the lock file beside this path or beside the real file."""
        real = Path(os.path.realpath(self.path))
        for lock in (self._lock_info_path(), real.with_name(real.name + ".lock")):
            try:
                fd = open_regular(lock)
            except OSError:
                continue
            try:
                return _holder(fd)
            finally:
                os.close(fd)
        return "another process (it has not said which yet)"

    def records(self) -> list[Record]:
        return read(self.path)

    def latest(self) -> dict[str, Record]:
        """The last record of each cell (by hash)."""
        out: dict[str, Record] = {}
        for rec in self.records():
            out[rec.cell_hash] = rec
        return out

    def resume_state(self, records: Sequence[Record] | None = None) -> tuple[set[tuple[str, int]], list[Record]]:
        """((cell hash, repeat) pairs with an outcome, start records whose attempt never ended), from the file
        or these records. A record without a repeat index (written before repeats existed) is repeat 1. A skip is
        no attempt: it neither gives its cell an outcome nor takes away one an attempt gave."""
        done, open_starts = set(), {}
        for rec in self.records() if records is None else records:
            key = (rec.cell_hash, rec.repeat)
            st = rec.status
            if st is Status.SKIPPED:
                continue
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
