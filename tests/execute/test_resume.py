"""--resume: a run killed with SIGKILL midway, then rerun, ends with every cell exactly once; a cell an earlier call
skipped is judged again under the resumed call's plan (a skip is no attempt)."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime

import psutil
import pytest

from bench.cli import main as cli
from bench.execute.plan import plan
from bench.records.record import Record
from bench.records.store import Store, read
from tests.conftest import ROOT, TINY, as_written, write_matrix, zerobench
from tests.faults.procs import cell_stepping, wait_for


def _tagged(tag: str) -> list[str]:
    """Command lines of the live processes whose environment carries the tag."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.environ().get("ZEROBENCH_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                found.append(" ".join(p.info["cmdline"] or []))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


@pytest.mark.slow
def test_sigkill_then_resume(tmp_path):
    m = write_matrix(
        tmp_path / "resume.yaml",
        TINY + "axes: {zero_stage: [0, 1, 2, 3]}\ninclude: [{precision: fp16, zero_stage: 0}]\n",
    )
    res = tmp_path / "resume.jsonl"
    # A tag in the environment marks this run's processes (workers inherit it): the check below must not
    # see other tests' workers running beside this one (pytest -n, or a second checkout's suite).
    tag = f"resume-{uuid.uuid4().hex}"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CUDA_VISIBLE_DEVICES": "",
        "ZEROBENCH_NO_GPU": "1",
        "ZEROBENCH_TEST_TAG": tag,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", str(m), "--results", str(res), "--no-report"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # Kill the orchestrator (not its group) while the third cell runs, as an OOM killer or a crash would.
    deadline = time.time() + 600
    while time.time() < deadline:
        recs = as_written(res) if res.exists() else []
        if sum(r["status"] == "started" for r in recs) == 3:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the run never reached its third cell")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = as_written(res)
    assert sum(r["status"] == "ok" for r in before) == 2

    r = zerobench("run", str(m), "--results", str(res), "--resume", "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    # The skipped cell (fp16 on CPU) is recorded first (the early order), then two ran: 3 have a result.
    assert [r["status"] for r in before if r["status"] != "started"] == ["skipped", "ok", "ok"]
    assert "resume: 3 of 5 cells already have a result" in r.stdout
    recs = as_written(res)
    outcomes = [x for x in recs if x["status"] not in ("started", "interrupted")]
    hashes = [x["cell_hash"] for x in outcomes]
    assert len(hashes) == 5 and len(set(hashes)) == 5, "every cell exactly once"
    assert sorted(x["status"] for x in outcomes) == ["ok"] * 4 + ["skipped"]
    interrupted = [x for x in recs if x["status"] == "interrupted"]
    assert len(interrupted) == 1 and "found by --resume" in interrupted[0]["reason"]
    rerun = next(x for x in outcomes if x["cell_hash"] == interrupted[0]["cell_hash"])
    assert rerun["attempt"] == 2 and rerun["run_id"] != interrupted[0]["run_id"]
    # The orphaned worker of the killed run exited by itself (it watches its parent).
    left = _tagged(tag)
    assert left == [], left

    # A second --resume has nothing left to do.
    r2 = zerobench("run", str(m), "--results", str(res), "--resume", "--no-report", cwd=tmp_path)
    assert r2.returncode == 0 and "resume: 5 of 5 cells" in r2.stdout
    assert len(as_written(res)) == len(recs)


@pytest.mark.slow
def test_answer_mode_killed_mid_attempt_counts_its_time_on_resume(tmp_path):
    """An answer-mode run SIGKILLed while a cell runs: --resume records that attempt interrupted with the time it
    ran (to its log's last write), and counts it against the budget."""
    m = write_matrix(tmp_path / "answer.yaml", TINY + "axes: {zero_stage: [0, 1]}\n")
    res = tmp_path / "answer.jsonl"
    # The attempt stops making progress at step 2 (it would run until the watchdog): the kill finds it running.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "ZEROBENCH_NO_GPU": "1"}
    env |= {"ZEROBENCH_FAULT": "hang@2", "TMPDIR": str(tmp)}
    args = ["run", str(m), "--answer", "--budget", "10m", "--results", str(res), "--no-report"]
    proc = subprocess.Popen([sys.executable, "-m", "bench", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        # Killed once its worker steps (an event, not a wait: on a loaded machine its imports alone outlast seconds).
        assert wait_for(lambda: cell_stepping(tmp) or proc.poll() is not None, 600) and proc.poll() is None
        (log,) = (tmp_path / "logs").rglob("*.1.log")
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.time()
        proc.wait()
        # The orphaned worker says in its log that the orchestrator is gone (it checks every second) and stops:
        # that write is the attempt's end. Resumed only then, so the resume reads the log as the attempt left it.
        assert wait_for(lambda: "is gone; stopping" in log.read_text(), 120), log.read_text()[-2000:]
        noticed = time.time()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a failed wait leaves nothing running
    assert [r["status"] for r in as_written(res)] == ["started"], "killed during the first attempt"
    start = datetime.fromisoformat(as_written(res)[0]["started_at"]).timestamp()
    r = zerobench("run", *args[1:], "--resume", cwd=tmp_path, env={"ZEROBENCH_FAULT": ""})
    assert r.returncode == 0, r.stderr[-2000:]
    cut = next(x for x in as_written(res) if x["status"] == "interrupted")
    # From its start record to that write: past the kill (less a tick of the file system's clock), before the test
    # saw the write.
    assert killed - start - 0.05 <= cut["wall_s"] <= noticed - start + 0.5, (cut, killed - start, noticed - start)
    assert "cut off by a kill" in cut["warnings"][0], cut
    spent = re.search(r"\((\d+) s of cell time spent\)", r.stdout)
    assert spent and int(spent[1]) == round(cut["wall_s"]), r.stdout[:2000]


# -- a skip is no attempt: resumed under another plan -----------------------------------------------------

COMPARE = ROOT / "matrices" / "compare-h200.yaml"


def _replayed(matrix, out, *more: str) -> int:
    """zerobench run over the committed H200 grid's recorded ends (no cell is launched)."""
    recording = str(ROOT / "results" / "compare-h200-a1.jsonl")
    return cli(["run", str(matrix), "--replay", recording, "--results", str(out), "--no-report", "--no-progress",
                *more])  # fmt: skip


def _ended(out) -> list[dict]:
    return [r for r in as_written(out) if r["status"] != "started"]


def test_a_cell_pruned_under_another_gpu_mem_runs_on_resume(tmp_path):
    # Under 30 GiB the memory model prunes the four gc-off cells; resumed with the GPU's own memory they fit, so
    # they run, each of their 3 repeats (the skip, written as repeat 1, is no outcome of repeat 1).
    out = tmp_path / "r.jsonl"
    assert _replayed(COMPARE, out, "--gpu-mem", "30GiB") == 0
    pruned = {r["cell_hash"] for r in _ended(out) if r["status"] == "skipped"}
    assert len(pruned) == 4 and all(
        r["skip"]["rule"] == "predicted-oom" for r in _ended(out) if r["status"] == "skipped"
    )
    assert _replayed(COMPARE, out, "--resume") == 0
    ran = collections.Counter(r["cell_hash"] for r in _ended(out) if r["status"] == "ok")
    assert {h: ran[h] for h in pruned} == dict.fromkeys(pruned, 3)


def test_a_skip_judged_the_same_again_is_not_written_again(tmp_path):
    # Two cells a rule stops (offload-needs-zero, gc on and off) beside the four pruned under 30 GiB. Resumed under
    # the same plan: nothing is written. Under 25 GiB: the pruned cells' skips are written anew (what they say
    # changed), the rule's are not. With the GPU's own memory: the pruned cells run, the rule's skips stand, once each.
    m = write_matrix(tmp_path / "m.yaml", COMPARE.read_text() + "include: [{zero_stage: 0, offload: optimizer}]\n")
    out = tmp_path / "r.jsonl"
    assert _replayed(m, out, "--gpu-mem", "30GiB") == 0
    first = _ended(out)
    assert collections.Counter(r["skip"]["rule"] for r in first if r["status"] == "skipped") == {
        "predicted-oom": 4, "offload-needs-zero": 2}  # fmt: skip
    assert _replayed(m, out, "--gpu-mem", "30GiB", "--resume") == 0
    assert _ended(out) == first
    assert _replayed(m, out, "--gpu-mem", "25GiB", "--resume") == 0
    anew = _ended(out)[len(first) :]
    assert len(anew) == 4 and all("of 25.0 GiB" in r["reason"] for r in anew)
    for _ in range(2):
        assert _replayed(m, out, "--resume") == 0
    last = _ended(out)
    assert sum(r["skip"]["rule"] == "offload-needs-zero" for r in last if r["status"] == "skipped") == 2
    assert sum(r["status"] == "ok" for r in last) == 8 * 3


# -- nothing left to measure: nothing paid for it ----------------------------------------------------------------


def test_a_resume_with_every_cell_done_runs_no_probe(tmp_path, monkeypatch, capsys):
    # Every runnable cell of the matrix already has an outcome in the results file (an error, here: an outcome all
    # the same): the resumed run measures nothing, so it neither probes the machine nor builds anything for it.
    m = write_matrix(tmp_path / "m.yaml", TINY + "axes: {zero_stage: [0, 1]}\n")
    out = tmp_path / "r.jsonl"
    store, at = Store(out), datetime.now().astimezone().isoformat()
    runnable = [it.cell for it in plan(str(m)).items if it.skip is None]
    assert len(runnable) == 2
    for cell in runnable:
        started = Record.started(cell, run_id="earlier", attempt=1, matrix_file=str(m), started_at=at)
        store.append(started)
        store.append(Record.error(started, "zerobench failed around this cell", ended_at=at, traceback="", log=""))
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZEROBENCH_CACHE", str(cache))
    assert cli(["run", str(m), "--results", str(out), "--resume", "--no-report", "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "resume: 2 of 2 cells already have a result" in said, said
    assert not [ln for ln in said.splitlines() if ln.startswith("probe")], said
    assert not list(cache.glob("probe/*")) and "fixed costs" not in said
    assert len(read(out)) == 4  # nothing written
