"""The fault suite's ledger: every test here injects one named fault into real processes and files,
then accounts for the results file the way a user would, from the bytes on disk.

A test declares its fault and the statuses each cell may end with:

    def test_worker_sigkill(ledger, tmp_path):
        ledger.fault("worker-sigkill-mid-step", "the worker is SIGKILLed at step 2")
        ...run zerobench...
        ledger.account(results_path, {"cell name or hash": {"killed"}})

`account` reads the JSONL itself (not through zerobench's reader, which is under test), counts
records lost (an expected cell with no outcome), duplicated (a cell with more than one final outcome
in one run) and statuses wrong (a final status outside the allowed set), and asserts all three are 0.
Each test's fault, outcome and counts go to the ledger file (ZEROBENCH_FAULT_LEDGER), which
`python -m tests.faults` summarises.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

# Statuses that are progress marks, not outcomes: a cell with only these has no outcome.
NOT_FINAL = {"started"}


@dataclass
class Entry:
    test: str
    fault: str = ""
    description: str = ""
    cells: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    torn_lines: int = 0
    outcome: str = ""  # passed / failed, from pytest
    details: list[str] = field(default_factory=list)


class Ledger:
    def __init__(self, test: str):
        self.entry = Entry(test=test)

    def fault(self, fault_id: str, description: str) -> None:
        """Name the injected fault (ids are unique across the suite; the summary counts distinct ids)."""
        self.entry.fault, self.entry.description = fault_id, description

    def account(self, results: Path, expect: dict[str, set[str]], *, runs: int | None = None) -> list[dict]:
        """Check the results file against the expected outcomes; returns its whole records.

        expect maps a cell (its cell_name, or a prefix of its cell_hash) to the statuses allowed for its
        final outcome. "interrupted" counts as final only when it is the cell's last record. A cell with
        several final records in one run_id is duplicated; with runs given, the file must hold exactly that
        many distinct run_ids."""
        e = self.entry
        recs, torn = [], 0
        raw = Path(results).read_bytes() if Path(results).exists() else b""
        for line in raw.splitlines():
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                torn += 1
                continue
            if isinstance(r, dict):
                recs.append(r)
        e.torn_lines += torn

        def matches(r: dict, key: str) -> bool:
            # A compact record (a cell that did not run) writes cell_id alone: name#hash.
            name, _, h = str(r.get("cell_id", "")).rpartition("#")
            return (r.get("cell_name") or name) == key or str(r.get("cell_hash") or h).startswith(key)

        e.cells += len(expect)
        for key, allowed in expect.items():
            mine = [r for r in recs if matches(r, key)]
            final = [r for r in mine if r.get("status") not in NOT_FINAL]
            if not final:
                e.lost += 1
                e.details.append(f"lost: {key} ({len(mine)} progress records)")
                continue
            per_run: dict[str, list[dict]] = {}
            for r in final:
                per_run.setdefault(str(r.get("run_id")), []).append(r)
            for run_id, rs in per_run.items():
                settled = [r for r in rs if r.get("status") != "interrupted"]
                if len(settled) > 1:
                    e.duplicated += len(settled) - 1
                    e.details.append(f"duplicated: {key} has {len(settled)} outcomes in run {run_id}")
            last = final[-1]
            if last.get("status") not in allowed:
                e.wrong += 1
                e.details.append(
                    f"wrong: {key} ended {last.get('status')!r} ({last.get('reason', '')!r}), allowed {sorted(allowed)}"
                )
        if runs is not None:
            got = len({r.get("run_id") for r in recs})
            if got != runs:
                e.details.append(f"runs: {got} run ids, expected {runs}")
                e.wrong += 1
        assert not (e.lost or e.duplicated or e.wrong), "; ".join(e.details)
        return recs


def _ledger_path() -> Path | None:
    p = os.environ.get("ZEROBENCH_FAULT_LEDGER")
    return Path(p) if p else None


@pytest.fixture
def ledger(request):
    led = Ledger(request.node.nodeid)
    request.node._fault_ledger = led
    yield led


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    led = getattr(item, "_fault_ledger", None)
    path = _ledger_path()
    if led is not None and path is not None and (rep.when == "call" or (rep.when == "setup" and rep.failed)):
        led.entry.outcome = rep.outcome
        with path.open("a") as f:
            f.write(json.dumps(asdict(led.entry)) + "\n")
    return rep
