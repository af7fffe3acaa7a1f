"""Tests split by hardware, honestly.

- `gpu`-marked tests need CUDA: they skip without it (a skip is never evidence; run them on the GPU host).
- Every other test runs with CUDA hidden (CUDA_VISIBLE_DEVICES=""), inherited by the workers it
  starts, so an unmarked test cannot quietly use a GPU: on a GPU host it would fail instead.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def cuda_available() -> bool:
    # In a subprocess: importing torch here would slow every test session and hold a CUDA context.
    r = subprocess.run(
        [sys.executable, "-c", "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)"], capture_output=True
    )
    return r.returncode == 0


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if gpu_items and not cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU (run `nox -s gpu_tests` on the GPU host)")
        for it in gpu_items:
            it.add_marker(skip)


@pytest.fixture(autouse=True)
def _cuda_guard(request, monkeypatch):
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        monkeypatch.setenv("ZEROBENCH_NO_GPU", "1")
    yield


def zerobench(*args: str, cwd: Path, env: dict | None = None, timeout: float = 1200) -> subprocess.CompletedProcess:
    """Run the CLI as a user would, in a fresh process."""
    e = {**os.environ, **(env or {})}
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=cwd, env=e, capture_output=True, text=True, timeout=timeout
    )


def write_matrix(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


TINY = """\
model: llama-tiny
seq_len: 32
batch: {micro: 2, grad_accum: 1}
steps: {warmup: 1, measured: 4}
lr: 3.0e-3
timeout_s: 600
"""
