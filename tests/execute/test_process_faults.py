"""The fault suite's process side, in pieces that need no training run: the fault specs and their
validation, the classification of a killed worker and of a multi-rank end, the stale-lock check
against real processes, held signals, whole failure messages, and the report's notes. The same
behaviours end to end, with real workers, are in tests/faults/."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bench.execute import launch
from bench.execute.launch import folders
from bench.execute.launch.outcome import Outcome, _classify
from bench.host import hostmem
from bench.matrix import faults
from bench.matrix.cells import Cell
from bench.records.measured import worker_documents
from bench.records.record import Record, WorkerDoc
from bench.records.status import Status
from bench.worker import ops
from bench.worker.main import REASON_MAX, short_message

CELL = Cell(model="llama-tiny", seq_len=32, micro_batch=2, warmup_steps=1, measured_steps=4)
TWO = Cell(model="llama-tiny", seq_len=32, micro_batch=2, warmup_steps=1, measured_steps=4, gpus=2)


# -- faults: parsed once, checked against the cells before anything runs ------------------------------


def test_fault_specs_parse_and_pick_the_rank_and_cell():
    fs = faults.parse("nan@2#1~zero=0,hang@3")
    assert fs == [faults.Fault("nan", 2, 1, "zero=0"), faults.Fault("hang", 3)]
    assert faults.for_worker("nan@2#1~zero=0,hang@3", 1, "zero=0,mb=2#abc").kind == "nan"
    assert faults.for_worker("nan@2#1~zero=0,hang@3", 0, "zero=0,mb=2#abc").kind == "hang"
    assert faults.for_worker("nan@2#1~zero=1", 1, "zero=0,mb=2#abc") is None
    with pytest.raises(faults.FaultError, match="kind one of"):
        faults.parse("explode@1")


def test_a_fault_that_would_never_fire_is_a_problem():
    steps = CELL.warmup_steps + CELL.measured_steps
    assert faults.check(f"nan@{steps - 1}", [CELL]) == []
    (p,) = faults.check(f"nan@{steps}", [CELL])
    assert "would never fire" in p[1] and f"0-{steps - 1}" in p[1]
    assert "ranks 0-0" in faults.check("raise@1#1", [CELL])[0][1]
    assert faults.check("raise@1#1", [TWO]) == []
    assert "matches no cell" in faults.check("raise@1~zero=3", [CELL])[0][1]
    hf = Cell(model="llama-tiny", seq_len=32, micro_batch=2, engine="hf_trainer")
    assert "cannot poison" in faults.check("nan@1", [hf])[0][1]
    assert "memory cgroup limit" in faults.check("oom@1", [CELL])[0][1]
    assert faults.check("oom@1", [CELL], memory_limited=True) == []


# -- a SIGKILLed worker: host_oom only with evidence ------------------------------------------------


def _dead(**kw) -> Outcome:
    base = dict(status=Status.ERROR, reason="", ranks=[], exit_code=-9, log_tail="", phase_at_end="measured")
    return Outcome(**{**base, **kw})


def test_a_sigkill_without_oom_evidence_is_killed():
    st, why = _classify(_dead(telemetry={"all": {"host_rss_peak_bytes": 2**30}}), None, CELL)
    assert st is Status.KILLED and why.startswith("killed by signal 9 from outside zerobench; no OOM evidence")
    assert not Status.KILLED.is_outcome, "--resume runs a killed cell again"
    assert Status.HOST_OOM.is_outcome


def test_a_sigkill_with_an_oom_kill_counted_is_host_oom():
    before, after = hostmem.OomCounts(cgroup=3, host=7), hostmem.OomCounts(cgroup=4, host=8)
    evidence = before.rise(after)
    assert evidence == "the memory cgroup's oom_kill count rose from 3 to 4"
    st, why = _classify(_dead(oom_evidence=evidence), None, CELL)
    assert st is Status.HOST_OOM and evidence in why
    assert hostmem.OomCounts(None, 1).rise(hostmem.OomCounts(None, 2)).startswith("the kernel's oom_kill count")
    assert hostmem.OomCounts(1, 1).rise(hostmem.OomCounts(1, 1)) is None


def test_a_sigkill_at_the_memory_limit_is_host_oom():
    limit = hostmem.memory_limit()
    st, why = _classify(_dead(telemetry={"all": {"host_rss_peak_bytes": int(limit * 0.95)}}), None, CELL)
    assert st is Status.HOST_OOM and "within 10% of the" in why


def test_the_oom_counters_of_this_host_are_readable():
    # Linux exposes both; the classification above depends on them (None would mean: no evidence).
    counts = hostmem.oom_kills()
    assert counts.host is not None and counts.host >= 0
    assert hostmem.memory_limit() and hostmem.memory_limit() <= hostmem.host_memory()


# -- several ranks: the first rank's root cause wins -----------------------------------------------


def _doc(rank, status, reason, t_end):
    return WorkerDoc(rank=rank, status=status, reason=reason, t_end=t_end)


def test_divergence_beats_the_other_ranks_collateral_error():
    docs = [
        _doc(0, "error", "RuntimeError in phase measured: [gloo/pair.cc:534] Connection closed by peer", 12.0),
        _doc(1, "diverged", "loss became nan at step 2", 10.0),
    ]
    st, why = _classify(_dead(ranks=docs, exit_code=1), None, TWO)
    assert (st, why) == (Status.DIVERGED, "rank 1: loss became nan at step 2")


def test_the_first_failing_rank_by_time_is_the_cause():
    docs = [_doc(0, "cuda_oom", "CUDA out of memory", 11.0), _doc(1, "error", "ValueError: bad", 10.0)]
    st, why = _classify(_dead(ranks=docs, exit_code=1), None, TWO)
    assert st is Status.ERROR and why == "rank 1: ValueError: bad"


def test_a_rank_killed_without_a_document_is_named_from_torchruns_summary():
    tail = (
        "Root Cause (first observed failure):\n[0]:\n  time      : x\n  host      : h\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 42)\n  error_file: <N/A>\n"
        "  traceback : Signal 9 (SIGKILL) received by PID 42\n============================================"
    )
    docs = [_doc(0, "error", "RuntimeError: Connection reset by peer", 10.0)]
    st, why = _classify(_dead(ranks=docs, exit_code=1, log_tail=tail), None, TWO)
    assert st is Status.KILLED and why.startswith("rank 1: killed by signal 9 from outside zerobench"), why


def test_a_rank_stopped_while_writing_its_reason_is_not_the_cause():
    # CI: rank 1 SIGKILLed; torchrun's SIGTERM reached rank 0 while it was writing its gloo error, which
    # left status error with no reason, and that outranked rank 1's end ("error: 'rank 0: '").
    tail = (
        "Root Cause (first observed failure):\n[0]:\n  rank      : 1 (local_rank: 1)\n"
        "  exitcode  : -9 (pid: 42)\n============================================"
    )
    st, why = _classify(_dead(ranks=[_doc(0, "error", "", 10.0)], exit_code=1, log_tail=tail), None, TWO)
    assert st is Status.KILLED and why.startswith("rank 1: killed by signal 9"), why


def test_once_a_worker_has_ended_a_stop_signal_does_not_cut_its_document_short():
    code = (
        "import os, signal; from bench.worker.main import _defer_stop_signals; _defer_stop_signals(); "
        "os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGINT); print('wrote it')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout.strip()) == (0, "wrote it"), r.stderr[-1000:]


# -- whole messages ----------------------------------------------------------------------------------


def test_a_failure_reason_keeps_every_line_of_the_message():
    e = ValueError("Please correct the following DeepSpeed config values:\n- ds fp16.enabled=True vs hf fp16=False")
    assert short_message(e) == str(e)
    long = short_message(RuntimeError("x" * 5000))
    assert len(long) <= REASON_MAX and long.endswith("more characters in the traceback)")


# -- held signals --------------------------------------------------------------------------------------


def test_a_signal_inside_a_held_block_lands_after_it():
    seen = []

    def handler(signum, _frame):
        raise KeyboardInterrupt(signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with launch.holding_signals():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                seen.append("the block finished")
        assert seen == ["the block finished"]
    finally:
        signal.signal(signal.SIGTERM, old)


# -- stale extension locks, against real processes -----------------------------------------------


def test_a_lock_no_process_holds_is_removed(tmp_path):
    (tmp_path / "lock").write_text("")
    removed, held = ops.clear_stale_lock(tmp_path)
    assert removed and "removed a stale lock" in removed and held is None
    assert not (tmp_path / "lock").exists()
    assert ops.clear_stale_lock(tmp_path) == (None, None)


def test_a_lock_a_live_build_holds_is_kept_until_its_holder_dies(tmp_path):
    lock = tmp_path / "lock"
    # As torch's FileBaton holds it: created exclusively, kept open while the build runs.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, time; fd = os.open({str(lock)!r}, os.O_CREAT | os.O_EXCL); print('held', flush=True); "
            "time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline().strip() == b"held"
        removed, held = ops.clear_stale_lock(tmp_path)
        assert removed is None and f"pid {holder.pid}" in held and lock.exists()
    finally:
        holder.kill()
        holder.wait()
    removed, _ = ops.clear_stale_lock(tmp_path)
    assert removed and not lock.exists()


# -- the report says what a record warns of -------------------------------------------------------


def test_warnings_reach_the_reports_notes(tmp_path):
    from bench.report import write_reports

    started = Record.started(CELL, run_id="r", attempt=1, matrix_file="m.yaml", started_at="2026-01-01T00:00:00Z")
    doc = {
        "rank": 0,
        "status": "ok",
        "reason": "",
        "losses": [3.0, 2.0],
        "step_times_s": [0.1, 0.1],
        "metrics": {"tokens_per_s": 640.0, "step_time_median_s": 0.1},  # 64 tokens per step
        "ops_built": [{"op": "deepspeed_shm_comm", "s": 61.5}],
    }
    out = Outcome(status=Status.OK, reason="", ranks=worker_documents([doc])[0], exit_code=0, wall_s=70.0,
                  warnings=["port note"])  # fmt: skip
    rec = Record.from_outcome(started, out, ds_config={}, log="l", ended_at="2026-01-01T00:01:10Z")
    assert rec.warnings == [
        "port note",
        "op deepspeed_shm_comm was built inside the cell (61.5 s): its wall time and setup memory include the build",
    ]
    res = tmp_path / "r.jsonl"
    res.write_text(json.dumps(rec.to_dict()) + "\n")
    paths = write_reports([res], tmp_path / "r")
    md = Path(next(p for p in paths if str(p).endswith(".md"))).read_text()
    html = Path(next(p for p in paths if str(p).endswith(".html"))).read_text()
    assert "## Notes" in md and "deepspeed\\_shm\\_comm was built inside the cell" in md
    assert 'id="notes"' in html and "deepspeed_shm_comm was built inside the cell" in html


# -- attempt folders of a killed orchestrator --------------------------------------------------------


def test_attempt_folders_of_a_dead_orchestrator_are_swept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_tag = folders._owner_tag(gone.pid)  # taken while it lives (or as it exits)
    gone.wait()
    dead, mine, alien = (tmp_path / f"zerobench-{n}" for n in ("dead", "mine", "alien"))
    for d in (dead, mine, alien):
        d.mkdir()
        (d / "spec.json").write_text("{}")
    (dead / "owner").write_text(dead_tag if not dead_tag.endswith(" 0") else f"{gone.pid} 1.00")
    (mine / "owner").write_text(folders._owner_tag(os.getpid()))  # a run still going: keep
    launch.sweep_attempt_folders()
    assert not dead.exists()
    assert mine.exists() and alien.exists(), "a live run's folder, or one without an owner, is not ours to remove"


def test_the_sweep_leaves_folders_it_cannot_prove_dead(tmp_path, monkeypatch):
    """Runs in other PID namespaces (containers sharing the temp dir) name PIDs that mean nothing here: their
    folders stay unless very old; a folder without zerobench's exact owner marker is never ours to remove."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a PID dead in our namespace, as another container's live orchestrator looks from here
    tag = json.loads(folders._owner_tag(os.getpid()))
    foreign, old_foreign, plain, dead = (
        tmp_path / f"zerobench-{n}" for n in ("foreign", "oldforeign", "plain", "dead")
    )
    for d in (foreign, old_foreign, plain, dead):
        d.mkdir()
    other_ns = {**tag, "pid": gone.pid, "pid_ns": (tag["pid_ns"] or 0) + 1}
    (foreign / "owner").write_text(json.dumps(other_ns))
    (old_foreign / "owner").write_text(json.dumps(other_ns))
    week_ago = time.time() - folders._FOREIGN_MAX_AGE_S - 60
    os.utime(old_foreign / "owner", (week_ago, week_ago))
    (plain / "owner").write_text(f"{gone.pid} 1.00")  # "PID CREATE_TIME" without the marker: not provably ours
    (dead / "owner").write_text(json.dumps({**tag, "pid": gone.pid}))  # our namespace, owner dead
    launch.sweep_attempt_folders()
    assert foreign.exists(), "a live run in another PID namespace lost its attempt folder"
    assert plain.exists(), "a folder without zerobench's marker was deleted"
    assert not old_foreign.exists() and not dead.exists()
