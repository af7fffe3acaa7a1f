"""Provenance by content: the package version and a hash of its source on every record; the git commit
only when zerobench runs from its own checkout (not from a wheel, not from a copy inside another repo)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.host import env
from tests.conftest import ROOT

_PRINT = "import json; from bench.host import env; print(json.dumps(env.provenance()))"


def _provenance(pythonpath: Path, cwd: Path) -> dict:
    e = {**os.environ, "PYTHONPATH": str(pythonpath), "ZEROBENCH_NO_GPU": "1"}
    r = subprocess.run([sys.executable, "-c", _PRINT], cwd=cwd, env=e, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _git(cwd: Path, *args: str) -> str:
    e = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=e, capture_output=True, text=True, check=True).stdout.strip()


def test_own_checkout_names_its_commit():
    if not (ROOT / ".git").exists():
        pytest.skip("not running from a git checkout of zerobench")
    p = _provenance(ROOT, ROOT)
    assert p["git_commit"] == _git(ROOT, "rev-parse", "HEAD")
    assert p["source_sha256"] == env.source_sha() and len(p["source_sha256"]) == 64


def test_copy_inside_another_repository_claims_no_commit(tmp_path):
    outer = tmp_path / "other-project"
    outer.mkdir()
    _git(outer, "init", "-q")
    (outer / "README").write_text("someone else's repository\n")
    _git(outer, "add", "README")
    _git(outer, "commit", "-qm", "theirs")
    copy = outer / "vendor" / "zerobench"
    shutil.copytree(ROOT / "bench", copy / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    p = _provenance(copy, tmp_path)
    assert p["git_commit"] is None and p["git_dirty"] is None, "the enclosing repository's commit is not ours"
    assert p["source_sha256"] == env.source_sha(), "same code, same hash"
    (copy / "bench" / "host" / "env.py").write_text((ROOT / "bench" / "host" / "env.py").read_text() + "\n# edited\n")
    assert _provenance(copy, tmp_path)["source_sha256"] != env.source_sha(), "edited code, another hash"


@pytest.mark.slow
def test_installed_wheel_outside_any_git_tree(tmp_path):
    wheels, site, cwd, src = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere", tmp_path / "src"
    cwd.mkdir()
    # From a clean copy: setuptools reuses a checkout's build/ folder, whose files of an earlier
    # layout would end up in the wheel.
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            "build",
            "dist",
            ".git",
            ".nox",
            ".venv",
            "*.egg-info",
            "__pycache__",
            "results",
            "reports",
            ".whl",
            ".aio",
            ".torch_ext",
            ".inductor",
        ),
    )
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = wheels.glob("zerobench-*.whl")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(site), str(whl)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    p = _provenance(site, cwd)
    assert p["git_commit"] is None and p["git_dirty"] is None
    assert p["zerobench_version"] is not None
    # The wheel carries every file of the package: its source hash is the checkout's.
    assert p["source_sha256"] == env.source_sha()
