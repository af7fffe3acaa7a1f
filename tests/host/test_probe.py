"""`zerobench probe` on the CI host: the CPU's own rates, each positive, in under 30 s, cached per machine (the matmuls
per shape), and a run's records carry them in their machine section."""

from __future__ import annotations

import json
import time

import pytest

from bench.execute.probe import _join, _merge, _split, run_shape
from bench.host.rates import Rates, line
from bench.matrix.cells import Cell
from bench.records.store import read_records
from tests.conftest import TINY, copy_built_ops, write_matrix, zerobench

CPU_FIGURES = ("matmul_fp32", "matmul_bf16", "matmul_fp16", "hbm", "host_mem", "host_overhead_s")


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory) -> dict:
    """One per-machine cache for this module's probes and run."""
    return {"ZEROBENCH_CACHE": str(tmp_path_factory.mktemp("cache"))}


def _probe(cache_env: dict, *args: str, cwd) -> tuple[dict, str, float]:
    t0 = time.time()
    r = zerobench("probe", "--json", *args, cwd=cwd, env=cache_env, timeout=300)
    took = time.time() - t0
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout), r.stderr, took


def test_probe_measures_the_cpu_in_under_30_s_and_caches_it(cache_env, tmp_path):
    first, said, took = _probe(cache_env, cwd=tmp_path)
    assert took < 30, f"the probe took {took:.0f} s"
    assert first["source"] == "cpu" and not first["cached"]
    for name in CPU_FIGURES:
        assert first.get(name, 0) > 0, (name, first)
    # What a CPU cannot give is None, each said why; DeepSpeed's CPU Adam only where its op is built (this cache
    # vouches for none): the probe compiles nothing.
    assert "h2d_pinned" not in first and "dequant_4bit" not in first and "matmul_tf32" not in first
    assert "pcie: no GPU" in first["notes"] and "matmul_tf32: no TF32 on a CPU" in first["notes"]
    assert first.get("cpu_adam", 0) > 0 or "cpu_adam: its op is not built" in first["notes"]
    assert said.startswith("probe: ") and " fp32 " in said and "FLOP/s" in said and "cached" not in said

    again, said_again, took_again = _probe(cache_env, cwd=tmp_path)
    assert again["cached"] and said_again.startswith("probe: cached: ")
    assert {k: again[k] for k in CPU_FIGURES} == {k: first[k] for k in CPU_FIGURES}
    assert took_again < took

    plain = zerobench("probe", cwd=tmp_path, env=cache_env, timeout=120)
    assert plain.returncode == 0 and plain.stdout.startswith("probe: cached: ") and plain.stdout.count("\n") == 1


@pytest.mark.slow
def test_a_new_shape_times_only_the_matmuls_again_and_refresh_all(cache_env, tmp_path):
    base, _, _ = _probe(cache_env, cwd=tmp_path)
    other, said, _ = _probe(cache_env, "--model", "llama-tiny", "--tokens", "64", cwd=tmp_path)
    assert said.startswith("probe: cached, matmul timed at 64x128x352: ")
    assert other["matmul_shape"] == "64x128x352" and other["host_mem"] == base["host_mem"]
    assert all(other[k] > 0 for k in CPU_FIGURES)
    fresh, said_fresh, _ = _probe(cache_env, "--model", "llama-tiny", "--tokens", "64", "--refresh", cwd=tmp_path)
    assert not fresh["cached"] and not said_fresh.startswith("probe: cached")


@pytest.mark.slow
def test_a_run_writes_the_probed_rates_into_every_record(cache_env, tmp_path):
    m = write_matrix(tmp_path / "m.yaml", TINY + "axes: {zero_stage: [0]}\n")
    out = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(out), "--no-report", cwd=tmp_path, env=cache_env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    probe_lines = [ln for ln in r.stdout.splitlines() if ln.startswith("probe: ")]
    assert len(probe_lines) == 1 and " fp32 " in probe_lines[0], r.stdout[-3000:]
    recs = [x.to_dict() for x in read_records(out)]
    attempts = [x for x in recs if x["status"] in ("started", "ok")]
    assert {x["status"] for x in attempts} == {"started", "ok"}
    for rec in attempts:
        rates = rec["machine"]["rates"]
        assert rates["source"] == "cpu" and rates["matmul_shape"] == "64x128x352"
        assert all(rates[k] > 0 for k in CPU_FIGURES)


@pytest.mark.slow
@pytest.mark.copies_ops  # a build beside its copy would leave a partial copy
def test_cpu_adam_is_timed_once_its_op_is_built_and_never_compiled_by_the_probe(tmp_path):
    ext = tmp_path / "ext"
    copy_built_ops(ext)  # the machine's built ops (CI builds CPU Adam first) spare this test the compile
    e = {"TORCH_EXTENSIONS_DIR": str(ext), "ZEROBENCH_CACHE": str(tmp_path / "cache")}
    tiny = ("--model", "llama-tiny", "--tokens", "64")
    without, _, _ = _probe(e, *tiny, cwd=tmp_path)
    assert "cpu_adam" not in without and "cpu_adam: its op is not built" in without["notes"]
    # Once built, CPU Adam alone is timed; the rest comes from the cache.
    built, said, _ = _probe(e, *tiny, "--build-cpu-adam", cwd=tmp_path)
    said = [ln for ln in said.splitlines() if ln.startswith("probe: ")]  # after the build's lines
    assert built["cpu_adam"] > 0 and said[0].startswith("probe: cached, CPU Adam timed: ") and " CPU Adam " in said[0]
    assert built["host_mem"] == without["host_mem"] and "cpu_adam" not in built["notes"]
    again, said, _ = _probe(e, *tiny, cwd=tmp_path)
    assert again["cached"] and again["cpu_adam"] == built["cpu_adam"]


GPU_FIGURES = (
    "matmul_bf16",
    "matmul_fp16",
    "matmul_fp32",
    "matmul_tf32",
    "hbm",
    "h2d_pinned",
    "d2h_pinned",
    "h2d_pageable",
    "d2h_pageable",
    "host_mem",
    "host_overhead_s",
)


@pytest.mark.gpu
def test_probe_on_a_gpu_measures_every_gpu_figure(tmp_path):
    rates, said, took = _probe({"ZEROBENCH_CACHE": str(tmp_path / "cache")}, cwd=tmp_path)
    assert took < 60, f"the probe took {took:.0f} s"
    assert rates["source"] == "probe" and said.startswith("probe: bf16 ") and "PCIe h2d " in said
    for name in GPU_FIGURES:
        assert rates.get(name, 0) > 0, (name, rates)
    # Each precision's tensor cores beat full fp32; pinned memory beats pageable over PCIe; the device's memory
    # beats the host's.
    assert rates["matmul_bf16"] > rates["matmul_fp32"] and rates["matmul_tf32"] > rates["matmul_fp32"]
    assert rates["h2d_pinned"] > rates["h2d_pageable"] and rates["hbm"] > rates["host_mem"]
    assert rates.get("dequant_4bit", 0) > 0 or "dequant_4bit: bitsandbytes does not import" in rates["notes"]


def test_a_run_is_probed_at_its_largest_preset_and_its_most_tokens():
    cells = [
        Cell(model="llama-tiny", micro_batch=8, seq_len=512),
        Cell(model="llama-small", micro_batch=2, seq_len=64),
        Cell(model="llama-small", micro_batch=4, seq_len=64),
        Cell(model="llama-small", micro_batch="auto", seq_len=512),
        Cell(model="/a/local/model", micro_batch=64, seq_len=4096),
    ]
    assert run_shape(cells) == (512, 512, 1408)
    assert run_shape(cells[-1:]) == (2048, 4096, 11008)  # no preset: the default 7B shape


def test_a_later_part_replaces_the_note_that_said_it_was_missing():
    cached = {"hbm": 2e9, "notes": "pcie: no GPU; cpu_adam: its op is not built"}
    assert _merge(cached, {"cpu_adam": 3e8, "source": "cpu"}) == {
        "hbm": 2e9,
        "cpu_adam": 3e8,
        "source": "cpu",
        "notes": "pcie: no GPU",
    }
    failed = _merge(cached, {"notes": "cpu_adam: RuntimeError: no"})
    assert failed["notes"] == "pcie: no GPU; cpu_adam: RuntimeError: no"


def test_the_cache_keeps_the_machine_and_each_shape_apart():
    figures = {
        "matmul_fp32": 1e9,
        "hbm": 2e9,
        "matmul_shape": "8x4x4",
        "source": "cpu",
        "notes": "matmul_tf32: no TF32 on a CPU; pcie: no GPU",
    }
    machine, mm = _split(figures)
    assert machine == {"hbm": 2e9, "source": "cpu", "notes": "pcie: no GPU"}
    assert mm == {"matmul_fp32": 1e9, "matmul_shape": "8x4x4", "notes": "matmul_tf32: no TF32 on a CPU"}
    assert _join(machine, mm) == Rates.from_dict(figures)


def test_the_line_names_each_figure_and_what_is_missing():
    r = Rates(
        matmul_bf16=612e12,
        matmul_fp32=51e12,
        hbm=2.9e12,
        h2d_pinned=52e9,
        h2d_pageable=14e9,
        d2h_pinned=50e9,
        d2h_pageable=12e9,
        cpu_adam=3.5e8,
        host_overhead_s=12e-6,
        device="GPU",
    )
    s = line(r)
    assert s.startswith("probe: bf16 612 TFLOP/s, fp32 51 TFLOP/s, HBM 2.9 TB/s, PCIe h2d 52/14 GB/s, d2h 50/12 GB/s")
    assert "CPU Adam 350 Mparam/s" in s and "host overhead 12 us" in s
    assert s.endswith("not measured: matmul_fp16, matmul_tf32, host_mem, dequant_4bit")
    assert line(r, cached="cached").startswith("probe: cached: bf16 ")


@pytest.mark.slow
@pytest.mark.copies_ops  # a build beside its copy would leave a partial copy
def test_a_first_run_whose_prebuild_builds_cpu_adam_times_it_before_its_cells(tmp_path):
    # A fresh machine (an empty cache): the probe runs before the prebuild, which it must not disturb, so it finds no
    # CPU Adam it may load; the prebuild then makes it loadable, and CPU Adam alone is timed before any cell starts.
    ext = tmp_path / "ext"
    copy_built_ops(ext)  # the machine's built ops (CI builds CPU Adam first) spare this test the compile
    e = {"TORCH_EXTENSIONS_DIR": str(ext), "ZEROBENCH_CACHE": str(tmp_path / "cache"), "ZEROBENCH_FAULT": "exit@0"}
    m = write_matrix(
        tmp_path / "m.yaml", TINY + "axes: {zero_stage: [2], offload: [optimizer], optimizer: [cpuadam]}\n"
    )
    out = tmp_path / "r.jsonl"
    r = zerobench("run", str(m), "--results", str(out), "--no-report", cwd=tmp_path, env=e, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    said = r.stdout.splitlines()
    probes = [i for i, ln in enumerate(said) if ln.startswith("probe: ")]
    assert len(probes) == 2 and " CPU Adam " not in said[probes[0]], r.stdout[-3000:]
    assert said[probes[1]].startswith("probe: cached, CPU Adam timed: "), r.stdout[-3000:]
    built = next(i for i, ln in enumerate(said) if ln.startswith("ops "))
    assert probes[0] < built < probes[1], r.stdout[-3000:]
    started = [x.to_dict() for x in read_records(out) if x.status.value == "started"]
    assert len(started) == 1 and started[0]["machine"]["rates"]["cpu_adam"] > 0
