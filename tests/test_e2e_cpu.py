"""The whole pipeline on CPU with real DeepSpeed engines: the embedded smoke matrix as a user runs it."""

from __future__ import annotations

import pytest

from bench import results as results_mod
from bench.cli import DEFAULT_MATRIX
from bench.record import SCHEMA_VERSION, Record
from bench.store import read

from .conftest import zerobench

pytestmark = pytest.mark.slow

EXPECTED_OPTIMIZER = {"adamw": "AdamW", "fusedadam": "FusedAdam", "cpuadam": "DeepSpeedCPUAdam"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    d = tmp_path_factory.mktemp("smoke")
    r = zerobench("run", "--results", str(d / "smoke.jsonl"), "--report", str(d / "smoke"), cwd=d)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return d, r, read(d / "smoke.jsonl")


def test_every_cell_has_one_outcome(smoke):
    d, r, recs = smoke
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


def test_every_record_is_current_and_carries_provenance(smoke):
    d, _, _ = smoke
    for line in (d / "smoke.jsonl").read_text().splitlines():  # as written, not as read (read upgrades)
        x = Record.model_validate_json(line)
        assert x.schema_version == SCHEMA_VERSION and x.provenance and x.provenance.host, x.status


def test_skip_reasons(smoke):
    _, _, recs = smoke
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
    for x in skips.values():
        assert x["reason"] and "fix:" in x["reason"]


def test_real_training(smoke):
    _, _, recs = smoke
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
    # or its loss curve is not comparable (on the H200 it once started at 10.55 against 10.78).
    _, _, recs = smoke
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
    d, _, recs = smoke
    md = (d / "smoke.md").read_text()
    for x in recs:
        assert x["cell_name"].replace("_", "\\_") in md
    assert "DeepSpeed's CPU accelerator has no fp16" in md


def test_dataframe(smoke):
    d, _, _ = smoke
    df = results_mod.load(d / "smoke.jsonl")
    assert len(df) == 18 and set(df["status"]) == {"ok", "skipped"}
    assert str(df["started_at"].dt.tz) == "UTC"
    assert {"tokens_per_s", "host_rss_peak_bytes", "zero_stage", "deepspeed_version"} <= set(df.columns)


def test_cells_command_lists_skips():
    from .conftest import ROOT

    r = zerobench("cells", str(DEFAULT_MATRIX), cwd=ROOT, timeout=60)
    assert r.returncode == 0
    assert "18 cells, 13 runnable here, 5 skipped" in r.stdout
    assert r.stdout.count("why:") == 3, "each rule's reason once (5 cells skipped by 3 rules)"
    assert r.stdout.count("  skip  ") == 5
