"""Each rule that says a combination fails or misbehaves on a GPU, shown on a GPU: the cell is run
past the rules and must not run as named. A rule whose combination turns out to work goes.

Run on the GPU host (`nox -s gpu_tests`); they skip elsewhere."""

from __future__ import annotations

import pytest

from bench import dsconfig, env, rules
from bench.axes import OPTIMIZERS
from bench.cells import Cell, Lora, Qlora
from bench.execute import launch

pytestmark = pytest.mark.gpu

SMALL = dict(model="llama-tiny", seq_len=128, micro_batch=2, warmup_steps=1, measured_steps=2, timeout_s=300)
GPU = env.Platform(
    gpus=(env.Gpu(0, "GPU", 0, "x"),),
    versions={"torch": "2.11.0+cu130", "deepspeed": "0.19.6", "bitsandbytes": "0.50.2", "liger-kernel": "0.8.5"},
)
CASES = [
    # On CPU DeepSpeed builds DeepSpeedCPUAdam at stage 0 too (the parameters already live on the
    # CPU), so only a GPU can show what stage 0 does with offload_optimizer.
    ("offload-needs-zero", Cell(zero_stage=0, offload="optimizer", optimizer="cpuadam", **SMALL)),
    (
        "offload-optimizer-kind",
        Cell(zero_stage=2, offload="optimizer", optimizer="fusedlamb", precision="fp16", **SMALL),
    ),
    ("offload-optimizer-kind", Cell(zero_stage=2, offload="optimizer", optimizer="paged_adamw_8bit", **SMALL)),
    ("onebit-needs-zero0", Cell(zero_stage=1, optimizer="onebitadam", precision="fp16", **SMALL)),
    ("cpuadam-needs-offload", Cell(optimizer="cpuadam", **SMALL)),
    # At the 1.1B shape; a tiny-preset cell compiled with Liger ran
    # (results/gpu-evidence/2026-11-30_gpu-rules-h200_liger.log), so the failure depends on the shapes and the
    # rule stops the combination as unreliable.
    (
        "liger-no-compile",
        Cell(kernels="liger", compile=True, optimizer="fusedadam", **{**SMALL, "model": "llama-1b", "seq_len": 512}),
    ),
    ("fusedlamb-no-bf16", Cell(optimizer="fusedlamb", precision="bf16", **SMALL)),
]

# Combinations no rule forbids: they ran on the H200 (results/gpu-evidence/2026-11-30_gpu-rules-h200.log and
# 2026-11-30_gpu-rules-h200_removed-rules.log), and must keep running.
RUNS = [
    ("onebit-bf16", Cell(zero_stage=0, optimizer="onebitadam", precision="bf16", **SMALL)),
    ("onebit-lora", Cell(optimizer="onebitadam", precision="fp16", peft="lora", lora=Lora(r=8), **SMALL)),
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
]


@pytest.mark.parametrize("rule,cell", CASES, ids=[f"{r}-{i}" for i, (r, _) in enumerate(CASES)])
def test_rule_holds_on_gpu(tmp_path, rule, cell):
    skip = rules.check(cell, GPU)
    assert skip is not None and skip.rule == rule
    out = launch.run_cell(cell, dsconfig.build(cell), log_path=tmp_path / "log", gpus=[0])
    print(rule, out.status.value, out.reason[:300])
    assert out.status.value != "ok", f"{rule}: the combination ran fine on this GPU; the rule must go"


@pytest.mark.parametrize("name,cell", RUNS, ids=[n for n, _ in RUNS])
def test_formerly_ruled_out_combination_runs(tmp_path, name, cell):
    assert rules.check(cell, GPU) is None, f"{name}: a rule stops it again; show it failing on a GPU first"
    out = launch.run_cell(cell, dsconfig.build(cell), log_path=tmp_path / "log", gpus=[0])
    assert out.status.value == "ok", f"{name}: {out.status.value}: {out.reason[:300]}"
    assert out.ranks[0]["optimizer_class"].endswith(OPTIMIZERS[cell.optimizer].cls)
