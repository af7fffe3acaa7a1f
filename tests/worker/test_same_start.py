"""Cells that differ only in ZeRO stage, offload or engine start from the same weights: the same first
loss (real DeepSpeed, on the CPU). Under ZeRO-3 the weights are made inside zero.Init, which once drew
them from a different RNG stream than ZeRO 0-2."""

from __future__ import annotations

import pytest

from tests.conftest import as_written, write_matrix, zerobench

pytestmark = pytest.mark.slow

MATRIX = """\
model: llama-tiny
seq_len: 32
batch: {micro: 2, grad_accum: 1}
steps: {warmup: 1, measured: 2}
timeout_s: 600
axes: {zero_stage: [0, 1, 2, 3], precision: [fp32]}
include:
  - {zero_stage: [0, 3], precision: fp32, engine: hf_trainer}
  - {zero_stage: 2, precision: fp32, offload: optimizer, optimizer: cpuadam}
"""


def test_every_stage_offload_and_engine_starts_from_the_same_weights(tmp_path):
    m = write_matrix(tmp_path / "m.yaml", MATRIX)
    res = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    recs = [x for x in as_written(res) if x["status"] != "started"]
    assert len(recs) == 7 and all(x["status"] == "ok" for x in recs), [(x["cell_id"], x["reason"]) for x in recs]
    first = {x["cell_id"]: x["losses"][0] for x in recs}
    ref = next(iter(first.values()))
    # Relative 1e-4: on an AMD EPYC (AVX2) host the own loop's ZeRO-3 cell's first loss is 4.4e-5 (relative) from
    # the others' (7.575944 vs 7.575608; equal to 1e-6 on other CPUs, and the Trainer's ZeRO-3 equal here), while
    # another seed (seed: 1, its own weights and data) moves it by 7.5e-3.
    assert all(abs(v - ref) <= 1e-4 * abs(ref) for v in first.values()), "\n".join(
        f"{v!r} {k}" for k, v in first.items()
    )
    assert all(x["worker"]["weights_init"] == "seeded-per-name" for x in recs)
