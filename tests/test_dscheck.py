"""User DeepSpeed configs: every problem found before anything runs, and the tables match DeepSpeed.

The checks run without DeepSpeed; the drift tests at the end import the installed DeepSpeed and
compare its pydantic models and the keys its config parser reads with bench/dscheck.py's tables.
"""
from __future__ import annotations

import json
import subprocess
import sys
import typing

import pytest

from bench import dscheck
from bench.matrix import MatrixError

from .conftest import ROOT

EXAMPLES = ROOT / "matrices" / "ds_configs"


def problems(cfg_or_text, file="t.json") -> dict[str, dscheck.Problem]:
    """The problems dscheck finds, by key path (fails if there are none)."""
    text = cfg_or_text if isinstance(cfg_or_text, str) else json.dumps(cfg_or_text, indent=2)
    with pytest.raises(MatrixError) as ei:
        dscheck.loads(text, file)
    return {p.where: p for p in ei.value.problems}


def zero(stage: int, **kw) -> dict:
    return {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage, **kw}}


# -- syntax -----------------------------------------------------------------------------------
def test_broken_json_reports_line_and_column(tmp_path):
    f = tmp_path / "broken.json"
    f.write_text('{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {\n    "stage": 2\n'
                 '    "overlap_comm": true\n  }\n}\n')
    with pytest.raises(MatrixError) as ei:
        dscheck.load(f)
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
        dscheck.load(tmp_path / "nope.json")
    assert "no such DeepSpeed config file" in ei.value.problems[0].what


def test_duplicate_key_reported_with_both_lines():
    text = '{\n  "train_micro_batch_size_per_gpu": 1,\n  "zero_optimization": {"stage": 1},\n' \
           '  "zero_optimization": {"stage": 3}\n}'
    p = problems(text)["zero_optimization"]
    assert "given twice (lines 3 and 4)" in p.what and p.line == 4


# -- misplaced and unknown keys ---------------------------------------------------------------
def test_example_misplaced_offload_says_where_it_belongs():
    with pytest.raises(MatrixError) as ei:
        dscheck.load(EXAMPLES / "misplaced_offload.json")
    [p] = ei.value.problems
    assert p.where == "offload_optimizer" and p.line == 11
    assert "ignores it" in p.what
    assert "did you mean zero_optimization.offload_optimizer?" in p.fix


@pytest.mark.parametrize("path,value,belongs", [
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
    (("zero_optimization", "offload_optimizer", "offload_param"), {"device": "cpu"},
     "zero_optimization.offload_param"),
    (("partition_activations",), True, "activation_checkpointing.partition_activations"),
])
def test_misplaced_key_names_its_place(path, value, belongs):
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "offload_optimizer": {
        "device": "cpu"}}, "optimizer": {"type": "AdamW", "params": {}}}
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
    assert "zero_optimization.offload_optimizer.pin_memory or zero_optimization.offload_param.pin_memory" in p.fix \
        or "zero_optimization.offload_param.pin_memory or zero_optimization.offload_optimizer.pin_memory" in p.fix


@pytest.mark.parametrize("path,suggest", [
    (("zero_optimization", "offload_optimzer"), "zero_optimization.offload_optimizer"),
    (("zero_optimization", "stage3_max_live_parameter"), "zero_optimization.stage3_max_live_parameters"),
    (("zero_optimisation",), "zero_optimization"),
    (("gradient_clip",), "gradient_clipping"),
    (("wall_clock_breakdwn",), "wall_clock_breakdown"),
    (("activation_checkpointing", "partitioned_activations"), "activation_checkpointing.partition_activations"),
    (("fp16", "loss_scale_windw"), "fp16.loss_scale_window"),
    (("bf16", "enable"), "bf16.enabled"),
    (("offload_optimzer",), "zero_optimization.offload_optimizer"),  # typo and misplaced at once
])
def test_typos_get_a_suggestion(path, suggest):
    cfg = zero(2, offload_optimizer={"device": "cpu"}) | {"fp16": {"enabled": False}, "bf16": {"enabled": False},
                                                          "activation_checkpointing": {}}
    node = cfg
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = {} if path[-1].startswith("offload") else 1
    p = problems(cfg)[".".join(path)]
    assert "unknown key" in p.what
    assert f"did you mean {suggest}?" in p.fix


def test_unknown_key_inside_an_open_section_is_allowed():
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "foreach": True}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "warmup_max_lr": 1e-3}},
           "compression_training": {"anything": {"goes": 1}}}
    assert dscheck.loads(json.dumps(cfg)) == cfg


def test_name_and_alias_together():
    p = problems(zero(3, max_live_parameters=1, stage3_max_live_parameters=2))["zero_optimization.max_live_parameters"]
    assert "alias" in p.what and "stage3_max_live_parameters" in p.fix


@pytest.mark.parametrize("path,value,fix", [
    (("zero_optimization", "cpu_offload"), True, "offload_optimizer"),
    (("zero_optimization", "cpu_offload_use_pin_memory"), True, "ignores it"),
    (("zero_optimization", "stage3_gather_fp16_weights_on_model_save"), True, "16bit"),
    (("bfloat16",), {"enabled": True}, "rename it to bf16"),
])
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
    p = problems(zero(3, offload_param={"device": "nvme"}))["zero_optimization.offload_param.device"]
    assert "nvme_path" in p.what
    dscheck.loads(json.dumps(zero(3, offload_param={"device": "nvme", "nvme_path": "/local_nvme"})))


def test_partial_offload_needs_stage_3():
    p = problems(zero(2, offload_optimizer={"device": "cpu", "ratio": 0.5}))
    assert "zero_optimization.offload_optimizer.ratio" in p


def test_fp16_and_bf16_both_on():
    p = problems({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}})
    assert "both enabled" in p["fp16.enabled"].what


@pytest.mark.parametrize("cfg,where,what,fix", [
    ({"bf16": {"enabled": "true"}}, "bf16.enabled", "got the string 'true'", "write true without quotes"),
    ({"fp16": {"enabled": "false"}}, "fp16.enabled", "got the string 'false'", "write false without quotes"),
    ({"wall_clock_breakdown": "false"}, "wall_clock_breakdown", "got the string 'false'", "without quotes"),
    ({"zero_optimization": {"stage": "2"}}, "zero_optimization.stage", 'got "2"', "remove the quotes"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage", "expected one of 0, 1, 2, 3", ""),
    ({"zero_optimization": {"stage": True}}, "zero_optimization.stage", "got true", ""),
    ({"zero_optimization": {"stage": 2.5}}, "zero_optimization.stage", "got 2.5", ""),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": "5e8"}}, "zero_optimization.reduce_bucket_size",
     "expected a whole number", "remove the quotes"),
    ({"gradient_clipping": "1.0"}, "gradient_clipping", "expected a number", "remove the quotes"),
    ({"optimizer": {"type": "AdamW", "params": {"torch_adam": "true"}}}, "optimizer.params.torch_adam",
     "got the string 'true'", "without quotes"),
    ({"zero_optimization": True}, "zero_optimization", "boolean form is deprecated", '{"stage": 1}'),
    ({"fp16": 1}, "fp16", "expected an object of settings", ""),
])
def test_wrong_types(cfg, where, what, fix):
    p = problems({"train_micro_batch_size_per_gpu": 1, **cfg})[where]
    assert what in p.what and fix in p.fix


def test_integral_floats_are_whole_numbers():
    # JSON configs write 5e8, which parses as a float; DeepSpeed's pydantic takes it as an int.
    dscheck.loads(json.dumps(zero(2, reduce_bucket_size=5e8, allgather_bucket_size=2e8)))


@pytest.mark.parametrize("cfg,where,effect", [
    ({"fp16": {"enabled": "auto"}}, "fp16.enabled", "drops it and uses false"),
    ({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto"}},
     "zero_optimization.stage3_prefetch_bucket_size", "uses 50000000"),
    ({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "auto"}}},
     "zero_optimization.offload_optimizer.device", 'uses "none"'),
    ({"gradient_clipping": "auto"}, "gradient_clipping", 'takes the string "auto"'),
    ({"optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto"}}}, "optimizer.params.lr",
     'takes the string "auto"'),
])
def test_auto_outside_batch_keys(cfg, where, effect):
    p = problems({"train_micro_batch_size_per_gpu": "auto", **cfg})
    assert "train_micro_batch_size_per_gpu" not in p
    assert "HF Trainer" in p[where].what and effect in p[where].what


@pytest.mark.parametrize("kind,ok,fix", [
    ("AdamW", True, ""), ("adamw", True, ""), ("ADAM", True, ""), ("Lamb", True, ""), ("OneBitAdam", True, ""),
    ("SGD", True, ""), ("Adafactor", True, ""),
    ("sgd", False, "did you mean 'SGD'?"), ("FusedAdam", False, 'write "Adam"'),
    ("DeepSpeedCPUAdam", False, "offload_optimizer"), ("AdamWW", False, "did you mean 'adamw'?"),
])
def test_optimizer_types(kind, ok, fix):
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": kind, "params": {"lr": 1e-3}}}
    if ok:
        dscheck.loads(json.dumps(cfg))
    else:
        p = problems(cfg)["optimizer.type"]
        assert "unknown optimizer type" in p.what and fix in p.fix


def test_optimizer_rules_deepspeed_enforces():
    p = problems({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1},
                  "optimizer": {"type": "OneBitAdam", "params": {"max_grad_norm": 1.0}}})
    assert "does not run under ZeRO" in p["optimizer.type"].what
    assert "gradient_clipping" in p["optimizer.params.max_grad_norm"].fix
    assert "no \"type\"" in problems({"optimizer": {"params": {}}})["optimizer"].what


def test_every_problem_at_once_in_file_order():
    text = json.dumps({"stage": 2, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"},
                                                         "overlap_com": True},
                       "fp16": {"enabled": True}, "bf16": {"enabled": "true"}, "gradient_clipping": "auto"}, indent=2)
    with pytest.raises(MatrixError) as ei:
        dscheck.loads(text, "many.json")
    ps = ei.value.problems
    assert [p.where for p in ps] == ["stage", "zero_optimization.offload_param", "zero_optimization.overlap_com",
                                     "bf16.enabled", "gradient_clipping"]
    assert [p.line for p in ps] == sorted(p.line for p in ps)
    assert all(p.line for p in ps) and all(p.fix for p in ps)
    assert str(ei.value).startswith("5 problems in many.json")


# -- valid configs pass ---------------------------------------------------------------------
VALID = {
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
    "steps_per_print": 100, "gradient_clipping": 1.0, "wall_clock_breakdown": False,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": 5e8,
        "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e5, "sub_group_size": 1e9,
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
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
    "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
            "overlap_events": True},
}


def test_valid_configs_pass():
    assert dscheck.loads(json.dumps(VALID, indent=2)) == VALID
    assert dscheck.check(VALID) == []
    cfg = dscheck.load(EXAMPLES / "zero2_offload.json")
    assert dscheck.describe(cfg) == {"zero_stage": 2, "offload": "optimizer", "precision": "bf16",
                                     "optimizer": "cpuadam"}


def test_check_without_text_has_no_lines():
    [p] = dscheck.check({"offload_optimizer": {"device": "cpu"}})
    assert p.where == "offload_optimizer" and p.line is None


# -- describe ---------------------------------------------------------------------------------
def opt(kind, **params):
    return {"optimizer": {"type": kind, "params": params}}


@pytest.mark.parametrize("cfg,expect", [
    ({}, (0, "none", "fp32", None)),
    (zero(1), (1, "none", "fp32", None)),
    (zero(2, offload_optimizer={"device": "cpu"}), (2, "optimizer", "fp32", None)),
    (zero(3, offload_optimizer={"device": "cpu"}, offload_param={"device": "cpu"}),
     (3, "optimizer+params", "fp32", None)),
    (zero(3, offload_optimizer={"device": "nvme", "nvme_path": "/n"}), (3, "nvme", "fp32", None)),
    (zero(3, offload_optimizer={"device": "cpu"}, offload_param={"device": "nvme", "nvme_path": "/n"}),
     (3, "nvme", "fp32", None)),
    (zero(3, offload_param={"device": "cpu"}), (3, "params", "fp32", None)),
    (zero(2, offload_optimizer={"device": "none"}), (2, "none", "fp32", None)),
    (zero(2, cpu_offload=True), (2, "optimizer", "fp32", None)),
    ({"fp16": {"enabled": True}}, (0, "none", "fp16", None)),
    ({"fp16": {"enabled": False}, "bf16": {"enabled": True}}, (0, "none", "bf16", None)),
    ({"bfloat16": {"enabled": True}}, (0, "none", "bf16", None)),
    ({"bf16": {"enabled": False}}, (0, "none", "fp32", None)),
    ({"zero_optimization": True}, (1, "none", "fp32", None)),
])
def test_describe_stage_offload_precision(cfg, expect):
    d = dscheck.describe(cfg)
    assert (d["zero_stage"], d["offload"], d["precision"], d["optimizer"]) == expect


OFFLOADED = zero(2, offload_optimizer={"device": "cpu"})["zero_optimization"]
NVME = zero(2, offload_optimizer={"device": "nvme", "nvme_path": "/n"})["zero_optimization"]


@pytest.mark.parametrize("cfg,expect", [
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
])
def test_describe_optimizer(cfg, expect):
    assert dscheck.describe(cfg)["optimizer"] == expect


# -- resolve ----------------------------------------------------------------------------------
def test_resolve_auto_batch_keys():
    cfg = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "zero_optimization": {"stage": 2}}
    out = dscheck.resolve(cfg, micro_batch=4, grad_accum=8)
    assert out == {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,
                   "zero_optimization": {"stage": 2}, "steps_per_print": 10**9}
    assert cfg["train_batch_size"] == "auto"  # the input is left alone
    out["zero_optimization"]["stage"] = 3
    assert cfg["zero_optimization"]["stage"] == 2  # a deep copy


def test_resolve_keeps_explicit_values_and_fills_absent_ones():
    out = dscheck.resolve({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 5}, micro_batch=4, grad_accum=8)
    assert out == {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8, "steps_per_print": 5}
    # train_batch_size given: DeepSpeed derives the rest, so nothing is filled in.
    out = dscheck.resolve({"train_batch_size": 32, "gradient_accumulation_steps": "auto"}, micro_batch=4, grad_accum=8)
    assert out == {"train_batch_size": 32, "gradient_accumulation_steps": 8, "steps_per_print": 10**9}


def test_resolved_example_passes_the_check():
    cfg = dscheck.resolve(dscheck.load(EXAMPLES / "zero2_offload.json"), micro_batch=2, grad_accum=1)
    assert dscheck.check(cfg) == []
    assert "auto" not in json.dumps(cfg)


# -- the orchestrator stays light -----------------------------------------------------------
def test_importing_dscheck_imports_no_torch_or_deepspeed():
    code = "import sys, bench.dscheck; print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


# -- drift: the tables against the installed DeepSpeed -------------------------------------------
@pytest.fixture(scope="module")
def ds():
    import deepspeed
    return deepspeed


def test_installed_deepspeed_is_the_one_the_tables_mirror(ds):
    assert ds.__version__.split("+")[0] == dscheck.DS_VERSION, \
        "DeepSpeed changed: re-read its config sources, update bench/dscheck.py's tables and DS_VERSION"


def _model_keys(model) -> set[str]:
    keys = set()
    for name, f in model.model_fields.items():
        keys.add(name)
        if f.alias:
            keys.add(f.alias)
    return keys


def _token(annotation) -> object:
    """A pydantic field annotation as a dscheck spec token (None where the table is free to differ)."""
    import enum
    import pathlib
    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) is typing.Union and type(None) in args
    if optional:
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else None
    simple = {bool: "bool", int: "int", float: "number", str: "str", pathlib.Path: "str", list: "list"}
    if annotation in simple:
        return simple[annotation] + ("?" if optional else "")
    if typing.get_origin(annotation) in (list, typing.List):
        return "list" + ("?" if optional else "")
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return tuple(dict.fromkeys(m.value for m in annotation))
    return None


def _pydantic_sections(ds):
    from deepspeed.comm.config import CommsLoggerConfig
    from deepspeed.compile.config import CompileConfig
    from deepspeed.monitor.config import CometConfig, CSVConfig, TensorBoardConfig, WandbConfig
    from deepspeed.runtime.config import HybridEngineConfig
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    from deepspeed.runtime.zenflow.zenflow_config import ZenFlowConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.leaf_module_config import DeepSpeedZeroLeafModuleConfig
    from deepspeed.runtime.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,
                                                       DeepSpeedZeroOffloadParamConfig)
    from deepspeed.utils.config import DeepSpeedThroughputTimerConfig
    return [
        (dscheck.ZERO, DeepSpeedZeroConfig), (dscheck.OFFLOAD_PARAM, DeepSpeedZeroOffloadParamConfig),
        (dscheck.OFFLOAD_OPTIMIZER, DeepSpeedZeroOffloadOptimizerConfig), (dscheck.ZENFLOW, ZenFlowConfig),
        (dscheck.LEAF_MODULE, DeepSpeedZeroLeafModuleConfig), (dscheck.FP16, DeepSpeedFP16Config),
        (dscheck.BF16, DeepSpeedBF16Config), (dscheck.COMMS_LOGGER, CommsLoggerConfig),
        (dscheck.TENSORBOARD, TensorBoardConfig), (dscheck.CSV_MONITOR, CSVConfig), (dscheck.WANDB, WandbConfig),
        (dscheck.COMET, CometConfig), (dscheck.TIMERS["throughput"], DeepSpeedThroughputTimerConfig),
        (dscheck.HYBRID_ENGINE, HybridEngineConfig), (dscheck.COMPILE, CompileConfig),
    ]


def test_tables_have_every_pydantic_field_and_alias(ds):
    for table, model in _pydantic_sections(ds):
        assert set(table) == _model_keys(model), model.__name__


def test_table_types_match_pydantic_annotations(ds):
    for table, model in _pydantic_sections(ds):
        for name, f in model.model_fields.items():
            want = _token(f.annotation)
            if want is None:  # nested models, unions, dicts: checked as sections or left open
                continue
            for key in {name, f.alias} - {None}:
                assert table[key] == want, f"{model.__name__}.{key}: table {table[key]!r}, DeepSpeed {want!r}"


def test_zero_aliases_and_deprecations_match(ds):
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    fields = DeepSpeedZeroConfig.model_fields
    assert dscheck.ZERO_ALIASES == {n: f.alias for n, f in fields.items() if f.alias}
    deprecated = {n for n, f in fields.items() if (f.json_schema_extra or {}).get("deprecated")}
    assert deprecated == {p[1] for p in dscheck.DEPRECATED if p[0] == "zero_optimization"}
    assert dscheck.ZERO["offload_param"] is dscheck.OFFLOAD_PARAM
    assert dscheck.ZERO["offload_optimizer"] is dscheck.OFFLOAD_OPTIMIZER


def test_key_by_key_sections_match_deepspeed_constants(ds):
    from deepspeed.profiling import constants as prof
    from deepspeed.runtime.activation_checkpointing.config import ACT_CHKPT_DEFAULT
    from deepspeed.runtime.swap_tensor.aio_config import AIO_DEFAULT_DICT
    assert set(dscheck.ACTIVATION_CHECKPOINTING) == set(ACT_CHKPT_DEFAULT)
    assert set(dscheck.AIO) == set(AIO_DEFAULT_DICT)
    flops = {v for k, v in vars(prof).items() if k.startswith("FLOPS_PROFILER_") and isinstance(v, str)
             and not k.endswith(("_DEFAULT", "_FORMAT"))}
    assert set(dscheck.FLOPS_PROFILER) == flops


def test_optimizer_names_match(ds):
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS
    assert set(dscheck.DS_OPTIMIZERS) == set(DEEPSPEED_OPTIMIZERS)
    torch_optimizers = {n for n, o in vars(torch.optim).items()
                        if isinstance(o, type) and issubclass(o, torch.optim.Optimizer) and n != "Optimizer"}
    assert set(dscheck.TORCH_OPTIMIZERS) <= torch_optimizers


class _Recorder(dict):
    """A config dict that notes every top-level key DeepSpeedConfig asks about."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.asked: set[str] = set()

    def get(self, k, *default):
        self.asked.add(k)
        return super().get(k, *default)

    def __getitem__(self, k):
        self.asked.add(k)
        return super().__getitem__(k)

    def __contains__(self, k):
        self.asked.add(k)
        return super().__contains__(k)

    def keys(self):  # DeepSpeed writes `KEY in param_dict.keys()`
        outer = self

        class Keys:
            def __contains__(self, k):
                return outer.__contains__(k)

            def __iter__(self):
                return iter(dict.keys(outer))

        return Keys()

    def __copy__(self):  # DeepSpeedConfig reads a copy.copy of the dict
        return self


def test_top_level_keys_match_what_deepspeed_reads(ds):
    from deepspeed.runtime.config import DeepSpeedConfig
    rec = _Recorder(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1)
    DeepSpeedConfig(rec)
    asked = {k for k in rec.asked if isinstance(k, str)}
    assert asked - set(dscheck.SCHEMA) == set(), "DeepSpeed reads top-level keys the table does not know"
    # Read only in some cases (quantize_training when compression is on) or by deepspeed.initialize.
    assert set(dscheck.SCHEMA) - asked == {"quantize_training", "sequence_parallel_size", "data_parallel_size"}


# -- evidence: DeepSpeed behaves as the problem messages say -------------------------------------
def test_deepspeed_silently_ignores_a_misplaced_offload(ds):
    from deepspeed.runtime.config import DeepSpeedConfig
    cfg = json.loads((EXAMPLES / "misplaced_offload.json").read_text())
    c = DeepSpeedConfig(dscheck.resolve(cfg, micro_batch=1, grad_accum=1))  # no error...
    assert c.zero_config.offload_optimizer is None  # ...and no offload: the benchmark would lie


def test_deepspeed_parses_the_examples_as_described(ds):
    from deepspeed.runtime.config import DeepSpeedConfig
    for cfg in (dscheck.load(EXAMPLES / "zero2_offload.json"), VALID):
        c = DeepSpeedConfig(dscheck.resolve(cfg, micro_batch=2, grad_accum=1))
        d = dscheck.describe(cfg)
        assert c.zero_optimization_stage == d["zero_stage"]
        assert c.bfloat16_config.enabled == (d["precision"] == "bf16")
        assert c.float16_config.enabled == (d["precision"] == "fp16")
        devices = {c.zero_config.offload_optimizer.device, getattr(c.zero_config.offload_param, "device", None)}
        assert ("nvme" in devices) == (d["offload"] == "nvme")


@pytest.mark.parametrize("cfg", [
    zero(2, offload_optimzer={"device": "cpu"}),
    zero(2, offload_optimizer={"device": "CPU"}),
    zero(3, max_live_parameters=1, stage3_max_live_parameters=2),
    {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "bf16": {"enabled": True}},
])
def test_deepspeed_stops_where_dscheck_says_it_does(ds, cfg):
    from deepspeed.runtime.config import DeepSpeedConfig
    with pytest.raises(Exception):
        DeepSpeedConfig(cfg)
    assert dscheck.check(cfg)


def test_deepspeed_drops_auto_in_its_pydantic_sections(ds):
    from deepspeed.runtime.config import DeepSpeedConfig
    c = DeepSpeedConfig(zero(2, offload_optimizer={"device": "auto"}) | {"bf16": {"enabled": "auto"}})
    assert c.zero_config.offload_optimizer.device == "none" and not c.bfloat16_config.enabled
