"""Generated DeepSpeed configs: every axis value lands in the right section, and every config a cell
would run passes the checker for users' files (dsconfig.check) and reads back (describe) as the cell's
own axis values."""

from __future__ import annotations

import itertools
import json

import pytest

from bench.host.env import Gpu, Platform
from bench.matrix import dsconfig, rules
from bench.matrix.axes import OFFLOADS, OPTIMIZERS, PEFTS, PRECISIONS, ZERO_STAGES
from bench.matrix.cells import Cell, Lora, Qlora

# A GPU host with everything installed: only the combination rules can stop a cell there.
GPU_HOST = Platform(
    gpus=(Gpu(0, "NVIDIA H200", 141 << 30, "GPU-0"),),
    driver="580",
    versions={"torch": "2.11.0+cu130", "deepspeed": "0.19.6", "bitsandbytes": "0.45.0"},
)


def cell(**axes) -> Cell:
    peft = axes.get("peft", "none")
    return Cell(
        **axes,
        micro_batch=2,
        grad_accum=4,
        lr=3e-4,
        lora=Lora() if peft != "none" else None,
        qlora=Qlora() if peft == "qlora" else None,
    )


def round_trip(c: Cell, tmp_path) -> dict:
    """build -> JSON file -> dsconfig.load (raises on any problem) -> the config as read back."""
    f = tmp_path / f"{c.hash}.json"
    f.write_text(json.dumps(dsconfig.build(c), indent=2))
    return dsconfig.load(f)


def axes_of(c: Cell) -> dict:
    return {
        "zero_stage": c.zero_stage,
        "offload": c.offload,
        "precision": c.precision,
        "optimizer": c.optimizer if c.optimizer in dsconfig.OPTIMIZER_SECTIONS else None,
        "micro_batch": c.micro_batch,
        "grad_accum": c.grad_accum,
        "lr": c.lr if c.optimizer in dsconfig.OPTIMIZER_SECTIONS else None,
    }


# -- each axis value ---------------------------------------------------------------------------
@pytest.mark.parametrize("stage", ZERO_STAGES)
def test_zero_stage(stage, tmp_path):
    c = cell(zero_stage=stage)
    cfg = dsconfig.build(c)
    z = cfg["zero_optimization"]
    assert z["stage"] == stage
    assert cfg["train_micro_batch_size_per_gpu"] == 2 and cfg["gradient_accumulation_steps"] == 4
    if stage == 0:
        assert set(z) == {"stage"}
    else:
        assert z["overlap_comm"] is z["contiguous_gradients"] is (stage >= 2)
    assert ("stage3_gather_16bit_weights_on_model_save" in z) is (stage == 3)
    assert "offload_optimizer" not in z and "offload_param" not in z
    assert dsconfig.describe(round_trip(c, tmp_path)) == axes_of(c)


@pytest.mark.parametrize("offload", OFFLOADS)
def test_offload(offload, tmp_path):
    c = cell(zero_stage=3, offload=offload, optimizer="cpuadam" if offload != "none" else "adamw")
    z = dsconfig.build(c)["zero_optimization"]
    assert ("offload_optimizer" in z) is (offload != "none")
    assert ("offload_param" in z) is (offload in ("optimizer+params", "nvme"))
    for key in ("offload_optimizer", "offload_param"):
        if key in z and offload != "nvme":
            assert z[key] == {"device": "cpu", "pin_memory": True}
        elif key in z:
            assert z[key]["device"] == "nvme" and z[key]["nvme_path"]
    assert dsconfig.describe(round_trip(c, tmp_path)) == axes_of(c)


def test_optimizer_offload_at_stages_1_and_2(tmp_path):
    for stage in (1, 2):
        c = cell(zero_stage=stage, offload="optimizer", optimizer="cpuadam")
        assert dsconfig.describe(round_trip(c, tmp_path)) == axes_of(c)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_precision(precision, tmp_path):
    c = cell(precision=precision)
    cfg = dsconfig.build(c)
    assert ("bf16" in cfg) is (precision == "bf16") and ("fp16" in cfg) is (precision == "fp16")
    if precision == "fp16":
        assert cfg["fp16"]["enabled"] is True and cfg["fp16"]["loss_scale"] == 0  # dynamic loss scaling
    if precision == "bf16":
        assert cfg["bf16"] == {"enabled": True}
    assert dsconfig.describe(round_trip(c, tmp_path)) == axes_of(c)


@pytest.mark.parametrize("grad_ckpt", [False, True])
def test_grad_ckpt_is_the_models_not_deepspeeds(grad_ckpt, tmp_path):
    # Gradient checkpointing is switched on in the model (HF), so the DeepSpeed config does not change.
    c = cell(zero_stage=2, grad_ckpt=grad_ckpt)
    cfg = dsconfig.build(c)
    assert "activation_checkpointing" not in cfg
    assert cfg == dsconfig.build(cell(zero_stage=2, grad_ckpt=not grad_ckpt))
    round_trip(c, tmp_path)


# Each optimizer on a cell the rules let it run on.
OPTIMIZER_CELLS = {
    "adamw": dict(zero_stage=2),
    "fusedadam": dict(zero_stage=2),
    "cpuadam": dict(zero_stage=2, offload="optimizer"),
    "fusedlamb": dict(zero_stage=0, precision="fp16"),  # no bf16 kernel, no ZeRO (fusedlamb-no-bf16, -needs-zero0)
    "onebitadam": dict(zero_stage=0, precision="fp16"),
    "zerooneadam": dict(zero_stage=0, precision="fp16"),
    "onebitlamb": dict(zero_stage=0, precision="fp16"),
    "paged_adamw": dict(zero_stage=2),
    "paged_adamw_8bit": dict(zero_stage=2),
    "adamw_8bit": dict(zero_stage=2),
}


def test_optimizer_table_covers_every_optimizer():
    assert set(OPTIMIZER_CELLS) == set(OPTIMIZERS)
    assert set(dsconfig.OPTIMIZER_SECTIONS) | set(dsconfig.CLIENT_OPTIMIZERS) == set(OPTIMIZERS)
    assert not set(dsconfig.OPTIMIZER_SECTIONS) & set(dsconfig.CLIENT_OPTIMIZERS)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer(name, tmp_path):
    c = cell(optimizer=name, **OPTIMIZER_CELLS[name])
    assert rules.check(c, GPU_HOST) is None
    cfg = dsconfig.build(c)
    if name in dsconfig.OPTIMIZER_SECTIONS:
        sec = dsconfig.OPTIMIZER_SECTIONS[name]
        assert cfg["optimizer"]["type"] == sec["type"]
        assert cfg["optimizer"]["params"] == {"lr": 3e-4, "weight_decay": 0.0, **sec["params"]}
        assert "zero_allow_untested_optimizer" not in cfg
    else:  # built by the worker and handed to deepspeed.initialize
        assert "optimizer" not in cfg and cfg["zero_allow_untested_optimizer"] is True
    assert ("zero_force_ds_cpu_optimizer" in cfg) is (name == "cpuadam")
    assert dsconfig.describe(round_trip(c, tmp_path)) == axes_of(c)


@pytest.mark.parametrize("peft", PEFTS)
def test_peft_does_not_change_the_deepspeed_config(peft, tmp_path):
    c = cell(zero_stage=2, peft=peft, precision="bf16")
    assert dsconfig.build(c) == dsconfig.build(cell(zero_stage=2, precision="bf16"))
    assert dsconfig.describe(round_trip(c, tmp_path)) == axes_of(c)


# -- the whole cross product ---------------------------------------------------------------------
def all_cells():
    for stage, off, prec, gc, name, peft in itertools.product(
        ZERO_STAGES, OFFLOADS, PRECISIONS, (False, True), OPTIMIZERS, PEFTS
    ):
        yield cell(zero_stage=stage, offload=off, precision=prec, grad_ckpt=gc, optimizer=name, peft=peft)


def test_every_runnable_cell_passes_the_check_and_reads_back_as_itself():
    runnable = 0
    for c in all_cells():
        cfg = dsconfig.build(c)
        found = dsconfig.check(json.loads(json.dumps(cfg)), c.id)
        if rules.check(c, GPU_HOST) is not None:
            continue  # the rules stop it before a config is ever built for it
        runnable += 1
        assert found == [], f"{c.id}: " + "; ".join(map(str, found))
        assert dsconfig.describe(cfg) == axes_of(c), c.id
    assert runnable > 100


def test_what_the_check_rejects_the_rules_stop():
    # The generated configs the check objects to are exactly combinations the rules table already stops
    # (offload at stage 0, parameter offload below stage 3, 1-bit optimizers under ZeRO).
    rejected = [c for c in all_cells() if dsconfig.check(dsconfig.build(c))]
    assert rejected
    assert all(rules.check(c, GPU_HOST) is not None for c in rejected)


def test_generated_config_describes_what_deepspeed_would_build():
    # DeepSpeed swaps optimizers by its own logic; describe() mirrors it, and the rules skip the
    # cells whose axis value would then be untrue.
    fused_offload = cell(zero_stage=2, offload="optimizer", optimizer="fusedadam")
    assert dsconfig.describe(dsconfig.build(fused_offload))["optimizer"] == "cpuadam"
    assert rules.check(fused_offload, GPU_HOST).rule == "offload-runs-cpuadam"
    cpuadam_alone = cell(zero_stage=2, optimizer="cpuadam")
    assert dsconfig.describe(dsconfig.build(cpuadam_alone))["optimizer"] == "fusedadam"
    assert rules.check(cpuadam_alone, GPU_HOST).rule == "cpuadam-needs-offload"


def test_resolve_leaves_generated_configs_alone():
    for c in (cell(zero_stage=0), cell(zero_stage=3, offload="optimizer+params", optimizer="cpuadam")):
        cfg = dsconfig.build(c)
        assert dsconfig.resolve(cfg, c) == cfg


@pytest.mark.parametrize("compile_", [False, True, "max-autotune"])
def test_compile_is_the_models_not_deepspeeds(compile_, tmp_path):
    # torch.compile is applied to the engine's module (engine.compile()), not through the config.
    c = Cell(zero_stage=2, compile=compile_, micro_batch=2, grad_accum=4)
    assert dsconfig.build(c) == dsconfig.build(Cell(zero_stage=2, micro_batch=2, grad_accum=4))
    round_trip(c, tmp_path)


@pytest.mark.parametrize("micro", [1, 16, 24])
def test_micro_batch_axis_sets_the_batch_size(micro, tmp_path):
    c = Cell(zero_stage=1, micro_batch=micro, grad_accum=2, gpus=2)
    cfg = round_trip(c, tmp_path)
    assert cfg["train_micro_batch_size_per_gpu"] == micro and cfg["gradient_accumulation_steps"] == 2


@pytest.mark.parametrize("kernels", ["hf", "liger"])
@pytest.mark.parametrize("grad_accum", [1, 8])
def test_kernels_are_the_models_and_grad_accum_is_deepspeeds(kernels, grad_accum, tmp_path):
    # Liger patches the model's modules, not the config; gradient accumulation is DeepSpeed's.
    c = Cell(zero_stage=3, kernels=kernels, micro_batch=2, grad_accum=grad_accum)
    cfg = round_trip(c, tmp_path)
    assert cfg == round_trip(Cell(zero_stage=3, micro_batch=2, grad_accum=grad_accum), tmp_path)
    assert cfg["gradient_accumulation_steps"] == grad_accum


def test_liger_needs_a_gpu_and_the_package():
    from bench.host.env import Platform

    c = cell(zero_stage=0, kernels="liger")
    assert rules.check(c, Platform()).rule == "liger-needs-cuda"
    assert rules.check(c, GPU_HOST).rule == "liger-installed"
    with_liger = Platform(gpus=GPU_HOST.gpus, driver="580", versions={**GPU_HOST.versions, "liger-kernel": "0.8.5"})
    assert rules.check(c, with_liger) is None
    assert rules.check(cell(zero_stage=0), Platform()) is None


def test_liger_under_compile_is_stopped_on_the_version_it_failed_on():
    from bench.host.env import Platform

    def host(v):
        return Platform(gpus=GPU_HOST.gpus, driver="580", versions={**GPU_HOST.versions, "liger-kernel": v})

    c = cell(zero_stage=0, kernels="liger", compile=True)
    assert rules.check(c, host("0.8.5")).rule == "liger-no-compile"
    assert rules.check(c, host("0.9.0")) is None  # a later release gets measured, not assumed broken
    assert rules.check(cell(zero_stage=0, kernels="liger"), host("0.8.5")) is None


def test_nvme_swap_buffers_hold_the_largest_weight(tmp_path):
    # DeepSpeed's swap_in asserts "More elements ... than buffer size" when a weight's partition
    # outgrows a buffer: a 7B Llama's embedding (32000 x 4096) is over its default 1e8 on one GPU.
    def size(model, gpus=1):
        cell = Cell(zero_stage=3, offload="nvme", optimizer="cpuadam", nvme_path="/tmp", model=model, gpus=gpus)
        return dsconfig.build(cell)["zero_optimization"]["offload_param"]["buffer_size"]

    assert size("llama-1b") == 100_000_000
    assert size("llama-7b") == 32000 * 4096
    assert size("llama-7b", gpus=2) == 100_000_000  # each GPU swaps its half
    local = tmp_path / "m"
    local.mkdir()
    (local / "config.json").write_text('{"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336}')
    assert size(str(local)) == 128256 * 4096
