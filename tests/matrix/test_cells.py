"""A cell is a value: readable id, stable hash, round-trips through JSON."""

from __future__ import annotations

import json

from bench.matrix.cells import Cell, Lora


def test_hash_is_stable_and_ignores_timeout():
    a = Cell(zero_stage=2, offload="optimizer", optimizer="cpuadam", timeout_s=10, matrix="a")
    b = Cell(zero_stage=2, offload="optimizer", optimizer="cpuadam", timeout_s=99, matrix="b")
    assert a.hash == b.hash
    # Pinned: a hash that changes between releases would orphan every stored result.
    assert Cell().hash == Cell().hash and len(Cell().hash) == 10


def test_hash_changes_with_anything_measured():
    base = Cell()
    for change in (
        {"seq_len": 256},
        {"micro_batch": 4},
        {"seed": 1},
        {"model": "llama-1b"},
        {"grad_ckpt": True},
        {"lr": 2e-3},
        {"measured_steps": 9},
        {"compile": True},
        {"kernels": "liger"},
        {"grad_accum": 4},
    ):
        assert Cell(**change).hash != base.hash, change


def test_readable_id():
    c = Cell(
        zero_stage=3,
        offload="optimizer+params",
        precision="bf16",
        grad_ckpt=True,
        optimizer="cpuadam",
        peft="lora",
        lora=Lora(r=8),
    )
    assert c.name == "zero=3,offload=optimizer+params,prec=bf16,gc=on,opt=cpuadam,peft=lora-r8,mb=1"
    assert c.id == f"{c.name}#{c.hash}"
    assert Cell(compile=True, micro_batch=16).name.endswith(",compile=on,mb=16")
    # Kernels and gradient accumulation show only when they differ from the default (hf, 1).
    assert Cell(kernels="liger", micro_batch=16, grad_accum=4).name.endswith(",kernels=liger,mb=16,ga=4")


def test_hashes_of_published_results_survive_new_fields():
    # Cells recorded before the compile axis existed keep their hash: their history, baselines and
    # --resume still find them. Read from a committed GPU results file, not restated here.
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "results" / "1b.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert recs
    for rec in recs:
        assert "compile" not in rec["cell"]
        assert Cell.from_dict(rec["cell"]).hash == rec["cell_hash"], rec["cell_name"]
    assert Cell(compile=True).hash != Cell().hash


def test_round_trip():
    c = Cell(peft="lora", lora=Lora(r=4, targets=("q_proj", "v_proj")), timeout_s=5)
    back = Cell.from_dict(json.loads(json.dumps(c.to_dict())))
    assert back == c and back.hash == c.hash and back.timeout_s == 5
