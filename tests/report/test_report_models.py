"""The report per model: never one ranking across models, and each knob's effect with its 95% interval and
the number of pairs behind it (bench/judge/effects.py has the method).

Inputs: the committed H200 results (1.1B and 7B records as zerobench wrote them), and records built with
test_compare's record helper where the true effect has to be known."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest

from bench.judge import effects, results
from bench.judge.results import records_to_frame
from bench.records.record import parse
from bench.report import fmt, html, markdown
from bench.report.analysis import analyse
from tests.judge.test_compare import rec

ROOT = Path(__file__).resolve().parents[2] / "results"


@pytest.fixture(scope="module")
def two_models():
    return analyse(results.load(ROOT / "1b.jsonl", ROOT / "7b-build.jsonl"))


def _model_of(name: str) -> str:
    return name.split(" ", 1)[0]


def test_two_models_get_a_section_each_and_no_cross_model_ranking(two_models):
    a = two_models
    assert [(s.model, s.seq_len) for s in a.sections] == [("llama-1b", 2048), ("llama-7b", 2048)]
    for s in a.sections:
        ranked = [r for r in (s.fastest, s.smallest, s.best_mfu) if r] + s.frontier.to_dict("records")
        ranked += s.ok.to_dict("records")
        assert {_model_of(r["cell_name"]) for r in ranked} == {s.model}
        # Every knob effect pairs cells of this model only.
        for ab in s.ablations:
            for g in ab.groups:
                assert {_model_of(c["cell_name"]) for c in g["cells"].values() if c} == {s.model}
    one_b, seven_b = a.sections
    # The 7B's best cell is slower and larger than the 1.1B's cells that beat it: one ranking over both
    # models would have dropped it from the frontier and never named it fastest.
    best7 = seven_b.fastest
    assert best7["pareto"] and best7["cell_name"] == seven_b.frontier.iloc[0]["cell_name"]
    assert any(
        r["tokens_per_s"] > best7["tokens_per_s"] and r["peak_memory_bytes"] < best7["peak_memory_bytes"]
        for r in one_b.ok.to_dict("records")
    )
    # ZeRO-3 against ZeRO-0: the 1.1B's pairs and the 7B's counted apart (one pooled median before).
    z3 = {
        s.model: next(e for ab in s.ablations if ab.axis == "zero_stage" for e in ab.effects if e["value"] == 3)
        for s in a.sections
    }
    assert (z3["llama-1b"]["n"], z3["llama-7b"]["n"]) == (3, 1)


def _chunks(text: str, marks: list[str]) -> list[str]:
    """text cut at each mark in turn: the part from one mark to the next."""
    at = [text.index(m) for m in marks] + [len(text)]
    assert at[:-1] == sorted(at[:-1])
    return [text[i:j] for i, j in zip(at, at[1:])]


def test_markdown_and_html_rank_each_model_in_its_own_section(two_models):
    a = two_models
    md = markdown.render_analysis(a)
    assert "One section per model and sequence length" in md
    heads = [f"## {markdown.escape(s.label)}\n" for s in a.sections] + ["## Loss parity"]
    one_b, seven_b, _ = _chunks(md, heads)
    for part, model, other in ((one_b, "llama-1b", "llama-7b"), (seven_b, "llama-7b", "llama-1b")):
        for h in ("### Best cells", "### What fits", "### One knob at a time"):
            assert h in part, (model, h)
        assert f"| fastest | {model} " in part and other not in part
    # The 1.1B's knob table: ZeRO-3 over its 3 pairs, with the interval and verdict.
    assert "| ZeRO stage | 3 vs 0 | 3 | ×0.56 [0.45–0.71, 95%] | slower |" in one_b
    page = html.render_analysis(a)
    sections = _chunks(page, [f'<section id="{s.slug}" class="model">' for s in a.sections] + ['<section id="cells">'])
    for part, s in zip(sections, a.sections):
        other = "llama-7b" if s.model == "llama-1b" else "llama-1b"
        assert f"<h2>{s.label}</h2>" in part and f"{s.model} zero=" in part and f"{other} zero=" not in part
        assert f'id="{s.slug}-summary"' in part and f'id="{s.slug}-tradeoff"' in part
        assert part.count("<svg") == 1  # its own chart
    assert page.count('class="model"') == 2


def test_one_model_reads_as_before(tmp_path):
    from bench.report import write_reports

    written = write_reports([ROOT / "1b.jsonl"], tmp_path / "r")
    assert sorted(p.name for p in written) == ["r.html", "r.loss.png", "r.md", "r.tradeoff.png"]
    md = (tmp_path / "r.md").read_text()
    assert "## Best cells" in md and "## One knob at a time" in md and "###" not in md
    assert "One section per model" not in md
    page = (tmp_path / "r.html").read_text()
    assert 'class="model"' not in page
    for part in ("summary", "tradeoff", "ablations", "compute"):
        assert f'<section id="{part}"' in page


# -- effects with intervals ----------------------------------------------------------------------------


def _cell(i: int, gc: bool, tps: float, jitter: float, rng: random.Random) -> dict:
    """A record of group i (its micro-batch) with checkpointing gc, measured at tps tokens/s with each of
    its 8 measured steps `jitter` apart (relative), as a run's steps spread."""
    r = rec(0, 1, tps=tps)
    r["cell"] |= {"micro_batch": i + 1, "grad_ckpt": gc, "measured_steps": 8}
    r["cell_hash"] = f"{2 * i + gc:010x}"
    r["cell_name"] = f"zero=0,gc={'on' if gc else 'off'},mb={i + 1}"
    r["cell_id"] = f"{r['cell_name']}#{r['cell_hash']}"
    step = 8192 / tps
    times = [step * math.exp(rng.gauss(0, jitter)) for _ in range(8)]
    r["step_times_s"] = [1.0] + times
    r["metrics"] |= {"tokens_per_s": 8192 / statistics.median(times), "step_time_median_s": statistics.median(times)}
    return r


def _gc_effect(true_ratio: float, pairs: int, seed: int, between: float = 0.04, within: float = 0.01):
    """Records of `pairs` groups, each measured once per side with run-to-run noise `between` (relative)
    around a group's own speed, and the report's checkpointing effect over them."""
    rng = random.Random(seed)
    recs = []
    for i in range(pairs):
        base = 30_000 * (1 + i / 4)  # the groups run at different speeds: only the ratio is shared
        for gc, f in ((False, 1.0), (True, true_ratio)):
            recs.append(_cell(i, gc, base * f * math.exp(rng.gauss(0, between)), within, rng))
    a = analyse(records_to_frame(map(parse, recs)))
    (s,) = a.sections
    (ab,) = [x for x in s.ablations if x.axis == "grad_ckpt"]
    (e,) = ab.effects
    return e, a


def test_an_effect_over_several_pairs_has_an_interval_around_the_true_ratio():
    e, a = _gc_effect(0.8, pairs=6, seed=1)
    t = e["tokens"]
    assert e["n"] == t.n == 6 and t.method == "t-interval over 6 pairs"
    assert t.ci[0] < 0.8 < t.ci[1] < 1 and t.verdict == "slower"
    assert t.ratio == pytest.approx(math.exp(statistics.fmean(math.log(x) for x in t.ratios)))
    md = markdown.render_analysis(a)
    assert f"| Gradient checkpointing | on vs off | 6 | {fmt.effect(t.ratio, t.ci, t.ci_conf)} | slower |" in md
    assert "t-interval over 6 pairs" in html.render_analysis(a)


def test_no_effect_over_several_pairs_is_no_significant_difference():
    e, a = _gc_effect(1.0, pairs=6, seed=2)
    t = e["tokens"]
    assert t.ci[0] < 1 < t.ci[1] and t.verdict == "no significant difference" and t.why == "the interval covers ×1"
    assert "| Gradient checkpointing | on vs off | 6 |" in markdown.render_analysis(a)
    assert "no significant difference" in html.render_analysis(a)


def test_interval_coverage_and_false_calls_over_many_constructed_runs():
    # The summary itself (bench.judge.effects) over 400 constructed experiments: 4 pairs, 5% run-to-run
    # noise, a true ratio of 0.85 or 1. The 95% interval should cover the truth about 95% of the time,
    # and with no effect the report should rarely call one.
    rng = random.Random(7)

    def experiment(true_ratio: float) -> effects.Effect:
        pairs = []
        for _ in range(4):
            ref = effects.Side(value=math.exp(rng.gauss(0, 0.05)), sds=(0.005,))
            cur = effects.Side(value=true_ratio * math.exp(rng.gauss(0, 0.05)), sds=(0.005,))
            pairs.append((ref, cur))
        return effects.throughput(pairs)

    for true_ratio in (0.85, 1.0):
        runs = [experiment(true_ratio) for _ in range(400)]
        covered = sum(e.ci[0] <= true_ratio <= e.ci[1] for e in runs) / len(runs)
        assert 0.91 <= covered <= 0.99, (true_ratio, covered)
        if true_ratio == 1.0:
            assert sum(e.verdict in ("faster", "slower") for e in runs) / len(runs) <= 0.05


def test_pairs_that_agree_by_chance_keep_their_measurement_noise():
    # Two pairs with the same ratio have no spread, but each cell's run was noisy: the interval is as wide
    # as the cells' own standard errors allow (t with 1 degree of freedom), and covers 1 here.
    noisy = effects.Side(value=1.0, sds=(0.02,))
    pair = (noisy, effects.Side(value=0.95, sds=(0.02,)))
    t = effects.throughput([pair, pair])
    half = math.log(t.ci[1] / t.ratio)
    assert half == pytest.approx(12.706 * math.sqrt(2 * 0.02**2 / 2), rel=1e-3)
    assert t.ci[0] < 1 < t.ci[1] and t.verdict == "no significant difference"


def test_one_pair_of_single_runs_is_judged_by_its_interval():
    # One run a side: the interval is the two measurements' noise (1% each here); the verdict follows from it.
    ref = effects.Side(value=100.0, sds=(0.01,))
    t = effects.throughput([(ref, effects.Side(value=110.0, sds=(0.01,)))])
    assert t.ci[0] > 1.05 and t.verdict == "faster" and t.method == "1 pair: the two cells' noise, one run each"
    unsure = effects.throughput([(ref, effects.Side(value=104.0, sds=(0.01,)))])
    assert 1 < unsure.ci[0] < 1.05 and unsure.verdict == "not settled" and unsure.why.startswith("faster, but")
    same = effects.throughput([(ref, effects.Side(value=101.0, sds=(0.01,)))])
    assert same.ci[0] < 1 < same.ci[1] and same.verdict == "no significant difference"


def test_memory_effect_beyond_its_tolerance():
    gib = 2**30
    pairs = [(effects.Side(value=40 * gib), effects.Side(value=f * 28 * gib)) for f in (0.99, 1.0, 1.01)]
    m = effects.memory(pairs, "nvml")
    assert m.verdict == "less" and m.ci[0] < 0.7 < m.ci[1] and m.n == 3
    same = effects.memory([(effects.Side(value=40 * gib), effects.Side(value=40.4 * gib))], "nvml")
    assert same.verdict == "no significant difference" and same.ci is None  # 1% against NVML's 2%
