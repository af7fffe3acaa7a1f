"""The LoRA sweep on CPU with real DeepSpeed engines: rank x targets x alpha, trainable parameters
against the closed form, and the report's one-knob table showing each setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.estimate import shape_of, trainable_params
from bench.matrix.cells import Cell
from tests.conftest import as_written, zerobench

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MATRIX = ROOT / "matrices" / "lora-sweep-cpu.yaml"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    r = zerobench("run", str(MATRIX), "--results", str(d / "r.jsonl"), "--report", str(d / "r"), cwd=d, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [x for x in as_written(d / "r.jsonl") if x["status"] != "started"], (d / "r.md").read_text()


def test_twelve_cells_ran(sweep):
    recs, _ = sweep
    assert len(recs) == 12 and {x["status"] for x in recs} == {"ok"}
    cells = [Cell.from_dict(x["cell"]) for x in recs]
    assert {(c.lora_r, c.lora_targets, c.lora_alpha) for c in cells} == {
        (r, t, a) for r in (4, 8, 16) for t in ("qkv", "all-linear") for a in (16, 32)
    }


def test_trainable_parameters_match_the_closed_form(sweep):
    recs, _ = sweep
    shape = shape_of("llama-tiny")
    seen = {}
    for x in recs:
        cell = Cell.from_dict(x["cell"])
        assert x["worker"]["params_trainable"] == trainable_params(cell, shape), cell.name
        seen[(cell.lora_r, cell.lora_targets)] = x["worker"]["params_trainable"]
    # Linear in the rank; all seven linears of a block adapt more than q, k and v.
    assert seen[(16, "qkv")] == 4 * seen[(4, "qkv")] and seen[(8, "all-linear")] > seen[(8, "qkv")]


def test_report_shows_each_setting(sweep):
    _, md = sweep
    # CPU figures of a tiny model: the knob effects are folded under the report's note.
    assert "**Not GPU figures**" in md
    table = md.split("<summary>One knob at a time", 1)[1].split("</details>", 1)[0]
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]) for line in table.splitlines() if "|" in line}
    assert {("LoRA rank", "8 vs 4"), ("LoRA rank", "16 vs 4"), ("LoRA alpha", "32 vs 16")} <= rows
    assert ("LoRA targets", "all-linear vs qkv") in rows
    assert "| trainable params | loss (same step, random weights) |" in table
    rank16 = next(line for line in table.splitlines() if line.startswith("| LoRA rank | 16 vs 4 |"))
    assert "×4.00" in rank16  # trainable parameters grow with the rank
