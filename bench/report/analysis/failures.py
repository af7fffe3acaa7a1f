"""Cells that ran and did not end ok, grouped by cause (their reasons with what varies masked) or by the rule
that skipped them."""

from __future__ import annotations

import re

import pandas as pd

from .values import NOT_RUN, STATUS_ORDER, records


def _failure_groups(failures: pd.DataFrame) -> list[dict]:
    """Cells that did not end ok, grouped by cause: first those that ran (error, out of memory, diverged, ...),
    their reasons grouped as `causes` says, most cells first; then those that did not run (skipped by a rule
    or pruned, implied out of memory, left unmeasured), by rule or reason. Each group: status, `reason` (the
    cause: the reason with the words that vary between its cells as "…"), `n`, `cells` (names), `example` and
    `example_reason` (its first cell and that cell's own reason), `rule` (a skip's) and `ran`."""
    if failures.empty:
        return []
    rows = records(failures, _GROUP_FIELDS)
    ran = [r for r in rows if r["status"] not in NOT_RUN]
    out = _by_cause(ran) + _by_rule([r for r in rows if r["status"] in NOT_RUN])
    return out


def _by_cause(rows: list[dict]) -> list[dict]:
    """Attempts that failed, grouped by cause (causes), most cells first, then by status order."""
    rank = {s: i for i, s in enumerate(STATUS_ORDER)}
    groups: dict[tuple[str, str, int], list[dict]] = {}
    for st in dict.fromkeys(r["status"] for r in rows):
        mine = [r for r in rows if r["status"] == st]
        for cause, members in causes([str(r["reason"] or "") for r in mine]):
            groups[(st, cause, members[0])] = [mine[i] for i in members]
    out = [_group(st, cause, members, ran=True) for (st, cause, _), members in groups.items()]
    out.sort(key=lambda d: (-d["n"], rank.get(d["status"], len(rank))))
    return out


def _by_rule(rows: list[dict]) -> list[dict]:
    """Cells that did not run, by status and rule (a skip) or reason, in status order, most cells first."""
    rank = {s: i for i, s in enumerate(STATUS_ORDER)}
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        rule = r["skip_rule"] if isinstance(r["skip_rule"], str) else None
        groups.setdefault((r["status"], rule or str(r["reason"] or "")), []).append(r)
    out = []
    for (st, _), members in groups.items():
        g = _group(st, str(members[0]["reason"] or ""), members, ran=False)
        g["rule"] = members[0]["skip_rule"] if isinstance(members[0]["skip_rule"], str) else None
        wordings = len({m["reason"] for m in members})
        g["wordings"] = wordings
        out.append(g)
    out.sort(key=lambda d: (rank.get(d["status"], len(rank)), -d["n"], d["reason"]))
    return out


def _group(status: str, cause: str, members: list[dict], ran: bool) -> dict:
    first = members[0]
    return {
        "status": status, "reason": cause, "n": len(members), "cells": [m["cell_name"] for m in members],
        "example": first["cell_name"], "example_reason": str(first["reason"] or ""), "rule": None, "ran": ran,
    }  # fmt: skip


_GROUP_FIELDS = ["status", "reason", "cell_name", "skip_rule"]

_VARIES = "…"

# What varies between reasons of one cause: numbers, addresses, quoted names, paths of one attempt.
_MASKS = [
    (re.compile(r"'[^']*'|\"[^\"]*\""), "'…'"),
    (re.compile(r"(?<![\w.])(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)?)(?![\w.])"), "N"),
    (re.compile(r"(?:/[\w.+-]+){2,}/?"), "PATH"),
]


def causes(reasons: list[str]) -> list[tuple[str, list[int]]]:
    """Reasons grouped by cause: after masking what varies between attempts (numbers, quoted names, paths), the
    reasons of one cause have the same words but for at most one in ten (at least one), where they differ in
    a name (an optimizer's class, a file). Returns each cause (its reason where all of its reasons are the
    same; else the masked words, "…" where they differ) with the indexes of its reasons, the most first."""
    words = [_masked(r) for r in reasons]
    order = sorted(range(len(reasons)), key=lambda i: (-words.count(words[i]), i))
    groups: list[tuple[list[str], list[int]]] = []
    for i in order:
        w = words[i].split()
        for template, members in groups:
            diff = [k for k, (a, b) in enumerate(zip(template, w)) if a != b]
            if len(template) == len(w) and len(diff) <= max(1, len(w) // 10):
                for k in diff:
                    template[k] = _VARIES
                members.append(i)
                break
        else:
            groups.append((w, [i]))
    groups.sort(key=lambda g: (-len(g[1]), g[1][0]))
    out = []
    for template, members in groups:
        same = len({reasons[i] for i in members}) == 1
        out.append((reasons[members[0]] if same else " ".join(template), sorted(members)))
    return out


def _masked(reason: str) -> str:
    text = " ".join(reason.split())[:400]
    for rx, to in _MASKS:
        text = rx.sub(to, text)
    return text
