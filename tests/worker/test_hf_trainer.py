"""The HF Trainer engine (TrainingArguments(deepspeed=...)), measured the same way as the DeepSpeed loop."""

from __future__ import annotations

import pytest

from tests.conftest import TINY, as_written, write_matrix, zerobench

pytestmark = pytest.mark.slow


def test_trainer_cells_run_and_are_comparable(tmp_path):
    body = (
        TINY.replace("batch: {micro: 2, grad_accum: 1}", "batch: {micro: 8, grad_accum: 2}")
        .replace("steps: {warmup: 1, measured: 4}", "steps: {warmup: 2, measured: 6}")
        .replace("lr: 3.0e-3", "lr: 1.0e-2")
    )
    m = write_matrix(tmp_path / "m.yaml", body + "axes: {zero_stage: [0, 3], engine: [hf_trainer, deepspeed]}\n")
    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [x for x in as_written(res) if x["status"] != "started"]
    assert len(recs) == 4 and all(x["status"] == "ok" for x in recs), [x["reason"] for x in recs]
    for x in recs:
        assert len(x["step_times_s"]) == len(x["losses"]) == 8, "same number of timed optimizer steps"
        assert x["worker"]["optimizer_class"].endswith(".AdamW")
        # Both paths say which kernels the model ran (the Trainer's from inside train()).
        assert x["worker"]["kernels"] == {"asked": "hf", "liger_modules": 0, "liger_settings": None}
        measured = x["losses"][2:]
        assert sum(measured[-2:]) < sum(measured[:2]), x["losses"]
    trainer = [x for x in recs if x["cell"]["engine"] == "hf_trainer"]
    assert len(trainer) == 2 and all("optimizer" in x["ds_config"] for x in trainer)
