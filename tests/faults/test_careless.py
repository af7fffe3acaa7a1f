"""Careless and hostile use of replay, resume, shards and compare: each ends in a correct result or one message
that says what to do, never a silent wrong answer.

Every case goes through the real CLI in a fresh process, over records measured on H200s (results/) or on this
CI's CPU (tests/data/); a replay (`--replay`) stands in for the GPU, so nothing here needs one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bench.records.record import parse
from bench.records.status import Status
from bench.report.tracking import _config
from tests.conftest import ROOT, zerobench

MATRIX = str(ROOT / "matrices" / "compare-h200.yaml")
A1, A2 = ROOT / "results" / "compare-h200-a1.jsonl", ROOT / "results" / "compare-h200-a2.jsonl"
ANSWER_7B = ROOT / "results" / "7b-answer-h200.jsonl"
CPU = ROOT / "tests" / "data" / "smoke_cpu.jsonl"


def _lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def _write(p: Path, recs: list[dict]) -> Path:
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def _refused(cwd: Path, *args: str, says: list[str], code: int = 2) -> str:
    """zerobench exits `code` with a message (no traceback) saying each of `says`, and writes no file."""
    before = {p: p.read_bytes() for p in cwd.rglob("*") if p.is_file()}
    r = zerobench(*args, cwd=cwd, timeout=300)
    assert r.returncode == code, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    for s in says:
        assert s in r.stderr, (s, r.stderr[-2000:])
    after = {p: p.read_bytes() for p in cwd.rglob("*") if p.is_file()}
    assert after == before, "refused, yet it wrote"
    return r.stderr


def _replay(cwd: Path, out: str, *extra: str, sources=(A1,)) -> Path:
    """The answer for compare-h200 replayed from recorded ends into `out` (a real replay run)."""
    r = zerobench("run", MATRIX, "--answer", "--replay", *map(str, sources), "--results", out, "--no-report", *extra,
                  cwd=cwd, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return cwd / out


# -- replay -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["gpu-first", "cpu-first"])
def test_replay_of_two_machines_is_refused(tmp_path, ledger, order):
    ledger.fault(f"replay-two-machines-{order}", "--replay of an H200 file and a CPU file: judged as on the first one")
    files = [str(A1), str(CPU)] if order == "gpu-first" else [str(CPU), str(A1)]
    _refused(
        tmp_path, "run", MATRIX, "--answer", "--replay", *files, "--results", "r.jsonl",
        says=["recorded on 2 kinds of machine", "1 x NVIDIA H200 (140 GiB): ", "a CPU host: ", str(CPU),
              "replay the files of one machine at a time"],
    )  # fmt: skip


def test_replay_into_its_own_source_is_refused(tmp_path, ledger):
    ledger.fault("replay-into-source", "--replay X --results X (and through a link to X): appended to what it replays")
    src = tmp_path / "a1.jsonl"
    shutil.copy(A1, src)
    (tmp_path / "link.jsonl").symlink_to(src)
    for results in ("a1.jsonl", "link.jsonl"):
        _refused(tmp_path, "run", MATRIX, "--answer", "--replay", "a1.jsonl", "--results", results,
                 says=[f"--results {results} is the --replay file a1.jsonl", "give --results a new file"])  # fmt: skip


def test_a_replay_without_results_writes_beside_its_source(tmp_path, ledger):
    ledger.fault("replay-default-results", "--replay results/M.jsonl with no --results: M's default results file")
    (tmp_path / "results").mkdir()
    src = tmp_path / "results" / "compare-h200.jsonl"  # the matrix's own results file, replayed
    shutil.copy(A1, src)
    r = zerobench("run", MATRIX, "--answer", "--replay", "results/compare-h200.jsonl", "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    # The matrix's default results file is results/local/M.jsonl: the replay's records go beside it, not beside
    # (or into) the replayed file.
    assert src.read_bytes() == A1.read_bytes() and "results: results/local/compare-h200.replay.jsonl" in r.stdout
    replayed = _lines(tmp_path / "results/local/compare-h200.replay.jsonl")
    assert all(x.get("replay") for x in replayed if x["status"] == "ok")


def test_replay_into_measured_results_is_refused(tmp_path, ledger):
    ledger.fault("replay-into-measurements", "real H200 results resumed with the replay executor")
    shutil.copy(A2, tmp_path / "a2.jsonl")
    _refused(
        tmp_path, "run", MATRIX, "--answer", "--resume", "--replay", str(A1), "--results", "a2.jsonl",
        says=["--results a2.jsonl holds 24 record(s) measured anew", "give --results a new file"],
    )  # fmt: skip


def test_replay_of_disagreeing_ends_is_refused(tmp_path, ledger):
    ledger.fault("replay-forged-oom", "a cuda_oom forged before a cell's ok in a replayed file")
    recs = _lines(A1)
    i = next(i for i, r in enumerate(recs) if r["status"] == "ok" and ",gc=on," in r["cell_name"])
    forged = {k: v for k, v in recs[i].items() if k not in ("metrics", "losses", "step_times_s", "steps")}
    forged |= {"status": "cuda_oom", "reason": "CUDA out of memory in phase measured"}
    _write(tmp_path / "forged.jsonl", recs[:i] + [forged] + recs[i:])
    _refused(
        tmp_path, "run", MATRIX, "--answer", "--replay", "forged.jsonl", "--results", "r.jsonl",
        says=["the recorded ends of 1 cell(s) disagree", recs[i]["cell_name"], f"cuda_oom (forged.jsonl:{i + 1})",
              f"ok (forged.jsonl:{i + 2})", "keep one end per cell"],
    )  # fmt: skip


def test_a_replay_is_named_in_compare_reports_and_exports(tmp_path, ledger):
    ledger.fault("replay-unnamed", "a replay compared, reported beside real records and exported: 'replay' nowhere")
    rep = _replay(tmp_path, "replay.jsonl")
    r = zerobench("compare", str(A2), "replay.jsonl", cwd=tmp_path)
    assert "current (replay.jsonl) is a replay: nothing in it ran anew" in r.stdout and str(A1) in r.stdout, r.stdout
    # A replay's records beside real ones (one file of both): the report counts each, not "nothing here ran anew".
    _write(tmp_path / "both.jsonl", _lines(A2) + _lines(rep))
    r = zerobench("report", "both.jsonl", "-o", "rep/both", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    md, html = (tmp_path / "rep/both.md").read_text(), (tmp_path / "rep/both.html").read_text()
    ran = [x for x in _lines(tmp_path / "both.jsonl") if Status(x["status"]).ran]
    n, replays = len(ran), sum(1 for x in ran if x.get("replay"))  # the answer measures what it needs: counted
    assert f"**Replay**: {replays} of the {n} attempts that ran here are replays" in md
    assert f"the other {n - replays} ran" in md and 0 < replays < n
    assert "nothing here ran anew" not in md and f"{replays} of the {n} attempts" in html
    r = zerobench("export", "replay.jsonl", "--pytest-benchmark", "pb.json", cwd=tmp_path)
    assert r.returncode == 0 and "replayed record(s) among them" in r.stdout, r.stderr[-2000:]
    benches = json.loads((tmp_path / "pb.json").read_text())["benchmarks"]
    assert benches and all(b["extra_info"]["replayed_from"] == str(A1) for b in benches)
    replayed = next(x for x in _lines(rep) if x.get("replay"))
    assert _config(parse(replayed))["replay.source"] == str(A1)  # W&B: its config (and a `replay` tag)


# -- compare ---------------------------------------------------------------------------------------------------


def test_compare_of_shards_with_no_cell_in_common_exits_3(tmp_path, ledger):
    ledger.fault("compare-disjoint-shards", "two shards of one matrix compared: no cell in common")
    for i in (1, 2):
        r = zerobench("run", MATRIX, "--shard", f"{i}/2", "--replay", str(A1), "--results", f"s{i}.jsonl",
                      "--no-report", cwd=tmp_path)  # fmt: skip
        assert r.returncode == 0, r.stderr[-2000:]
    r = zerobench("compare", "s1.jsonl", "s2.jsonl", cwd=tmp_path)
    assert r.returncode == 3, (r.returncode, r.stdout[-2000:])
    assert "**Compared too little**" in r.stdout and "compared 0 of the baseline's" in r.stderr


def test_compare_of_a_few_cells_against_the_whole_exits_3(tmp_path, ledger):
    ledger.fault("compare-too-few-cells", "a baseline of 8 cells against a file holding 2 of them")
    r = zerobench("run", MATRIX, "--filter", "zero=0", "--replay", str(A2), "--results", "part.jsonl", "--no-report",
                  cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    r = zerobench("compare", str(A1), "part.jsonl", "--md", "c.md", cwd=tmp_path)
    assert r.returncode == 3, (r.returncode, r.stdout[-2000:])
    assert "compared 2 of the baseline's 8 cells that ran: too little (at least 50% must be" in r.stdout
    (tmp_path / "t.yaml").write_text("min_compared: 0.25\n")  # a gate on a part, on purpose
    r = zerobench("compare", str(A1), "part.jsonl", "--thresholds", "t.yaml", cwd=tmp_path)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:])


def test_compare_short_schedules_against_full_ones_is_not_a_regression(tmp_path, ledger):
    ledger.fault("compare-short-schedule", "answer mode's rung-0 records against the same cells' full schedule")
    recs = [r for r in _lines(ANSWER_7B) if r["status"] == "ok"]
    full = [r for r in recs if r["answer"]["rung"] == 1]
    short = [r for r in recs if r["answer"]["rung"] == 0 and r["cell_hash"] in {f["cell_hash"] for f in full}]
    assert len(full) == len(short) == 9
    _write(tmp_path / "full.jsonl", full)
    _write(tmp_path / "short.jsonl", short)
    r = zerobench("compare", "full.jsonl", "short.jsonl", "--md", "c.md", cwd=tmp_path)
    assert r.returncode == 3 and "regression" not in r.stdout, (r.returncode, r.stdout[-3000:])
    md = (tmp_path / "c.md").read_text()
    assert "Step schedules differ, so those cells are not comparable (not regressions)" in md
    assert sum(int(x.rsplit("|", 2)[1]) for x in md.splitlines() if "short schedule (rung 0) |" in x) == 9
    # The answer's own file (both rungs) against the full runs: each cell judged on its full schedule.
    r = zerobench("compare", "full.jsonl", str(ANSWER_7B), cwd=tmp_path)
    assert r.returncode == 0 and "compared 9 of the baseline's 9 cells" in r.stdout, r.stdout[-3000:]


def test_compare_of_an_answer_against_a_full_run(tmp_path, ledger):
    ledger.fault("compare-unmeasured", "an answer's unmeasured cells against a full run's ok ones")
    _replay(tmp_path, "answer.jsonl")
    left = sum(r["status"] == "unmeasured" for r in _lines(tmp_path / "answer.jsonl"))
    assert left
    r = zerobench("compare", str(A2), "answer.jsonl", cwd=tmp_path)
    said = f"**No regression** in 8 cells ({8 - left} unchanged, {left} not run)"
    assert r.returncode == 0 and said in r.stdout, r.stdout


# -- answer mode, resumed ------------------------------------------------------------------------------------


def test_resume_with_another_group_by_is_refused(tmp_path, ledger):
    ledger.fault("resume-group-by", "an answer resumed with another --group-by")
    _replay(tmp_path, "r.jsonl", "--budget", "30s")
    _refused(
        tmp_path, "run", MATRIX, "--answer", "--resume", "--group-by", "zero_stage", "--replay", str(A1),
        "--results", "r.jsonl",
        says=["--group-by zero_stage: the answer in r.jsonl was grouped by peft", "resume with --group-by peft"],
    )  # fmt: skip


def test_resume_with_the_budget_spent_says_so(tmp_path, ledger):
    ledger.fault("resume-budget-spent", "an answer resumed with its --budget already spent")
    first = [r for r in _lines(_replay(tmp_path, "r.jsonl", "--budget", "15s")) if r["status"] == "unmeasured"]
    assert {r["answer"]["needed"] for r in first} == {True, False}  # some were not needed, some could still count
    n = len(_lines(tmp_path / "r.jsonl"))
    r = zerobench("run", MATRIX, "--answer", "--resume", "--budget", "15s", "--replay", str(A1), "--results", "r.jsonl",
                  "--no-report", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    spent = sum(x.get("wall_s") or 0 for x in _lines(tmp_path / "r.jsonl")[:n] if x["status"] != "started")
    assert f"--budget 15 s is the whole search's, {15 - spent:.0f} s of it left" in r.stdout, r.stdout
    assert "the budget left afforded no attempt: this call measured nothing" in r.stdout
    again = [x for x in _lines(tmp_path / "r.jsonl")[n:] if x["status"] == "unmeasured"]
    assert again and not [x for x in again if "not needed" in x["reason"]], [x["reason"] for x in again]
    spent = [x for x in again if x["reason"].endswith("spent before this call could measure anything")]
    assert spent and all("not needed:" in x["answer"]["why"] and not x["answer"]["needed"] for x in spent)
    r = zerobench("run", MATRIX, "--answer", "--resume", "--budget", "10s", "--replay", str(A1), "--results", "r.jsonl",
                  "--no-report", cwd=tmp_path)  # fmt: skip
    assert "the --budget (10 s, the whole search's) is already spent: nothing more is measured" in r.stdout


def test_an_attempt_cut_off_by_a_kill_counts_against_the_budget(tmp_path, ledger):
    ledger.fault("resume-killed-attempt", "answer mode killed mid-attempt, then resumed: the attempt's time")
    whole = _lines(_replay(tmp_path, "r.jsonl"))
    # What SIGKILL leaves mid-attempt: the file ends with the attempt's start; its worker wrote its log for 40 s.
    i = next(i for i, x in enumerate(whole) if x["status"] == "started" and i > 3)
    start = whole[i]
    _write(tmp_path / "r.jsonl", whole[: i + 1])
    log = tmp_path / "logs" / "r" / f"{start['cell_hash']}.{start['attempt']}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("step 3\n")
    from datetime import datetime

    t0 = datetime.fromisoformat(start["started_at"]).timestamp()
    os.utime(log, (t0 + 40, t0 + 40))
    spent = sum(x.get("wall_s") or 0 for x in whole[:i])
    r = zerobench("run", MATRIX, "--answer", "--resume", "--budget", "10m", "--replay", str(A1), "--results", "r.jsonl",
                  "--no-report", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    cut = next(x for x in _lines(tmp_path / "r.jsonl") if x["status"] == "interrupted")
    assert cut["wall_s"] == pytest.approx(40, abs=0.01) and "cut off by a kill" in cut["warnings"][0]
    assert f"({spent + 40:.0f} s of cell time spent)" in r.stdout, r.stdout[:2000]


# -- estimate ------------------------------------------------------------------------------------------------


def test_estimate_check_of_one_results_file(tmp_path, ledger):
    ledger.fault("estimate-check-one-file", "zerobench estimate --check ONE_FILE: leave-one-file-out leaves nothing")
    r = zerobench("estimate", "--check", str(ANSWER_7B), cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "note: these records are all from" in r.stdout and "give records of two or more results files" in r.stdout
    step = r.stdout.split("Step-time model", 1)
    assert len(step) == 2 and "held out (leave one results file out)" not in step[1]  # no fold to hold out
