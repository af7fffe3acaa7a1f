"""The record format's versions: reading upgrades a stored record of any version to the current one, one function
per version step, so every results file ever written loads; the store writes only the current version. What each
version changed is in bench.records.record's docstring."""

from __future__ import annotations

from collections.abc import Callable

from .machine import machine_of
from .status import Status

__all__ = ["SCHEMA_VERSION", "RecordVersionError", "UPGRADES", "upgrade"]

SCHEMA_VERSION = 4


class RecordVersionError(ValueError):
    """A record from a newer zerobench than this one (or with no usable version)."""


def _v1_to_v2(rec: dict) -> dict:
    rec.setdefault("provenance", None)
    if rec.get("reason") is None:
        rec["reason"] = ""
    return rec


def _v2_to_v3(rec: dict) -> dict:
    """The machine its provenance names (GPU UUIDs; no boot id then), for an attempt; unknown (null) where it
    names none."""
    try:
        status = Status(rec.get("status"))
    except ValueError:
        return rec  # validation says what is wrong with it
    if status is Status.STARTED or status.ran:
        m = machine_of(rec.get("provenance"), (rec.get("placement") or {}).get("gpus"))
        rec["machine"] = m.model_dump(mode="json") if m is not None else None
    return rec


def _v3_to_v4(rec: dict) -> dict:
    return rec  # v4 only leaves fields out of compact records: a v3 record is a v4 one


# UPGRADES[n] turns a version-n record into a version-(n + 1) one.
UPGRADES: dict[int, Callable[[dict], dict]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4}
assert set(UPGRADES) == set(range(1, SCHEMA_VERSION)), "one upgrade per version step"


def upgrade(rec: dict) -> dict:
    """A stored record of any version, as the current version (a new dict; the argument is left as it is)."""
    v = rec.get("schema_version", 1)
    if not isinstance(v, int) or v < 1:
        raise RecordVersionError(f"schema_version {v!r} is not a version")
    if v > SCHEMA_VERSION:
        raise RecordVersionError(
            f"schema_version {v} is newer than this zerobench reads ({SCHEMA_VERSION}): upgrade zerobench"
        )
    rec = dict(rec)
    while v < SCHEMA_VERSION:
        rec = UPGRADES[v](rec)
        v += 1
        rec["schema_version"] = v
    return rec
