"""Faults on one rank of a 2-rank CPU cell (torchrun, gloo): the cell is classified by the rank that
failed first, not by the other rank's collateral "connection closed" error or by torchrun stopping it;
a rank killed, hung, exiting or diverging each ends the cell with its own status and names the rank.

One matrix run carries six faults, one per cell (ZEROBENCH_FAULT's ~regex picks the cell), with the
rendezvous port taken before every launch (ZEROBENCH_PORT): each cell must move to another port."""

from __future__ import annotations

import json
import re
import socket

import pytest

from tests.conftest import TINY, write_matrix, zerobench

pytestmark = pytest.mark.slow

# fault id: (the cell, the fault, allowed final statuses, what is injected)
CELLS = {
    "rank1-nan-beats-collateral": (
        "zero=0.*mb=2",
        "nan@2#1",
        {"diverged"},
        "rank 1's loss becomes NaN at step 2; rank 0 then finds its peer gone",
    ),
    "rank0-nan": ("zero=1.*mb=2", "nan@2#0", {"diverged"}, "rank 0's loss becomes NaN at step 2"),
    "rank1-sigkill": ("zero=2.*mb=2", "sigkill@1#1", {"killed"}, "rank 1 is SIGKILLed from outside at step 1"),
    "rank1-hang-watchdog": ("zero=0.*mb=4", "hang@1#1", {"timeout"}, "rank 1 stops making progress at step 1"),
    "rank0-exit-no-result": ("zero=1.*mb=4", "exit@1#0", {"error"}, "rank 0 exits with code 3 at step 1, no result"),
    "rank0-exception-whole-message": (
        "zero=2.*mb=4",
        "raise@1#0",
        {"error"},
        "rank 0 raises an exception with a two-line message at step 1",
    ),
}


def _by_name(res) -> dict[str, dict]:
    recs = [json.loads(x) for x in res.read_text().splitlines() if x.strip()]
    return {r["cell_name"]: r for r in recs if r["status"] != "started"}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks")
    m = write_matrix(
        root / "ranks.yaml", TINY + "gpus: 2\naxes: {zero_stage: [0, 1, 2], precision: [fp32], micro_batch: [2, 4]}\n"
    )
    res = root / "ranks.jsonl"
    with socket.socket() as held:  # the rendezvous port every first launch is given, already taken
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = zerobench(
            "run",
            str(m),
            "--results",
            str(res),
            "--no-report",
            cwd=root,
            env={
                "ZEROBENCH_FAULT": ",".join(f"{f}~{sel}" for sel, f, _, _ in CELLS.values()),
                "ZEROBENCH_STALL_S": "20",
                "ZEROBENCH_PORT": str(port),
            },
        )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    recs = _by_name(res)
    cells = {fid: next(n for n in recs if re.search(sel, n)) for fid, (sel, *_) in CELLS.items()}
    return {"results": res, "records": recs, "cells": cells, "port": port}


# Not serial: the watchdog arms at the first step (bench.execute.launch.protocol), and a tiny cell's steps and
# teardown take seconds, not ZEROBENCH_STALL_S's 20, on a machine running two test files at once.
@pytest.mark.parametrize("fid", list(CELLS))
def test_a_fault_on_one_rank(ranks, fid, ledger):
    sel, fault, allowed, what = CELLS[fid]
    ledger.fault(fid, f"2-rank cell: {what}")
    name = ranks["cells"][fid]
    ledger.account(ranks["results"], {name: allowed})
    rec = ranks["records"][name]
    reason = rec["reason"]
    rank = fault.split("#")[1]
    assert reason.startswith(f"rank {rank}: ") or fid == "rank1-hang-watchdog", reason
    if fid == "rank1-nan-beats-collateral":
        assert "loss became nan at step 2" in reason
        # The other rank failed after it, of it: its own end is kept, but it is not the cell's.
        ends = {d["rank"]: d["status"] for d in rec["ranks"]}
        assert ends[1] == "diverged", rec["ranks"]
    if fid == "rank0-nan":
        assert "loss became nan at step 2" in reason
    if fid == "rank1-sigkill":
        assert "killed by signal 9 from outside zerobench; no OOM evidence" in reason
        assert "fault injected" in reason and rec["worker"]["fault_injected"]
    if fid == "rank1-hang-watchdog":
        assert "no progress" in reason, reason
    if fid == "rank0-exit-no-result":
        assert "exited with code 3 without a result" in reason and "fault injected" in reason, reason
    if fid == "rank0-exception-whole-message":
        assert "injected fault\nsecond line of the injected fault's message" in reason, reason


def test_rendezvous_port_taken(ranks, ledger):
    ledger.fault("rendezvous-port-taken-two-ranks", "every 2-rank cell's first rendezvous port is already taken")
    ledger.account(ranks["results"], {ranks["cells"][f]: CELLS[f][2] for f in CELLS})
    for name in ranks["cells"].values():
        rec = ranks["records"][name]
        assert any(f"rendezvous port {ranks['port']} was in use" in w for w in rec.get("warnings") or []), rec


def test_wall_clock_timeout_on_one_rank(tmp_path, ledger):
    ledger.fault("rank1-hang-wall-clock", "2-rank cell: rank 1 hangs at step 1; only the wall-clock limit can end it")
    m = write_matrix(tmp_path / "t.yaml", TINY.replace("timeout_s: 600", "timeout_s: 30") + "gpus: 2\n")
    res = tmp_path / "t.jsonl"
    r = zerobench(
        "run",
        str(m),
        "--results",
        str(res),
        "--no-report",
        cwd=tmp_path,
        env={"ZEROBENCH_FAULT": "hang@1#1", "ZEROBENCH_STALL_S": "600"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = ledger.account(res, {"": {"timeout"}}, runs=1)[-1:]
    assert "ran past the 30 s limit" in rec["reason"], rec["reason"]
