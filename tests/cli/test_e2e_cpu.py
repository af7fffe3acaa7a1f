"""The whole pipeline on CPU with real DeepSpeed engines: the embedded smoke matrix as a user runs it, the
README's first command (`nox -s bench` runs `zerobench run`) in a fresh clone of this repository, whose own
checks then pass in that clone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import DEFAULT_MATRIX
from bench.judge import results as results_mod
from bench.records.record import SCHEMA_VERSION, Record
from bench.records.store import read_records
from tests.conftest import ROOT, zerobench

pytestmark = pytest.mark.slow

EXPECTED_OPTIMIZER = {"adamw": "AdamW", "fusedadam": "FusedAdam", "cpuadam": "DeepSpeedCPUAdam"}


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def fresh_clone(dest: Path) -> Path:
    """A git clone of this repository with the working tree's uncommitted changes laid over it: what a fresh clone
    of them, committed, holds (nothing git ignores: no results a run wrote, no .nox)."""
    try:
        _git("clone", "-q", str(ROOT), str(dest), cwd=ROOT)
        changed = _git("ls-files", "-z", "-m", "-d", "-o", "--exclude-standard", cwd=ROOT)
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout, so no fresh clone of it: {e}")
    for name in filter(None, changed.split("\0")):
        src, dst = ROOT / name, dest / name
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
        else:
            dst.unlink(missing_ok=True)
    return dest


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`zerobench run` as `nox -s bench` runs it (no argument: the embedded default) in a fresh clone: the folder
    its results and report went to, the run, its records with each cell's settings, and the clone."""
    clone = fresh_clone(tmp_path_factory.mktemp("clone") / "zerobench")
    r = zerobench("run", cwd=clone)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    d = clone / "results" / "local"
    (clone / "reports" / "local" / "smoke.md").replace(d / "smoke.md")  # beside the results, for the tests below
    recs = [x.to_dict() for x in results_mod.with_cells(read_records(d / "smoke.jsonl"))]
    return d, r, recs, clone


def test_the_repository_checks_pass_in_the_clone_the_bench_run_wrote_into(smoke):
    """The README's two commands in either order: what the bench run wrote is git-ignored and read by none of the
    repository's own checks (the generated pages, the results catalogue), which pass in that clone."""
    d, _, _, clone = smoke
    assert (d / "smoke.jsonl").is_file() and (clone / "reports" / "local" / "smoke.html").is_file()
    assert _git("ls-files", "-o", "--exclude-standard", "results", "reports", cwd=clone) == ""
    env = {**os.environ, "PYTHONPATH": str(clone)}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_docs.py"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_every_cell_has_one_outcome(smoke):
    d, r, recs, _ = smoke
    outcomes = [x for x in recs if x["status"] != "started"]
    assert len(outcomes) == 18 and len({x["cell_hash"] for x in outcomes}) == 18
    by_status = {}
    for x in outcomes:
        by_status.setdefault(x["status"], []).append(x)
    assert len(by_status["ok"]) == 13, [(x["cell_name"], x["reason"]) for x in outcomes if x["status"] != "ok"]
    assert len(by_status["skipped"]) == 5
    # Every started record was closed by an outcome.
    started = [x["cell_hash"] for x in recs if x["status"] == "started"]
    assert sorted(started) == sorted(x["cell_hash"] for x in by_status["ok"])


def test_every_record_is_current_and_an_attempt_carries_provenance(smoke):
    d, _, _, _ = smoke
    for line in (d / "smoke.jsonl").read_text().splitlines():  # as written, not as read (read upgrades)
        x = Record.model_validate_json(line)
        assert x.schema_version == SCHEMA_VERSION, x.status
        # A skipped cell's record is compact: nothing ran, so no machine to name.
        assert (x.provenance is None) if x.compact else bool(x.provenance and x.provenance.host), x.status


def test_skip_reasons(smoke):
    d, _, recs, _ = smoke
    skips = {
        x["cell"]["optimizer"] + "/" + x["cell"]["precision"] + "/" + x["cell"]["peft"]: x
        for x in recs
        if x["status"] == "skipped"
    }
    assert skips["adamw/fp16/none"]["skip"]["rule"] == "fp16-needs-cuda"
    assert skips["fusedlamb/bf16/none"]["skip"]["rule"] == "lamb-needs-cuda"
    assert skips["paged_adamw_8bit/bf16/none"]["skip"]["rule"] == "bnb-needs-cuda"
    assert skips["adamw/bf16/qlora"]["skip"]["rule"] == "bnb-needs-cuda"
    assert skips["onebitadam/fp16/none"]["skip"]["rule"] in ("fp16-needs-cuda", "onebit-needs-cuda")
    fixes = results_mod.load(d / "smoke.jsonl").set_index("cell_hash")["skip_fix"]
    for x in skips.values():
        assert x["reason"] and fixes[x["cell_hash"]], "the rule's reason in the record, its fix from the rule"


def test_real_training(smoke):
    _, _, recs, _ = smoke
    ok = [x for x in recs if x["status"] == "ok"]
    for x in ok:
        losses = x["losses"]
        assert len(losses) == x["cell"]["warmup_steps"] + x["cell"]["measured_steps"]
        # The built-in data is learnable: the loss falls over the measured steps (compared by thirds,
        # since one step's loss is noisy).
        measured = losses[x["cell"]["warmup_steps"] :]
        third = max(1, len(measured) // 3)
        assert sum(measured[-third:]) < sum(measured[:third]), (x["cell_name"], losses)
        assert x["metrics"]["tokens_per_s"] > 0 and x["metrics"]["step_time_median_s"] > 0
        assert x["memory"]["host_rss_peak_bytes"] > 50 * 2**20
        assert x["ds_config"]["zero_optimization"]["stage"] == x["cell"]["zero_stage"]
        # The optimizer that ran is the one the cell is named after.
        assert x["worker"]["optimizer_class"].endswith("." + EXPECTED_OPTIMIZER[x["cell"]["optimizer"]])
        assert x["provenance"]["versions"]["deepspeed"] == "0.19.6"
        assert x["schema_version"] == SCHEMA_VERSION
    offload = [x for x in ok if x["cell"]["offload"] == "optimizer+params"]
    assert offload and offload[0]["ds_config"]["zero_optimization"]["offload_param"]["device"] == "cpu"
    lora = [x for x in ok if x["cell"]["peft"] == "lora"]
    assert lora and all(x["worker"]["params_trainable"] < x["worker"]["params_total"] / 5 for x in lora)


def test_every_stage_starts_from_the_same_init(smoke):
    # ZeRO-3 builds under zero.Init; its weights must still get the same init as the other stages,
    # or its loss curve is not comparable.
    _, _, recs, _ = smoke
    first = {
        x["cell"]["zero_stage"]: x["losses"][0]
        for x in recs
        if x["status"] == "ok"
        and x["cell"]["peft"] == "none"
        and x["cell"]["precision"] == "bf16"
        and not x["cell"]["grad_ckpt"]
        and x["cell"]["optimizer"] == "adamw"
    }
    assert set(first) == {0, 1, 2, 3}
    assert abs(first[3] - first[0]) / first[0] < 0.01, first


def test_report_lists_every_cell(smoke):
    d, _, recs, _ = smoke
    md = (d / "smoke.md").read_text()
    for x in recs:
        assert x["cell_name"].replace("_", "\\_") in md
    assert "DeepSpeed's CPU accelerator has no fp16" in md


def test_dataframe(smoke):
    d, _, _, _ = smoke
    df = results_mod.load(d / "smoke.jsonl")
    assert len(df) == 18 and set(df["status"]) == {"ok", "skipped"}
    assert str(df["started_at"].dt.tz) == "UTC"
    assert {"tokens_per_s", "host_rss_peak_bytes", "zero_stage", "deepspeed_version"} <= set(df.columns)


def test_cells_command_lists_skips():
    r = zerobench("cells", str(DEFAULT_MATRIX), cwd=ROOT, timeout=60)
    assert r.returncode == 0
    assert "18 cells, 13 runnable here, 5 skipped" in r.stdout
    assert r.stdout.count("why:") == 3, "each rule's reason once (5 cells skipped by 3 rules)"
    assert r.stdout.count("  skip  ") == 5
