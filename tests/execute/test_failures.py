"""Errors teach answer mode (bench.execute.answer.failures): an error's signature, the failing settings of a repeated
one, and on the 7B answer's committed H200 records, no signature attempted more than twice while a full run still
runs every cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.cli import main as cli
from bench.execute.answer.failures import TEACHES_AT, Lessons, attempts, shared, signature
from bench.judge import effects, results
from bench.records.record import parse
from bench.records.status import Status
from bench.records.store import Store
from tests.conftest import as_written

ROOT = Path(__file__).resolve().parents[2]
SEVEN_B = "results/7b-answer-h200.jsonl"  # the 7B answer's attempt records (results/README.md)


def _rec(status: str, reason: str, phase: str | None = "warmup") -> dict:
    return {"status": status, "reason": reason, "phase_at_end": phase}


def test_a_signature_is_the_phase_and_the_reason_without_numbers_paths_and_addresses():
    a = signature(
        _rec("error", "the worker exited with code 1 without a result (phase warmup): Error invalid argument at line "
             "177 in file /src/csrc/ops.cu")
    )  # fmt: skip
    b = signature(
        _rec("error", "the worker exited with code 1 without a result (phase warmup): Error invalid argument at line "
             "180 in file /build/bnb/csrc/ops.cu")
    )  # fmt: skip
    assert (
        a
        == b
        == (
            "warmup: the worker exited with code # without a result (phase warmup): Error invalid argument at line # "
            "in file <path>"
        )
    )
    nan7, nan9 = (signature(_rec("diverged", f"loss became nan at step {n}", "teardown")) for n in (7, 9))
    assert nan7 == nan9 == "teardown: loss became nan at step #"
    assert signature(_rec("error", "illegal access at 0x7f3a2c00 in tensor of 25.10 GiB")) == (
        "warmup: illegal access at 0x# in tensor of # GiB"
    )
    # Names that hold digits are kept: two optimizers are two errors.
    one = signature(_rec("error", "optimizer 'adamw_8bit' asked for AdamW8bit, but the Trainer built AdamW"))
    other = signature(
        _rec("error", "optimizer 'paged_adamw_8bit' asked for PagedAdamW8bit, but the Trainer built AdamW")
    )
    assert "'adamw_8bit'" in one and "AdamW8bit" in one and one != other
    # The phase tells two ends with one message apart; ends that are not errors have none.
    assert signature(_rec("error", "boom", "setup")) != signature(_rec("error", "boom", "measured"))
    for status in ("ok", "cuda_oom", "host_oom", "implied_oom", "interrupted", "killed", "timeout", "skipped"):
        assert signature(_rec(status, "CUDA out of memory at step 3")) is None


def _cell(**kw) -> dict:
    base = {"zero_stage": 0, "precision": "bf16", "optimizer": "adamw", "peft": "none", "engine": "deepspeed", "mb": 1}
    return {**base, **kw}


def _end(status: str, reason: str = "") -> object:
    return parse(
        {
            "schema_version": 2, "run_id": "r", "attempt": 1, "matrix": "m", "cell_id": "c#h", "cell_hash": "h",
            "cell_name": "c", "cell": {}, "status": status, "reason": reason, "started_at": "t",
            "phase_at_end": "measured", "provenance": None,
        }
    )  # fmt: skip


TRAINER = "RuntimeError: optimizer 'adamw_8bit' asked for AdamW8bit, but the Trainer built AdamW"


def test_one_failure_teaches_nothing_and_the_second_marks_the_cells_sharing_its_settings():
    cells = [_cell(zero_stage=z, engine=e, optimizer=o) for z in (0, 1) for e in ("deepspeed", "hf_trainer")
             for o in ("adamw", "adamw_8bit")]  # fmt: skip
    lessons = Lessons(shared(cells))  # mb=1 and peft=none: every cell has them, so no failure is theirs
    for c in (_cell(), _cell(optimizer="adamw_8bit"), _cell(engine="hf_trainer")):
        lessons.observe(_end("ok"), str(c), c)
    first = _cell(engine="hf_trainer", optimizer="adamw_8bit", precision="fp16")
    lessons.observe(_end("error", TRAINER), "first", first)
    assert TEACHES_AT == 2 and not any(lessons.expected(c) for c in cells)
    second = _cell(engine="hf_trainer", optimizer="adamw_8bit", zero_stage=1)
    lessons.observe(_end("error", TRAINER), "second", second)
    sig = signature(_end("error", TRAINER))
    # zero_stage and precision differ between the failures; each of the shared values is in a cell that ran, so
    # the failing settings are the fewest that no cell that ran has together.
    assert lessons.settings(sig) == {"optimizer": "adamw_8bit", "engine": "hf_trainer"}
    expected = [c for c in cells if lessons.expected(c)]
    assert expected == [_cell(zero_stage=z, engine="hf_trainer", optimizer="adamw_8bit") for z in (0, 1)]
    assert "opt=adamw_8bit, engine=hf_trainer" in lessons.why(sig) and "first; second" in lessons.why(sig)


def test_values_no_cell_that_ran_has_are_the_failing_settings_and_a_cell_that_ran_with_all_of_them_clears_it():
    lessons = Lessons()
    lessons.observe(_end("ok"), "fused", _cell(optimizer="fusedadam"))
    lamb = "AssertionError: You are using an untested ZeRO Optimizer"
    lessons.observe(_end("error", lamb), "a", _cell(optimizer="fusedlamb", zero_stage=1, precision="fp16"))
    lessons.observe(_end("error", lamb), "b", _cell(optimizer="fusedlamb", zero_stage=2, precision="fp16"))
    sig = signature(_end("error", lamb))
    # No cell that ran has fusedlamb, fp16 or ZeRO stage > 0... the zero stages differ: fusedlamb and fp16 remain.
    assert lessons.settings(sig) == {"precision": "fp16", "optimizer": "fusedlamb"}
    assert lessons.expected(_cell(optimizer="fusedlamb", zero_stage=3, precision="fp16")) == sig
    assert lessons.expected(_cell(optimizer="fusedlamb", zero_stage=3)) is None  # bf16: not shown to fail
    # A cell with every value the failures share ran: the error is not a matter of these settings.
    lessons.observe(_end("ok"), "lamb-ok", _cell(optimizer="fusedlamb", precision="fp16"))
    assert lessons.settings(sig) is None and lessons.expected(_cell(optimizer="fusedlamb", precision="fp16")) is None


def test_the_values_an_error_names_are_its_failing_settings_before_values_not_yet_run():
    # The Trainer's rejection of paged_adamw as the 7B answer met it: two failures share gradient checkpointing,
    # QLoRA, the optimizer and the engine; no cell that ran had checkpointing on, but each of the other values
    # ran in some cell. The message names the optimizer and the Trainer: those are the settings, not "gc on",
    # so a LoRA cell without checkpointing is expected to fail as well, and a checkpointed DeepSpeed one is not.
    msg = "RuntimeError: optimizer 'paged_adamw' asked for PagedAdamW, but the Trainer built AdamW"
    lessons = Lessons()
    for c in (_cell(optimizer="paged_adamw"), _cell(engine="hf_trainer"), _cell(peft="qlora")):
        lessons.observe(_end("ok"), str(c), c)
    for z in (0, 1):
        failed = _cell(zero_stage=z, gc=True, optimizer="paged_adamw", peft="qlora", engine="hf_trainer")
        lessons.observe(_end("error", msg), f"z{z}", failed)
    sig = signature(_end("error", msg))
    assert lessons.settings(sig) == {"optimizer": "paged_adamw", "engine": "hf_trainer"}
    assert lessons.expected(_cell(gc=False, optimizer="paged_adamw", peft="lora", engine="hf_trainer")) == sig
    assert lessons.expected(_cell(gc=True, optimizer="adamw", peft="qlora")) is None
    # "None" in a message names no setting: with only LoRA cells run so far, "expected a Tensor, got None" does not
    # make peft=none alone the failing settings (every full fine-tune would be left), only with the optimizer.
    got_none = "TypeError: expected a Tensor, got None"
    fresh = Lessons()
    fresh.observe(_end("ok"), "lora", _cell(peft="lora"))
    for z in (0, 1):
        fresh.observe(_end("error", got_none), f"n{z}", _cell(zero_stage=z, optimizer="fusedadam"))
    assert fresh.settings(signature(_end("error", got_none))) == {"optimizer": "fusedadam", "peft": "none"}
    # Where the named values ran together, they are not the cause: the values no cell that ran has are.
    lessons.observe(_end("ok"), "both", _cell(optimizer="paged_adamw", engine="hf_trainer"))
    assert lessons.settings(sig) == {"gc": True}


def test_attempts_counts_a_results_files_errors_by_signature():
    counts = attempts(Store(ROOT / SEVEN_B).records())
    assert sum(counts.values()) == 28  # 26 errors and 2 divergences
    assert counts["teardown: loss became nan at step #"] == 2
    assert max(counts.values()) == 9  # the Trainer's check rejecting adamw_8bit, the most repeated


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    """The 7B answer's records replayed with and without --answer (nothing runs: their ends are served)."""
    folder = tmp_path_factory.mktemp("replay")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        # 4,320 records a run, each synced to the disk: seconds on a busy disk, and no part of what is tested.
        mp.setattr("bench.records.store.os.fsync", lambda fd: None)
        for name, extra in (("answer", ["--answer", "--budget", "20m"]), ("full", [])):
            res = folder / f"{name}.jsonl"
            argv = ["run", "matrices/7b.yaml", *extra, "--replay", SEVEN_B, "--results", str(res), "--no-report",
                    "--no-progress"]  # fmt: skip
            assert cli(argv) == 0
            out[name] = [r for r in as_written(res) if r["status"] != Status.STARTED.value]
            out[f"{name}-file"] = res
    return out


def test_answer_mode_attempts_no_cell_its_lessons_expect_to_repeat_an_error(replays):
    recs = replays["answer"]
    counts = attempts(map(parse, recs))
    assert counts and max(counts.values()) <= TEACHES_AT, counts
    # And no attempt of a cell its failing settings, as learnt by then, expected to repeat an error.
    cells = {it.cell.hash: it for it in _plan_7b()}
    lessons = Lessons(shared(effects.features(results.axis_values(it.cell.to_dict())) for it in cells.values()))
    for r in recs:
        if r["status"] in ("unmeasured", "skipped", "implied_oom"):
            continue
        feats = effects.features(results.axis_values(r["cell"]))
        assert lessons.expected(feats) is None, r["cell_name"]
        lessons.observe(parse(r), r["cell_name"], feats)
    expected = [r for r in recs if r["status"] == "unmeasured" and r["answer"].get("expected_error")]
    assert expected, "cells sharing a repeated error's settings are left, each saying which error"
    for r in expected:
        assert counts[r["answer"]["expected_error"]] >= TEACHES_AT
        assert r["answer"]["needed"] is False and r["reason"].startswith("answer mode: not measured, expected to")
        n = counts[r["answer"]["expected_error"]]
        assert r["answer"]["why"].startswith(f"expected to repeat an error seen in {n} attempt(s)")


def _plan_7b():
    from bench.execute.executors.replay import Recording
    from bench.execute.plan import plan

    rec = Recording([str(ROOT / SEVEN_B)])
    return [it for it in rec.restrict(plan("matrices/7b.yaml", platform=rec.platform())).items if it.skip is None]


def test_the_report_counts_the_cells_left_to_repeat_an_error(replays):
    from bench.judge import results
    from bench.report import markdown

    left = [r for r in replays["answer"] if r["status"] == "unmeasured"]
    expected = [r for r in left if r["answer"].get("expected_error")]
    text = markdown.render(results.load(replays["answer-file"]), title="replay")
    assert f"Left unmeasured: {len(left)} cells ({len(expected)} of them expected to repeat an error" in text


def test_a_full_run_still_runs_every_cell(replays):
    # Without --answer every recorded cell runs, whatever failed before it: each is a record.
    full = replays["full"]
    counts = attempts(map(parse, full))
    assert max(counts.values()) > TEACHES_AT and not [r for r in full if r["status"] == "unmeasured"]
    recorded = {r["cell_hash"] for r in as_written(ROOT / SEVEN_B) if _ended(r)}
    ran = {r["cell_hash"] for r in full if r["status"] not in ("skipped", "implied_oom")}
    skipped = {r["cell_hash"]: r["skip"]["rule"] for r in full if r["status"] == "skipped"}
    # Each recorded cell ran again, but for those the rules now stop before anything runs.
    assert {h: skipped[h] for h in recorded - ran} and set(skipped[h] for h in recorded - ran) <= {
        "fusedlamb-needs-zero0",
        "bnb-over-int32",
        "onebit-needs-fp16",
    }


def _ended(rec: dict) -> bool:
    """An end the replay serves: it ran, and is an outcome (not a stop)."""
    st = Status(rec["status"])
    return st.ran and st.is_outcome
