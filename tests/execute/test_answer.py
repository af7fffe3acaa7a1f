"""Answer mode (bench.execute.answer) and the replay executor (bench.execute.executors.replay): the online correction of
the models, the short schedule, the CLI's checks,
and answer mode replayed over committed H200 grids against the answers the full grids give."""

from __future__ import annotations

import collections
import math
import random
import re

import pytest

from bench.cli import main as cli
from bench.estimate.planning.online import SHARE, Online
from bench.execute import answer
from bench.execute.executors.replay import Recording
from bench.execute.plan import plan
from bench.matrix import spec
from bench.matrix.cells import Cell
from bench.records.record import Record, parse
from bench.records.status import Status
from tests.conftest import GRIDS, as_written, full_search

# -- the constants and pieces -----------------------------------------------------------------------------


def test_online_learns_the_machine_and_the_knobs_from_a_few_cells():
    # Truth: the machine runs everything at 0.5x the base; knob b=1 costs a further 0.7x. Noise 5%.
    rng = random.Random(0)
    on = Online(prior_sd=0.5, offset_sd=2.0, noise_sd=0.05)
    before = on.predict({"a": 1, "b": 1}, 0.0)
    for a in (0, 1, 2):
        for b in (0, 1):
            truth = math.log(0.5) + b * math.log(0.7)
            on.observe({"a": a, "b": b}, 0.0, truth + rng.gauss(0, 0.05))
    mean, sd = on.predict({"a": 1, "b": 1}, 0.0)
    assert abs(mean - (math.log(0.5) + math.log(0.7))) < 0.1
    assert sd < before[1] / 4  # six cells narrow the prior's width a lot
    # An interaction the additive effects cannot hold shows as misfit, widening every prediction.
    on2 = Online(prior_sd=0.5, offset_sd=2.0, noise_sd=0.01)
    for a, b, y in [(0, 0, 0.0), (0, 1, 0.0), (1, 0, 0.0), (1, 1, 1.0), (2, 0, 0.0), (2, 1, 1.0)] * 2:
        on2.observe({"a": a, "b": b}, 0.0, y)
    assert on2.misfit > 0.1


def test_online_moves_a_cell_with_its_host_share_on_each_machine():
    # Truth: two machines whose hosts run 0.7x and 1.3x the typical host's time; a cell moves by -share * that
    # (log), whatever its knobs. Measured: cells of shares 0.1-0.8 on each. Asked: a share-0.9 cell's value on
    # each machine, whose knobs no measured cell has.
    host = {"m1": math.log(0.7), "m2": math.log(1.3)}
    rng = random.Random(1)

    def fitted(host_sd: float) -> dict:
        on = Online(prior_sd=0.05, offset_sd=0.5, noise_sd=0.01, host_sd=host_sd)
        for block, h in host.items():
            for k, share in enumerate((0.1, 0.3, 0.5, 0.8)):
                on.observe({"a": k, SHARE: share}, 0.0, -share * h + rng.gauss(0, 0.01), block=block)
        return {b: on.predict({"a": 9, SHARE: 0.9}, 0.0, block=b) for b in host}

    with_host, without = fitted(0.1), fitted(0.0)
    for b, h in host.items():
        assert abs(with_host[b][0] - (-0.9 * h)) < 0.05, with_host  # the host term carries it
        assert abs(without[b][0] - (-0.9 * h)) > 0.1, without  # one offset per block cannot
    assert with_host["m1"][0] - with_host["m2"][0] > 0.4  # host-bound: the two machines ~0.56 apart


def test_a_cells_variance_alone_is_its_variance_jointly():
    # Its host term enters times its share, so its variance takes the share squared, alone as jointly.
    on = Online(prior_sd=0.05, offset_sd=0.5, noise_sd=0.01, host_sd=0.1)
    items = [({"a": 1, SHARE: 0.5}, 0.0), ({"a": 2, SHARE: 0.9}, 0.0)]
    _, sds = on.marginals(items)
    assert sds**2 == pytest.approx(on.posterior(items)[1].diagonal())


@pytest.mark.parametrize("learn", [False, True])
def test_measurements_of_one_cell_share_its_misfit(learn):
    # The cell with b=1 measured five times 0.1 above the base, against eight cells on it. Counted as five cells,
    # its rows would teach b=1's effect five times over; sharing one misfit they teach it as one cell does: a new
    # cell with b=1 is predicted nearer the base, and less surely; a learned misfit likewise.
    def fitted(key) -> tuple[float, float]:
        on = Online(prior_sd=0.05, offset_sd=0.5, noise_sd=0.02, misfit_sd=0.05, learn_misfit=learn)
        for a in range(8):
            on.observe({"a": a, "b": 0}, 0.0, 0.0, cell=f"c{a}")
        for _ in range(5):
            on.observe({"a": 8, "b": 1}, 0.0, 0.1, cell=key)
        return on.predict({"a": 9, "b": 1}, 0.0)

    (shared, shared_sd), (apart, apart_sd) = fitted("top"), fitted(None)
    assert shared < apart and shared_sd > apart_sd


def test_a_setting_only_some_cells_have_stays_in_the_model():
    # LoRA's rank is the same in every LoRA cell and absent from the full fine-tunes: peft tells the same cells apart,
    # but each of the rank's pairs with another knob is an interaction of its own; so is the accumulation beside
    # the micro-batch. A setting every cell has alike tells nothing apart and goes.
    cells = [
        {"peft": p, "lora_r": 16 if p == "lora" else None, "optimizer": o, "micro_batch": mb, "grad_accum": 4 // mb,
         "compile": False}
        for p in ("none", "lora") for o in ("adamw", "paged") for mb in (1, 2)
    ]  # fmt: skip
    kept = answer.distinct(cells)
    assert {k for f in kept for k in f} == {"peft", "lora_r", "optimizer", "micro_batch", "grad_accum"}

    # Why it matters: an optimizer's effect measured on LoRA cells alone speaks less surely of a full fine-tune when
    # the rank's pair with the optimizer is a term of its own.
    def predicted(features) -> float:
        on = Online(prior_sd=0.05, offset_sd=0.5, noise_sd=0.01, misfit_sd=0.01, pair_sd=0.01)
        on.declare(features)
        for f in features:
            if f["peft"] == "lora":
                on.observe(f, 0.0, 0.1 if f["optimizer"] == "paged" else 0.0)
        return on.predict(next(f for f in features if f["peft"] == "none" and f["optimizer"] == "paged"), 0.0)[1]

    assert predicted(kept) > predicted([{k: v for k, v in f.items() if k != "lora_r"} for f in kept])


def test_a_knobs_effect_in_one_family_speaks_less_surely_of_another_with_family_pairs():
    """With family_pair_sd, an optimizer's effect measured on LoRA cells leaves a full fine-tune's wider than a
    LoRA cell's, and wider than with every pair at pair_sd; a pair of two knobs keeps pair_sd."""
    cells = [{"peft": p, "optimizer": o, "micro_batch": mb} for p in ("none", "lora") for o in ("adamw", "paged")
             for mb in (1, 2)]  # fmt: skip

    def online(family: float) -> Online:
        on = Online(prior_sd=0.05, offset_sd=0.5, noise_sd=0.01, misfit_sd=0.01, pair_sd=0.01,
                    family_axes=("peft",), family_pair_sd=family)  # fmt: skip
        on.declare(cells)
        for f in cells:
            if f["peft"] == "lora":
                on.observe(f, 0.0, 0.1 if f["optimizer"] == "paged" else 0.0)
        return on

    full = next(f for f in cells if f["peft"] == "none" and f["optimizer"] == "paged" and f["micro_batch"] == 1)
    lora = next(f for f in cells if f["peft"] == "lora" and f["optimizer"] == "paged" and f["micro_batch"] == 1)
    narrow, wide = online(0.0), online(0.1)
    assert wide.predict(full, 0.0)[1] > 2 * narrow.predict(full, 0.0)[1]
    assert wide.predict(full, 0.0)[1] > 2 * wide.predict(lora, 0.0)[1]
    sds = {t: wide._term_sd(t) for t in wide._terms}
    assert sds[(("optimizer", "paged"), ("peft", "none"))] == 0.1
    assert sds[(("micro_batch", 1), ("optimizer", "paged"))] == 0.01 and sds[("optimizer", "paged")] == 0.05


def test_rung_zero_is_the_short_schedule_and_rung_one_the_matrixs():
    fixed = Cell(matrix="m", model="llama-tiny", measured_steps=8)
    assert answer.rung_cell(fixed, 0).measured_steps == 4 and answer.rung_cell(fixed, 1) == fixed
    m = spec.load("matrices/7b.yaml")
    c = spec.expand(m)[0]
    short = answer.rung_cell(c, 0)
    assert short.adaptive.tolerance == 2 * c.adaptive.tolerance
    assert short.adaptive.max_seconds == c.adaptive.max_seconds / 2
    assert short.measured_steps == c.measured_steps // 2
    # A short look: warm-up settled over 2 steps, then 4 measured whose range reaches the 87.5% it can
    assert (short.adaptive.settle_window, short.adaptive.min_steps, short.adaptive.level) == (2, 4, 0.875)
    assert (c.adaptive.settle_window, c.adaptive.min_steps, c.adaptive.level) == (3, 6, 0.95)
    assert short.hash != c.hash  # what the worker runs; the record keeps the matrix's cell (tested below)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--budget", "20m"], "--budget only with --answer"),
        (["--answer", "--budget", "twenty"], "a duration such as"),
        (["--answer", "--group-by", "peft,nonsense"], "--group-by nonsense: not an axis"),
        (["--dry-run", "--answer", "--budget", "20"], "--budget 20: give a unit, e.g. 20m or 20s"),
        (["--dry-run", "--answer", "--budget", ""], "--budget '': a duration such as"),
        (["--dry-run", "--budget", ""], "--budget only with --answer"),
        (["--dry-run", "--answer", "--group-by", ""], "--group-by '': name the axes to group by"),
        (["--dry-run", "--answer", "--group-by", " , "], "--group-by ' , ': name the axes to group by"),
        (["--dry-run", "--answer", "--settle", "5e-324"], "--settle 5e-324: a chance from 0.1% to 50%"),
        (["--dry-run", "--answer", "--settle", "0.9"], "--settle 0.9: a chance from 0.1% to 50%"),
        (["--dry-run", "--answer", "--settle", ""], "--settle : a chance from 0.1% to 50%"),
        (["--answer", "--repeats", "2"], "--repeats with --answer"),
        (["--collapse", "--no-frontier"], "--collapse, --no-frontier only with --answer"),
        (["--screen", "3"], "--screen only with --answer"),
        (["--executor", "replay"], "--executor replay needs the results files"),
    ],
)
def test_answer_options_are_checked_before_anything_runs(tmp_path, capsys, argv, message):
    code = cli(["run", "matrices/compare-h200.yaml", "--results", str(tmp_path / "r.jsonl"), "--no-report", *argv])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


def test_the_screen_the_collapse_and_the_lead_question_alone_are_options_of_the_run():
    from bench.cli import parser
    from bench.cli.run_options import _answer_settings

    args = parser().parse_args(["run", "matrices/7b.yaml", "--answer", "--screen", "3", "--collapse", "--no-frontier"])
    got = _answer_settings(args)
    assert (got.screen, got.collapse, got.frontier) == (3, True, False)
    plain = _answer_settings(parser().parse_args(["run", "matrices/7b.yaml", "--answer"]))
    assert (plain.screen, plain.collapse, plain.frontier) == (0, False, True)


def test_answer_mode_refuses_a_searched_micro_batch(tmp_path, capsys):
    code = cli(["run", "matrices/mb-auto-1b.yaml", "--answer", "--replay", "results/mb-auto-1b.jsonl",
                "--results", str(tmp_path / "r.jsonl"), "--no-report"])  # fmt: skip
    assert code == 2 and "micro_batch: auto" in capsys.readouterr().err


# -- replayed over committed H200 grids -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_answer_mode_replayed_recovers_the_answer_of_the_full_grid(tmp_path, capsys, name):
    files = GRIDS[name]
    out = tmp_path / f"{name}.jsonl"
    code = cli(["run", f"matrices/{name}.yaml", "--answer", "--replay", *files, "--results", str(out),
                "--no-report", "--no-progress"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    full = full_search(f"matrices/{name}.yaml", files, answer.Settings())
    recs = [r for r in as_written(out) if r["status"] != Status.STARTED.value]
    # Every cell of the matrix ends with a record; each measured one says why, each unmeasured one why not.
    p = plan(f"matrices/{name}.yaml", platform=Recording(files).platform())
    assert {r["cell_hash"] for r in recs} == {it.cell.hash for it in p.items}
    for r in recs:
        if r["status"] == Status.UNMEASURED.value:
            assert r["answer"]["why"].startswith("not needed") and r["answer"]["needed"] is False
        elif r["status"] not in (Status.SKIPPED.value, Status.IMPLIED_OOM.value):
            assert r["replay"]["source"] in files and r["answer"]["role"] in (
                "leader",
                "contender",
                "frontier",
                "effect",
            )
    # (a) the fastest cell per group and (b) the frontier, against the full grid, as the run printed them.
    got = answer.Search([c.planned for c in full.candidates], full.hw, answer.Settings(), cuda=True)
    for r in recs:
        got.observe(parse(r))
    agree = answer.agreement(got, full)
    assert all(same for _, _, same in agree["leaders"].values()), agree
    found, total = agree["frontier"]
    assert found >= 0.9 * total, agree
    assert "DIFFERENT" not in printed and f"frontier: {found} of the grid's {total} points measured" in printed
    # What it paid, printed, against what the full grid took.
    paid = sum(r.get("wall_s") or 0 for r in recs)
    assert f"cost: {paid:.0f} s of cell time" in printed
    assert paid <= sum(r.get("wall_s") or 0 for ends in Recording(files).ends.values() for r, _ in ends)


def test_replayed_records_keep_the_cell_and_say_what_they_replay(tmp_path):
    out = tmp_path / "r.jsonl"
    assert cli(["run", "matrices/compare-h200.yaml", "--answer", "--replay", "results/compare-h200-a3.jsonl",
                "--results", str(out), "--no-report", "--no-progress"]) == 0  # fmt: skip
    recorded = {(r["run_id"], r["cell_hash"], r["attempt"]): r for r in as_written("results/compare-h200-a3.jsonl")}
    ran = [r for r in as_written(out) if r["status"] == "ok"]
    assert ran
    for r in ran:
        src = recorded[(r["replay"]["run_id"], r["cell_hash"], r["replay"]["attempt"])]
        assert r["cell_hash"] == src["cell_hash"] and r["metrics"] == src["metrics"]
        assert r["provenance"]["gpu_name"] == "NVIDIA H200" and r["replay"]["reused"] is False
    # At most as many attempts of a cell as the file has ends of it (3 repeats each).
    assert max(collections.Counter(r["cell_hash"] for r in ran).values()) <= 3


def test_a_budget_stops_the_search_and_each_cell_left_says_it_was_still_needed(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    files = GRIDS["1b"]
    assert cli(["run", "matrices/1b.yaml", "--answer", "--budget", "40s", "--replay", *files,
                "--results", str(out), "--no-report", "--no-progress"]) == 0  # fmt: skip
    recs = [r for r in as_written(out) if r["status"] != "started"]
    left = [r for r in recs if r["status"] == "unmeasured"]
    assert left and any(r["answer"]["needed"] for r in left)
    assert all("budget (40 s) was spent" in r["answer"]["why"] for r in left if r["answer"]["needed"])
    spent = sum(r.get("wall_s") or 0 for r in recs)
    assert spent <= 40 + max(r.get("wall_s") or 0 for r in recs)  # the last cell may end past it
    # --resume with a larger budget goes on from what was measured, never measuring a cell twice needlessly.
    assert cli(["run", "matrices/1b.yaml", "--answer", "--budget", "20m", "--replay", *files, "--resume",
                "--results", str(out), "--no-report", "--no-progress"]) == 0  # fmt: skip
    again = [r for r in as_written(out) if r["status"] == "ok"]
    assert len(again) > len([r for r in recs if r["status"] == "ok"])
    last = {r["cell_hash"]: r for r in as_written(out) if r["status"] != "started"}
    assert not [r for r in last.values() if r["status"] == "unmeasured" and r["answer"]["needed"]]
    assert "resume" in capsys.readouterr().out


def test_a_stopped_answer_run_still_records_every_cell(tmp_path):
    # SIGTERM from inside the run (as a job scheduler sends it) once two cells are recorded: every cell of the
    # matrix still ends with a record, the ones the search did not reach saying the run was stopped.
    import os
    import signal

    out = tmp_path / "r.jsonl"
    seen: list[Record] = []

    def stop_after_two(rec):
        seen.append(rec)
        if rec.status.value == "ok" and sum(r.status.value == "ok" for r in seen) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    from bench.execute import RunSettings, Stopped, run

    s = RunSettings(matrix="matrices/1b.yaml", answer=answer.Settings(), replay=tuple(GRIDS["1b"]), results=str(out),
                    progress=False)  # fmt: skip
    with pytest.raises(Stopped):
        run(s, on_record=stop_after_two, printer=lambda *a: None)
    last = {r["cell_hash"]: r for r in as_written(out) if r["status"] != "started"}
    p = plan("matrices/1b.yaml", platform=Recording(GRIDS["1b"]).platform())
    assert set(last) == {it.cell.hash for it in p.items}
    stopped = [r for r in last.values() if r["status"] == "unmeasured" and r["answer"]["needed"]]
    assert stopped and all(r["reason"].startswith("answer mode: not measured, the run was stopped") for r in stopped)
    assert all(r["answer"]["stopped"] for r in stopped)


# -- resumed under another plan or budget -------------------------------------------------------------------

COMPARE = ["run", "matrices/compare-h200.yaml", "--answer", "--replay", "results/compare-h200-a1.jsonl",
           "--no-report", "--no-progress"]  # fmt: skip


def test_a_cell_skipped_under_another_plan_is_open_on_resume(tmp_path, capsys):
    # Under 30 GiB half the cells are predicted not to fit (skipped); resumed with the GPU's own memory they are
    # candidates never attempted: the search measures the fastest of them (gc off), not "settled" without it.
    out = str(tmp_path / "r.jsonl")
    assert cli([*COMPARE, "--results", out, "--gpu-mem", "30GiB"]) == 0
    skipped = {r["cell_hash"] for r in as_written(out) if r["status"] == Status.SKIPPED.value}
    assert len(skipped) == 4
    capsys.readouterr()
    assert cli([*COMPARE, "--results", out, "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "goes on from 4 cell(s) already measured or failed" in printed
    ran = {r["cell_hash"] for r in as_written(out) if r["status"] == "ok" and r["cell_hash"] in skipped}
    assert ran and "fastest, peft=none: the same" in printed


def test_the_budget_counts_earlier_cells_that_left_the_plan(tmp_path, capsys):
    # The first call spends its 40 s on cells of which some are predicted not to fit 30 GiB: resumed under 30 GiB,
    # the budget is still spent; nothing more is measured.
    out = str(tmp_path / "r.jsonl")
    assert cli([*COMPARE, "--results", out, "--budget", "40s"]) == 0
    before = sum(r.get("wall_s") or 0 for r in as_written(out))
    capsys.readouterr()
    assert cli([*COMPARE, "--results", out, "--budget", "40s", "--resume", "--gpu-mem", "30GiB"]) == 0
    assert f"({before:.0f} s of cell time spent)" in capsys.readouterr().out
    assert sum(r.get("wall_s") or 0 for r in as_written(out)) == before


def test_a_resume_with_the_budget_spent_prepares_nothing(tmp_path, capsys, monkeypatch):
    # Resumed on this host (the local executor) with the replayed call's budget spent: no attempt can start, so the
    # machine is not probed, nor an op built or a checkpoint written for one; every cell left says the budget was spent.
    from bench.execute.session import machine

    out = str(tmp_path / "r.jsonl")
    assert cli([*COMPARE, "--results", out, "--budget", "40s"]) == 0
    monkeypatch.setattr(machine, "prepare", lambda *a, **k: pytest.fail("prepared for a call that measures nothing"))
    capsys.readouterr()
    assert cli(["run", "matrices/compare-h200.yaml", "--answer", "--budget", "40s", "--resume", "--results", out,
                "--no-report", "--no-progress"]) == 0  # fmt: skip
    said = capsys.readouterr().out
    assert "prepare: nothing built, the --budget left pays for no attempt" in said
    assert not [ln for ln in said.splitlines() if ln.startswith("probe")], said
    last = {r["cell_hash"]: r for r in as_written(out) if r["status"] != "started"}
    assert all(r["status"] != "unmeasured" or "budget" in r["answer"]["why"] for r in last.values())


@pytest.mark.parametrize("pairs", [2, 1000000])
def test_pairs_measures_each_knob_values_pairs_where_the_matrix_has_them(tmp_path, capsys, pairs):
    # Each zero stage pairs with ZeRO-0 at gc on and at gc off: --pairs 2 (or more) measures both, even where one
    # cell of the second pair was measured already (for another question).
    assert cli([*COMPARE, "--results", str(tmp_path / "r.jsonl"), "--pairs", str(pairs)]) == 0
    printed = capsys.readouterr().out
    for stage in (1, 2, 3):
        assert re.search(rf"effect zero={stage} vs zero=0: .*\(2 pair\(s\) measured in one block\)", printed), printed


def test_an_answer_does_not_claim_settled_over_cells_no_anchor_ties_to_it(tmp_path, capsys):
    # The three 1b files are three runs (blocks); the offload cells' ends lie only in the second and third, which no
    # cell measured in both ties to the first: the chances leave them out, and the answer says it is not settled
    # against them rather than "both below" alone.
    out = str(tmp_path / "r.jsonl")
    assert cli(["run", "matrices/1b.yaml", "--answer", "--replay", *GRIDS["1b"], "--results", out, "--no-report",
                "--no-progress"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    settled = next(ln for ln in printed.splitlines() if ln.startswith("  not settled: "))
    assert "not compared with it (no block or anchor ties theirs to its)" in printed
    assert "both below); not settled against the 3 measured cell(s) of B2, B3, which no anchor ties to B1" in settled
    # One block: every measured cell compares, nothing is left out.
    assert cli([*COMPARE, "--results", str(tmp_path / "one.jsonl")]) == 0
    settled = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  settled: "))
    assert settled.endswith("(the search stops asking each below 5%: both below)")
