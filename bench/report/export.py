"""The tidy results table as CSV or Parquet, for spreadsheets and notebooks outside Python; and the
results in pytest-benchmark's JSON format, for its compare tooling (`pytest-benchmark compare`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..host.safefile import write_atomic

if TYPE_CHECKING:
    from ..judge.compare import CellSamples

__all__ = ["to_csv", "to_parquet", "to_pytest_benchmark", "parquet_error", "ExportError"]

# Per-step lists: kept as lists in Parquet, written as JSON arrays in CSV (one cell per list).
_LIST_COLUMNS = ("losses", "step_times_s")


class ExportError(RuntimeError):
    pass


def parquet_error() -> str | None:
    """Why Parquet cannot be written here, or None when it can."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return "zerobench report: --parquet needs pyarrow, which is not installed (pip install pyarrow), or use --csv"
    return None


def to_csv(df, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = df.copy()
    for col in _LIST_COLUMNS:
        if col in out:
            out[col] = out[col].map(lambda v: json.dumps(v) if isinstance(v, list) else "")
    out.to_csv(path, index=False, lineterminator="\n")
    return path


def to_parquet(df, path: str | Path) -> Path:
    err = parquet_error()
    if err:
        raise ExportError(err)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return path


# -- pytest-benchmark ---------------------------------------------------------------------------------
# Its storage format (pytest_benchmark.stats.Stats.fields; `pytest-benchmark compare FILE` reads it).
# Written here rather than through pytest-benchmark, which is a test dependency, not a runtime one.


def _quartiles(d: list[float]) -> tuple[float, float]:
    """Q1 and Q3 as pytest-benchmark computes them (Wikipedia's methods 3 and 2), so its columns agree."""
    import statistics

    n = len(d)
    if n == 1:
        return d[0], d[0]
    if n % 2:
        k, q = n // 4, n % 4
        if q == 1:
            return 0.25 * d[k - 1] + 0.75 * d[k], 0.75 * d[3 * k] + 0.25 * d[3 * k + 1]
        return 0.75 * d[k] + 0.25 * d[k + 1], 0.25 * d[3 * k + 1] + 0.75 * d[3 * k + 2]
    return statistics.median(d[: n // 2]), statistics.median(d[n // 2 :])


def _bench_stats(data: list[float]) -> dict:
    import statistics
    from bisect import bisect_left, bisect_right

    d = sorted(data)
    n = len(d)
    mean = statistics.mean(d)
    sd = statistics.stdev(d) if n > 1 else 0.0
    q1, q3 = _quartiles(d)
    iqr = q3 - q1
    lo, hi = q1 - 1.5 * iqr, q3 + 1.5 * iqr
    return {
        "min": d[0],
        "max": d[-1],
        "mean": mean,
        "stddev": sd,
        "rounds": n,
        "median": statistics.median(d),
        "iqr": iqr,
        "q1": q1,
        "q3": q3,
        "iqr_outliers": sum(1 for v in d if v < lo or v > hi),
        "stddev_outliers": sum(1 for v in d if v < mean - sd or v > mean + sd),
        "outliers": f"{sum(1 for v in d if v < mean - sd or v > mean + sd)};{sum(1 for v in d if v < lo or v > hi)}",
        "ld15iqr": d[0] if n == 1 else d[bisect_left(d, lo)],
        "hd15iqr": d[0] if n == 1 else d[bisect_right(d, hi) - 1],
        "ops": n / sum(d) if sum(d) else 0,
        "total": sum(d),
        "data": list(data),
        "iterations": 1,
    }


# The cell's settings a benchmark's params carry.
_PARAMS = (
    "zero_stage", "offload", "precision", "grad_ckpt", "optimizer", "peft", "engine", "micro_batch", "grad_accum",
    "seq_len", "gpus",
)  # fmt: skip


def to_pytest_benchmark(df, path: str | Path) -> tuple[Path, int, int]:
    """One benchmark per cell that ran ok: its rounds are the measured steps' times (seconds) of every
    ok repeat, so pytest-benchmark's min/median/stddev are per step; tokens/s, memory peaks, the
    repeats' own medians and the cell's axes travel in extra_info and params; a replayed cell's
    (`zerobench run --replay`: nothing ran anew) names the file it was replayed from (`replayed_from`).
    Returns the path, the cells written and the cells left out (no ok repeat, so no times)."""
    from ..judge import compare
    from ..judge.results import latest

    path = Path(path)
    samples = compare.samples(df)
    last = latest(df)
    rows = {compare.cell_key(r): r for r in last.to_dict("records")}
    benches, left_out = [], 0
    for key, s in samples.items():
        times = [t for rep in s.step_times for t in rep]
        if not times:
            left_out += 1
            continue
        benches.append(_benchmark(key, s, rows[key], times))
    first = last.iloc[0].to_dict() if len(last) else {}
    doc = {
        "machine_info": _machine_info(first),
        "commit_info": {
            "id": _plain(first.get("git_commit")),
            "dirty": _plain(first.get("git_dirty")),
            "project": "zerobench",
        },
        "benchmarks": benches,
        "datetime": str(last["ended_at"].max()) if "ended_at" in last and last["ended_at"].notna().any() else None,
        "version": "5.1.0",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with write_atomic(path) as f:  # a link at the path is replaced, not written through
        f.write(json.dumps(doc, indent=1, default=str) + "\n")
    return path, len(benches), left_out


def _benchmark(key: str, s: CellSamples, r: dict, times: list[float]) -> dict:
    """One cell's benchmark: `s` its samples, `r` its latest row, `times` the measured steps' times of its ok
    repeats."""
    from ..judge import compare

    return {
        "group": str(r.get("matrix")),
        "name": s.cell_name,
        "fullname": f"{r.get('matrix')}::{r.get('cell_id')}",
        "params": {k: _plain(r.get(k)) for k in _PARAMS},
        "param": key,
        "extra_info": {
            "cell_hash": r.get("cell_hash"),
            "status": s.status,
            "repeats": s.repeats,
            "unit": "seconds per training step",
            **{
                f.column: (_plain(compare.stats.median(s.values[f.column])) if s.values[f.column] else None)
                for f in compare.FIGURES
            },
            "tokens_per_s_by_repeat": s.values["tokens_per_s"],
            # A replay (`zerobench run --replay`) ran nothing anew: its times were recorded earlier.
            **({"replayed_from": r["replay_source"]} if isinstance(r.get("replay_source"), str) else {}),
        },
        "options": {"timer": "zerobench (torch.cuda.synchronize + perf_counter per step)", "warmup": True},
        "stats": _bench_stats(times),
    }


def _machine_info(first: dict) -> dict:
    """pytest-benchmark's machine_info, from the first row: host, CPU, OS, Python, GPU, driver, torch, DeepSpeed."""
    return {
        "node": _plain(first.get("host")),
        "processor": _plain(first.get("cpu")),
        "system": _plain(first.get("os")),
        "python_version": _plain(first.get("python_version")),
        "gpu": _plain(first.get("gpu_name")),
        "driver": _plain(first.get("gpu_driver")),
        "torch": _plain(first.get("torch_version")),
        "deepspeed": _plain(first.get("deepspeed_version")),
    }


def _plain(v):
    """A JSON value: numpy scalars as Python ones, NaN as null."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and v != v:
        return None
    return v
