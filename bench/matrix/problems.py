"""Problems found in a config file, and the error that carries all of them at once.

A leaf: the matrix (YAML) and DeepSpeed-config (JSON) checkers both report through it, and the CLI
prints it, so neither checker imports the other for its error type. `read_text` is the one way both
read their file: a path that is not a small UTF-8 text file is a problem too, not a traceback.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ..host.safefile import kind as kind_of
from ..host.safefile import open_regular

__all__ = ["Problem", "InputError", "ConfigError", "read_text", "MAX_CONFIG_BYTES", "MAX_DEPTH"]

# Config files are a few KB; anything this large is the wrong file, and parsing it would take minutes.
MAX_CONFIG_BYTES = 1 << 20
# How deep a matrix or DeepSpeed config may nest: real ones nest 4-5 levels; the parsers recurse.
MAX_DEPTH = 32


@dataclass(frozen=True)
class Problem:
    file: str
    where: str  # key path, e.g. axes.optimizer[2]
    what: str
    fix: str = ""
    line: int | None = None

    def __str__(self) -> str:
        loc = f"{self.file}:{self.line}" if self.line else self.file
        s = f"{loc}: {self.where or '(top level)'}: {self.what}"
        return s + (f"\n    fix: {self.fix}" if self.fix else "")


class InputError(Exception):
    """Input zerobench cannot use (a file, an argument, a results file another run holds): the CLI
    prints the message and exits 2, without a traceback."""


class ConfigError(InputError):
    """All problems found in one file (a matrix, or a DeepSpeed config it names), or in the arguments."""

    def __init__(self, problems: list[Problem]):
        # In the order they appear in each file (the first file's first), so the list reads top to bottom.
        first = problems[0].file if problems else ""
        problems = sorted(problems, key=lambda p: (p.file != first, p.file, p.line is None, p.line or 0))
        self.problems = problems
        n = len(problems)
        head = f"{n} problem{'s' if n != 1 else ''} in {problems[0].file}; nothing was run:" if problems else ""
        super().__init__("\n".join([head, *(f"  {p}" for p in problems)]))


def read_text(path: str | os.PathLike, kind: str, example: str) -> str:
    """The text of a config file, or a ConfigError that says why it is not one (missing, a folder, too
    large, binary or not UTF-8, unreadable). kind names the file ("matrix"); example is a good path."""

    def fail(what: str, fix: str) -> ConfigError:
        return ConfigError([Problem(str(path), "", what, fix)])

    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise fail(f"no such {kind} file", f"give a path such as {example}") from None
    except OSError as e:  # a name over 255 characters, a file where a folder should be, no permission
        raise fail(f"cannot be opened: {e.strerror}", f"give a path such as {example}") from None
    if stat.S_ISDIR(st.st_mode):
        raise fail(f"is a folder, not a {kind} file", f"give the path of the file, e.g. {example}")
    if not stat.S_ISREG(st.st_mode):
        raise fail(f"is {kind_of(st.st_mode)}, not a {kind} file", f"give a regular file, e.g. {example}")
    try:
        size = st.st_size
        if size > MAX_CONFIG_BYTES:
            raise fail(
                f"is {size / 2**20:.1f} MiB; a {kind} file is a few KB, and at most {MAX_CONFIG_BYTES >> 20} MiB",
                f"check the path: is this the {kind} file you meant?",
            )
        with os.fdopen(open_regular(p), "rb") as f:  # never waits on a FIFO swapped in since the stat
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise fail(f"cannot be read: {e.strerror}", "check the file's permissions") from None
    nul = data.find(b"\0")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        nul = e.start if nul < 0 else min(nul, e.start)
    else:
        if nul < 0:
            return text
    line = data[:nul].count(b"\n") + 1
    raise ConfigError(
        [
            Problem(
                str(path),
                "",
                f"is not a UTF-8 text file (byte {nul + 1} is {data[nul : nul + 1]!r})",
                f"give the {kind} file itself (text, UTF-8), e.g. {example}",
                line,
            )
        ]
    )
