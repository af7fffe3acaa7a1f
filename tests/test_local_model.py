"""A model from a local Hugging Face directory (the QLoRA path loads one too) trains in training mode."""
from __future__ import annotations

import pytest

from bench.store import read

from .conftest import TINY, write_matrix, zerobench

pytestmark = pytest.mark.slow


def test_local_checkpoint_trains_in_train_mode(tmp_path, monkeypatch):
    import torch

    from bench.worker import models

    monkeypatch.setenv("ZEROBENCH_CACHE", str(tmp_path / "cache"))
    ckpt = models.checkpoint("llama-tiny", torch.bfloat16, torch.device("cpu"))
    m = write_matrix(tmp_path / "m.yaml", TINY.replace("model: llama-tiny", f"model: {ckpt}")
                     + "axes: {grad_ckpt: [true]}\n")
    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    (rec,) = [x for x in read(res) if x["status"] != "started"]
    assert rec["status"] == "ok", rec["reason"]
    # from_pretrained hands back an eval-mode model; gradient checkpointing only acts in train mode.
    assert rec["worker"]["train_mode"] is True
    assert rec["worker"]["params_total"] > 500_000


def test_local_checkpoint_loads_its_weights_under_zero3(tmp_path, monkeypatch):
    # Under ZeRO-3 the weights must be loaded into the partitioned parameters, not into empty ones:
    # the same checkpoint gives the same first loss at ZeRO-0 and ZeRO-3.
    import torch

    from bench.worker import models

    monkeypatch.setenv("ZEROBENCH_CACHE", str(tmp_path / "cache"))
    ckpt = models.checkpoint("llama-tiny", torch.bfloat16, torch.device("cpu"))
    m = write_matrix(tmp_path / "m.yaml", TINY.replace("model: llama-tiny", f"model: {ckpt}")
                     + "axes: {zero_stage: [0, 3], optimizer: [adamw]}\n")
    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = {x["cell"]["zero_stage"]: x for x in read(res) if x["status"] != "started"}
    assert {z: x["status"] for z, x in recs.items()} == {0: "ok", 3: "ok"}, {z: x["reason"] for z, x in recs.items()}
    assert recs[3]["worker"]["params_total"] == recs[0]["worker"]["params_total"]
    assert recs[3]["losses"][0] == pytest.approx(recs[0]["losses"][0], rel=1e-3)
