"""Matrix files: validation reports every problem at once, and expansion is predictable."""

from __future__ import annotations

import pytest

from bench.matrix import spec
from bench.matrix.spec import MatrixError
from tests.conftest import TINY, write_matrix, zerobench

BAD = """\
name: bad
model: llama-7
seq_len: "128"
batch: {micro: 2, grad_acum: 4}
axes:
  zero_stage: [0, 4]
  grad_ckpt: ["false"]
  optimizer: [fusedadm, adamw]
  peft: []
offload_optimizer: {device: cpu}
"""


def test_all_problems_in_one_message(tmp_path):
    f = write_matrix(tmp_path / "bad.yaml", BAD)
    with pytest.raises(MatrixError) as ei:
        spec.load(f)
    probs = {p.where: p for p in ei.value.problems}
    assert set(probs) == {
        "model",
        "seq_len",
        "batch.grad_acum",
        "axes.zero_stage[1]",
        "axes.grad_ckpt[0]",
        "axes.optimizer[0]",
        "axes.peft",
        "offload_optimizer",
    }
    assert "llama-7b" in probs["model"].fix
    assert "grad_accum" in probs["batch.grad_acum"].fix
    assert "without quotes" in probs["axes.grad_ckpt[0]"].fix
    assert "fusedadam" in probs["axes.optimizer[0]"].what
    assert "axes.offload" in probs["offload_optimizer"].fix
    assert probs["axes.optimizer[0]"].line == 8
    msg = str(ei.value)
    assert msg.startswith("8 problems in") and "nothing was run" in msg


def test_bad_matrix_runs_nothing(tmp_path):
    f = write_matrix(tmp_path / "bad.yaml", BAD)
    r = zerobench("run", str(f), "--results", str(tmp_path / "r.jsonl"), cwd=tmp_path, timeout=120)
    assert r.returncode == 2
    assert "8 problems" in r.stderr and "axes.optimizer[0]" in r.stderr
    assert not (tmp_path / "r.jsonl").exists()
    assert not (tmp_path / "results").exists()


def test_yaml_syntax_error_has_line(tmp_path):
    f = write_matrix(tmp_path / "x.yaml", "axes:\n  zero_stage: [0, 1\n  offload: [none]\n")
    with pytest.raises(MatrixError) as ei:
        spec.load(f)
    assert ei.value.problems[0].line is not None and "YAML" in ei.value.problems[0].what


def test_exclude_matching_nothing_is_a_problem(tmp_path):
    f = write_matrix(tmp_path / "m.yaml", TINY + "axes: {zero_stage: [0, 1]}\nexclude: [{zero_stage: 3}]\n")
    with pytest.raises(MatrixError, match=r"exclude\[0\]: matches no cell"):
        spec.load(f)


def test_expand_cross_include_exclude(tmp_path):
    f = write_matrix(
        tmp_path / "m.yaml",
        TINY
        + """\
axes:
  zero_stage: [0, 1, 2]
  precision: [fp32, bf16]
include:
  - {zero_stage: 3, offload: optimizer+params, optimizer: cpuadam}
exclude:
  - {zero_stage: 1, precision: fp32}
""",
    )
    cells = spec.expand(spec.load(f))
    combos = [(c.zero_stage, c.precision, c.offload) for c in cells]
    # 3x2 crossed, minus one excluded, plus the include crossed with the precision axis it left out.
    assert combos == [
        (0, "fp32", "none"),
        (0, "bf16", "none"),
        (1, "bf16", "none"),
        (2, "fp32", "none"),
        (2, "bf16", "none"),
        (3, "fp32", "optimizer+params"),
        (3, "bf16", "optimizer+params"),
    ]
    assert all(c.matrix == "m" and c.seq_len == 32 for c in cells)


def test_duplicates_removed(tmp_path):
    f = write_matrix(tmp_path / "m.yaml", TINY + "axes: {zero_stage: [0, 1]}\ninclude: [{zero_stage: 0}]\n")
    assert [c.zero_stage for c in spec.expand(spec.load(f))] == [0, 1]


def test_embedded_smoke_matrix_is_valid():
    from bench.cli import DEFAULT_MATRIX

    cells = spec.expand(spec.load(DEFAULT_MATRIX))
    assert len(cells) == 18
    stages = {c.zero_stage for c in cells}
    assert stages == {0, 1, 2, 3}
    assert {c.offload for c in cells} == {"none", "optimizer", "optimizer+params"}
    assert {c.peft for c in cells} >= {"none", "lora"}


def test_micro_batch_and_compile_axes(tmp_path):
    # batch.micro is the default; axes.micro_batch crosses several, and include can pick one for a cell.
    f = write_matrix(
        tmp_path / "m.yaml",
        TINY
        + """\
axes:
  micro_batch: [2, 8]
  compile: [false, true]
include:
  - {micro_batch: 16, compile: true, zero_stage: 1}
""",
    )
    cells = spec.expand(spec.load(f))
    assert [(c.micro_batch, c.compile, c.zero_stage) for c in cells] == [
        (2, False, 0),
        (8, False, 0),
        (2, True, 0),
        (8, True, 0),
        (16, True, 1),
    ]
    assert len({c.name for c in cells}) == 5 and cells[-1].name.endswith("compile=on,mb=16")
    plain = spec.expand(spec.load(write_matrix(tmp_path / "p.yaml", TINY)))
    assert {c.micro_batch for c in plain} == {spec.load(tmp_path / "p.yaml").batch.micro}


def test_grad_accum_and_kernels_axes(tmp_path):
    # batch.grad_accum is the default; axes.grad_accum crosses several; kernels crosses hf and liger.
    f = write_matrix(
        tmp_path / "m.yaml",
        TINY
        + """\
axes:
  grad_accum: [1, 4]
  kernels: [hf, liger]
include:
  - {grad_accum: 8, kernels: liger, micro_batch: 16}
""",
    )
    cells = spec.expand(spec.load(f))
    assert [(c.grad_accum, c.kernels, c.micro_batch) for c in cells] == [
        (1, "hf", 2),
        (1, "liger", 2),
        (4, "hf", 2),
        (4, "liger", 2),
        (8, "liger", 16),
    ]
    assert cells[-1].name.endswith("kernels=liger,mb=16,ga=8") and len({c.hash for c in cells}) == 5
    plain = spec.expand(spec.load(write_matrix(tmp_path / "p.yaml", TINY.replace("grad_accum: 1", "grad_accum: 2"))))
    assert {c.grad_accum for c in plain} == {2} and {c.kernels for c in plain} == {"hf"}
    bad = write_matrix(tmp_path / "b.yaml", TINY + "axes: {kernels: [ligr], grad_accum: [0]}\n")
    with pytest.raises(MatrixError) as e:
        spec.load(bad)
    assert "axes.kernels" in str(e.value) and "'liger'" in str(e.value) and "axes.grad_accum" in str(e.value)


def test_micro_batch_axis_is_validated(tmp_path):
    f = write_matrix(tmp_path / "m.yaml", TINY + "axes: {micro_batch: [0, 4]}\n")
    with pytest.raises(MatrixError) as e:
        spec.load(f)
    assert "axes.micro_batch" in str(e.value)


def test_compile_axis_takes_a_mode(tmp_path):
    f = write_matrix(tmp_path / "m.yaml", TINY + "axes: {compile: [false, true, max-autotune]}\n")
    cells = spec.expand(spec.load(f))
    assert [c.compile for c in cells] == [False, True, "max-autotune"]
    assert cells[1].name.endswith("compile=on,mb=2") and cells[2].name.endswith("compile=max-autotune,mb=2")
    assert len({c.hash for c in cells}) == 3
    bad = write_matrix(tmp_path / "b.yaml", TINY + "axes: {compile: [max_autotune]}\n")
    with pytest.raises(MatrixError) as e:
        spec.load(bad)
    assert "axes.compile" in str(e.value) and "did you mean 'max-autotune'?" in str(e.value)
