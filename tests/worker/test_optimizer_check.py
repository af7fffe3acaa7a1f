"""The worker's check of the optimizer an engine built (bench/worker/parts/optimizer.py): the class, bitsandbytes' state
bits and paging, the learning rate and betas, against what the cell names; run before the first step, so a wrong
optimizer ends the attempt in its setup and a right one is measured.

On CPU, bitsandbytes is a stand-in (tests/fake_bnb: torch's AdamW under bitsandbytes' names and attributes); the
real one runs in tests/matrix/test_gpu_rules.py."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest

from bench.matrix import dsconfig
from bench.matrix.cells import Cell
from bench.worker.parts.optimizer import DEFAULT_BETAS, facts, refusal

FAKE_BNB = Path(__file__).parent.parent / "fake_bnb"


def _built(module: str, name: str, *, lr=1e-3, betas=DEFAULT_BETAS, bits=None, paged=None, initial_lr=None):
    """An optimizer-like object of class `module.name` (what facts() reads: the class, args.optim_bits, is_paged,
    param_groups)."""
    cls = type(name, (), {"__module__": module})
    opt = cls()
    group = {"lr": lr, "betas": betas}
    if initial_lr is not None:
        group["initial_lr"] = initial_lr
    opt.param_groups = [group]
    if bits is not None:
        opt.args = types.SimpleNamespace(optim_bits=bits)
        opt.is_paged = paged
    return opt


def _why(optimizer: str, opt, ds_config: dict | None = None, **cell) -> str | None:
    c = Cell(optimizer=optimizer, **cell)
    return refusal(c, facts(opt), dsconfig.build(c) if ds_config is None else ds_config, "the Trainer")


BNB_ADAMW = "bitsandbytes.optim.adamw"


@pytest.mark.parametrize(
    "optimizer,bits,paged",
    [("adamw_8bit", 8, False), ("paged_adamw", 32, True), ("paged_adamw_8bit", 8, True)],
)
def test_the_trainers_bitsandbytes_adamw_is_the_optimizer_asked_for(optimizer, bits, paged):
    # The HF Trainer builds bitsandbytes.optim.AdamW(optim_bits=..., is_paged=...) for each: the same optimizer as
    # the named class, which the check once refused by name after a whole measurement (19 attempts on the H200).
    assert _why(optimizer, _built(BNB_ADAMW, "AdamW", bits=bits, paged=paged)) is None
    cls = {"adamw_8bit": "AdamW8bit", "paged_adamw": "PagedAdamW", "paged_adamw_8bit": "PagedAdamW8bit"}[optimizer]
    assert _why(optimizer, _built(BNB_ADAMW, cls, bits=bits, paged=paged)) is None
    # Other bits or paging: another optimizer.
    assert "optim_bits=" in _why(optimizer, _built(BNB_ADAMW, "AdamW", bits=40 - bits, paged=paged))
    assert "is_paged=" in _why(optimizer, _built(BNB_ADAMW, "AdamW", bits=bits, paged=not paged))


def test_a_class_of_the_same_name_elsewhere_another_class_or_other_hyperparameters_are_refused():
    torch_adamw = _built("torch.optim.adamw", "AdamW")
    assert "built torch.optim.adamw.AdamW" in _why("adamw_8bit", torch_adamw)
    assert _why("adamw", torch_adamw) is None  # DeepSpeed's torch_adam: torch's AdamW is the cell's
    why = _why("fusedadam", _built("deepspeed.ops.adam.cpu_adam", "DeepSpeedCPUAdam"))
    assert why.startswith("optimizer 'fusedadam' asked for FusedAdam, but the Trainer built DeepSpeedCPUAdam")
    assert "lr=0.01 (asked 0.001)" in _why("adamw", _built("torch.optim.adamw", "AdamW", lr=1e-2))
    assert "betas=(0.9, 0.95)" in _why("adamw", _built("torch.optim.adamw", "AdamW", betas=(0.9, 0.95)))
    # The learning rate the optimizer starts from: a scheduler's first change is not a mismatch.
    assert _why("adamw", _built("torch.optim.adamw", "AdamW", lr=0.0, initial_lr=1e-3)) is None
    # A config that states them asks for them; one with a scheduler leaves the learning rate to it.
    stated = {"optimizer": {"type": "AdamW", "params": {"lr": 5e-4, "betas": [0.8, 0.9]}}}
    assert _why("adamw", _built("torch.optim.adamw", "AdamW", lr=5e-4, betas=(0.8, 0.9)), stated) is None
    assert "lr=" in _why("adamw", _built("torch.optim.adamw", "AdamW", betas=(0.8, 0.9)), stated)
    assert _why("adamw", _built("torch.optim.adamw", "AdamW", lr=0.0), {"scheduler": {"type": "WarmupLR"}}) is None


def _trainer_cell(tmp_path, optimizer: str, builds: str = ""):
    """A Trainer cell run on CPU through the child protocol, past the rules (bitsandbytes needs CUDA), with the
    stand-in bitsandbytes first on the worker's path; builds: what the stand-in builds whatever it is asked."""
    from bench.execute import launch

    cell = Cell(engine="hf_trainer", optimizer=optimizer, precision="fp32", seq_len=32, micro_batch=2,
                warmup_steps=1, measured_steps=2)  # fmt: skip
    env = {"PYTHONPATH": os.pathsep.join([str(FAKE_BNB), os.environ.get("PYTHONPATH", "")]), "FAKE_BNB_BUILDS": builds}
    return launch.run_cell(cell, dsconfig.build(cell), launch.Launch(tmp_path / "log", extra_env=env))


@pytest.mark.slow
def test_a_trainer_cell_with_the_right_optimizer_is_measured(tmp_path):
    out = _trainer_cell(tmp_path, "paged_adamw_8bit")
    assert out.status.value == "ok", out.reason
    rank = out.ranks[0].model_dump()
    assert rank["optimizer_class"] == "bitsandbytes.optim.AdamW" and len(rank["step_times_s"]) == 3


@pytest.mark.slow
def test_a_trainer_cell_with_the_wrong_optimizer_ends_before_any_step(tmp_path):
    out = _trainer_cell(tmp_path, "paged_adamw_8bit", builds="unpaged")
    assert out.status.value == "error" and out.phase_at_end == "setup", (out.status, out.phase_at_end, out.reason)
    assert "asked for PagedAdamW8bit, but the Trainer built AdamW with is_paged=False (asked True)" in out.reason
    rank = out.ranks[0].model_dump()
    assert not rank.get("step_times_s") and not rank.get("losses")
