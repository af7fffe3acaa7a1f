"""GPU measurement, checked on a real GPU (run on the GPU host: `nox -s gpu_tests`; they skip elsewhere).

Telemetry figures are taken side by side and must agree the way the memory hierarchy says they
must; failures are provoked for real and must be classified as what they are."""

from __future__ import annotations

import pytest

from tests.conftest import as_written, write_matrix, zerobench

pytestmark = pytest.mark.gpu

SMALL_1B = """\
model: llama-1b
seq_len: 1024
batch: {micro: 2, grad_accum: 1}
steps: {warmup: 2, measured: 6}
lr: 1.0e-4
timeout_s: 300
axes: {zero_stage: [0, 3], optimizer: [fusedadam], precision: [bf16], grad_ckpt: [false]}
"""


def _outcomes(path):
    return [x for x in as_written(path) if x["status"] != "started"]


def test_telemetry_side_by_side(tmp_path):
    m = write_matrix(tmp_path / "t.yaml", SMALL_1B)
    r = zerobench("run", str(m), "--results", str(tmp_path / "t.jsonl"), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = _outcomes(tmp_path / "t.jsonl")
    assert [x["status"] for x in recs] == ["ok", "ok"], [x["reason"] for x in recs]
    for x in recs:
        mem, met, tel = x["memory"], x["metrics"], x["telemetry"]
        print(x["cell_name"], {k: v for k, v in mem.items() if k.endswith("bytes")}, met["tokens_per_s"], met["mfu"])
        assert tel["nvml"] and tel["samples"] > 100, "NVML sampled every ~10 ms"
        alloc, reserved = mem["torch_max_allocated_bytes"], mem["torch_max_reserved_bytes"]
        # allocator <= its reservation <= what NVML sees for our processes <= the whole device
        assert 0 < alloc <= reserved
        assert mem["nvml_used_peak_measured_bytes"] >= reserved
        if mem["nvml_proc_peak_measured_bytes"]:  # per-process accounting may be hidden in a VM
            assert mem["nvml_proc_peak_measured_bytes"] >= reserved
            assert mem["nvml_proc_peak_measured_bytes"] <= mem["nvml_used_peak_measured_bytes"]
        assert mem["host_rss_peak_bytes"] > 1 * 2**30
        assert 0.02 < met["mfu"] < 1.0 and met["hfu"] >= met["mfu"]
        assert met["energy_j_per_token"] > 0 and met["gpu_util_mean_pct"] > 10
        # The GPU's state over the measured steps (a hot or power-capped GPU is not comparable).
        assert met["sm_clock_mean_mhz"] > 100 and met["mem_clock_mean_mhz"] > 100 and met["temperature_max_c"] > 0
        assert isinstance(met["throttle_reasons"], list) and met["power_max_w"] >= met["power_mean_w"]
        assert set(tel["phases"]) >= {"setup", "warmup", "measured"}
        # What persists between steps (model states, no activations) sits under the peak, and a
        # worker forked from the pre-imported server measures the same way as a fresh one.
        assert 0 < mem["torch_allocated_between_steps_bytes"] <= alloc
        if x["cell"]["zero_stage"] == 0:
            # Between steps a ZeRO-0 bf16 Adam run holds its model states and no gradients (freed
            # after the step): 2 (bf16) + 4 (fp32 master) + 8 (Adam moments) bytes per parameter, and
            # cuBLAS's workspaces (64 MiB). The previous step's logits must not be among them.
            extra = mem["torch_allocated_between_steps_bytes"] - 14 * x["worker"]["params_total"]
            assert 0 <= extra < 96 * 2**20, extra / 2**20
            # At the end of the backward pass the gradients (2 bytes per parameter at least) exist
            # beside those model states.
            grads = mem["torch_max_allocated_backward_bytes"] - mem["torch_allocated_between_steps_bytes"]
            assert grads >= 2 * x["worker"]["params_total"], grads / 2**30
        # The step's peak is its largest part's: the parts cover the whole step.
        parts = [mem[f"torch_max_allocated_{p}_bytes"] for p in ("forward", "backward", "step")]
        assert max(parts) == alloc, (parts, alloc)
        assert x["started_by"]["mode"] == "fork", x["started_by"]
        # The GPU was handed back clean.
        after = list(x["gpu_after"].values())[0]["used_bytes"]
        assert after < 2 * 2**30, after


def test_cuda_oom_is_classified_and_the_next_run_is_clean(tmp_path):
    m = write_matrix(
        tmp_path / "oom.yaml",
        """\
model: llama-13b
seq_len: 512
batch: {micro: 1, grad_accum: 1}
steps: {warmup: 1, measured: 2}
timeout_s: 300
axes: {zero_stage: [0], optimizer: [fusedadam], precision: [bf16]}
""",
    )
    # --no-prune: the memory model rightly predicts this cell cannot fit and would skip it unrun; the
    # test is about what happens when a cell really runs out of memory.
    r = zerobench("run", str(m), "--results", str(tmp_path / "oom.jsonl"), "--no-report", "--no-prune", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (rec,) = _outcomes(tmp_path / "oom.jsonl")
    print(rec["status"], rec["reason"])
    assert rec["status"] == "cuda_oom", rec["reason"]
    alloc = rec["worker"]["allocator_at_failure"]
    # A 13B's bf16 weights alone are 24 GiB: the allocator held a large share of the GPU when it failed (on an
    # H200 over a third, on an 80 GB card more).
    total = alloc["device_total_bytes"]
    assert total > 40 * 2**30 and alloc["reserved_bytes.all.peak"] > 0.3 * total
    after = list(rec["gpu_after"].values())[0]["used_bytes"]
    assert after < 2 * 2**30, "the GPU is back to baseline after the failed cell"
    # And the harness carries on: a small run right after succeeds.
    m2 = write_matrix(tmp_path / "ok.yaml", SMALL_1B.replace("zero_stage: [0, 3]", "zero_stage: [0]"))
    r = zerobench("run", str(m2), "--results", str(tmp_path / "ok.jsonl"), "--no-report", cwd=tmp_path)
    assert [x["status"] for x in _outcomes(tmp_path / "ok.jsonl")] == ["ok"]


def test_wrong_optimizer_name_is_refused_on_gpu(tmp_path):
    """The rule offload-runs-cpuadam, shown on the GPU: DeepSpeed swaps FusedAdam for DeepSpeedCPUAdam."""
    from bench.execute import launch
    from bench.matrix import dsconfig
    from bench.matrix.cells import Cell

    cell = Cell(
        model="llama-tiny",
        zero_stage=2,
        offload="optimizer",
        optimizer="fusedadam",
        seq_len=64,
        micro_batch=1,
        warmup_steps=1,
        measured_steps=2,
    )
    out = launch.run_cell(cell, dsconfig.build(cell), launch.Launch(tmp_path / "log", gpus=[0]))
    assert out.status.value == "error" and "but DeepSpeed built DeepSpeedCPUAdam" in out.reason


def test_liger_kernels_run_and_learn_like_hf(tmp_path):
    """kernels: liger patches the model with Liger's Triton modules (at ZeRO-3 without the fused linear
    cross-entropy, which would read the sharded head): same init and data, so the same first loss."""
    m = write_matrix(
        tmp_path / "k.yaml",
        """\
model: llama-tiny
seq_len: 256
batch: {micro: 4, grad_accum: 1}
steps: {warmup: 1, measured: 6}
lr: 1.0e-3
timeout_s: 300
axes: {zero_stage: [0, 3], optimizer: [fusedadam], precision: [bf16], kernels: [hf, liger]}
""",
    )
    r = zerobench("run", str(m), "--results", str(tmp_path / "k.jsonl"), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = {(x["cell"]["zero_stage"], x["cell"]["kernels"]): x for x in _outcomes(tmp_path / "k.jsonl")}
    assert {k: x["status"] for k, x in recs.items()} == {k: "ok" for k in recs} and len(recs) == 4, {
        k: x["reason"] for k, x in recs.items()
    }
    for zero in (0, 3):
        hf, lg = recs[(zero, "hf")], recs[(zero, "liger")]
        k = lg["worker"]["kernels"]
        print(zero, k, hf["losses"], lg["losses"])
        assert hf["worker"]["kernels"]["liger_modules"] == 0 and k["liger_modules"] > 0
        assert k["liger_settings"]["fused_linear_cross_entropy"] is (zero != 3)
        assert lg["worker"]["versions"]["liger-kernel"]
        assert abs(lg["losses"][0] - hf["losses"][0]) < 0.02 * hf["losses"][0]
        assert lg["losses"][-1] < lg["losses"][0]


def test_liger_kernels_on_the_trainer_path(tmp_path):
    """The HF Trainer path asks the Trainer for Liger (TrainingArguments(use_liger_kernel=...)), as its
    users do; the Trainer patches the built model, and the record must show Liger's modules in it."""
    m = write_matrix(
        tmp_path / "k.yaml",
        """\
model: llama-tiny
seq_len: 256
batch: {micro: 4, grad_accum: 1}
steps: {warmup: 1, measured: 4}
lr: 1.0e-3
timeout_s: 300
axes: {zero_stage: [2], optimizer: [fusedadam], precision: [bf16], engine: [hf_trainer], kernels: [hf, liger]}
""",
    )
    r = zerobench("run", str(m), "--results", str(tmp_path / "k.jsonl"), "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = {x["cell"]["kernels"]: x for x in _outcomes(tmp_path / "k.jsonl")}
    assert {k: x["status"] for k, x in recs.items()} == {"hf": "ok", "liger": "ok"}, {
        k: x["reason"] for k, x in recs.items()
    }
    print(recs["liger"]["worker"]["kernels"], recs["hf"]["losses"], recs["liger"]["losses"])
    assert (
        recs["hf"]["worker"]["kernels"]["liger_modules"] == 0
        and recs["liger"]["worker"]["kernels"]["liger_modules"] > 0
    )
    assert abs(recs["liger"]["losses"][0] - recs["hf"]["losses"][0]) < 0.02 * recs["hf"]["losses"][0]
