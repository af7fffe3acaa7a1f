"""PEFT settings as axes: LoRA rank, alpha and targets, QLoRA quantization type and double quantization.
Their values live in the cell's lora/qlora blocks, so a cell keeps its hash however it was written."""

from __future__ import annotations

from bench.estimate import predict, shape_of, trainable_params
from bench.host.env import Platform
from bench.matrix import rules, spec
from bench.matrix.cells import Cell, Lora, Qlora
from tests.conftest import write_matrix
from tests.matrix.test_dsconfig import GPU_HOST

SWEEP = """\
name: t
model: llama-tiny
axes:
  peft: [none, lora]
  lora_r: [4, 16]
  lora_targets: [qkv, all-linear]
lora: {r: 8, alpha: 16, targets: all-linear}
"""


def _cells(tmp_path, text):
    return spec.expand(spec.load(write_matrix(tmp_path / "m.yaml", text)))


def test_axes_write_the_blocks_and_peft_none_is_not_multiplied(tmp_path):
    cells = _cells(tmp_path, SWEEP)
    none = [c for c in cells if c.peft == "none"]
    assert len(none) == 1 and none[0].lora is None  # 4 crossed settings, one baseline
    lora = [c for c in cells if c.peft == "lora"]
    assert [(c.lora.r, c.lora.targets) for c in lora] == [
        (4, ("q_proj", "k_proj", "v_proj")),
        (4, ("all-linear",)),
        (16, ("q_proj", "k_proj", "v_proj")),
        (16, ("all-linear",)),
    ]
    assert all(c.lora.alpha == 16 for c in lora)  # the block gives what the axes leave unset


def test_an_exclude_on_a_lora_setting_leaves_the_full_fine_tuning_cell(tmp_path):
    cells = _cells(tmp_path, SWEEP + "exclude:\n  - {lora_r: 16}\n")
    assert sorted((c.peft, c.lora.r if c.lora else None) for c in cells) == [
        ("lora", 4),
        ("lora", 4),
        ("none", None),
    ]


def test_a_block_setting_and_the_same_axis_value_are_one_cell(tmp_path):
    by_block = _cells(tmp_path, "model: llama-tiny\naxes: {peft: [lora]}\nlora: {r: 64, alpha: 16}\n")
    by_axis = _cells(tmp_path, "model: llama-tiny\naxes: {peft: [lora], lora_r: [64], lora_alpha: [16]}\n")
    assert [c.id for c in by_block] == [c.id for c in by_axis]
    # A record written before the axes existed (no lora_r field) parses to the same cell.
    old = by_block[0].to_dict()
    assert not {"lora_r", "lora_alpha", "lora_targets", "qlora_quant", "qlora_double_quant"} & set(old)
    assert Cell.from_dict(old).id == by_block[0].id and Cell.from_dict(old).lora_r == 64


def test_names_show_a_setting_only_off_its_default():
    base = dict(peft="lora", lora=Lora(r=8, alpha=16))
    assert Cell(**base).name.endswith("peft=lora-r8,mb=1")
    assert "alpha=64" in Cell(peft="lora", lora=Lora(r=8, alpha=64)).name
    assert "targets=qkv" in Cell(peft="lora", lora=Lora(targets=("q_proj", "k_proj", "v_proj"))).name
    q = Cell(peft="qlora", lora=Lora(), qlora=Qlora(quant_type="fp4", double_quant=False))
    assert "peft=qlora-fp4-r16,dq=off" in q.name and "quant=" not in q.name


def test_settings_that_do_not_apply_are_rejected_with_the_reason(tmp_path):
    text = SWEEP + "include:\n  - {peft: none, lora_r: 8}\n  - {peft: lora, qlora_double_quant: false}\n"
    skips = {c.name: rules.check(c, Platform()) for c in _cells(tmp_path, text)}
    named = {n: s.rule for n, s in skips.items() if s}
    assert named.pop("zero=0,offload=none,prec=bf16,gc=off,opt=adamw,peft=none,r=8,mb=1") == "lora-settings-need-peft"
    # The include's QLoRA setting on each of the 4 LoRA cells it crosses with.
    assert len(named) == 4 and set(named.values()) == {"qlora-settings-need-qlora"}
    assert all(",dq=off," in n for n in named)
    reason = next(s for s in skips.values() if s and s.rule == "lora-settings-need-peft").reason
    assert "lora_r" in reason and "peft: none" in reason


def test_qlora_settings_need_cuda_here_and_expand_for_a_gpu_host(tmp_path):
    text = "model: llama-tiny\naxes: {peft: [qlora], qlora_quant: [nf4, fp4], qlora_double_quant: [true, false]}\n"
    cells = _cells(tmp_path, text)
    assert len(cells) == 4
    assert {(c.qlora.quant_type, c.qlora.double_quant) for c in cells} == {
        ("nf4", True),
        ("nf4", False),
        ("fp4", True),
        ("fp4", False),
    }
    cpu = [rules.check(c, Platform()) for c in cells]
    assert {s.rule for s in cpu} == {"bnb-needs-cuda"} and "CUDA" in cpu[0].reason
    assert [rules.check(c, GPU_HOST) for c in cells] == [None] * 4


def test_a_target_set_outside_the_named_ones_is_a_matrix_problem(tmp_path):
    f = write_matrix(tmp_path / "m.yaml", "model: llama-tiny\naxes: {peft: [lora], lora_targets: [qkvo]}\n")
    try:
        spec.load(f)
    except spec.MatrixError as e:
        assert [p.where for p in e.problems] == ["axes.lora_targets[0]"]
    else:
        raise AssertionError("qkvo was accepted")


def test_the_memory_model_follows_rank_targets_and_double_quant():
    shape = shape_of("llama-1b")

    def terms(**kw):
        c = Cell(model="llama-1b", **kw)
        return predict(c).gpu_terms, trainable_params(c, shape)

    small, t_small = terms(peft="lora", lora=Lora(r=4, targets=("q_proj", "k_proj", "v_proj")))
    big, t_big = terms(peft="lora", lora=Lora(r=64))
    assert t_big > 16 * t_small  # 16x the rank, and every linear
    assert small["optimizer_state"] == 8 * t_small and big["optimizer_state"] == 8 * t_big  # AdamW's moments
    dq, _ = terms(peft="qlora", lora=Lora(), qlora=Qlora(double_quant=True))
    single, _ = terms(peft="qlora", lora=Lora(), qlora=Qlora(double_quant=False))
    saved_bits = (single["qlora_quant_constants"] - dq["qlora_quant_constants"]) * 8 / shape.linear_params
    assert abs(saved_bits - 0.373) < 0.001  # 0.5 bit/param - (8/64 + 32/(64*256))
    fp4, _ = terms(peft="qlora", lora=Lora(), qlora=Qlora(quant_type="fp4"))
    assert fp4["weights"] == dq["weights"]  # same 4-bit storage, another code book
