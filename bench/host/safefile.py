"""Opening files in folders others may write to (a shared results or reports folder) without being led
elsewhere: a file we create is created new (O_EXCL, O_NOFOLLOW), so a link planted at its name is never
followed; a file we replace is written beside it under a name nobody can guess (tempfile) and renamed
over it (a link there is replaced, its target untouched); a file we read is checked to be a regular
file before a byte is read, so a device or a FIFO given as a path is refused instead of read forever
or waited on.

A leaf: it knows no zerobench type; callers turn `NotRegularFile` into their own message.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["NotRegularFile", "kind", "open_regular", "check_regular", "safe_open_new", "open_append", "write_atomic"]

_NEW = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class NotRegularFile(OSError):
    """The path names something that is not a regular file (a device, a FIFO, a socket, a folder)."""


def kind(mode: int) -> str:
    """What a file of this st_mode is, in words."""
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: str | os.PathLike, *, missing_ok: bool = False) -> os.stat_result | None:
    """The stat of path when it is a regular file (links followed); None when it is absent and missing_ok.
    Raises NotRegularFile for anything else, FileNotFoundError when absent, OSError (e.g. a name too long)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(0, f"is {kind(st.st_mode)}, not a regular file", os.fspath(path))
    return st


def open_regular(path: str | os.PathLike) -> int:
    """A read-only descriptor of path, which must be a regular file. O_NONBLOCK: opening a FIFO does not
    wait for a writer; fstat after the open, so what is read is what was checked."""
    check_regular(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    return _regular(fd, path)


def safe_open_new(path: str | os.PathLike, *, replace: bool = True, mode: int = 0o644) -> int:
    """A write descriptor of a file created new at path, never through a link planted there. With
    replace, whatever is at the name (a file from before, a link) is unlinked first; the link's target
    is left as it is."""
    try:
        return os.open(path, os.O_WRONLY | _NEW, mode)
    except FileExistsError:
        if not replace:
            raise
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | _NEW, mode)


def open_append(path: str | os.PathLike, *, mode: int = 0o644) -> int:
    """An append descriptor of path (created when absent), refusing a link at the name (ELOOP) and
    anything that is not a regular file."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    return _regular(fd, path)


@contextlib.contextmanager
def write_atomic(path: str | os.PathLike, binary: bool = False):
    """Yield a file object to write path's new content into; on a clean exit it replaces path whole
    (a link at path is replaced, not written through); on an error nothing at path changes."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": "\n"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _regular(fd: int, path: str | os.PathLike) -> int:
    """fd, blocking again, when it is a regular file (checked on the open file: what is read or written is
    what was checked); else closed, and NotRegularFile."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFile(0, f"is {kind(st.st_mode)}, not a regular file", os.fspath(path))
    os.set_blocking(fd, True)
    return fd
