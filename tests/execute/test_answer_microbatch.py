"""Micro-batch in answer mode (bench.execute.answer.outcomes): with batch.size each configuration's micro-batches hold
the tokens per optimizer step; the search measures the largest the memory model fits within the margin and the
neighbours that could be faster, and an out-of-memory end corrects the memory model and the family."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from bench.estimate import DEFAULT_MARGIN
from bench.execute import answer
from bench.execute.executors.replay import Recording
from bench.execute.plan import hardware, plan
from bench.execute.run import answer_items, family_of
from bench.matrix import spec
from bench.matrix.problems import ConfigError, InputError
from bench.records.record import parse

ANSWER_7B = "results/7b-answer-h200.jsonl"


def _search_7b() -> answer.Search:
    platform = Recording([ANSWER_7B]).platform()  # one H200, as the 7b answer ran
    p = answer_items(plan("matrices/7b.yaml", platform=platform), platform)
    return answer.Search([it for it in p.items if it.skip is None], hardware(platform), answer.Settings(), cuda=True)


def _ended(c: answer.Candidate, status: str) -> object:
    with open(ANSWER_7B) as f:
        rec = next(json.loads(line) for line in f if f'"status":"{status}"' in line.replace(" ", ""))
    cell = c.cell
    return parse(rec | {"cell": cell.to_dict(), "cell_hash": cell.hash, "cell_name": cell.name, "cell_id": cell.id})


@pytest.fixture(scope="module")
def search() -> answer.Search:
    return _search_7b()


def _fit(s: answer.Search, fam: list) -> answer.Candidate:
    """The largest micro-batch of a family the memory model fits within the margin (none fits: the smallest)."""
    room = s.capacity * (1 - DEFAULT_MARGIN)
    fits = [c for c in fam if c.state in ("open", "parked") and math.exp(sum(s.memory_interval(c)) / 2) <= room]
    return fits[-1] if fits else fam[0]


def test_each_configuration_holds_its_batch_and_measures_the_largest_micro_batch_that_fits(search):
    s = search
    assert len(s.families) == 988 and all(len(f) == 3 for f in s.families.values())
    parked = 0
    for fam in s.families.values():
        assert [c.cell.micro_batch * c.cell.grad_accum for c in fam] == [4, 4, 4]
        assert [c.cell.micro_batch for c in fam] == [1, 2, 4]
        fit = _fit(s, fam)
        assert fit.state == "open", fit.cell.name
        i = fam.index(fit)
        for c in fam[i + 2 :] + fam[: max(0, i - 1)]:  # neither the next larger nor the next smaller
            assert c.state == "parked" and c.parked_by is fit
        parked += sum(c.state == "parked" for c in fam)
    assert parked > len(s.families) / 2  # most configurations measure one or two of their three micro-batches
    why = s.aside(next(c for c in s.candidates if c.state == "parked"))
    assert "the largest the memory model fits within the margin" in why


def test_an_out_of_memory_end_drops_the_micro_batch_corrects_the_memory_model_and_opens_the_next_smaller():
    s = _search_7b()
    fam = next(f for f in s.families.values() if [c.state for c in f] == ["parked", "parked", "open"])
    big, mid = fam[2], fam[1]
    twin = next(f for f in s.families.values() if f is not fam and f[2].model.get("zero_stage") == big.model.get(
        "zero_stage") and f[2].state == "open")[2]  # fmt: skip
    before = s.memory_interval(twin)
    oom = next(json.loads(line) for line in open(ANSWER_7B) if '"cuda_oom"' in line)
    oom |= {"cell": big.cell.to_dict(), "cell_hash": big.cell.hash, "cell_name": big.cell.name, "cell_id": big.cell.id}
    s.observe(parse(oom), 0)
    assert big.state == "failed" and mid.state == "open"  # the next smaller is now the largest left
    assert s.memory_interval(twin)[1] > before[1]  # a cell that shares its settings is now predicted heavier
    # Cells now predicted past the memory are set aside, each record saying which end put them there.
    for c in (c for c in s.candidates if c.state == "wontfit"):
        assert big.cell.name in s.aside(c)


def test_a_searched_micro_batch_becomes_one_cell_per_divisor_of_the_batch(tmp_path):
    m = tmp_path / "m.yaml"
    m.write_text("name: m\nmodel: llama-tiny\nbatch: {micro: auto, size: 4}\naxes: {zero_stage: [0, 3]}\n")
    platform = Recording([ANSWER_7B]).platform()
    items = [it for it in answer_items(plan(str(m), platform=platform), platform).items if it.skip is None]
    assert sorted((it.cell.zero_stage, it.cell.micro_batch, it.cell.grad_accum) for it in items) == [
        (0, 1, 4), (0, 2, 2), (0, 4, 1), (3, 1, 4), (3, 2, 2), (3, 4, 1)
    ]  # fmt: skip
    assert len({it.family for it in items}) == 2 and all(it.family == family_of(it.cell) for it in items)
    m.write_text("name: m\nmodel: llama-tiny\nbatch: {micro: auto}\naxes: {zero_stage: [0, 3]}\n")
    with pytest.raises(InputError, match="set batch.size"):
        answer_items(plan(str(m), platform=platform), platform)


@pytest.mark.parametrize(
    "batch, says",
    [
        ("{micro: 3, size: 4}", "micro-batch 3 does not divide batch.size 4"),
        ("{grad_accum: 2, size: 4}", "batch.size 4 sets the accumulation"),
    ],
)
def test_batch_size_is_checked_against_the_micro_batches_and_the_accumulation(tmp_path, batch, says):
    m = tmp_path / "m.yaml"
    m.write_text(f"name: m\nmodel: llama-tiny\nbatch: {batch}\naxes: {{zero_stage: [0, 3]}}\n")
    with pytest.raises(ConfigError) as e:
        spec.load(str(m))
    assert says in str(e.value)


def test_a_parked_micro_batch_expected_to_repeat_an_error_is_not_opened_again():
    """Two cells fail alike, one the configuration's twin but for its engine, one but for its checkpointing: every
    micro-batch of the configuration has what they share, so each is expected to repeat the error
    (bench.execute.answer.failures), the parked ones too, and none is opened again when its family has no other left."""
    s = _search_7b()
    flip = {"deepspeed": "hf_trainer", "hf_trainer": "deepspeed"}
    for fam in (f for f in s.families.values() if [c.state for c in f] == ["parked", "parked", "open"]):
        twins = (
            s.by_hash.get(dataclasses.replace(fam[2].cell, engine=flip[fam[2].cell.engine]).hash),
            s.by_hash.get(dataclasses.replace(fam[1].cell, grad_ckpt=not fam[1].cell.grad_ckpt).hash),
        )
        if all(t is not None and t.state in ("open", "parked") for t in twins):
            break
    else:
        pytest.fail("no configuration with both twins runnable")
    for t in twins:
        s.started(t, 0)
        s.observe(_ended(t, "error"), 0)
    assert [c.state for c in fam] == ["expected"] * 3
    assert not any(s.measurable(c) for c in fam)


def test_an_attempt_interrupted_after_an_error_it_shares_was_learnt_is_expected_to_repeat_it():
    """A cell in flight is left out when errors teach the search (it is running); if its attempt then ends
    interrupted, with no outcome, it is expected to repeat the error the two ends that meanwhile came say it shares,
    not opened again."""
    s = _search_7b()
    flip = {"deepspeed": "hf_trainer", "hf_trainer": "deepspeed"}
    for c in (c for c in s.candidates if c.state == "open"):
        twins = (
            s.by_hash.get(dataclasses.replace(c.cell, engine=flip[c.cell.engine]).hash),
            s.by_hash.get(dataclasses.replace(c.cell, grad_ckpt=not c.cell.grad_ckpt).hash),
        )
        if all(t is not None and t.state == "open" for t in twins):
            break
    else:
        pytest.fail("no open cell with both twins open")
    s.started(c, 0)
    for t in twins:
        s.started(t, 0)
        s.observe(_ended(t, "error"), 0)
    assert c.state == "open"  # in flight: not judged while it runs
    s.observe(_ended(c, "interrupted"), 0)
    assert c.state == "expected" and not s.measurable(c)


def test_before_anything_is_measured_a_predicted_cells_range_is_its_familys_band():
    from bench.estimate.band import step_time_band

    fresh = _search_7b()
    assert not any(c.obs for c in fresh.candidates)
    c = next(c for c in fresh.candidates if c.base_tps is not None and c.cell.ds_config is None)
    lo, _, hi = step_time_band(c.cell, fresh.hw)
    tokens = c.cell.tokens_per_step
    # A slower step than predicted is fewer tokens/s: the band's high edge is the range's low one.
    assert f"[{answer.kilo(tokens / hi)}, {answer.kilo(tokens / lo)}] at 95%" in answer.speed_text(fresh, c)
