"""Process-level repeats through real cells: interleaved, one record each with its repeat index and the
cell's own identity; --resume with more repeats runs only the missing ones; the slow= and mem= faults
land on the cell they name and change what they should."""

from __future__ import annotations

import pytest

from bench.matrix import spec
from tests.conftest import TINY, as_written, write_matrix, zerobench

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
    first = [x for x in as_written(res) if x["status"] != "started"]
    assert [(x["cell_hash"], x["repeat"]) for x in first] == [(a.hash, 1), (b.hash, 1), (a.hash, 2), (b.hash, 2)]
    assert all(x["status"] == "ok" and x["cell_id"] in (a.id, b.id) for x in first), [x["reason"] for x in first]
    assert [x["attempt"] for x in first] == [1, 1, 2, 2], "attempts count per cell, repeats included"
    assert {x["worker"]["fault_injected"] for x in first if x["cell_hash"] == a.hash} == {"mem=256@0"}
    assert {x["worker"]["fault_injected"] for x in first if x["cell_hash"] == b.hash} == {"slow=300@0"}

    # A third repeat each, without faults: two of three done, so one more per cell, nothing else.
    r = zerobench("run", str(m), "--results", str(res), "--no-report", "--repeats", "3", "--resume", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resume: 4 of 6 cell repeats" in r.stdout
    recs = [x for x in as_written(res) if x["status"] != "started"]
    third = recs[len(first) :]
    assert [(x["cell_hash"], x["repeat"], x["worker"]["fault_injected"]) for x in third] == [
        (a.hash, 3, None),
        (b.hash, 3, None),
    ]

    # mem=256: the faulted repeats' host RSS is at least 200 MiB above the clean one's.
    rss = {x["repeat"]: x["memory"]["host_rss_peak_measured_bytes"] for x in recs if x["cell_hash"] == a.hash}
    assert min(rss[1], rss[2]) - rss[3] > 200 * 2**20, rss
    # slow=300: the host waits three times what the step took so far, inside the step's clock: nominally 3/4 of
    # each faulted step. Checked within each step (the wait the worker timed against the step time it recorded),
    # not against the clean cell, whose steps a CPU-heavy process beside the run slows as much as the fault.
    for x in first:
        waits = x["worker"]["fault_wait_s"]
        if x["cell_hash"] != b.hash:
            assert waits is None, x["cell_id"]
            continue
        steps = x["step_times_s"]
        assert len(waits) == len(steps), (waits, steps)
        assert all(0.6 * t <= w < t for w, t in zip(waits, steps, strict=True)), (waits, steps)

    # A results file compared with itself is no regression, faulted repeats and all.
    r = zerobench("compare", str(res), str(res), cwd=tmp_path)
    assert r.returncode == 0, "a file against itself is no regression"
