"""Errors that teach answer mode: an attempt's error signature, and the cells expected to repeat it.

An error's signature is its phase and its reason with the numbers, paths and addresses taken out: the same
failure in two cells reads the same ("RuntimeError in phase measured: optimizer 'adamw_8bit' asked for ...",
"loss became nan at step #"). Out-of-memory ends are not signatures: they imply the heavier cells instead
(bench.execute.schedule).

The failing settings of a signature are the axis values every cell that failed with it shares, narrowed by the
cells that ran: those the error's message names ('paged_adamw', "the Trainer": what the code that failed knew
of), where no cell that ran has them together; else the values none of them has, or where each value is in
some cell that ran, the fewest of them (rarest among those cells first) that no cell that ran has together. A
cell with all of them is expected to repeat the error. One failure says nothing about which of its values
caused it, so a signature teaches from its second attempt on: the search spends two attempts on a signature,
then measures no cell expected to repeat it, and each such cell's record names the error. Where a cell that
ran has every value the failures share, the error is not a matter of settings, and nothing is expected of it.

Pure: no I/O. The search (bench.execute.answer) feeds it outcomes and asks which cells to leave.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from typing import Any

from ...matrix.axes import AXIS
from ...records.record import Record
from ...records.status import Status

__all__ = ["FAILED", "TEACHES_AT", "signature", "shared", "Lessons", "attempts"]

FAILED = (Status.ERROR, Status.DIVERGED)
"""The ends whose reason is a signature."""
TEACHES_AT = 2
"""Attempts of one signature from which cells sharing its failing settings are expected to repeat it."""
_LONGEST = 300  # characters of a signature's reason: enough to tell errors apart, short enough to print

_ADDRESS = re.compile(r"\b0x[0-9a-fA-F]+\b")
_PATH = re.compile(r"(?<![\w.])(?:~|\.{1,2})?(?:/[\w.+@-]+)+/?")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w)")
_SPACE = re.compile(r"\s+")


def signature(rec: Record | dict) -> str | None:
    """The error signature of an attempt's record: its phase and its reason with numbers, paths and addresses
    stripped; None for an end that is not an error (ok, out of memory, interrupted, ...)."""
    get = rec.get if isinstance(rec, dict) else lambda k: getattr(rec, k, None)
    status = get("status")
    if Status(status) not in FAILED:
        return None
    text = _ADDRESS.sub("0x#", get("reason") or "")
    text = _NUMBER.sub("#", _PATH.sub("<path>", text))
    return f"{get('phase_at_end') or '?'}: {_SPACE.sub(' ', text).strip()[:_LONGEST]}"


def shared(features: Iterable[dict]) -> dict:
    """The axis values every one of these cells has: they tell no cell from another, so no failure is theirs."""
    out: dict | None = None
    for f in features:
        out = dict(f) if out is None else {k: v for k, v in out.items() if f.get(k) == v}
    return out or {}


def _has(features: dict, values: dict) -> bool:
    return all(features.get(k) == v for k, v in values.items())


class Lessons:
    """What the run's failures and successes say about the cells not yet measured."""

    def __init__(self, background: dict | None = None):
        """background: the axis values every candidate shares (shared())."""
        self.background = background or {}
        self.failed: dict[str, list[tuple[str, dict]]] = {}  # signature -> (cell name, features) per attempt
        self.ran: list[dict] = []  # the features of each cell that ran ok (once per cell)
        self._ran_names: set[str] = set()
        self._settings: dict[str, dict | None] = {}  # signature -> failing settings, until the next outcome

    def observe(self, rec: Record, name: str, features: dict) -> bool:
        """An attempt of the cell `name` ended; True when this changes what is expected."""
        if rec.status is Status.OK:
            if name in self._ran_names:
                return False
            self._ran_names.add(name)
            self.ran.append(features)
        elif (sig := signature(rec)) is not None:
            self.failed.setdefault(sig, []).append((name, features))
        else:
            return False
        self._settings.clear()
        return True

    def settings(self, sig: str) -> dict | None:
        """The failing settings of a signature, once it has TEACHES_AT attempts; None before, or where a cell that
        ran has every value its failures share."""
        if sig not in self._settings:
            self._settings[sig] = self._failing(sig)
        return self._settings[sig]

    def _failing(self, sig: str) -> dict | None:
        failed = [f for _, f in self.failed.get(sig, ())]
        if len(failed) < TEACHES_AT:
            return None
        common = {k: v for k, v in shared(failed).items() if v is not None and (k, v) not in self.background.items()}
        if not common or any(_has(r, common) for r in self.ran):
            return None
        named = {k: v for k, v in common.items() if _named(v, sig)}
        if named and not any(_has(r, named) for r in self.ran):
            return named
        count = collections.Counter((k, r.get(k)) for r in self.ran for k in common)
        keep = {k: v for k, v in common.items() if not count[(k, v)]}
        if keep:
            return keep
        for k, v in sorted(common.items(), key=lambda kv: count[kv]):
            keep[k] = v
            if not any(_has(r, keep) for r in self.ran):
                break
        return {k: v for k, v in common.items() if k in keep}  # in the axes' order

    def expected(self, features: dict) -> str | None:
        """The signature a cell with these axis values is expected to repeat (the most attempted one), or None."""
        hits = [s for s in self.failed if (c := self.settings(s)) is not None and _has(features, c)]
        return max(hits, key=lambda s: len(self.failed[s]), default=None)

    def why(self, sig: str) -> str:
        """In words: the error a cell is expected to repeat, where it was seen and the settings it comes with."""
        names = [n for n, _ in self.failed[sig]]
        return (
            f"expected to repeat an error seen in {len(names)} attempt(s) ({'; '.join(names[:3])}"
            f"{'; ...' if len(names) > 3 else ''}): they share {_text(self.settings(sig) or {})}, which no cell "
            f"that ran has together: {sig}"
        )

    def summary(self, expected: collections.Counter) -> list[str]:
        """One line per signature: its attempts and how many cells it left unmeasured (expected: per signature)."""
        lines = []
        for sig, seen in sorted(self.failed.items(), key=lambda kv: -len(kv[1])):
            settings = self.settings(sig)
            what = (
                f"{expected[sig]} cell(s) with {_text(settings)} expected to repeat it, not measured"
                if settings is not None
                else "no cell expected to repeat it"
            )
            lines.append(f"  error, {len(seen)} attempt(s): {sig} ({what})")
        return lines


def _named(value: Any, sig: str) -> bool:
    """Whether an error's signature names an axis value: the value, or a word of four letters or more of it, as a
    word of the message ('paged_adamw'; "Trainer" for hf_trainer). Numbers, flags and "none" (peft, offload: a
    Python error's "got None" names no setting) are not names."""
    if not isinstance(value, str) or value == "none":
        return False
    words = [value, *(w for w in re.split(r"[_.-]", value) if len(w) >= 4 and w.isalpha())]
    return any(re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", sig, re.IGNORECASE) for w in words)


def _text(settings: dict) -> str:
    return ", ".join(f"{AXIS[k].short if k in AXIS else k}={v}" for k, v in settings.items())


def attempts(records: Iterable[Record]) -> collections.Counter:
    """Attempts per error signature in a results file's records."""
    return collections.Counter(s for r in records if r.status is not Status.STARTED and (s := _safe(r)) is not None)


def _safe(rec: Record) -> Any:
    try:
        return signature(rec)
    except ValueError:  # a status this zerobench does not know
        return None
