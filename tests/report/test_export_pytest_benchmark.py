"""`zerobench export --pytest-benchmark`: pytest-benchmark's own loader reads the file, its statistics
agree with pytest-benchmark's, and its compare command tables two exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_benchmark.logger import Logger
from pytest_benchmark.stats import Stats
from pytest_benchmark.storage.file import FileStorage

from tests.conftest import zerobench

ROOT = Path(__file__).resolve().parents[2]


def test_pytest_benchmark_reads_the_export(tmp_path):
    out = tmp_path / "bench" / "0001_1b.json"
    r = zerobench("export", str(ROOT / "results" / "1b.jsonl"), "--pytest-benchmark", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "13 cells written" in r.stdout and "1 without an ok run left out" in r.stdout
    storage = FileStorage(tmp_path / "bench", logger=Logger(Logger.QUIET))
    benches = list(storage.load_benchmarks(str(out)))
    assert len(benches) == 13
    doc = json.loads(out.read_text())
    for b in doc["benchmarks"]:
        ref = Stats()
        for t in b["stats"]["data"]:
            ref.update(t)
        for field in Stats.fields:
            assert b["stats"][field] == pytest.approx(getattr(ref, field)) if field != "outliers" else True, field
        assert b["stats"]["outliers"] == ref.outliers
        assert b["stats"]["rounds"] == 10, "the 10 measured steps of the one repeat"
    z0 = next(b for b in doc["benchmarks"] if b["param"] == "0a1eaba46b")
    assert z0["extra_info"]["tokens_per_s"] == pytest.approx(34910, rel=1e-4) and z0["params"]["zero_stage"] == 0

    second = tmp_path / "bench" / "0002_rerun.json"
    assert (
        zerobench(
            "export", str(ROOT / "results" / "1b-rerun.jsonl"), "--pytest-benchmark", str(second), cwd=tmp_path
        ).returncode
        == 0
    )
    cmp = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_benchmark",
            "--storage",
            f"file://{tmp_path / 'bench'}",
            "compare",
            str(out),
            str(second),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert cmp.returncode == 0, cmp.stderr
    assert "0002_rerun" in cmp.stdout and "zero=0,offload=none,prec=bf16,gc=on" in cmp.stdout
