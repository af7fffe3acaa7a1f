"""What a run does once before its cells: the QLoRA checkpoint is built by one process, up front, once
per machine (bench.records.cache); a cached one that does not check out is built again."""

from __future__ import annotations

import json

from bench.execute import prepare
from bench.host import env
from bench.matrix.cells import Cell, Lora, Qlora
from bench.records import cache


def test_qlora_checkpoint_is_built_once_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROBENCH_CACHE", str(tmp_path / "cache"))
    cell = Cell(model="llama-tiny", peft="qlora", precision="bf16", lora=Lora(r=4), qlora=Qlora(), gpus=2)
    items = [prepare.Planned(cell=cell, skip=None, ds_config={}), prepare.Planned(cell=cell, skip=None, ds_config={})]
    lines: list[str] = []
    costs = prepare._checkpoints(items, tmp_path / "logs", None, env.probe(), lines.append)
    ckpt = cache.checkpoint_dir("llama-tiny", "bf16")
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "llama"
    assert any(p.suffix == ".safetensors" for p in ckpt.iterdir())
    assert cache.checkpoint_problem(ckpt, cache.checkpoint_key("llama-tiny", "bf16")) is None
    # One build for the two cells.
    assert len(lines) == 2 and "building" in lines[0] and "ready" in lines[1], lines
    assert costs["checkpoints"] == {"llama-tiny bf16": "built"} and costs["checkpoints_s"] > 0
    log = tmp_path / "logs" / "checkpoint-llama-tiny-bf16.log"
    assert "ready in" in log.read_text()
    weights = next(ckpt.glob("*.safetensors")).read_bytes()

    # The next run: found in the cache, no helper process.
    log.unlink()
    lines.clear()
    assert prepare._checkpoints(items, tmp_path / "logs", None, env.probe(), lines.append) == {
        "checkpoints": {"llama-tiny bf16": "cached"}
    }
    assert lines == [] and not log.exists()

    # Damaged weights: built again, the same weights (its own seed), whoever builds it.
    f = next(ckpt.glob("*.safetensors"))
    f.write_bytes(f.read_bytes()[:100])
    costs = prepare._checkpoints(items, tmp_path / "logs", None, env.probe(), lines.append)
    assert costs["checkpoints"] == {"llama-tiny bf16": "built"} and "changed size" in lines[0], lines
    assert next(ckpt.glob("*.safetensors")).read_bytes() == weights
