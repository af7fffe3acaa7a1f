"""Trainer-style DeepSpeed configs (no optimizer section, "auto" values, micro-batch 1, offload) run on
both engines as the HF Trainer would run them, and `zerobench cells` predicts what the worker does:
every cell it lists as runnable runs, every refusal is listed before anything runs."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT, TINY, as_written, write_matrix, zerobench

pytestmark = pytest.mark.slow
CORPUS = sorted((ROOT / "matrices" / "ds_configs" / "trainer").glob("*.json"))


def test_the_corpus_runs_on_both_engines_as_cells_predicts(tmp_path):
    assert len(CORPUS) >= 10
    m = write_matrix(tmp_path / "m.yaml", TINY + "axes: {engine: [deepspeed, hf_trainer], precision: [bf16]}\n")
    files = [str(p) for p in CORPUS]
    listed = zerobench("cells", str(m), "--ds-config", *files, cwd=tmp_path, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    # "  run  zero=...#hash" / "  skip zero=...#hash" lines: what cells promises, by cell hash.
    promised = {h: kind for kind, h in re.findall(r"^\s*(run|skip)\s+\S*#([0-9a-f]{10})", listed.stdout, re.M)}
    assert promised and "skip" in promised.values() and "run" in promised.values(), listed.stdout[-3000:]

    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--ds-config", *files, "--results", str(res), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = {x["cell_hash"]: x for x in as_written(res) if x["status"] != "started"}
    assert set(recs) == set(promised)
    for h, rec in recs.items():
        want = "ok" if promised[h] == "run" else "skipped"
        assert rec["status"] == want, f"{rec['cell_name']}: {rec['reason'][:800]}"
    engines = {(rec["cell"]["ds_config"], rec["cell"]["engine"]) for rec in recs.values() if rec["status"] == "ok"}
    assert len({f for f, _ in engines}) >= 10 and {e for _, e in engines} == {"deepspeed", "hf_trainer"}

    by_file = {}
    for rec in recs.values():
        by_file.setdefault(rec["cell"]["ds_config"].rsplit("/", 1)[-1], []).append(rec)
    # A config that offloads the optimizer runs DeepSpeedCPUAdam, and the cell says so.
    for rec in by_file["zero3-offload-unpinned.json"] + by_file["zero2-offload-optimizer.json"]:
        assert rec["cell"]["optimizer"] == "cpuadam"
        assert rec["worker"]["optimizer_class"].endswith("DeepSpeedCPUAdam")
    # Values a config states win over the matrix: micro-batch 1 and accumulation 2, clipping 0.5.
    for rec in by_file["zero1-explicit.json"]:
        assert (rec["cell"]["micro_batch"], rec["cell"]["grad_accum"]) == (1, 2)
        assert rec["ds_config"]["train_micro_batch_size_per_gpu"] == 1 and rec["ds_config"]["gradient_clipping"] == 0.5
    # fp16 cannot run on a CPU: refused before anything runs, as cells said.
    assert all(rec["status"] == "skipped" and "fp16" in rec["reason"] for rec in by_file["zero3-explicit-fp16.json"])
