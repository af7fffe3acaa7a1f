"""Answer mode against a full run of the same grid, real cells on this machine's CPU (real DeepSpeed engines):
matrices/answer-cpu.yaml, 12 runnable cells in two PEFT groups, four sequences per optimizer step at micro-batch
1, 2 or 4, run in full (three times over: REFERENCE_REPEATS) and then in answer mode. The answer must name the
same fastest cell per group (or one the full run cannot tell from it at one measurement's resolution), find the
full run's frontier of the configurations at the micro-batch answer mode measures for each (the largest that
fits: the others are parked, each record saying so), and choose cells that cost at most half one full pass's cell
time (each cell's first measurement, the records' wall_s summed; 23-31% of it in four runs), all its
measurements together, repeats included, less than one pass of the full run (37-65%). The repeats are what its
measurements' noise asks for, and that changes with the machine's load; the cells it leaves unmeasured are its
decisions. No figure is an absolute time: the checks are orders and ratios.

Each cell runs on one core (OMP_NUM_THREADS=1, as a user sharing a machine would set it): with both of a 2-core
machine's cores, a foreign process on one of them stalls every step's threads, the measurements turn noisy and
answer mode, rightly, measures more to settle them (beside a busy loop it measured all 12 cells). On one core the
other process takes the other core."""

from __future__ import annotations

import re

import pytest

from bench.cli import main as cli
from bench.execute import answer
from bench.execute.plan import arrange, hardware, host_platform, plan
from bench.execute.run import answer_items
from bench.records.record import parse
from bench.records.status import Status
from tests.conftest import as_written

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # alone: its verdicts are about throughput

MATRIX = "matrices/answer-cpu.yaml"
REFERENCE_REPEATS = 3
"""The full grid, the reference, is measured three times over (interleaved): one CPU measurement of these 30-ms
steps scatters by sd 0.10 or more (bench.records.quality.NOISE), so one pass names near-equal cells in either
order; the mean of three scatters by 1/sqrt(3) of that."""


def _search(records: list[dict], micro_batch: int | None = None) -> answer.Search:
    """A search that observed these records (of this micro-batch, if given): the answer they give."""
    platform = host_platform(None)
    hw = hardware(platform)
    items, _, free = arrange(
        list(answer_items(plan(MATRIX, platform=platform), platform).items), hw, 0.1, True, "early"
    )
    runnable = [it for it in items if it.skip is None and id(it) not in free]
    runnable = [it for it in runnable if micro_batch is None or it.cell.micro_batch == micro_batch]
    s = answer.Search(runnable, hw, answer.Settings(), False)
    for r in records:
        if r["status"] != Status.STARTED.value:
            s.observe(parse(r), (r.get("answer") or {}).get("rung"))
    return s


def _run(tmp_path, name: str, *extra: str) -> list[dict]:
    out = tmp_path / f"{name}.jsonl"
    assert cli(["run", MATRIX, "--results", str(out), "--no-report", "--no-progress", *extra]) == 0
    return as_written(out)


def test_answer_mode_finds_the_full_runs_answer_for_half_its_cost(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    full = _run(tmp_path, "full", "--repeats", str(REFERENCE_REPEATS))
    got = _run(tmp_path, "answer", "--answer")
    printed = capsys.readouterr().out
    assert len({r["cell_hash"] for r in full if r["status"] == "ok"}) == 12
    # Every cell has a record: measured, or unmeasured saying why (a parked micro-batch: which one is measured).
    last = {r["cell_hash"]: r for r in got if r["status"] != Status.STARTED.value}
    assert len(last) == 12 and all(r["status"] in ("ok", "unmeasured") for r in last.values()), last
    left = [r for r in last.values() if r["status"] == "unmeasured"]
    assert any("the largest the memory model fits within the margin" in r["answer"]["why"] for r in left), left
    agree = answer.agreement(_search(got), _search(full))
    print(agree)
    assert all(same for _, _, same in agree["leaders"].values()), agree
    fit = answer.agreement(_search(got, 4), _search(full, 4))
    found, total = fit["frontier"]
    assert total and found >= 0.9 * total, fit
    paid = sum(r.get("wall_s") or 0 for r in got)
    chosen = sum(r.get("wall_s") or 0 for r in {r["cell_hash"]: r for r in reversed(got) if r.get("wall_s")}.values())
    whole = sum(r.get("wall_s") or 0 for r in full if r.get("repeat") == 1)  # the full run: each cell once
    assert chosen <= 0.5 * whole and paid < whole and len(left) >= 3, (chosen, paid, whole, agree)
    assert "answer (95% intervals" in printed and "fastest, peft=none" in printed
    assert re.search(r"^  (not )?settled: the chance that one of the", printed, re.M)
