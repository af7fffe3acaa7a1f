"""A model from a local Hugging Face directory (the QLoRA path loads one too): it trains in training
mode, and under ZeRO-3 its weights are loaded into the partitioned parameters."""

from __future__ import annotations

import pytest

from tests.conftest import TINY, as_written, write_matrix, zerobench

pytestmark = pytest.mark.slow


def _run_local(tmp_path, monkeypatch, axes: str) -> list[dict]:
    """Run a matrix over a local checkpoint of llama-tiny (random weights, saved once); its outcomes."""
    import torch

    from bench.worker.parts import models

    monkeypatch.setenv("ZEROBENCH_CACHE", str(tmp_path / "cache"))
    ckpt = models.checkpoint("llama-tiny", torch.bfloat16, torch.device("cpu"))
    m = write_matrix(tmp_path / "m.yaml", TINY.replace("model: llama-tiny", f"model: {ckpt}") + f"axes: {axes}\n")
    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    return [x for x in as_written(res) if x["status"] != "started"]


def test_local_checkpoint_trains_in_train_mode(tmp_path, monkeypatch):
    (rec,) = _run_local(tmp_path, monkeypatch, "{grad_ckpt: [true]}")
    assert rec["status"] == "ok", rec["reason"]
    # from_pretrained hands back an eval-mode model; gradient checkpointing only acts in train mode.
    assert rec["worker"]["train_mode"] is True
    assert rec["worker"]["params_total"] > 500_000


def test_local_checkpoint_loads_its_weights_under_zero3(tmp_path, monkeypatch):
    # Inside zero.Init every weight met an already-partitioned (empty) parameter and the cell failed
    # on the size mismatch: the same checkpoint must give the same first loss at ZeRO-0 and ZeRO-3.
    recs = {
        x["cell"]["zero_stage"]: x
        for x in _run_local(tmp_path, monkeypatch, "{zero_stage: [0, 3], optimizer: [adamw]}")
    }
    assert {z: x["status"] for z, x in recs.items()} == {0: "ok", 3: "ok"}, {z: x["reason"] for z, x in recs.items()}
    assert recs[3]["worker"]["params_total"] == recs[0]["worker"]["params_total"]
    assert recs[3]["losses"][0] == pytest.approx(recs[0]["losses"][0], rel=1e-3)
