"""Report headlines computed from results alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.judge import results
from bench.report import analysis

DATA = Path(__file__).parent.parent / "data" / "synthetic_gpu.jsonl"


def test_best_mfu_headline_is_not_an_fp32_cell(tmp_path):
    # fp32 MFU is against the GPU's small non-tensor-core fp32 peak: a 42% fp32 cell must not
    # headline over a 40% bf16 one (it did on the first H200 report).
    recs = [json.loads(line) for line in DATA.read_text().splitlines()[:2]]
    fp32, bf16 = recs
    fp32 = {
        **fp32,
        "cell_hash": "fp32cell01",
        "cell": {**fp32["cell"], "precision": "fp32"},
        "metrics": {**fp32["metrics"], "mfu": 0.424},
    }
    bf16 = {**bf16, "metrics": {**bf16["metrics"], "mfu": 0.406}}
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (fp32, bf16)))
    (s,) = analysis.analyse(results.load(path)).sections
    assert s.best_mfu["precision"] == "bf16" and s.best_mfu["mfu"] == 0.406
    (only_fp32,) = analysis.analyse(results.load(path).query("precision == 'fp32'")).sections
    assert only_fp32.best_mfu["mfu"] == 0.424  # with nothing else, fp32 is still shown


def test_zero_stages_against_the_paper_from_the_2gpu_results():
    from bench import estimate
    from bench.report import html, markdown

    df = results.load(Path(__file__).resolve().parents[2] / "results" / "1b-2gpu.jsonl")
    a = analysis.analyse(df)
    rows = a.zero_scaling
    assert [r["zero_stage"] for r in rows] == [0, 1, 2, 3] and all(r["gpus"] == 2 for r in rows)
    for r in rows:  # the prediction is the paper's formula for mixed-precision Adam (K = 12)
        assert r["predicted_ratio"] == pytest.approx(estimate.zero_ratio(r["zero_stage"], 2))
        assert 0 < r["nvml_proc_peak_bytes_ratio"] <= 1.0
    assert rows[0]["torch_max_allocated_bytes_ratio"] == 1.0
    # QLoRA (frozen 4-bit base) is not a full fine-tune: the paper's ratios do not describe it.
    assert not any("qlora" in r["cell_name"] for r in rows)
    assert "## ZeRO stages against the paper" in markdown.render_analysis(a)
    assert 'id="zero"' in html.render_analysis(a)


def test_user_configs_are_compared_with_the_generated_zero0():
    # 1b-2gpu-buckets re-runs the generated ZeRO-0 cell beside ZeRO 1-3 from user configs with small
    # buckets: one ZeRO-0 row (the latest of the two runs of that cell), one row per stage and config.
    from bench.report import markdown

    root = Path(__file__).resolve().parents[2] / "results"
    df = results.load(root / "1b-2gpu-b.jsonl", root / "1b-2gpu-buckets.jsonl")
    rows = analysis.analyse(df).zero_scaling
    assert [(r["zero_stage"], r["ds_config"]) for r in rows] == [
        (0, None),
        (1, None),
        (1, "zero1-buckets-5e7.json"),
        (2, None),
        (2, "zero2-buckets-5e7.json"),
        (3, None),
        (3, "zero3-buckets-5e7.json"),
    ]
    z0 = df[(df["zero_stage"] == 0) & (df["status"] == "ok") & (df["peft"] == "none")]
    assert len(z0) == 2 and rows[0]["nvml_proc_peak_bytes"] == z0.iloc[-1]["nvml_proc_peak_bytes"]
    # Smaller buckets lower ZeRO-2's and ZeRO-3's peaks, not ZeRO-1's (which has no reduce buckets here).
    by = {(r["zero_stage"], r["ds_config"]): r for r in rows}
    for z in (2, 3):
        assert by[(z, f"zero{z}-buckets-5e7.json")]["nvml_proc_peak_bytes"] < by[(z, None)]["nvml_proc_peak_bytes"]
    assert "| DeepSpeed config |" in markdown.render_analysis(analysis.analyse(df))


def test_selfcheck_variants_stay_apart_in_a_report():
    df = results.load(Path(__file__).resolve().parents[2] / "results" / "selfcheck-1b.jsonl")
    a = analysis.analyse(df)
    assert sorted(a.cells["cell_name"].str.extract(r"\[(.*)\]")[0]) == ["no-telemetry", "reference", "zerobench"]


def test_zero_paper_ordering_at_the_end_of_backward():
    # 2 x H200, 1.1B, micro-batch 1: the allocator's peak in the backward pass (where parameters,
    # gradients and optimizer state all exist) falls from ZeRO-0 to 3 as the paper predicts once
    # DeepSpeed's buffers are sized to the model (5e7-element buckets; ZeRO-3 releasing each layer's
    # gathered parameters after use). With DeepSpeed's defaults it does not (ZeRO-2 above ZeRO-1).
    root = Path(__file__).resolve().parents[2] / "results"
    df = results.load(root / "1b-2gpu-mb1.jsonl", root / "1b-2gpu-z3live.jsonl")
    by = {(r["zero_stage"], r["ds_config"]): r for r in analysis.analyse(df).zero_scaling}
    tuned = [
        by[(0, None)],
        by[(1, "zero1-buckets-5e7.json")],
        by[(2, "zero2-buckets-5e7.json")],
        by[(3, "zero3-live-1e8.json")],
    ]
    for col in ("torch_max_allocated_backward_bytes", "nvml_proc_peak_bytes"):
        ratios = [r[f"{col}_ratio"] for r in tuned]
        assert ratios == sorted(ratios, reverse=True) and len(set(ratios)) == 4, (col, ratios)
    for r in tuned:  # activations and buffers sit on top of the model states: near the formula, not on it
        assert r["torch_max_allocated_backward_bytes_ratio"] == pytest.approx(r["predicted_ratio"], abs=0.05)
    assert by[(2, None)]["torch_max_allocated_backward_bytes"] > by[(1, None)]["torch_max_allocated_backward_bytes"]


def test_the_headline_says_how_many_skipped_cells_were_pruned(tmp_path):
    # Issue 16: the report says how many cells were pruned by the memory model, apart from rule skips.
    from bench.matrix import rules
    from bench.matrix.cells import Cell
    from bench.records.record import Record
    from bench.report import html, markdown

    GiB = 2**30
    pred = {"gpu_bytes": 200 * GiB, "gpu_memory_bytes": 140 * GiB, "gpu_verdict": "won't fit", "margin": 0.1}
    pred |= {"host_bytes": GiB, "host_memory_bytes": 100 * GiB, "host_verdict": "fits"}
    from bench.execute.plan import prune_skip

    pruned = prune_skip(pred)
    assert pruned is not None and pruned.rule == rules.PRUNED
    ruled = rules.Skip("no-gpu", "needs a GPU", "run it on a GPU", "a test")
    cells = [Cell(model="llama-tiny", seq_len=32, micro_batch=mb) for mb in (1, 2, 4)]
    ident = {"run_id": "r", "attempt": 1, "matrix_file": "m.yaml", "at": "2026-12-01T00:00:00Z"}
    recs = [Record.skipped(cells[0], pruned, **ident), Record.skipped(cells[1], pruned, **ident)]
    recs.append(Record.skipped(cells[2], ruled, **ident))
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in recs))
    a = analysis.analyse(results.load(path))
    assert (a.counts, a.pruned) == ({"skipped": 3}, 2)
    md = markdown.render_analysis(a)
    assert "Of the 3 skipped, 2 were pruned by the memory model (predicted not to fit) and 1 ruled out by a rule." in md
    assert "2 pruned by the memory model, 1 by a rule" in html.render_analysis(a)
