"""Each rule that says a combination fails or misbehaves on a GPU, shown on a GPU: the cell is run past the rules
and must not train as named (it fails, or its loss does not fall). A rule whose combination trains goes. The
losses are checked, not the status: a cell can end ok and still not train (1-bit optimizers in bf16).

Run on the GPU host (`nox -s gpu_tests`); they skip elsewhere."""

from __future__ import annotations

import math

import pytest

from bench.execute import launch
from bench.host import env
from bench.matrix import dsconfig, rules
from bench.matrix.axes import OPTIMIZERS
from bench.matrix.cells import Cell, Lora, Qlora

pytestmark = pytest.mark.gpu

# 21 steps, far past the 1-bit optimizers' freeze_step (2): with 7, a tiny LoRA or QLoRA cell's loss fell too
# little to tell an optimizer that trains from one that does not (results/README.md, the GPU rules' logs). A tiny
# model's step takes milliseconds: the cell's start-up dominates.
SMALL = dict(model="llama-tiny", seq_len=128, micro_batch=2, warmup_steps=1, measured_steps=20, timeout_s=300)
# A 7B full fine-tune on one H200 (ZeRO-1/2 hand one rank 6.74e9 elements), at the 7B matrix's learning rate.
BIG = dict(model="llama-7b", seq_len=128, micro_batch=1, warmup_steps=1, measured_steps=3, lr=1e-4, timeout_s=600)
GPU = env.Platform(
    gpus=(env.Gpu(0, "GPU", 0, "x"),),
    versions={"torch": "2.11.0+cu130", "deepspeed": "0.19.6", "bitsandbytes": "0.50.2", "liger-kernel": "0.8.5"},
)
CASES = [
    # (rule, cell, what its end says where it fails rather than trains badly)
    # On CPU DeepSpeed builds DeepSpeedCPUAdam at stage 0 too (the parameters already live on the
    # CPU), so only a GPU can show what stage 0 does with offload_optimizer.
    ("offload-needs-zero", Cell(zero_stage=0, offload="optimizer", optimizer="cpuadam", **SMALL), ""),
    (
        "offload-optimizer-kind",
        Cell(zero_stage=2, offload="optimizer", optimizer="fusedlamb", precision="fp16", **SMALL),
        "",
    ),
    ("offload-optimizer-kind", Cell(zero_stage=2, offload="optimizer", optimizer="paged_adamw_8bit", **SMALL), ""),
    ("onebit-needs-zero0", Cell(zero_stage=1, optimizer="onebitadam", precision="fp16", **SMALL), ""),
    ("cpuadam-needs-offload", Cell(optimizer="cpuadam", **SMALL), ""),
    # At the 1.1B shape; a tiny-preset cell compiled with Liger ran (results/README.md, the GPU rules' logs), so
    # the failure depends on the shapes and the rule stops the combination as unreliable.
    (
        "liger-no-compile",
        Cell(kernels="liger", compile=True, optimizer="fusedadam", **{**SMALL, "model": "llama-1b", "seq_len": 512}),
        "",
    ),
    ("fusedlamb-no-bf16", Cell(optimizer="fusedlamb", precision="bf16", **SMALL), "lamb_cuda_kernel"),
    ("fusedlamb-needs-zero0", Cell(zero_stage=1, optimizer="fusedlamb", precision="fp16", **SMALL), "untested ZeRO"),
    ("fusedlamb-needs-zero0", Cell(zero_stage=2, optimizer="fusedlamb", precision="fp32", **SMALL), "untested ZeRO"),
    ("bnb-over-int32", Cell(zero_stage=1, optimizer="adamw_8bit", precision="bf16", **BIG), "invalid argument"),
    ("onebit-needs-fp16", Cell(zero_stage=0, optimizer="onebitadam", precision="bf16", **SMALL), ""),
    ("onebit-needs-fp16", Cell(zero_stage=0, optimizer="onebitadam", precision="fp32", **SMALL), ""),
    ("onebit-needs-fp16", Cell(optimizer="zerooneadam", precision="bf16", peft="lora", lora=Lora(r=8), **SMALL), ""),
    ("onebit-needs-fp16", Cell(optimizer="onebitlamb", precision="bf16", peft="lora", lora=Lora(r=8), **SMALL), ""),
    (
        "onebitlamb-no-adapters",
        Cell(optimizer="onebitlamb", precision="fp16", peft="lora", lora=Lora(r=8), **SMALL),
        "ZeroDivisionError",
    ),
]

# Combinations no rule forbids: they must train. Some were rules once and ran on a GPU (results/README.md, the GPU
# rules' logs); the others are the other side of a rule above. FusedLamb trains at a LAMB learning rate: its trust
# ratio scales each layer's step to lr times the layer's weight norm, so at an AdamW rate it barely moves
# (results/README.md, the LAMB learning rates).
RUNS = [
    ("onebit-fp16", Cell(zero_stage=0, optimizer="onebitadam", precision="fp16", **SMALL)),
    ("fusedlamb-zero0", Cell(zero_stage=0, optimizer="fusedlamb", precision="fp16", lr=1e-1, **SMALL)),
    ("onebit-lora", Cell(optimizer="onebitadam", precision="fp16", peft="lora", lora=Lora(r=8), **SMALL)),
    ("onebitlamb-fp16", Cell(zero_stage=0, optimizer="onebitlamb", precision="fp16", **SMALL)),
    ("bnb-7b-zero0", Cell(zero_stage=0, optimizer="adamw_8bit", precision="bf16", **BIG)),
    ("qlora-fp32", Cell(peft="qlora", precision="fp32", optimizer="fusedadam", lora=Lora(r=8), qlora=Qlora(), **SMALL)),
    (
        "qlora-param-offload",
        Cell(
            zero_stage=3,
            offload="optimizer+params",
            optimizer="cpuadam",
            peft="qlora",
            lora=Lora(r=8),
            qlora=Qlora(),
            **SMALL,
        ),
    ),
    ("hf-trainer-onebit", Cell(engine="hf_trainer", optimizer="onebitadam", precision="fp16", **SMALL)),
    # The HF Trainer builds bitsandbytes.optim.AdamW(optim_bits, is_paged) for these: the worker's check passes it.
    *(
        (f"hf-trainer-{opt}", Cell(engine="hf_trainer", optimizer=opt, precision="bf16", **SMALL))
        for opt in ("adamw_8bit", "paged_adamw", "paged_adamw_8bit")
    ),
]


def _trained(out, runaway_only: bool = False) -> tuple[bool, list | None]:
    """Whether the cell trained: it ended ok, every loss finite, and its last two steps' mean loss is below its
    first step's by more than noise; with the losses. A 7B cell of four steps is asked only not to run away:
    its first Adam steps moved a random 7B model's loss 10.99 -> 11.22 -> 10.98."""
    losses = out.ranks[0].losses if out.ranks else None
    if out.status.value != "ok" or not losses or not all(x is not None and math.isfinite(x) for x in losses):
        return False, losses
    if runaway_only:
        return max(losses) < losses[0] + 1.0, losses
    return sum(losses[-2:]) / 2 < losses[0] - 0.05, losses


def _params(cases, ids):
    """The cases as pytest params; the 7B cells share an xdist group, since two on one H200 ran out of memory
    (`pytest -n 8 --dist loadgroup` runs them one after the other). The 7B cell that reaches bitsandbytes'
    int32 limit needs the whole GPU (its ZeRO-1 partition alone is 6.7e9 fp32 elements; beside a small cell it
    runs out of memory before the kernel):
    it is `serial`, run alone after the others: `pytest -m "gpu and not serial" -n 8 --dist loadgroup`, then
    `pytest -m "gpu and serial"`."""

    def marks(case, i):
        if i.startswith("bnb-over-int32"):
            return [pytest.mark.serial]
        return [pytest.mark.xdist_group("7b")] if case[1].model == BIG["model"] else []

    return [pytest.param(*c, id=i, marks=marks(c, i)) for c, i in zip(cases, ids)]


@pytest.mark.parametrize("rule,cell,says", _params(CASES, [f"{r}-{i}" for i, (r, _, _) in enumerate(CASES)]))
def test_rule_holds_on_gpu(tmp_path, rule, cell, says):
    skip = rules.check(cell, GPU)
    assert skip is not None and skip.rule == rule
    out = launch.run_cell(cell, dsconfig.build(cell), launch.Launch(tmp_path / "log", gpus=[0]))
    trained, losses = _trained(out, runaway_only=cell.model == BIG["model"])
    print(rule, out.status.value, losses, out.reason[:300])
    assert not trained, f"{rule}: the combination trained on this GPU (losses {losses}); the rule must go"
    if out.status.value != "ok":
        assert says in out.reason + (out.log_tail or ""), f"{rule}: it ended otherwise: {out.reason[:300]}"


@pytest.mark.parametrize("name,cell", _params(RUNS, [n for n, _ in RUNS]))
def test_formerly_ruled_out_combination_runs(tmp_path, name, cell):
    assert rules.check(cell, GPU) is None, f"{name}: a rule stops it again; show it failing on a GPU first"
    out = launch.run_cell(cell, dsconfig.build(cell), launch.Launch(tmp_path / "log", gpus=[0]))
    trained, losses = _trained(out, runaway_only=cell.model == BIG["model"])
    assert trained, f"{name}: {out.status.value}, losses {losses}: {out.reason[:300]}"
    spec = OPTIMIZERS[cell.optimizer]
    assert out.ranks[0].optimizer_class.rsplit(".", 1)[-1] in (spec.cls, *spec.built_as)
