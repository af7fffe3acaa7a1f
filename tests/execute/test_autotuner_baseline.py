"""tools/autotuner_baseline.py: DeepSpeed's autotuner put to a zerobench matrix, and its answer measured by
zerobench. The end-to-end test runs the real autotuner on the CPU (DeepSpeed's CPU accelerator, gloo): its
model-info run and fast-mode experiments through tools/autotuner_train.py, then zerobench on its choice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.matrix import dsconfig, spec
from tests.conftest import ROOT, write_matrix
from tools import autotuner_baseline as tb

SPACE = """
name: autotuner-cpu
model: llama-tiny
seq_len: 32
batch: {micro: 1, grad_accum: 1}
steps: {warmup: 2, measured: 6}
timeout_s: 300
axes:
  zero_stage: [0, 3]
  micro_batch: [1, 2]
  optimizer: [adamw]
"""


def test_plan_puts_the_matrix_to_the_autotuner(tmp_path):
    b = tb.plan(write_matrix(tmp_path / "m.yaml", SPACE))
    assert (b.stages, b.micro_batches) == ((0, 3), (1, 2))
    cfg = tb.user_config(b, {"max_train_micro_batch_size_per_gpu": 2}, tmp_path / "at")
    # The stages written out (a config naming none is tuned at stage 0 alone), no micro-batch (it starts at 1).
    assert cfg["zero_optimization"] == {"stage": [0, 3]}
    assert "train_micro_batch_size_per_gpu" not in cfg
    # Everything else is zerobench's config of the cell: precision, optimizer, clipping, accumulation.
    ours = dsconfig.build(b.base)
    for key in ("bf16", "optimizer", "gradient_clipping", "gradient_accumulation_steps"):
        assert cfg[key] == ours[key], key
    assert cfg["autotuning"] == {
        "enabled": True,
        "results_dir": str(tmp_path / "at" / "autotuning_results"),
        "exps_dir": str(tmp_path / "at" / "autotuning_exps"),
        "max_train_micro_batch_size_per_gpu": 2,
    }


@pytest.mark.parametrize(
    "change, says",
    [
        ("  grad_ckpt: [false, true]\n", "axis 'grad_ckpt' has 2 values"),
        ("  offload: [optimizer]\n  optimizer: [cpuadam]\n", "offload is 'optimizer'"),
        ("  engine: [hf_trainer]\n", "engine is 'hf_trainer'"),
    ],
)
def test_plan_refuses_what_the_autotuner_does_not_search(tmp_path, capsys, change, says):
    body = SPACE.replace("  optimizer: [adamw]\n", "") if "optimizer" in change else SPACE
    path = write_matrix(tmp_path / "m.yaml", body + change)
    with pytest.raises(tb.Refused, match=says):
        tb.plan(path)
    assert tb.main([str(path), "--results", str(tmp_path / "out")]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_overrides_and_the_defaults_they_change():
    got = tb.parse_overrides(["max_train_micro_batch_size_per_gpu=16", "fast=false", "tuner_type=gridsearch"])
    assert got == {"max_train_micro_batch_size_per_gpu": 16, "fast": False, "tuner_type": "gridsearch"}
    assert tb.changed_defaults(got)["max_train_micro_batch_size_per_gpu"] == {"default": 1024, "used": 16}
    with pytest.raises(tb.Refused, match="KEY=VALUE"):
        tb.parse_overrides(["max_train_micro_batch_size_per_gpu"])


OOM = """Traceback (most recent call last):
  File "tools/autotuner_train.py", line 96, in train
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 25.10 GiB. GPU 0 has a total capacity of 139.81 GiB
"""


def test_an_experiment_end_is_classified_as_the_autotuner_cannot():
    # The autotuner scores every experiment without a metrics file 0 ("merely slow"); the record says why.
    assert tb.classify(None, OOM) == ("cuda_oom", OOM.splitlines()[-1])
    assert tb.classify({"throughput": 3.0}, OOM)[0] == "ok"
    assert tb.classify(None, "[launch.py:341:main] cmd exits with return code = -9\n")[0] == "host_oom"
    assert tb.classify(None, "ValueError: bad\n") == ("error", "bad")
    # DeepSpeed's own rule (autotuning/utils.py search_error): any stderr line with an error word fails it,
    # a warning too.
    assert tb.autotuner_error("UserWarning: an error was ignored\nfine\n") == "was ignored"
    assert tb.autotuner_error("FutureWarning: deprecated\n") is None


def test_the_choice_is_a_one_cell_matrix_of_the_autotuners_file(tmp_path):
    b = tb.plan(write_matrix(tmp_path / "m.yaml", SPACE.replace("[adamw]", "[adamw]\n  grad_ckpt: [true]")))
    cfg = tb.user_config(b, {}, tmp_path)
    cfg.update(zero_optimization={"stage": 3}, train_micro_batch_size_per_gpu=2, train_batch_size=4)
    cfg.update(gradient_accumulation_steps=2)
    del cfg["autotuning"]
    optimal = tmp_path / "ds_config_optimal.json"
    optimal.write_text(json.dumps(cfg))
    cells = spec.expand(spec.load(tb.choice_matrix(b, {"ds_config_path": str(optimal)}, tmp_path)))
    assert len(cells) == 1
    c = cells[0]
    assert (c.zero_stage, c.micro_batch, c.grad_accum, c.grad_ckpt) == (3, 2, 2, True)
    assert (c.model, c.seq_len, c.warmup_steps, c.measured_steps) == (b.base.model, 32, 2, 6)
    assert c.matrix == "autotuner-cpu-autotuner-choice"


def test_measured_reads_zerobenchs_answer():
    got = tb.measured(ROOT / "results" / "7b.jsonl")
    groups = {g["group"]: g["cell_name"] for g in got["answer"]["groups"]}
    assert set(groups) == {"peft=none", "peft=lora", "peft=qlora"}
    fastest = max(got["cells"], key=lambda c: c["tokens_per_s"])
    assert got["fastest"] == fastest and fastest["cell"] == groups["peft=lora"]
    assert got["attempts"] == {"ok": 8, "error": 2}


@pytest.mark.slow
def test_the_autotuner_end_to_end_on_the_cpu(tmp_path):
    """The autotuner runs on the CPU: its model-info run, then fast mode over ZeRO 0 and 3 at micro-batch 1
    (capped there to keep CI short); zerobench then measures the configuration it chose."""
    path = write_matrix(tmp_path / "m.yaml", SPACE)
    out = tmp_path / "out"
    tool(path, "--results", out, "--autotuning", "max_train_micro_batch_size_per_gpu=1", "--autotuner-timeout", 900)
    summary = json.loads((out / "summary.json").read_text())
    exps = [json.loads(line) for line in (out / "experiments.jsonl").read_text().splitlines()]

    # Fast mode's experiments for stages [0, 3] capped at micro-batch 1: one each, after the model-info run;
    # the autotuner counts each twice (its micro-batch list re-scores the run it already has).
    assert [x["name"] for x in exps] == ["profile_model_info", "z0_gas1_tmbspg1", "z3_gas1_tmbspg1"]
    assert all(x["status"] == "ok" for x in exps), exps
    at = summary["autotuner"]
    assert (at["exit_code"], at["launched_experiments"], at["counted_experiments"]) == (0, 3, 4)
    assert at["changed_defaults"] == {"max_train_micro_batch_size_per_gpu": {"default": 1024, "used": 1}}
    assert 0 < at["tuning_s"] <= at["wall_s"]

    # Its choice is its best experiment by its own metric, and zerobench measured exactly that file.
    best = max(exps[1:], key=lambda x: x["metrics"]["throughput"])
    choice = at["chosen"]
    assert (choice["experiment"], choice["zero_stage"], choice["micro_batch"]) == (best["name"], best["zero_stage"], 1)
    measured = summary["choice_measured"]
    assert measured["exit_code"] == 0 and measured["attempts"] == {"ok": 1}
    assert measured["fastest"]["cell"].startswith(f"zero={best['zero_stage']},")
    assert measured["fastest"]["cell"].endswith(",mb=1,ds_config=ds_config_optimal.json")
    record = next(json.loads(x) for x in (out / "choice.jsonl").read_text().splitlines() if '"ok"' in x)

    # Measured the same way: the same model (parameters) trained on the same batches to the same losses.
    assert exps[0]["model_info"]["num_params"] == record["worker"]["params_total"]
    assert best["losses"] == pytest.approx(record["losses"][: len(best["losses"])], abs=2e-4)
    assert len(best["losses"]) == 5  # the engine stops itself after end_profile_step (5)
    assert at["best_so_far"]["name"] == best["name"]

    # --optimal: no autotuner, its earlier choice measured again (as beside zerobench's answer in another call).
    again = tmp_path / "again"
    tool(path, "--results", again, "--optimal", choice["ds_config_path"])
    second = json.loads((again / "summary.json").read_text())
    assert second["autotuner"]["chosen"]["ds_config"] == choice["ds_config"]
    assert second["choice_measured"]["fastest"]["cell"] == measured["fastest"]["cell"]
    assert not (again / "autotuner").exists()


def tool(*args) -> None:
    """tools/autotuner_baseline.py as a user runs it; fails the test with its output and the autotuner's log."""
    e = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "tools.autotuner_baseline", *map(str, args)]
    r = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=1500)
    out = Path(args[args.index("--results") + 1])
    log = out / "autotuner" / "console.log"
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:] + (log.read_text()[-3000:] if log.exists() else "")
