"""The ZeRO paper's model-state accounting (the estimator's seed)."""
from __future__ import annotations

import pytest

from bench.estimate import model_states, zero_ratio

PSI = 7_000_000_000


def test_paper_example_7_5b_on_64_gpus():
    # ZeRO paper, figure 1: 7.5B parameters, K=12, N=64 -> 120 GB, 31.4 GB, 16.6 GB, 1.88 GB per GPU.
    psi, n = 7.5e9, 64
    got = [model_states(params=int(psi), trainable=int(psi), zero_stage=s, gpus=n, precision="bf16",
                        optimizer="fusedadam")["gpu_bytes"] / 1e9 for s in range(4)]
    assert got == pytest.approx([120, 31.4, 16.6, 1.875], rel=0.01)


def test_ratios_two_gpus():
    assert [zero_ratio(s, 2) for s in range(4)] == pytest.approx([1.0, 10 / 16, 9 / 16, 0.5])


def test_offload_and_lora():
    full = model_states(params=PSI, trainable=PSI, zero_stage=2, gpus=1, precision="bf16", optimizer="cpuadam",
                        offload="optimizer")
    assert full["gpu_optimizer_bytes"] == 0 and full["host_bytes"] == 12 * PSI
    lora = model_states(params=PSI, trainable=40_000_000, zero_stage=0, gpus=1, precision="bf16", optimizer="fusedadam")
    assert lora["gpu_bytes"] == pytest.approx(2 * PSI + 14 * 40e6)  # weights, then grads + Adam for the adapters
    q = model_states(params=PSI, trainable=40_000_000, zero_stage=0, gpus=1, precision="bf16", optimizer="fusedadam",
                     quantized_4bit=True)
    assert q["gpu_params_bytes"] < lora["gpu_params_bytes"] / 3
