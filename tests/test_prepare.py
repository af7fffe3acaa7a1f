"""What a run does once before its cells: the QLoRA checkpoint is built by one process, up front."""
from __future__ import annotations

import json

from bench import env, run
from bench.cells import Cell, Lora, Qlora


def test_qlora_checkpoint_is_built_once_before_the_cells(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEROBENCH_CACHE", str(tmp_path / "cache"))
    cell = Cell(model="llama-tiny", peft="qlora", precision="bf16", lora=Lora(r=4), qlora=Qlora(), gpus=2)
    items = [run.Planned(cell=cell, skip=None, ds_config={}), run.Planned(cell=cell, skip=None, ds_config={})]
    lines: list[str] = []
    run._checkpoints(items, tmp_path / "logs", None, env.probe(), lines.append)
    ckpt = tmp_path / "cache" / "checkpoints" / "llama-tiny-bfloat16"
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "llama"
    assert any(p.suffix == ".safetensors" for p in ckpt.iterdir())
    assert len(lines) == 1 and "ready" in lines[0], lines  # one build for the two cells
    assert "ready in" in (tmp_path / "logs" / "checkpoint-llama-tiny-bf16.log").read_text()
