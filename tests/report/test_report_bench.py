"""Report generation at scale: 10,000 result rows -> Markdown + PNGs + HTML in well under 10 s.

The records are synthetic (host "test-fixture"), GPU-shaped so every section of the report has
data: NVML and allocator memory, MFU, loss curves, failures of each kind.
"""

from __future__ import annotations

import html
import itertools
import json
import math
import time

from bench.report import write_reports

N_ROWS = 10_000
BUDGET_S = 10.0  # the acceptance bar for a 10k-row report, on an idle 2-core machine
# CPU seconds of _calibrate() on a quiet 2-core machine of the CI kind: the fastest of 15 runs at a load
# of about 1 (0.38-0.59 s); beside other jobs it took 0.34-0.62 s.
IDLE_CALIBRATION_S = 0.38
GiB = 2**30

_STATUSES = ["ok"] * 17 + ["cuda_oom", "skipped", "error", "timeout", "diverged"]


def synthetic_records(n: int):
    """n distinct cells: every combination of the axes, in a fixed order (no randomness)."""
    axes = itertools.product(
        (0, 1, 2, 3),
        ("none", "optimizer", "optimizer+params"),
        ("bf16", "fp16", "fp32"),
        (False, True),
        ("adamw", "fusedadam", "cpuadam", "adamw_8bit"),
        ("none", "lora", "qlora"),
        (1, 2, 4, 8),
        (512, 1024, 2048),
    )
    prov = {
        "host": "test-fixture",
        "gpu_name": "NVIDIA H100 80GB HBM3 (synthetic)",
        "gpu_count": 1,
        "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3 (synthetic)", "memory_bytes": 80 * GiB}],
        "driver": "synthetic",
        "versions": {"torch": "2.11.0", "deepspeed": "0.19.6"},
        "git_commit": "0" * 40,
    }
    for i, (zero, off, prec, gc, opt, peft, mb, seq) in enumerate(itertools.islice(axes, n)):
        status = _STATUSES[i % len(_STATUSES)]
        lora = {"r": 16, "alpha": 32} if peft != "none" else None
        gc_s = "on" if gc else "off"
        name = f"zero={zero},offload={off},prec={prec},gc={gc_s},opt={opt},peft={peft},mb={mb},seq={seq}"
        rec = {
            "schema_version": 1,
            "run_id": "synthetic-bench",
            "attempt": 1,
            "matrix": "bench10k",
            "cell_hash": f"{i:010x}",
            "cell_name": name,
            "cell_id": f"{name}#{i:010x}",
            "status": status,
            "reason": "" if status == "ok" else f"synthetic {status} for cell {i}",
            "started_at": "2026-11-30T05:00:00+00:00",
            "ended_at": "2026-11-30T05:00:30+00:00",
            "wall_s": 30.0,
            "cell": {
                "zero_stage": zero,
                "offload": off,
                "precision": prec,
                "grad_ckpt": gc,
                "optimizer": opt,
                "peft": peft,
                "engine": "deepspeed",
                "model": "llama-7b",
                "seq_len": seq,
                "micro_batch": mb,
                "grad_accum": 1,
                "gpus": 1,
                "warmup_steps": 2,
                "measured_steps": 18,
                "seed": 0,
                "lora": lora,
                "qlora": {"quant_type": "nf4"} if peft == "qlora" else None,
            },
            "provenance": prov,
        }
        if status != "skipped":
            peak = (10 + 60 / (1 + zero) / (2 if off != "none" else 1) + mb * seq / 512) * GiB
            tps = 40_000 / (1 + zero * 0.2) / (4 if off != "none" else 1) * (0.8 if gc else 1) * (1 + i % 7 / 10)
            rec["memory"] = {
                "nvml_proc_peak_bytes": peak,
                "nvml_used_peak_bytes": peak + 0.5 * GiB,
                "torch_max_reserved_bytes": peak - 1.5 * GiB,
                "torch_max_allocated_bytes": peak - 3 * GiB,
                "host_rss_peak_bytes": 8 * GiB,
            }
            rec["metrics"] = {
                "tokens_per_s": tps,
                "step_time_median_s": mb * seq / tps,
                "mfu": tps / 100_000,
                "hfu": tps / 90_000,
                "tflops_per_gpu": tps / 100_000 * 989.4,
                "loss_final": 6.0 + i % 5 / 10,
            }
            rec["losses"] = [6.0 + 4 * math.exp(-k / 5) + (i % 5) / 10 for k in range(20)]
        yield rec


def _calibrate() -> float:
    """CPU seconds of a fixed workload shaped like the report's (JSON, many small dicts and strings, escaping),
    independent of zerobench's code: how fast this machine runs such work right now. A tight arithmetic loop
    was tried first; it stays in cache and missed a CI machine 1.3x slower at the report than at the loop."""
    c0 = time.process_time()
    lines = [json.dumps(r) for r in synthetic_records(2_000)]
    for _ in range(2):
        rows = [json.loads(x) for x in lines]
        html.escape("".join(f"<td>{r['cell_name']}</td><td>{r['wall_s']:,.1f}</td>" for r in rows))
        sorted(rows, key=lambda r: (r["status"], r["cell_name"]))
    return time.process_time() - c0


def test_report_10k_rows_under_budget(benchmark, tmp_path):
    # Held to the budget in this process's CPU time, scaled by how much slower a fixed workload runs now
    # than on an idle machine: beside other jobs the same work costs more CPU time too (shared caches
    # and cores), and wall time more still.
    results = tmp_path / "bench10k.jsonl"
    with results.open("w") as f:
        for rec in synthetic_records(N_ROWS):
            f.write(json.dumps(rec) + "\n")
    out = tmp_path / "reports" / "bench10k"
    timings = []

    def generate():
        c0, t0 = time.process_time(), time.perf_counter()
        paths = write_reports([results], out)
        timings.append((time.process_time() - c0, time.perf_counter() - t0))
        return paths

    # Warm: imports, bytecode, matplotlib's font cache and the template compile are a first call's costs,
    # not the rendering of 10k rows (a cold first run after a checkout went over the bar).
    warm = tmp_path / "warm.jsonl"
    warm.write_text("".join(json.dumps(r) + "\n" for r in synthetic_records(20)))
    write_reports([warm], tmp_path / "reports" / "warm")
    before = _calibrate()
    paths = benchmark.pedantic(generate, rounds=1, iterations=1)
    slowdown = max(1.0, min(before, _calibrate()) / IDLE_CALIBRATION_S)
    cpu_s, wall_s = timings[0]
    assert cpu_s < BUDGET_S * slowdown, (
        f"report for {N_ROWS} rows took {cpu_s:.1f} s of CPU ({wall_s:.1f} s wall); "
        f"budget {BUDGET_S} s on an idle machine, x{slowdown:.2f} for this one's load"
    )

    assert {p.suffix for p in paths} == {".md", ".html", ".png"}
    page = (out.parent / "bench10k.html").read_text()
    table = page.split('id="cells-table"', 1)[1].split("</table>", 1)[0]
    assert table.count("<tr data-status=") == N_ROWS, "every cell is a row of the cells table"
