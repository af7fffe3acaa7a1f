"""micro_batch: auto, the search (bench.estimate.planning.search) and its place in `zerobench run`.

The search's logic is tested against a memory wall stated here (micro-batches up to the wall run, the
rest run out of memory): it stands in for the GPU, whose answers the search only reads. The real
pipeline is tested on CPU with real tiny cells: a matrix that says auto expands and plans, and a run
with a GPU budget given prunes a cell predicted not to fit, recording why.
"""

from __future__ import annotations

import json

import pytest

from bench.estimate import Hardware, predict
from bench.estimate.planning.search import next_probe, search_micro_batch, seed_micro_batch
from bench.judge.results import with_cells
from bench.matrix import spec
from bench.records.record import parse
from bench.records.store import read_records
from tests.conftest import zerobench

GiB = 2**30


def _wall(limit: int, other: dict[int, str] | None = None):
    """A run() for search_micro_batch: micro-batches up to `limit` run, larger ones run out of memory."""
    ran, searches = [], []

    def run(mb: int, search_after):
        status = (other or {}).get(mb) or ("ok" if mb <= limit else "cuda_oom")
        ran.append(mb)
        searches.append(search_after(status, f"hash{mb}"))
        return status, f"hash{mb}"

    return run, ran, searches


def test_an_accurate_seed_closes_in_two_probes():
    run, ran, searches = _wall(12)
    res = search_micro_batch(run, seed=12, template="t")
    assert ran == [12, 13] and res.largest_ok == 12 and res.smallest_oom == 13
    assert searches[-1]["ended"] == "micro-batch 12 runs and 13 runs out of memory"
    assert searches[0]["ended"] == ""  # the first record's search was still open


def test_gallops_up_then_bisects():
    run, ran, _ = _wall(20)
    res = search_micro_batch(run, seed=10, template="t")
    assert ran == [10, 11, 13, 17, 25, 21, 19, 20]
    assert res.largest_ok == 20 and res.smallest_oom == 21


def test_gallops_down_from_an_optimistic_seed():
    run, ran, _ = _wall(5)
    res = search_micro_batch(run, seed=12, template="t")
    assert ran[:4] == [12, 11, 9, 5] and res.largest_ok == 5 and res.smallest_oom == 6


def test_nothing_fits():
    run, ran, _ = _wall(0)
    res = search_micro_batch(run, seed=3, template="t")
    assert res.largest_ok is None and ran[-1] == 1
    assert res.ended == "even micro-batch 1 runs out of memory"


def test_a_failure_that_is_not_memory_ends_the_search():
    run, ran, searches = _wall(50, other={11: "error"})
    res = search_micro_batch(run, seed=10, template="t")
    assert ran == [10, 11] and res.largest_ok == 10
    assert "ended error: not a memory answer" in res.ended and searches[-1]["ended"] == res.ended


def test_probe_limit_and_cap():
    run, ran, _ = _wall(10**6)
    res = search_micro_batch(run, seed=1, template="t", max_probes=4)
    assert ran == [1, 2, 4, 8] and "4 probes" in res.ended
    run, ran, _ = _wall(10**6)
    res = search_micro_batch(run, seed=30, template="t", cap=32)
    assert ran == [30, 31, 32] and "cap" in res.ended


def test_non_monotonic_answers_stop_rather_than_guess():
    assert next_probe(8, [(8, "cuda_oom"), (7, "ok"), (9, "ok")])[0] is None


def test_the_search_record_validates():
    run, _, searches = _wall(3)
    search_micro_batch(run, seed=2, template="zero=0,mb=auto")
    from bench.records.record import Search

    s = Search.model_validate(searches[-1])
    assert s.largest_ok == 3 and [p.micro_batch for p in s.probes] == [2, 3, 5, 4]


def test_seed_is_the_models_largest_fitting_micro_batch():
    m = spec.loads("model: llama-1b\nseq_len: 2048\nbatch: {micro: auto}\naxes: {grad_ckpt: [true]}")
    (template,) = spec.expand(m)
    assert template.micro_batch == "auto" and "mb=auto" in template.name
    hw = Hardware(gpu_memory_bytes=40 * GiB, host_memory_bytes=100 * GiB)
    seed = seed_micro_batch(template, hw)
    from dataclasses import replace

    from bench.matrix import dsconfig

    def need(mb):
        c = replace(template, micro_batch=mb)
        return predict(c, dsconfig.build(c), hw).gpu_bytes

    assert seed > 1 and need(seed) <= 40 * GiB < need(seed + 1)
    assert seed_micro_batch(template, Hardware()) == 1  # no GPU to judge against: start at 1


def test_auto_is_validated():
    with pytest.raises(spec.MatrixError, match="auto"):
        spec.loads("batch: {micro: autoo}")
    cells = spec.expand(spec.loads("axes: {micro_batch: [2, auto]}"))
    assert [c.micro_batch for c in cells] == [2, "auto"]


@pytest.mark.slow
def test_run_prunes_cells_predicted_not_to_fit(tmp_path):
    """A CPU run told the GPU has 2 GiB: the cell the model says needs more is recorded as skipped with
    the prediction and why; the other runs, carrying its prediction. --no-prune runs both."""
    (tmp_path / "m.yaml").write_text(
        "name: prune\nmodel: llama-tiny\nseq_len: 64\nsteps: {warmup: 1, measured: 2}\n"
        "axes: {zero_stage: [0], precision: [fp32], micro_batch: [1, 256]}\n"
    )
    r = zerobench("run", "m.yaml", "--gpu-mem", "2GiB", "--no-report", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    # A skipped cell's record is compact: its cell comes from the matrix file (bench.judge.results.with_cells).
    recs = list(with_cells(read_records(tmp_path / "results/local/prune.jsonl"), near=[tmp_path]))
    ends = {rec.cell["micro_batch"]: rec for rec in recs if rec.status.value != "started"}
    assert ends[1].status.value == "ok" and ends[1].predicted.gpu_memory_bytes == 2 * GiB
    pruned = ends[256]
    assert pruned.status.value == "skipped" and pruned.skip.rule == "predicted-oom"
    assert pruned.reason.startswith("predicted OOM: needs ") and " of 2.0 GiB" in pruned.reason
    assert pruned.predicted.gpu_bytes > 2.2 * GiB and pruned.predicted.gpu_verdict == "won't fit"
    assert "skipped" in r.stdout and "predicted OOM" in r.stdout

    r = zerobench(
        "run",
        "m.yaml",
        "--gpu-mem",
        "2GiB",
        "--no-prune",
        "--results",
        "all.jsonl",
        "--no-report",
        "--no-progress",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert sorted(x["status"] for x in recs if x["status"] != "started") == ["ok", "ok"]
    assert all(x["predicted"]["gpu_verdict"] for x in recs)


@pytest.mark.slow
def test_cpu_run_without_a_gpu_prunes_nothing(tmp_path):
    (tmp_path / "m.yaml").write_text(
        "name: noprune\nmodel: llama-tiny\nseq_len: 64\nsteps: {warmup: 1, measured: 2}\n"
        "axes: {zero_stage: [0], precision: [fp32]}\n"
    )
    r = zerobench("run", "m.yaml", "--no-report", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(line) for line in (tmp_path / "results/local/noprune.jsonl").read_text().splitlines()]
    assert [x["status"] for x in recs] == ["started", "ok"] and not any("predicted" in x for x in recs)


@pytest.mark.slow
def test_run_records_the_search_on_its_probes(tmp_path):
    """micro_batch: auto in a real CPU run: each probe is its own recorded cell, and its record carries the
    search as it stands. Without a GPU budget the search starts at 1; a probe that fails for another reason
    than memory (a fault injected into the real worker) ends the search, which says why."""
    (tmp_path / "m.yaml").write_text(
        "name: auto\nmodel: llama-tiny\nseq_len: 32\nbatch: {micro: auto}\nsteps: {warmup: 1, measured: 2}\n"
        "axes: {zero_stage: [0], precision: [fp32]}\n"
    )
    r = zerobench("run", "m.yaml", "--no-report", "--no-progress", cwd=tmp_path, env={"ZEROBENCH_FAULT": "raise@1"})
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [json.loads(line) for line in (tmp_path / "results/local/auto.jsonl").read_text().splitlines()]
    ends = [x for x in recs if x["status"] != "started"]
    assert len(ends) == 1 and ends[0]["cell"]["micro_batch"] == 1 and ends[0]["status"] == "error"
    s = parse(ends[0]).search
    assert s.template.endswith("mb=auto") and s.seed == 1 and [p.micro_batch for p in s.probes] == [1]
    assert "not a memory answer" in s.ended and s.largest_ok is None
    assert "micro_batch auto for" in r.stdout


def test_estimate_shows_an_auto_cell_at_its_seed():
    from bench.estimate.table import estimate_cells

    m = spec.loads("model: llama-1b\nseq_len: 2048\nbatch: {micro: auto}\naxes: {grad_ckpt: [true]}")
    hw = Hardware(gpu_memory_bytes=40 * GiB, host_memory_bytes=100 * GiB)
    ((cell, e, why),) = estimate_cells(spec.expand(m), hw)
    assert why == "" and cell.micro_batch == seed_micro_batch(spec.expand(m)[0], hw)
    assert e.gpu_bytes <= 40 * GiB
