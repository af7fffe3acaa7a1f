"""The orchestrator stopped by SIGKILL, SIGTERM or SIGINT in each phase of a run (the op prebuild
compiling, the fork server starting, a cell stepping, the report being written), each stop followed
by `--resume`: every cell ends with exactly one outcome, nothing the run started keeps running, and
SIGTERM behaves as Ctrl-C does (the worker stopped, the cell recorded interrupted, the report of what
finished written, temporary folders removed, exit code 128 + the signal's number).

One chain of runs on one results file serves all twelve faults (each run costs the imports and the
op prebuild): the runs are made once per module, and each fault's test checks its own stop."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import TINY, copy_built_ops, write_matrix
from tests.faults.procs import (
    SIGNALS,
    Run,
    attempt_dirs,
    cell_stepping,
    compiler_running,
    env,
    forkserver_running,
    wait_for,
)

# copies_ops: it copies the machine's built DeepSpeed ops (a build beside it would leave a partial copy).
pytestmark = [pytest.mark.slow, pytest.mark.copies_ops]

PHASES = {
    "prebuild": "while the op prebuild compiles (a fresh extensions folder)",
    "forkserver": "while the fork server imports its stack",
    "cell": "while a cell's worker steps",
    "report": "as the report begins (every record already stored; the run holds there until the signal)",
}
EXIT = {"sigkill": -9, "sigterm": 143, "sigint": 130}


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Run the chain; return the results file, the cell's name and, per (signal, phase), what was seen."""
    root = tmp_path_factory.mktemp("signals")
    m = write_matrix(root / "sig.yaml", TINY + "axes: {precision: [fp32]}\n")
    res = root / "sig.jsonl"
    seen: dict[tuple[str, str], dict] = {}
    n = 0

    def step(sig: str, phase: str, marker, *, ext: Path | None = None, report: bool = False) -> None:
        nonlocal n
        n += 1
        tmp = root / f"tmp{n}"
        extra = {"TORCH_EXTENSIONS_DIR": str(ext)} if ext else {}
        args = [str(m), "--results", str(res), "--resume", "--no-progress", "--report", str(root / f"report{n}")]
        hold = root / f"report-held{n}" if phase == "report" else None
        out = root / f"out{n}.txt"
        run = Run(args + ([] if report else ["--no-report"]), root, env(tmp, **extra), out, hold=hold).start()
        before = len(_records(res))
        hit = wait_for(lambda: marker(run, tmp) or run.proc.poll() is not None, 600)
        obs = {"reached": bool(hit) and run.proc.poll() is None, "output": ""}
        if obs["reached"]:
            run.signal(SIGNALS[sig])
            try:
                obs["rc"] = run.wait(120)
            except Exception as e:  # noqa: BLE001 - a run that does not end is this fault's failure
                obs["rc"] = f"did not exit: {e}"
                run.proc.kill()
            obs["exit_s"] = round(time.time() - run.t_signal, 1)
            obs["leftovers"] = run.leftovers(10.0)
        else:
            run.proc.kill()
            run.wait()
        obs["output"] = run.output
        obs["new_records"] = _records(res)[before:]
        obs["attempt_dirs"] = [str(d) for d in attempt_dirs(tmp)]
        obs["tmp"] = tmp
        obs["report"] = (root / f"report{n}.md").exists()
        seen[(sig, phase)] = obs

    def compiling(run, tmp):
        return compiler_running(run)

    def serving(run, tmp):
        return forkserver_running(run) and "ops done" not in run.output

    def stepping(run, tmp):
        return cell_stepping(tmp)

    def reporting(run, tmp):
        return run.hold.exists()  # its report has begun and waits there (tests.faults.procs.HOLD_REPORT)

    shared = root / "ext-shared"  # a copy: a stale lock left here by a killed build must not reach other tests
    copy_built_ops(shared)
    for sig in SIGNALS:
        step(sig, "prebuild", compiling, ext=root / f"ext-fresh-{sig}")
    for sig in SIGNALS:
        step(sig, "forkserver", serving, ext=shared)
    for sig in SIGNALS:
        step(sig, "cell", stepping, ext=shared, report=True)
    # The run that completes the cell is stopped in its report; the two after it have nothing left to
    # run and are stopped in theirs. Each report is held where it begins until the signal comes: a report
    # of seconds, signalled once "results:" was printed, ended first on a loaded machine.
    for sig in SIGNALS:
        step(sig, "report", reporting, ext=shared, report=True)
    # The last run shares the temp dir of the run SIGKILLed mid-cell, whose attempt folder it must sweep.
    killed_tmp = seen[("sigkill", "cell")]["tmp"]
    left_by_kill = [str(d) for d in attempt_dirs(killed_tmp)]
    final = Run(
        [str(m), "--results", str(res), "--resume", "--no-report", "--no-progress"],
        root,
        env(killed_tmp),
        root / "out-final.txt",
    ).start()
    final.wait(600)
    swept = {"before": left_by_kill, "after": [str(d) for d in attempt_dirs(killed_tmp)]}
    return {"results": res, "cell": _records(res)[0]["cell_name"], "seen": seen, "final": final.output, "swept": swept}


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("sig", list(SIGNALS))
def test_orchestrator_stopped_then_resumed(chain, sig, phase, ledger):
    ledger.fault(f"orchestrator-{sig}-{phase}", f"the orchestrator gets {sig.upper()} {PHASES[phase]}, then --resume")
    obs = chain["seen"][(sig, phase)]
    assert obs["reached"], f"the run never reached the phase: {obs['output'][-2000:]}"
    assert obs["rc"] == EXIT[sig], obs["output"][-2000:]
    # Nothing the run started is left running: no compiler, fork server or worker (a SIGKILLed
    # orchestrator's helpers notice within a second or two).
    assert obs["leftovers"] == [], obs["leftovers"]
    new = obs["new_records"]
    if phase in ("prebuild", "forkserver"):
        assert new == [], "nothing is recorded before a cell starts"
    if phase == "cell":
        # This run's records (a --resume first closes the attempt a SIGKILLed run left open).
        run_id = next(r["run_id"] for r in new if r["status"] == "started")
        mine = [r for r in new if r["run_id"] == run_id]
        if sig == "sigkill":
            assert [r["status"] for r in mine] == ["started"]  # --resume finds it
        else:
            assert [r["status"] for r in mine] == ["started", "interrupted"]
            why = {"sigterm": "stopped by SIGTERM", "sigint": "stopped by the user (SIGINT)"}[sig]
            assert mine[-1]["reason"] == why
    if phase == "report":
        assert "results: " in obs["output"]
        if sig != "sigkill":  # stopped in the report, and said so
            assert "while writing the report" in obs["output"] and not obs["report"], obs["output"][-2000:]
        assert not any(r["status"] == "interrupted" and "found by --resume" not in r["reason"] for r in new)
    if sig != "sigkill":
        name = sig.upper()
        assert f"stopped by {name}" in obs["output"], obs["output"][-2000:]
        # Its temporary folders are gone; what finished is reported (a cell stopped, or the report itself).
        assert obs["attempt_dirs"] == []
        if phase == "cell":
            assert obs["report"], "the report of what finished is written"
    ledger.account(chain["results"], {chain["cell"]: {"ok"}})
    assert "resume: 1 of 1 cells already have a result" in chain["final"]


def test_a_sigkilled_runs_attempt_folder_is_removed_by_the_next_run(chain, ledger):
    ledger.fault("orchestrator-sigkill-attempt-folder", "a run SIGKILLed mid-cell leaves its attempt folder behind")
    assert len(chain["swept"]["before"]) == 1, chain["swept"]
    assert chain["swept"]["after"] == [], chain["swept"]
