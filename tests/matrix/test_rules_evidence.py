"""Every rule that says a combination fails on CPU is backed by a real run that shows it fail.

The cells are run directly through the child protocol, past the rules, on real DeepSpeed."""

from __future__ import annotations

import pytest

from bench.execute import launch
from bench.host import env
from bench.matrix import dsconfig, rules
from bench.matrix.cells import Cell

pytestmark = pytest.mark.slow


def _cpu_has_fp16() -> bool:
    """What torch.ops.mkldnn._is_mkldnn_fp16_supported checks, read from the CPU's flags."""
    try:
        flags = set(open("/proc/cpuinfo").read().split())
    except OSError:
        return False
    return bool(flags & {"avx512_fp16", "amx_fp16"})


CPU = env.Platform(gpus=(), versions={"deepspeed": "0.19.6", "torch": "2.13.0+cpu"})


@pytest.mark.parametrize(
    "rule,cell,expect",
    [
        (
            "fp16-needs-cuda",
            Cell(precision="fp16", seq_len=32, micro_batch=1, warmup_steps=1, measured_steps=2),
            "Type fp16 is not supported on your device",
        ),
        (
            "lamb-needs-cuda",
            Cell(optimizer="fusedlamb", seq_len=32, micro_batch=1, warmup_steps=1, measured_steps=2),
            "This op had not been implemented on CPU backend",
        ),
        (
            "cpuadam-needs-offload",
            Cell(optimizer="cpuadam", seq_len=32, micro_batch=1, warmup_steps=1, measured_steps=2),
            "but DeepSpeed built FusedAdam",
        ),
        (
            "offload-runs-cpuadam",
            Cell(
                zero_stage=2,
                offload="optimizer",
                optimizer="fusedadam",
                seq_len=32,
                micro_batch=1,
                warmup_steps=1,
                measured_steps=2,
            ),
            "but DeepSpeed built DeepSpeedCPUAdam",
        ),
    ],
)
def test_rule_is_true_on_cpu(tmp_path, rule, cell, expect):
    skip = rules.check(cell, CPU)
    assert skip is not None and skip.rule == rule
    out = launch.run_cell(cell, dsconfig.build(cell), launch.Launch(tmp_path / "log"))
    if rule == "fp16-needs-cuda" and _cpu_has_fp16():
        # oneDNN (and so DeepSpeed's CPU accelerator) has fp16 on CPUs with AVX512-FP16 or AMX-FP16: there the
        # cell trains, and the rule is zerobench's choice (fp16 is measured on GPUs), as its reason says.
        assert out.status.value == "ok", out.reason
        assert "AVX512-FP16" in skip.reason
        return
    assert out.status.value == "error"
    assert expect in out.reason or expect in out.log_tail, out.reason


def test_onebit_without_cupy_on_cpu(tmp_path):
    assert rules.check(Cell(optimizer="onebitadam", precision="fp16"), CPU).rule in (
        "fp16-needs-cuda",
        "onebit-needs-cuda",
    )
    # With fp32 (past the fp16 check), the 1-bit optimizer itself fails: it needs cupy/NCCL.
    cell = Cell(optimizer="onebitadam", precision="fp32", seq_len=32, micro_batch=1, warmup_steps=1, measured_steps=2)
    out = launch.run_cell(cell, dsconfig.build(cell), launch.Launch(tmp_path / "log"))
    assert out.status.value == "error" and "cupy" in out.reason


def test_torch_adamw_with_offload_really_runs(tmp_path):
    # The other side of offload-runs-cpuadam: torch AdamW is kept (its step runs on the CPU copy).
    cell = Cell(
        zero_stage=2,
        offload="optimizer",
        optimizer="adamw",
        seq_len=32,
        micro_batch=1,
        warmup_steps=1,
        measured_steps=2,
    )
    assert rules.check(cell, CPU) is None
    out = launch.run_cell(cell, dsconfig.build(cell), launch.Launch(tmp_path / "log"))
    assert out.status.value == "ok", out.reason
    assert out.ranks[0].optimizer_class == "torch.optim.adamw.AdamW"


def test_param_offload_below_zero3_is_ignored(tmp_path):
    # param-offload-needs-zero3: stage 2 runs, but the parameters stay put: the DeepSpeed config
    # check says so before anything runs, and DeepSpeed's engine reports no parameter offload.
    cell = Cell(
        zero_stage=2,
        offload="optimizer+params",
        optimizer="cpuadam",
        seq_len=32,
        micro_batch=1,
        warmup_steps=1,
        measured_steps=2,
    )
    assert rules.check(cell, CPU).rule == "param-offload-needs-zero3"
    probs = dsconfig.check(dsconfig.build(cell))
    assert any("offload_param" in p.where for p in probs), probs


def test_zero_takes_no_fusedlamb():
    # fusedlamb-needs-zero0: DeepSpeed's ZeRO refuses an optimizer outside this list unless told to allow untested
    # ones (engine._do_optimizer_sanity_check); FusedLamb cannot be built on a CPU, so the list itself is shown.
    from deepspeed.ops.adam import FusedAdam
    from deepspeed.ops.lamb import FusedLamb
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    assert FusedLamb not in ZERO_SUPPORTED_OPTIMIZERS and FusedAdam in ZERO_SUPPORTED_OPTIMIZERS
    gpu = env.Platform(gpus=(env.Gpu(0, "GPU", 0, "x"),), versions={"deepspeed": "0.19.6"})
    for stage in (1, 2, 3):
        cell = Cell(optimizer="fusedlamb", precision="fp16", zero_stage=stage)
        assert rules.check(cell, gpu).rule == "fusedlamb-needs-zero0"
    assert rules.check(Cell(optimizer="fusedlamb", precision="fp16", zero_stage=0), gpu) is None
