"""User DeepSpeed configs: every problem found before anything runs, and the tables match DeepSpeed.

The checks run without DeepSpeed; the drift tests at the end import the installed DeepSpeed and
regenerate bench/matrix/dsconfig_keys.json from it (bench/matrix/dsconfig_gen.py) and compare with the checked-in file.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.matrix import dsconfig
from bench.matrix.axes import OFFLOADS
from bench.matrix.cells import Cell
from bench.matrix.dsconfig import tables
from bench.matrix.problems import Problem
from bench.matrix.spec import MatrixError
from tests.conftest import ROOT

EXAMPLES = ROOT / "matrices" / "ds_configs"


def problems(cfg_or_text, file="t.json") -> dict[str, Problem]:
    """The problems the checker finds, by key path (fails if there are none)."""
    text = cfg_or_text if isinstance(cfg_or_text, str) else json.dumps(cfg_or_text, indent=2)
    with pytest.raises(MatrixError) as ei:
        dsconfig.loads(text, file)
    return {p.where: p for p in ei.value.problems}


def zero(stage: int, **kw) -> dict:
    return {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage, **kw}}


# -- syntax -----------------------------------------------------------------------------------
def test_broken_json_reports_line_and_column(tmp_path):
    f = tmp_path / "broken.json"
    f.write_text(
        '{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {\n    "stage": 2\n'
        '    "overlap_comm": true\n  }\n}\n'
    )
    with pytest.raises(MatrixError) as ei:
        dsconfig.load(f)
    [p] = ei.value.problems
    assert p.file == str(f) and p.line == 5
    assert "not valid JSON" in p.what and "column 5" in p.what
    assert "comma is missing" in p.fix
    assert str(ei.value).startswith(f"1 problem in {f}; nothing was run")


def test_trailing_comma_and_empty_file():
    [p] = problems('{\n  "train_micro_batch_size_per_gpu": 1,\n}').values()
    assert p.line == 3 and "column 1" in p.what and "trailing comma" in p.fix
    [p] = problems("").values()
    assert p.line == 1 and "not valid JSON" in p.what


@pytest.mark.parametrize("text,kind", [("[1, 2]", "a list"), ('"zero"', "a string"), ("null", "null")])
def test_top_level_must_be_an_object(text, kind):
    [p] = problems(text).values()
    assert p.where == "" and f"got {kind}" in p.what


def test_missing_file(tmp_path):
    with pytest.raises(MatrixError) as ei:
        dsconfig.load(tmp_path / "nope.json")
    assert "no such DeepSpeed config file" in ei.value.problems[0].what


def test_duplicate_key_reported_with_both_lines():
    text = (
        '{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {"stage": 1},\n'
        '  "zero_optimization": {"stage": 3}\n}'
    )
    p = problems(text)["zero_optimization"]
    assert "given twice (lines 3 and 4)" in p.what and p.line == 4


# -- misplaced and unknown keys ---------------------------------------------------------------
def test_example_misplaced_offload_says_where_it_belongs():
    with pytest.raises(MatrixError) as ei:
        dsconfig.load(EXAMPLES / "misplaced_offload.json")
    [p] = ei.value.problems
    assert p.where == "offload_optimizer" and p.line == 11
    assert "ignores it" in p.what
    assert "did you mean zero_optimization.offload_optimizer?" in p.fix


@pytest.mark.parametrize(
    "path,value,belongs",
    [
        (("offload_optimizer",), {"device": "cpu"}, "zero_optimization.offload_optimizer"),
        (("offload_param",), {"device": "cpu"}, "zero_optimization.offload_param"),
        (("stage",), 2, "zero_optimization.stage"),
        (("overlap_comm",), True, "zero_optimization.overlap_comm"),
        (("contiguous_gradients",), True, "zero_optimization.contiguous_gradients"),
        (("reduce_bucket_size",), 500_000_000, "zero_optimization.reduce_bucket_size"),
        (("stage3_max_live_parameters",), 10**9, "zero_optimization.stage3_max_live_parameters"),
        (("loss_scale",), 0, "fp16.loss_scale"),
        (("initial_scale_power",), 16, "fp16.initial_scale_power"),
        (("lr",), 1e-3, "optimizer.params.lr"),
        (("optimizer", "weight_decay"), 0.0, "optimizer.params.weight_decay"),
        (("zero_optimization", "pin_memory"), True, "zero_optimization.offload_optimizer.pin_memory"),
        (("zero_optimization", "device"), "cpu", "zero_optimization.offload_optimizer.device"),
        (
            ("zero_optimization", "offload_optimizer", "offload_param"),
            {"device": "cpu"},
            "zero_optimization.offload_param",
        ),
        (("partition_activations",), True, "activation_checkpointing.partition_activations"),
    ],
)
def test_misplaced_key_names_its_place(path, value, belongs):
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
        "optimizer": {"type": "AdamW", "params": {}},
    }
    node = cfg
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    where = ".".join(path)
    found = problems(cfg)
    assert set(found) == {where}, found
    assert f"did you mean {belongs}" in found[where].fix
    assert ("stops on it" if path[0] == "zero_optimization" else "ignores it") in found[where].what


def test_ambiguous_misplaced_key_lists_the_places():
    p = problems(zero(3, pin_memory=True))["zero_optimization.pin_memory"]
    assert (
        "zero_optimization.offload_optimizer.pin_memory or zero_optimization.offload_param.pin_memory" in p.fix
        or "zero_optimization.offload_param.pin_memory or zero_optimization.offload_optimizer.pin_memory" in p.fix
    )


@pytest.mark.parametrize(
    "path,suggest",
    [
        (("zero_optimization", "offload_optimzer"), "zero_optimization.offload_optimizer"),
        (("zero_optimization", "stage3_max_live_parameter"), "zero_optimization.stage3_max_live_parameters"),
        (("zero_optimisation",), "zero_optimization"),
        (("gradient_clip",), "gradient_clipping"),
        (("wall_clock_breakdwn",), "wall_clock_breakdown"),
        (("activation_checkpointing", "partitioned_activations"), "activation_checkpointing.partition_activations"),
        (("fp16", "loss_scale_windw"), "fp16.loss_scale_window"),
        (("bf16", "enable"), "bf16.enabled"),
        (("offload_optimzer",), "zero_optimization.offload_optimizer"),  # typo and misplaced at once
    ],
)
def test_typos_get_a_suggestion(path, suggest):
    cfg = zero(2, offload_optimizer={"device": "cpu"}) | {
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "activation_checkpointing": {},
    }
    node = cfg
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = {} if path[-1].startswith("offload") else 1
    p = problems(cfg)[".".join(path)]
    assert "unknown key" in p.what
    assert f"did you mean {suggest}?" in p.fix


def test_unknown_key_inside_an_open_section_is_allowed():
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "foreach": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-3}},
        "compression_training": {"anything": {"goes": 1}},
    }
    assert dsconfig.loads(json.dumps(cfg)) == cfg


def test_name_and_alias_together():
    p = problems(zero(3, max_live_parameters=1, stage3_max_live_parameters=2))["zero_optimization.max_live_parameters"]
    assert "alias" in p.what and "stage3_max_live_parameters" in p.fix


@pytest.mark.parametrize(
    "path,value,fix",
    [
        (("zero_optimization", "cpu_offload"), True, "offload_optimizer"),
        (("zero_optimization", "cpu_offload_use_pin_memory"), True, "ignores it"),
        (("zero_optimization", "stage3_gather_fp16_weights_on_model_save"), True, "16bit"),
        (("bfloat16",), {"enabled": True}, "rename it to bf16"),
    ],
)
def test_deprecated_keys(path, value, fix):
    cfg = zero(2)
    node = cfg
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    p = problems(cfg)[".".join(path)]
    assert "deprecated" in p.what and fix in p.fix


# -- settings that would not do what they say ---------------------------------------------------
def test_offload_param_below_stage_3():
    p = problems(zero(2, offload_param={"device": "cpu"}))["zero_optimization.offload_param"]
    assert "only at ZeRO stage 3" in p.what and "at stage 2 DeepSpeed ignores it" in p.what
    assert "stage to 3" in p.fix


def test_offload_optimizer_at_stage_0():
    p = problems(zero(0, offload_optimizer={"device": "cpu"}))["zero_optimization.offload_optimizer"]
    assert "stage 1, 2 or 3" in p.what


def test_offload_without_device_offloads_nothing():
    p = problems(zero(2, offload_optimizer={"pin_memory": True}))["zero_optimization.offload_optimizer"]
    assert "no device" in p.what and "nothing is offloaded" in p.what


@pytest.mark.parametrize("device,fix", [("gpu", ""), ("CPU", 'write "cpu"'), (True, "")])
def test_offload_device_values(device, fix):
    p = problems(zero(2, offload_optimizer={"device": device}))["zero_optimization.offload_optimizer.device"]
    assert 'expected one of "none", "cpu", "nvme"' in p.what and fix in p.fix


def test_nvme_needs_a_path():
    p = problems(zero(3, offload_optimizer={"device": "cpu"}, offload_param={"device": "nvme"}))[
        "zero_optimization.offload_param.device"
    ]
    assert "nvme_path" in p.what
    dsconfig.loads(
        json.dumps(
            zero(3, offload_optimizer={"device": "cpu"}, offload_param={"device": "nvme", "nvme_path": "/local_nvme"})
        )
    )


def test_partial_offload_needs_stage_3():
    p = problems(zero(2, offload_optimizer={"device": "cpu", "ratio": 0.5}))
    assert "zero_optimization.offload_optimizer.ratio" in p


def test_fp16_and_bf16_both_on():
    p = problems({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}})
    assert "both enabled" in p["fp16.enabled"].what


@pytest.mark.parametrize(
    "cfg,where,what,fix",
    [
        ({"bf16": {"enabled": "true"}}, "bf16.enabled", "got the string 'true'", "write true without quotes"),
        ({"fp16": {"enabled": "false"}}, "fp16.enabled", "got the string 'false'", "write false without quotes"),
        ({"wall_clock_breakdown": "false"}, "wall_clock_breakdown", "got the string 'false'", "without quotes"),
        ({"zero_optimization": {"stage": "2"}}, "zero_optimization.stage", 'got "2"', "remove the quotes"),
        ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage", "expected one of 0, 1, 2, 3", ""),
        ({"zero_optimization": {"stage": True}}, "zero_optimization.stage", "got true", ""),
        ({"zero_optimization": {"stage": 2.5}}, "zero_optimization.stage", "got 2.5", ""),
        (
            {"zero_optimization": {"stage": 2, "reduce_bucket_size": "5e8"}},
            "zero_optimization.reduce_bucket_size",
            "expected a whole number",
            "remove the quotes",
        ),
        ({"gradient_clipping": "1.0"}, "gradient_clipping", "expected a number", "remove the quotes"),
        (
            {"optimizer": {"type": "AdamW", "params": {"torch_adam": "true"}}},
            "optimizer.params.torch_adam",
            "got the string 'true'",
            "without quotes",
        ),
        ({"zero_optimization": True}, "zero_optimization", "boolean form is deprecated", '{"stage": 1}'),
        ({"fp16": 1}, "fp16", "expected an object of settings", ""),
    ],
)
def test_wrong_types(cfg, where, what, fix):
    p = problems({"train_micro_batch_size_per_gpu": 1, **cfg})[where]
    assert what in p.what and fix in p.fix


def test_integral_floats_are_whole_numbers():
    # JSON configs write 5e8, which parses as a float; DeepSpeed's pydantic takes it as an int.
    dsconfig.loads(json.dumps(zero(2, reduce_bucket_size=5e8, allgather_bucket_size=2e8)))


@pytest.mark.parametrize(
    "cfg,where,effect",
    [
        ({"fp16": {"enabled": True, "loss_scale": "auto"}}, "fp16.loss_scale", "drops it and uses its default"),
        (
            {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": "auto"}},
            "zero_optimization.stage3_max_live_parameters",
            "uses its default",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "auto"}}},
            "zero_optimization.offload_optimizer.device",
            'uses "none"',
        ),
        ({"steps_per_print": "auto"}, "steps_per_print", 'takes the string "auto"'),
        (
            {"optimizer": {"type": "AdamW", "params": {"lr": "auto", "amsgrad": "auto"}}},
            "optimizer.params.amsgrad",
            'takes the string "auto"',
        ),
    ],
)
def test_auto_where_the_trainer_fills_none(cfg, where, effect):
    p = problems({"train_micro_batch_size_per_gpu": "auto", **cfg})
    assert "train_micro_batch_size_per_gpu" not in p
    assert "HF Trainer" in p[where].what and effect in p[where].what


@pytest.mark.parametrize(
    "kind,ok,fix",
    [
        ("AdamW", True, ""),
        ("adamw", True, ""),
        ("ADAM", True, ""),
        ("Lamb", True, ""),
        ("OneBitAdam", True, ""),
        ("SGD", True, ""),
        ("Adafactor", True, ""),
        ("sgd", False, "did you mean 'SGD'?"),
        ("FusedAdam", False, 'write "Adam"'),
        ("DeepSpeedCPUAdam", False, "offload_optimizer"),
        ("AdamWW", False, "did you mean 'adamw'?"),
    ],
)
def test_optimizer_types(kind, ok, fix):
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": kind, "params": {"lr": 1e-3}}}
    if ok:
        dsconfig.loads(json.dumps(cfg))
    else:
        p = problems(cfg)["optimizer.type"]
        assert "unknown optimizer type" in p.what and fix in p.fix


def test_optimizer_rules_deepspeed_enforces():
    p = problems(
        {
            "train_micro_batch_size_per_gpu": 1,
            "zero_optimization": {"stage": 1},
            "optimizer": {"type": "OneBitAdam", "params": {"max_grad_norm": 1.0}},
        }
    )
    assert "does not run under ZeRO" in p["optimizer.type"].what
    assert "gradient_clipping" in p["optimizer.params.max_grad_norm"].fix
    assert 'no "type"' in problems({"optimizer": {"params": {}}})["optimizer"].what


def test_every_problem_at_once_in_file_order():
    text = json.dumps(
        {
            "stage": 2,
            "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}, "overlap_com": True},
            "fp16": {"enabled": True},
            "bf16": {"enabled": "true"},
            "steps_per_print": "auto",
        },
        indent=2,
    )
    with pytest.raises(MatrixError) as ei:
        dsconfig.loads(text, "many.json")
    ps = ei.value.problems
    assert [p.where for p in ps] == [
        "stage",
        "zero_optimization.offload_param",
        "zero_optimization.overlap_com",
        "bf16.enabled",
        "steps_per_print",
    ]
    assert [p.line for p in ps] == sorted(p.line for p in ps)
    assert all(p.line for p in ps) and all(p.fix for p in ps)
    assert str(ei.value).startswith("5 problems in many.json")


# -- valid configs pass ---------------------------------------------------------------------
VALID = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "steps_per_print": 100,
    "gradient_clipping": 1.0,
    "wall_clock_breakdown": False,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e8,
        "stage3_prefetch_bucket_size": 5e7,
        "stage3_param_persistence_threshold": 1e5,
        "sub_group_size": 1e9,
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": False,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": True, "buffer_count": 4},
        "offload_param": {"device": "cpu", "pin_memory": True},
    },
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 10}},
    "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False},
    "tensorboard": {"enabled": False, "output_path": "tb/"},
    "comms_logger": {"enabled": False},
    "flops_profiler": {"enabled": False, "profile_step": 2},
    "aio": {
        "block_size": 1048576,
        "queue_depth": 8,
        "intra_op_parallelism": 1,
        "single_submit": False,
        "overlap_events": True,
    },
}


def test_valid_configs_pass():
    assert dsconfig.loads(json.dumps(VALID, indent=2)) == VALID
    assert dsconfig.check(VALID) == []
    cfg = dsconfig.load(EXAMPLES / "zero2_offload.json")
    assert dsconfig.describe(cfg) == {
        "zero_stage": 2,
        "offload": "optimizer",
        "precision": "bf16",
        "optimizer": "cpuadam",
        "micro_batch": None,
        "grad_accum": None,
        "lr": 1e-3,
    }


def test_check_without_text_has_no_lines():
    [p] = dsconfig.check({"offload_optimizer": {"device": "cpu"}})
    assert p.where == "offload_optimizer" and p.line is None


# -- describe ---------------------------------------------------------------------------------
def opt(kind, **params):
    return {"optimizer": {"type": kind, "params": params}}


@pytest.mark.parametrize(
    "cfg,expect",
    [
        ({}, (0, "none", "fp32", None)),
        (zero(1), (1, "none", "fp32", None)),
        (zero(2, offload_optimizer={"device": "cpu"}), (2, "optimizer", "fp32", "cpuadam")),
        (
            zero(3, offload_optimizer={"device": "cpu"}, offload_param={"device": "cpu"}),
            (3, "optimizer+params", "fp32", "cpuadam"),
        ),
        (
            zero(
                3,
                offload_optimizer={"device": "nvme", "nvme_path": "/n"},
                offload_param={"device": "nvme", "nvme_path": "/n"},
            ),
            (3, "nvme", "fp32", "cpuadam"),
        ),
        (
            zero(3, offload_optimizer={"device": "nvme", "nvme_path": "/n"}, offload_param={"device": "cpu"}),
            (3, "nvme", "fp32", "cpuadam"),
        ),
        (
            zero(3, offload_optimizer={"device": "cpu"}, offload_param={"device": "nvme", "nvme_path": "/n"}),
            (3, "nvme", "fp32", "cpuadam"),
        ),
        (
            zero(2, offload_optimizer={"device": "nvme", "nvme_path": "/n"}),
            (2, "optimizer", "fp32", "cpuadam"),
        ),  # CPU memory
        (zero(2, offload_optimizer={"device": "none"}), (2, "none", "fp32", None)),
        (zero(2, cpu_offload=True), (2, "optimizer", "fp32", "cpuadam")),
        ({"fp16": {"enabled": True}}, (0, "none", "fp16", None)),
        ({"fp16": {"enabled": False}, "bf16": {"enabled": True}}, (0, "none", "bf16", None)),
        ({"bfloat16": {"enabled": True}}, (0, "none", "bf16", None)),
        ({"bf16": {"enabled": False}}, (0, "none", "fp32", None)),
        ({"zero_optimization": True}, (1, "none", "fp32", None)),
    ],
)
def test_describe_stage_offload_precision(cfg, expect):
    d = dsconfig.describe(cfg)
    assert (d["zero_stage"], d["offload"], d["precision"], d["optimizer"]) == expect


SECTIONS = (None, {"device": "none"}, {"device": "cpu"}, {"device": "nvme", "nvme_path": "/n"})


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("opt_sec", SECTIONS)
@pytest.mark.parametrize("param_sec", SECTIONS)
def test_describe_gives_only_offload_axis_values(stage, opt_sec, param_sec):
    # Every offload a config can ask for: a config the check passes reads back as a value of the
    # offload axis (bench.matrix.axes.OFFLOADS), which the rules and the memory estimate understand.
    z = {k: v for k, v in (("offload_optimizer", opt_sec), ("offload_param", param_sec)) if v is not None}
    cfg = zero(stage, **z)
    if dsconfig.check(cfg):
        return
    assert dsconfig.describe(cfg)["offload"] in OFFLOADS


def test_parameter_offload_alone_is_refused():
    # DeepSpeed runs it, but no offload axis value says it: it used to become offload="params", which
    # the memory estimate took for no offload.
    p = problems(zero(3, offload_param={"device": "cpu"}))["zero_optimization.offload_param"]
    assert p.line == 5 and "offload axis" in p.what
    assert '"offload_optimizer": {"device": "cpu"}' in p.fix and "optimizer+params" in p.fix
    with pytest.raises(MatrixError):
        dsconfig.describe(zero(3, offload_param={"device": "cpu"}))


def test_every_offload_placement_names_an_axis_value():
    # describe() returns OFFLOAD_AXIS's values only, and each axis value is a placement some config has.
    assert set(dsconfig.OFFLOAD_AXIS.values()) == set(OFFLOADS)


def test_optimizer_alone_on_nvme_is_refused():
    # The worker used to die on it (KeyError: 'offload_param'); no offload axis value says it either.
    p = problems(zero(3, offload_optimizer={"device": "nvme", "nvme_path": "/n"}))[
        "zero_optimization.offload_optimizer"
    ]
    assert p.line == 5 and "offload axis" in p.what
    assert "offload_param" in p.fix and '"cpu"' in p.fix


def test_optimizer_on_nvme_below_stage_3_stays_in_cpu_memory():
    p = problems(zero(2, offload_optimizer={"device": "nvme", "nvme_path": "/n"}))[
        "zero_optimization.offload_optimizer.device"
    ]
    assert "only at ZeRO stage 3" in p.what and "CPU memory" in p.what
    assert '"cpu"' in p.fix and "stage to 3" in p.fix


OFFLOADED = zero(2, offload_optimizer={"device": "cpu"})["zero_optimization"]
NVME = zero(2, offload_optimizer={"device": "nvme", "nvme_path": "/n"})["zero_optimization"]


@pytest.mark.parametrize(
    "cfg,expect",
    [
        (opt("AdamW"), "fusedadam"),
        (opt("Adam", adam_w_mode=False), "fusedadam"),
        (opt("adamw"), "fusedadam"),  # DeepSpeed lowercases its own optimizer names
        (opt("ADAM"), "fusedadam"),
        (opt("AdamW", torch_adam=True), "adamw"),
        (opt("Adam", torch_adam=True), "adamw"),  # adam_w_mode defaults to true
        (opt("Adam", torch_adam=True, adam_w_mode=False), None),  # torch.optim.Adam
        (opt("AdamW") | {"zero_optimization": OFFLOADED}, "cpuadam"),
        (opt("Adam") | {"zero_optimization": NVME}, "cpuadam"),  # CPU Adam for NVMe too (zero_use_cpu_optimizer)
        (opt("AdamW", torch_adam=True) | {"zero_optimization": OFFLOADED}, "adamw"),  # torch_adam wins over offload
        (opt("Lamb"), "fusedlamb"),
        (opt("lamb"), "fusedlamb"),
        (opt("OneBitAdam"), "onebitadam"),
        (opt("ZeroOneAdam"), "zerooneadam"),
        (opt("OneBitLamb"), "onebitlamb"),
        (opt("onebitlamb"), "onebitlamb"),
        (opt("SGD"), None),
        (opt("Lion"), None),
        ({}, None),
    ],
)
def test_describe_optimizer(cfg, expect):
    assert dsconfig.describe(cfg)["optimizer"] == expect


# -- resolve ----------------------------------------------------------------------------------
def test_resolve_auto_batch_keys():
    cfg = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    }
    out = dsconfig.resolve(cfg, Cell(micro_batch=4, grad_accum=8, gpus=2))
    assert out == {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 8,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "steps_per_print": 10**9,
    }
    assert cfg["train_batch_size"] == "auto"  # the input is left alone
    out["zero_optimization"]["stage"] = 3
    assert cfg["zero_optimization"]["stage"] == 2  # a deep copy


def test_resolve_keeps_explicit_values_and_fills_absent_ones():
    c = Cell(micro_batch=4, grad_accum=8)
    out = dsconfig.resolve({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 5, "optimizer": {"type": "SGD"}}, c)
    assert out == {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 8,
        "steps_per_print": 5,
        "optimizer": {"type": "SGD"},
        "zero_optimization": {"stage": 0},
    }
    # train_batch_size given: DeepSpeed derives the rest, so nothing is filled in.
    out = dsconfig.resolve(
        {"train_batch_size": 32, "gradient_accumulation_steps": "auto", "optimizer": {"type": "SGD"}}, c
    )
    assert out == {
        "train_batch_size": 32,
        "gradient_accumulation_steps": 8,
        "steps_per_print": 10**9,
        "optimizer": {"type": "SGD"},
        "zero_optimization": {"stage": 0},
    }


def test_resolve_fills_auto_as_the_trainer_does():
    # transformers' HfTrainerDeepSpeedConfig: the TrainingArguments' values; here the cell's, with the
    # Trainer's defaults for what a cell does not set (max_grad_norm, betas, eps, weight decay, warmup).
    cfg = dsconfig.load(EXAMPLES / "trainer" / "zero3-hf-docs.json")
    c = Cell(
        model="llama-tiny",
        zero_stage=3,
        precision="bf16",
        micro_batch=2,
        grad_accum=4,
        lr=3e-3,
        warmup_steps=2,
        measured_steps=6,
    )
    out = dsconfig.resolve(cfg, c)
    assert "auto" not in json.dumps(out) and dsconfig.check(out) == []
    assert out["bf16"]["enabled"] is True and out["fp16"]["enabled"] is False
    assert out["gradient_clipping"] == 1.0 and out["train_batch_size"] == 8
    assert out["optimizer"]["params"] == {"lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    assert out["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 1}
    z = out["zero_optimization"]  # trainer_config_finalize: sized to the model's hidden size (128)
    assert (z["reduce_bucket_size"], z["stage3_prefetch_bucket_size"], z["stage3_param_persistence_threshold"]) == (
        128 * 128,
        int(0.9 * 128 * 128),
        1280,
    )


def test_resolve_completes_what_auto_leaves_open():
    # train_batch_size "auto" alone: the cell's micro-batch and accumulation, not DeepSpeed's derivation
    # (which would step the optimizer after every micro-batch).
    out = dsconfig.resolve(
        {"train_batch_size": "auto", "optimizer": {"type": "SGD"}}, Cell(micro_batch=1, grad_accum=4)
    )
    assert (out["train_batch_size"], out["train_micro_batch_size_per_gpu"], out["gradient_accumulation_steps"]) == (
        4,
        1,
        4,
    )
    # precision "auto" in the bf16 section only, run in fp16: the fp16 section is added, as accelerate adds it.
    out = dsconfig.resolve({"bf16": {"enabled": "auto"}, "optimizer": {"type": "SGD"}}, Cell(precision="fp16"))
    assert out["bf16"] == {"enabled": False} and out["fp16"] == {"enabled": True}


@pytest.mark.parametrize(
    "offload,optimizer,expect_type",
    [("none", "adamw", "AdamW"), ("none", "fusedadam", "Adam"), ("optimizer", "cpuadam", "AdamW")],
)
def test_resolve_gives_a_config_without_optimizer_the_cells(offload, optimizer, expect_type):
    cfg = {"zero_optimization": {"stage": 2, **({"offload_optimizer": {"device": "cpu"}} if offload != "none" else {})}}
    out = dsconfig.resolve(cfg, Cell(zero_stage=2, offload=offload, optimizer=optimizer, lr=1e-3))
    assert out["optimizer"]["type"] == expect_type and out["optimizer"]["params"]["lr"] == 1e-3
    assert out.get("zero_force_ds_cpu_optimizer", False) is (optimizer == "cpuadam")
    out = dsconfig.resolve({"zero_optimization": {"stage": 2}}, Cell(zero_stage=2, optimizer="adamw_8bit"))
    assert "optimizer" not in out and out["zero_allow_untested_optimizer"] is True  # the worker builds it


def test_resolved_example_passes_the_check():
    cfg = dsconfig.resolve(dsconfig.load(EXAMPLES / "zero2_offload.json"), Cell(micro_batch=2, grad_accum=1))
    assert dsconfig.check(cfg) == []
    assert "auto" not in json.dumps(cfg)


# -- the orchestrator stays light -----------------------------------------------------------
def test_importing_dsconfig_imports_no_torch_or_deepspeed():
    code = (
        "import sys, bench.matrix.dsconfig, bench.matrix.spec; "
        "print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


# -- the generated tables, and what is written by hand over them ---------------------------------
def _leaves(spec: dict, path: tuple = ()):
    for k, v in spec.items():
        if isinstance(v, dict):
            yield from _leaves(v, path + (k,))
        else:
            yield path + (k,), v


def test_every_key_has_a_type():
    # The generated tables leave a type open (null) where DeepSpeed's default does not state one; each
    # is set by hand (tables._TYPES), so a key a new DeepSpeed adds without a default fails here.
    assert [p for p, v in _leaves(dsconfig.SCHEMA) if v is None] == []


def test_hand_types_name_keys_deepspeed_reads():
    generated = tables._KEYS["schema"]
    for path in tables._TYPES:
        node = generated
        for k in path[:-1]:
            node = node[k]
        assert path[-1] in node, f"{path}: DeepSpeed {dsconfig.DS_VERSION} does not read it"
    assert not set(tables._ELSEWHERE) & set(generated), "DeepSpeedConfig reads it now: drop it from _ELSEWHERE"


def test_deprecation_advice_covers_what_deepspeed_deprecates():
    assert {p[1] for p in tables.DEPRECATED if p[0] == "zero_optimization"} == set(tables._KEYS["zero_deprecated"])
    assert all(tables.ZERO[name] == tables.ZERO[alias] for name, alias in tables.ZERO_ALIASES.items())


# -- drift: the generated tables against the installed DeepSpeed -------------------------------
@pytest.fixture(scope="module")
def ds():
    import deepspeed

    return deepspeed


def test_installed_deepspeed_is_the_one_the_tables_mirror(ds):
    assert ds.__version__.split("+")[0] == dsconfig.DS_VERSION, (
        "DeepSpeed changed: run `nox -s ds_tables`, review the changes to the rules and messages, commit"
    )


def test_generated_tables_match_the_installed_deepspeed(ds):
    # Everything the old hand-kept tables were compared on: every pydantic field and alias with its
    # type, the keys read one by one, the top-level keys DeepSpeedConfig reads, the optimizer names.
    from bench.matrix import dsconfig_gen

    text = dsconfig_gen.render(dsconfig_gen.generate())
    assert json.loads(text) == json.loads(dsconfig_gen.KEYS_FILE.read_text()), (
        "bench/matrix/dsconfig_keys.json differs from the installed DeepSpeed: run `nox -s ds_tables` and commit it"
    )
    assert text == dsconfig_gen.KEYS_FILE.read_text()


def test_torch_optimizer_names_exist(ds):
    import torch

    torch_optimizers = {
        n
        for n, o in vars(torch.optim).items()
        if isinstance(o, type) and issubclass(o, torch.optim.Optimizer) and n != "Optimizer"
    }
    assert set(dsconfig.TORCH_OPTIMIZERS) <= torch_optimizers


# -- evidence: DeepSpeed behaves as the problem messages say -------------------------------------
def test_deepspeed_silently_ignores_a_misplaced_offload(ds):
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = json.loads((EXAMPLES / "misplaced_offload.json").read_text())
    c = DeepSpeedConfig(dsconfig.resolve(cfg, Cell(micro_batch=1, grad_accum=1)))  # no error...
    assert c.zero_config.offload_optimizer is None  # ...and no offload: the benchmark would lie


def test_deepspeed_parses_the_examples_as_described(ds):
    from deepspeed.runtime.config import DeepSpeedConfig

    for cfg in (dsconfig.load(EXAMPLES / "zero2_offload.json"), VALID):
        c = DeepSpeedConfig(dsconfig.resolve(cfg, Cell(micro_batch=2, grad_accum=1)))
        d = dsconfig.describe(cfg)
        assert c.zero_optimization_stage == d["zero_stage"]
        assert c.bfloat16_config.enabled == (d["precision"] == "bf16")
        assert c.float16_config.enabled == (d["precision"] == "fp16")
        devices = {c.zero_config.offload_optimizer.device, getattr(c.zero_config.offload_param, "device", None)}
        assert ("nvme" in devices) == (d["offload"] == "nvme")


@pytest.mark.parametrize(
    "cfg",
    [
        zero(2, offload_optimzer={"device": "cpu"}),
        zero(2, offload_optimizer={"device": "CPU"}),
        zero(3, max_live_parameters=1, stage3_max_live_parameters=2),
        {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}},
    ],
)
def test_deepspeed_stops_where_the_check_says_it_does(ds, cfg):
    from deepspeed.runtime.config import DeepSpeedConfig

    with pytest.raises(Exception):  # noqa: B017 - DeepSpeed raises several types here; any refusal is the point
        DeepSpeedConfig(cfg)
    assert dsconfig.check(cfg)


def test_deepspeed_drops_auto_in_its_pydantic_sections(ds):
    from deepspeed.runtime.config import DeepSpeedConfig

    c = DeepSpeedConfig(zero(2, offload_optimizer={"device": "auto"}) | {"bf16": {"enabled": "auto"}})
    assert c.zero_config.offload_optimizer.device == "none" and not c.bfloat16_config.enabled
