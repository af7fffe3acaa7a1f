"""Answer mode against a full run of the same grid, real cells on this machine's CPU (real DeepSpeed engines):
matrices/answer-cpu.yaml, 48 runnable cells in two PEFT groups, run in full and then in answer mode. The
answer must name the same fastest cell per group (or one the full run cannot tell from it at its
measurements' resolution), find at least 90% of the full run's frontier, and cost at most 35% of the full
run's cell-seconds (the records' wall_s, summed)."""

from __future__ import annotations

import pytest

from bench.cli import main as cli
from bench.execute import answer
from bench.execute.plan import arrange, hardware, host_platform, plan
from bench.record import parse
from bench.status import Status
from bench.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # alone: its verdicts are about throughput

MATRIX = "matrices/answer-cpu.yaml"


def _search(records: list[dict]) -> answer.Search:
    """A search that observed these records: the answer they give."""
    platform = host_platform(None)
    hw = hardware(platform)
    items, _, free = arrange(plan(MATRIX, platform=platform).items, hw, 0.1, True, "early")
    s = answer.Search([it for it in items if it.skip is None and id(it) not in free], hw, answer.Settings(), False)
    for r in records:
        if r["status"] != Status.STARTED.value:
            s.observe(parse(r), (r.get("answer") or {}).get("rung"))
    return s


def _run(tmp_path, name: str, *extra: str) -> list[dict]:
    out = tmp_path / f"{name}.jsonl"
    assert cli(["run", MATRIX, "--results", str(out), "--no-report", "--no-progress", *extra]) == 0
    return Store(out).records()


def test_answer_mode_finds_the_full_runs_answer_for_a_third_of_its_cost(tmp_path, capsys):
    full = _run(tmp_path, "full")
    got = _run(tmp_path, "answer", "--answer")
    printed = capsys.readouterr().out
    assert len({r["cell_hash"] for r in full if r["status"] == "ok"}) == 48
    # Every cell has a record: measured, or unmeasured saying why.
    last = {r["cell_hash"]: r for r in got if r["status"] != Status.STARTED.value}
    assert len(last) == 48 and all(r["status"] in ("ok", "unmeasured") for r in last.values()), last
    agree = answer.agreement(_search(got), _search(full))
    print(agree)
    assert all(same for _, _, same in agree["leaders"].values()), agree
    found, total = agree["frontier"]
    assert total and found >= 0.9 * total, agree
    paid = sum(r.get("wall_s") or 0 for r in got)
    whole = sum(r.get("wall_s") or 0 for r in full)
    assert paid <= 0.35 * whole, (paid, whole, agree)
    assert "answer (95% intervals" in printed and "fastest, peft=none" in printed
