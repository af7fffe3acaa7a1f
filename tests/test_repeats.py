"""Process-level repeats through real cells: interleaved, one record each with its repeat index and the
cell's own identity; --resume with more repeats runs only the missing ones; the slow= and mem= faults
land on the cell they name and change what they should."""

from __future__ import annotations

import statistics

import pytest

from bench.matrix import spec
from bench.records.store import read
from tests.conftest import TINY, write_matrix, zerobench

pytestmark = pytest.mark.slow


def test_repeats_interleave_resume_and_targeted_faults(tmp_path):
    m = write_matrix(tmp_path / "rep.yaml", TINY.replace("measured: 4", "measured: 6") + "axes: {zero_stage: [0, 1]}\n")
    a, b = spec.expand(spec.load(m))
    res = tmp_path / "rep.jsonl"
    fault = f"slow=300~{b.hash},mem=256~{a.hash}"
    r = zerobench(
        "run",
        str(m),
        "--results",
        str(res),
        "--no-report",
        "--repeats",
        "2",
        cwd=tmp_path,
        env={"ZEROBENCH_FAULT": fault},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    first = [x for x in read(res) if x["status"] != "started"]
    assert [(x["cell_hash"], x["repeat"]) for x in first] == [(a.hash, 1), (b.hash, 1), (a.hash, 2), (b.hash, 2)]
    assert all(x["status"] == "ok" and x["cell_id"] in (a.id, b.id) for x in first), [x["reason"] for x in first]
    assert [x["attempt"] for x in first] == [1, 1, 2, 2], "attempts count per cell, repeats included"
    assert {x["worker"]["fault_injected"] for x in first if x["cell_hash"] == a.hash} == {"mem=256@0"}
    assert {x["worker"]["fault_injected"] for x in first if x["cell_hash"] == b.hash} == {"slow=300@0"}

    # A third repeat each, without faults: two of three done, so one more per cell, nothing else.
    r = zerobench("run", str(m), "--results", str(res), "--no-report", "--repeats", "3", "--resume", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resume: 4 of 6 cell repeats" in r.stdout
    recs = [x for x in read(res) if x["status"] != "started"]
    third = recs[len(first) :]
    assert [(x["cell_hash"], x["repeat"], x["worker"]["fault_injected"]) for x in third] == [
        (a.hash, 3, None),
        (b.hash, 3, None),
    ]

    # mem=256: the faulted repeats' host RSS is at least 200 MiB above the clean one's.
    rss = {x["repeat"]: x["memory"]["host_rss_peak_measured_bytes"] for x in recs if x["cell_hash"] == a.hash}
    assert min(rss[1], rss[2]) - rss[3] > 200 * 2**20, rss
    # slow=300: each measured step takes four times as long (the host waits three times what the step took).
    # Against the clean cell beside it in the same run (a1, b1, a2, b2: the same load, the same moment), not
    # against a later run's: a busy 2-core host can make one run's steps several times another's. Two cores
    # shared with other jobs can halve or double a step, so the bound is 2x, not 4x.
    med = {
        (x["cell_hash"], x["repeat"]): statistics.median(x["step_times_s"][x["cell"]["warmup_steps"] :]) for x in first
    }
    slowed = sum(med[(b.hash, k)] for k in (1, 2)) / sum(med[(a.hash, k)] for k in (1, 2))
    assert slowed > 2, med

    # The comparison of the clean repeat against the faulted ones sees both (one repeat a side: by the
    # minimum effect alone; the slowdown is ~50% of tokens/s, far past 15%).
    r = zerobench("compare", str(res), str(res), cwd=tmp_path)
    assert r.returncode == 0, "a file against itself is no regression"
