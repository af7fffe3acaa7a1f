"""User-supplied DeepSpeed configs: checked before anything runs, described as axis values, resolved.

DeepSpeed ignores top-level keys it does not know, and reads several sections key by key, so a
misplaced key (offload_optimizer at the top level instead of under zero_optimization) silently turns
the feature off and the benchmark measures something other than what the file says. load() reports
every problem of a file at once, each with where the key belongs or how to fix it.

The tables below mirror DeepSpeed 0.19.6: runtime/config.py and runtime/constants.py (top level),
runtime/zero/config.py and runtime/zero/offload_config.py (zero_optimization), runtime/precision_config.py
(fp16, bf16), runtime/activation_checkpointing/config.py, profiling/, monitor/, comm/, swap_tensor/ (aio),
utils/config.py (timers), compile/config.py. tests/test_dscheck.py compares them with the installed
DeepSpeed, so an upgrade that adds or renames a key fails a test instead of a benchmark.
This module imports neither torch nor deepspeed: the orchestrator stays light.
"""
from __future__ import annotations

import bisect
import copy
import difflib
import json
import os
import re
from pathlib import Path
from typing import Any, Union

from .matrix import MatrixError, Problem

__all__ = ["Problem", "load", "loads", "check", "describe", "resolve", "DS_VERSION", "SCHEMA", "ZERO_ALIASES",
           "DS_OPTIMIZERS", "TORCH_OPTIMIZERS"]

DS_VERSION = "0.19.6"  # the DeepSpeed release these tables were read from

# -- value types ------------------------------------------------------------------------------
# A key's spec is a type name ("int?" also allows null), a tuple of allowed values, or a nested
# section (a dict). A section holding OPEN takes keys beyond those listed (optimizer kwargs, say).
Spec = Union[str, tuple, dict]
OPEN = "*"
MAP: dict[str, Spec] = {OPEN: "any"}  # a section DeepSpeed hands on whole; its keys are not checked here

DEVICES = ("none", "cpu", "nvme")  # zero/offload_config.py OffloadDeviceEnum (case-sensitive)
STAGES = (0, 1, 2, 3)  # zero/config.py ZeroStageEnum

_TYPE_WORDS = {"bool": "true or false", "int": "a whole number", "number": "a number", "str": "a string",
               "list": "a list", "any": "any value"}

# -- zero_optimization ------------------------------------------------------------------------
OFFLOAD_PARAM: dict[str, Spec] = {  # DeepSpeedZeroOffloadParamConfig
    "device": DEVICES, "nvme_path": "str?", "buffer_count": "int", "buffer_size": "int", "max_in_cpu": "int",
    "pin_memory": "bool",
}
OFFLOAD_OPTIMIZER: dict[str, Spec] = {  # DeepSpeedZeroOffloadOptimizerConfig
    "device": DEVICES, "nvme_path": "str?", "buffer_count": "int", "pin_memory": "bool", "pipeline_read": "bool",
    "pipeline_write": "bool", "fast_init": "bool", "ratio": "number", "super_offload": "bool",
    "cpuadam_cores_perc": "number",
}
ZENFLOW: dict[str, Spec] = {  # zenflow/zenflow_config.py ZenFlowConfig
    "topk_ratio": "number", "select_strategy": "str", "select_interval": "any", "update_interval": "any",
    "overlap_step": "bool", "offload": "bool", "auto_ratio": "number", "full_warm_up_rounds": "int",
    "pt_reserved_cores_perc": "number", "steps_per_epoch": "int?",
}
LEAF_MODULE: dict[str, Spec] = {"classes": "list", "names": "list", "name_suffixes": "list"}

# DeepSpeedZeroConfig by field name; pydantic also takes each field's alias (ZERO_ALIASES), not both.
_ZERO_FIELDS: dict[str, Spec] = {
    "stage": STAGES, "contiguous_gradients": "bool", "reduce_scatter": "bool", "reduce_bucket_size": "int",
    "use_multi_rank_bucket_allreduce": "bool", "allgather_partitions": "bool", "allgather_bucket_size": "int",
    "overlap_comm": "bool?", "load_from_fp32_weights": "bool", "elastic_checkpoint": "bool",
    "offload_param": OFFLOAD_PARAM, "offload_optimizer": OFFLOAD_OPTIMIZER, "zenflow": ZENFLOW,
    "sub_group_size": "int", "cpu_offload_param": "bool?", "cpu_offload_use_pin_memory": "bool?",
    "cpu_offload": "bool?", "prefetch_bucket_size": "int", "param_persistence_threshold": "int",
    "model_persistence_threshold": "int", "max_live_parameters": "int", "max_reuse_distance": "int",
    "gather_16bit_weights_on_model_save": "bool", "module_granularity_threshold": "int",
    "use_all_reduce_for_fetch_params": "bool", "allgather_sequential": "bool",
    "stage3_gather_fp16_weights_on_model_save": "bool", "ignore_unused_parameters": "bool", "legacy_stage1": "bool",
    "round_robin_gradients": "bool", "zero_hpz_partition_size": "int", "zero_quantized_weights": "bool",
    "zero_quantized_nontrainable_weights": "bool", "zero_quantized_gradients": "bool", "zeropp_loco_param": MAP,
    "mics_shard_size": "int", "mics_hierarchical_params_gather": "bool", "memory_efficient_linear": "bool",
    "pipeline_loading_checkpoint": "bool", "override_module_apply": "bool", "log_trace_cache_warnings": "bool",
    "enable_sanity_checks": "bool", "save_muon_momentum_buffer_in_memory": "bool", "leaf_module": LEAF_MODULE,
}
ZERO_ALIASES = {  # field name -> alias (the stage3_* spelling most configs use)
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "model_persistence_threshold": "stage3_model_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    "module_granularity_threshold": "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params": "stage3_use_all_reduce_for_fetch_params",
    "allgather_sequential": "stage3_allgather_sequential",
}
ZERO: dict[str, Spec] = {**_ZERO_FIELDS, **{alias: _ZERO_FIELDS[name] for name, alias in ZERO_ALIASES.items()}}

# -- precision --------------------------------------------------------------------------------
FP16: dict[str, Spec] = {  # DeepSpeedFP16Config
    "enabled": "bool", "auto_cast": "bool", "loss_scale": "number", "initial_scale_power": "int",
    "loss_scale_window": "int", "hysteresis": "int", "consecutive_hysteresis": "bool", "min_loss_scale": "int",
    "fp16_master_weights_and_grads": "bool",
}
BF16: dict[str, Spec] = {  # DeepSpeedBF16Config
    "enabled": "bool", "immediate_grad_update": "bool", "check_grad_overflow": "bool",
    "bf16_master_weights_and_grads": "bool", "bf16_optimizer_states": "bool",
}

# -- optimizer and scheduler ------------------------------------------------------------------
# runtime/config.py DEEPSPEED_OPTIMIZERS: matched case-insensitively (the config lowercases them).
DS_OPTIMIZERS = ("adagrad", "adam", "adamw", "lamb", "onebitadam", "onebitlamb", "zerooneadam", "muadam", "muadamw",
                 "musgd", "lion", "muon")
# Any other type is looked up with getattr(torch.optim, type): case-sensitive. torch 2.13's list.
TORCH_OPTIMIZERS = ("Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "LBFGS", "Muon", "NAdam",
                    "RAdam", "RMSprop", "Rprop", "SGD", "SparseAdam")
ONEBIT = ("onebitadam", "zerooneadam", "onebitlamb")
_CLASS_NAMES = {  # class names people write as the type, and the type that makes DeepSpeed build that class
    "fusedadam": 'write "Adam" (DeepSpeed builds FusedAdam for it) ',
    "cpuadam": 'write "Adam" with zero_optimization.offload_optimizer (DeepSpeed then builds DeepSpeedCPUAdam) ',
    "deepspeedcpuadam": 'write "Adam" with zero_optimization.offload_optimizer (DeepSpeed then builds '
                        'DeepSpeedCPUAdam) ',
    "fusedlamb": 'write "Lamb" (DeepSpeed builds FusedLamb for it) ',
}  # engine asserts "not compatible with ZeRO"
OPTIMIZER_PARAMS: dict[str, Spec] = {
    OPEN: "any",  # passed to the optimizer's constructor; the listed ones are typed (and found when misplaced)
    "lr": "number", "betas": "list", "eps": "number", "weight_decay": "number", "bias_correction": "bool",
    "amsgrad": "bool", "torch_adam": "bool", "adam_w_mode": "bool", "fp32_optimizer_states": "bool",
    "max_coeff": "number", "min_coeff": "number", "freeze_step": "int", "cuda_aware": "bool",
    "comm_backend_name": "str", "var_freeze_step": "int", "var_update_scaler": "int", "local_step_scaler": "int",
    "local_step_clipper": "int",
}
OPTIMIZER: dict[str, Spec] = {"type": "str", "params": OPTIMIZER_PARAMS, "legacy_fusion": "bool"}
SCHEDULER: dict[str, Spec] = {"type": "str", "params": {
    OPEN: "any", "warmup_min_lr": "number", "warmup_max_lr": "number", "warmup_num_steps": "int",
    "warmup_type": "str", "total_num_steps": "int", "last_batch_iteration": "int"}}

# -- monitoring, profiling, I/O ---------------------------------------------------------------
ACTIVATION_CHECKPOINTING: dict[str, Spec] = {  # activation_checkpointing/config.py ACT_CHKPT_DEFAULT
    "partition_activations": "bool", "number_checkpoints": "int?", "contiguous_memory_optimization": "bool",
    "synchronize_checkpoint_boundary": "bool", "profile": "bool", "cpu_checkpointing": "bool",
}
FLOPS_PROFILER: dict[str, Spec] = {  # profiling/constants.py
    "enabled": "bool", "recompute_fwd_factor": "number", "profile_step": "int", "module_depth": "int",
    "top_modules": "int", "detailed": "bool", "output_file": "str?",
}
AIO: dict[str, Spec] = {  # swap_tensor/constants.py
    "block_size": "int", "queue_depth": "int", "intra_op_parallelism": "int", "single_submit": "bool",
    "overlap_events": "bool", "use_gds": "bool",
}
COMMS_LOGGER: dict[str, Spec] = {"enabled": "bool", "prof_all": "bool", "prof_ops": "list", "verbose": "bool",
                                 "debug": "bool"}
TENSORBOARD: dict[str, Spec] = {"enabled": "bool", "output_path": "str", "job_name": "str"}
CSV_MONITOR: dict[str, Spec] = {"enabled": "bool", "output_path": "str", "job_name": "str"}
WANDB: dict[str, Spec] = {"enabled": "bool", "group": "str?", "team": "str?", "project": "str"}
COMET: dict[str, Spec] = {
    "enabled": "bool", "samples_log_interval": "int", "project": "str?", "workspace": "str?", "api_key": "str?",
    "experiment_name": "str?", "experiment_key": "str?", "online": "bool?", "mode": "str?",
}
TIMERS: dict[str, Spec] = {"throughput": {"enabled": "bool", "synchronized": "bool"}}
HYBRID_ENGINE: dict[str, Spec] = {
    "enabled": "bool", "max_out_tokens": "int", "inference_tp_size": "int", "release_inference_cache": "bool",
    "pin_parameters": "bool", "tp_gather_partition_size": "int", "enable_cuda_graph": "bool",
}
COMPILE: dict[str, Spec] = {
    "deepcompile": "bool", "free_activation": "bool", "free_activation_threshold": "int",
    "offload_activation": "bool", "offload_activation_pin_memory": "bool", "offload_opt_states": "bool",
    "double_buffer": "bool", "symmetric_memory": "bool", "debug_log": "bool", "offload_parameters": "bool",
    "sync_before_reduce": "bool", "sync_after_reduce": "bool", "sync_before_allgather": "bool",
    "sync_after_allgather": "bool", "keep_int_input_tensors": "bool", "keep_all_input_tensors": "bool",
    "passes": "list?",
}
TORCH_AUTOCAST: dict[str, Spec] = {"enabled": "bool", "dtype": "str?", "lower_precision_safe_modules": "list?"}
DATA_TYPES: dict[str, Spec] = {"grad_accum_dtype": "str?", "param_dtype": "str?", "buffer_dtype": "str?"}

# -- the top level: every key DeepSpeedConfig reads (plus two that deepspeed.initialize reads) ---
SCHEMA: dict[str, Spec] = {
    "train_batch_size": "int?", "train_micro_batch_size_per_gpu": "int?", "gradient_accumulation_steps": "int?",
    "managed_gradient_accumulation": "bool", "steps_per_print": "int?", "dump_state": "bool",
    "disable_allgather": "bool", "communication_data_type": "str?", "seq_parallel_communication_data_type": "str?",
    "prescale_gradients": "bool", "gradient_predivide_factor": "number", "gradient_allreduce_op": "str",
    "sparse_gradients": "bool", "gradient_clipping": "number", "graph_harvesting": "bool",
    "wall_clock_breakdown": "bool", "memory_breakdown": "bool", "vocabulary_size": "int?",
    "dataloader_drop_last": "bool", "log_level": "str?", "use_data_before_expert_parallelism": "bool",
    "zero_allow_untested_optimizer": "bool", "zero_force_ds_cpu_optimizer": "bool",
    "zero_optimization": ZERO, "fp16": FP16, "bf16": BF16, "bfloat16": BF16,
    "optimizer": OPTIMIZER, "scheduler": SCHEDULER,
    "activation_checkpointing": ACTIVATION_CHECKPOINTING, "flops_profiler": FLOPS_PROFILER, "aio": AIO,
    "comms_logger": COMMS_LOGGER, "tensorboard": TENSORBOARD, "csv_monitor": CSV_MONITOR, "wandb": WANDB,
    "comet": COMET, "timers": TIMERS, "hybrid_engine": HYBRID_ENGINE, "compile": COMPILE,
    "torch_autocast": TORCH_AUTOCAST, "data_types": DATA_TYPES,
    # Sections handed on whole to subsystems this harness does not use.
    "amp": MAP, "compression_training": MAP, "quantize_training": MAP, "autotuning": MAP, "elasticity": MAP,
    "sparse_attention": MAP, "pipeline": MAP, "progressive_layer_drop": MAP, "curriculum_learning": MAP,
    "data_efficiency": MAP, "checkpoint": MAP, "nebula": MAP, "datastates_ckpt": MAP, "weight_quantization": MAP,
    "tensor_parallel": MAP, "expert_parallel": MAP,
    # Read by deepspeed.initialize (mesh setup), not by DeepSpeedConfig.
    "sequence_parallel_size": "int", "data_parallel_size": "int",
}

# Sections DeepSpeed builds pydantic models from: an unknown key there stops DeepSpeed at start-up, and
# an "auto" value is dropped for the default. Everywhere else DeepSpeed reads keys one by one (dict.get):
# an unknown key is ignored without a word, and "auto" is taken as the value.
_PYDANTIC = {("zero_optimization",), ("zero_optimization", "offload_param"), ("zero_optimization", "offload_optimizer"),
             ("zero_optimization", "zenflow"), ("zero_optimization", "leaf_module"), ("fp16",), ("bf16",),
             ("bfloat16",), ("comms_logger",), ("tensorboard",), ("csv_monitor",), ("wandb",), ("comet",),
             ("timers", "throughput"), ("hybrid_engine",), ("compile",)}

# Deprecated spellings DeepSpeed 0.19.6 still accepts (or, for cpu_offload_use_pin_memory, drops).
DEPRECATED = {
    ("zero_optimization", "cpu_offload"): 'use zero_optimization.offload_optimizer: {"device": "cpu"}',
    ("zero_optimization", "cpu_offload_param"): 'use zero_optimization.offload_param: {"device": "cpu"}',
    ("zero_optimization", "cpu_offload_use_pin_memory"):
        "DeepSpeed ignores it: set pin_memory inside offload_optimizer / offload_param",
    ("zero_optimization", "stage3_gather_fp16_weights_on_model_save"):
        "use zero_optimization.stage3_gather_16bit_weights_on_model_save",
    ("bfloat16",): "rename it to bf16 (DeepSpeed reads bfloat16 only when bf16 is absent)",
}

# Names people use that the tables cannot place by themselves.
HINTS = {
    "zero_stage": "zero_optimization.stage", "zero": "zero_optimization",
    "gradient_checkpointing": "activation_checkpointing (DeepSpeed's), or zerobench's grad_ckpt axis for the model",
    "max_grad_norm": "gradient_clipping", "thread_count": "aio.intra_op_parallelism",
    "micro_batch_size": "train_micro_batch_size_per_gpu", "batch_size": "train_micro_batch_size_per_gpu",
    "grad_accum": "gradient_accumulation_steps",
}

# HF Trainer fills in "auto"; zerobench runs DeepSpeed directly, so only these are resolved (by resolve()).
_AUTO_OK = {("train_batch_size",), ("train_micro_batch_size_per_gpu",), ("gradient_accumulation_steps",)}
_AUTO_DEFAULTS = {  # DeepSpeed's defaults for the keys HF-style configs most often leave "auto"
    ("zero_optimization", "reduce_bucket_size"): 500_000_000,
    ("zero_optimization", "stage3_prefetch_bucket_size"): 50_000_000,
    ("zero_optimization", "stage3_param_persistence_threshold"): 100_000,
    ("zero_optimization", "offload_optimizer", "device"): "none",
    ("zero_optimization", "offload_param", "device"): "none",
    ("fp16", "enabled"): False, ("bf16", "enabled"): False,
}


def _index(spec: dict, path: tuple = (), out: dict | None = None) -> dict[str, list[tuple]]:
    """Every key name -> the paths where it is valid (for 'did you mean zero_optimization.X?')."""
    out = {} if out is None else out
    for k, sub in spec.items():
        if k == OPEN:
            continue
        out.setdefault(k, []).append(path + (k,))
        if isinstance(sub, dict):
            _index(sub, path + (k,), out)
    return out


_WHERE_VALID = _index(SCHEMA)


# -- locating keys in the text ----------------------------------------------------------------
_WS = re.compile(r"[ \t\n\r]*")


def _key_lines(text: str) -> tuple[dict[tuple, int], list[tuple[tuple, int, int]]]:
    """The 1-based line of each key path, and every duplicated key (path, first line, repeat line).

    Walks text that json.loads already accepted, so it needs no error handling.
    """
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    lines: dict[tuple, int] = {}
    dups: list[tuple[tuple, int, int]] = []
    decoder = json.JSONDecoder()

    def line(i: int) -> int:
        return bisect.bisect_right(starts, i)

    def value(i: int, path: tuple) -> int:
        i = _WS.match(text, i).end()
        if text[i] == "{":
            i = _WS.match(text, i + 1).end()
            if text[i] == "}":
                return i + 1
            while True:
                key, j = json.decoder.scanstring(text, i + 1)
                p = path + (key,)
                if p in lines:
                    dups.append((p, lines[p], line(i)))
                else:
                    lines[p] = line(i)
                i = value(_WS.match(text, j).end() + 1, p)  # past the ':'
                i = _WS.match(text, i).end()
                if text[i] == "}":
                    return i + 1
                i = _WS.match(text, i + 1).end()  # past the ','
        if text[i] == "[":
            i, n = _WS.match(text, i + 1).end(), 0
            if text[i] == "]":
                return i + 1
            while True:
                i = _WS.match(text, value(i, path + (n,))).end()
                n += 1
                if text[i] == "]":
                    return i + 1
                i += 1
        return decoder.raw_decode(text, i)[1]

    value(0, ())
    return lines, dups


def _fmt(path: tuple) -> str:
    s = ""
    for part in path:
        s += f"[{part}]" if isinstance(part, int) else (f".{part}" if s else str(part))
    return s


class _Report:
    """Collects problems for one file, each placed on the line of its key."""

    def __init__(self, file: str, lines: dict[tuple, int]):
        self.file, self.lines, self.problems = file, lines, []

    def add(self, path: tuple, what: str, fix: str = "") -> None:
        line = next((self.lines[path[:n]] for n in range(len(path), 0, -1) if path[:n] in self.lines), None)
        self.problems.append(Problem(self.file, _fmt(path), what, fix, line))


# -- loading ----------------------------------------------------------------------------------
_JSON_HINTS = (
    ("Expecting property name", "keys need double quotes, and JSON allows no trailing comma before }"),
    ("Expecting ',' delimiter", "a comma is missing between two entries (often at the end of the line before)"),
    ("Expecting value", "a value is missing, or there is a trailing comma or a comment (JSON has neither)"),
    ("Extra data", "the file holds more than one JSON object; keep one"),
    ("Invalid control character", "a string runs past the end of the line; close its quote"),
    ("Unterminated string", "close the string's double quote"),
)


def loads(text: str, file: str = "<ds_config>") -> dict:
    """Parse and check DeepSpeed config text; raise MatrixError listing every problem."""
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        fix = next((h for prefix, h in _JSON_HINTS if e.msg.startswith(prefix)), "fix the JSON syntax there")
        raise MatrixError([Problem(file, "", f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
                                   fix + " (zerobench reads strict JSON, not DeepSpeed's hjson)", e.lineno)]) from None
    if not isinstance(cfg, dict):
        raise MatrixError([Problem(file, "", f"expected a JSON object of DeepSpeed settings, got {_json_type(cfg)}",
                                   "see matrices/ds_configs/zero2_offload.json", 1)])
    lines, dups = _key_lines(text)
    report = _Report(file, lines)
    for path, first, again in dups:
        report.problems.append(Problem(file, _fmt(path), f"key given twice (lines {first} and {again}); DeepSpeed "
                                       "refuses duplicate keys", "keep one of them", again))
    _check(cfg, report)
    if report.problems:
        raise MatrixError(sorted(report.problems, key=lambda p: p.line or 0))
    return cfg


def load(path: str | os.PathLike) -> dict:
    """Read and check a DeepSpeed JSON config file; raise MatrixError listing every problem in it."""
    p = Path(path)
    if not p.is_file():
        raise MatrixError([Problem(str(path), "", "no such DeepSpeed config file",
                                   "give the path of a JSON file, e.g. matrices/ds_configs/zero2_offload.json")])
    return loads(p.read_text(), str(path))


def check(cfg: dict, file: str = "<ds_config>") -> list[Problem]:
    """Every problem of an already-parsed config (no line numbers): [] when it does what it says."""
    if not isinstance(cfg, dict):
        return [Problem(file, "", f"expected a JSON object of DeepSpeed settings, got {_json_type(cfg)}")]
    report = _Report(file, {})
    _check(cfg, report)
    return report.problems


def _check(cfg: dict, report: _Report) -> None:
    _walk(cfg, SCHEMA, (), cfg, report)
    _semantics(cfg, report)


# -- structure: keys and types ----------------------------------------------------------------
def _json_type(v: Any) -> str:
    return {bool: "a boolean", str: "a string", int: "a number", float: "a number", list: "a list",
            dict: "an object", type(None): "null"}.get(type(v), type(v).__name__)


def _type_ok(v: Any, spec: Spec) -> bool:
    if isinstance(spec, tuple):  # exact values: True is not 1, "CPU" is not "cpu"
        return any(v == c and type(v) is type(c) for c in spec)
    if spec.endswith("?"):
        if v is None:
            return True
        spec = spec[:-1]
    if spec == "bool":
        return isinstance(v, bool)
    if spec == "int":  # 5e8 parses as a float; pydantic takes it as an int, so do we
        return not isinstance(v, bool) and (isinstance(v, int) or isinstance(v, float) and v.is_integer())
    if spec == "number":
        return not isinstance(v, bool) and isinstance(v, (int, float))
    if spec == "str":
        return isinstance(v, str)
    if spec == "list":
        return isinstance(v, list)
    return True


def _type_problem(path: tuple, v: Any, spec: Spec, report: _Report) -> None:
    if isinstance(spec, tuple):
        want = "one of " + ", ".join(json.dumps(c) for c in spec)
    else:
        want = _TYPE_WORDS[spec.rstrip("?")] + (" or null" if spec.endswith("?") else "")
    what, fix = f"expected {want}, got {json.dumps(v)}", ""
    if isinstance(v, str) and v.strip().lower() in ("true", "false") and spec in ("bool", "bool?"):
        what = f"expected true or false, got the string {v!r}"
        fix = f"write {v.strip().lower()} without quotes"
    elif isinstance(v, str) and _is_number(v) and not isinstance(spec, tuple) and spec.rstrip("?") in ("int",
                                                                                                          "number"):
        fix = "remove the quotes"
    elif isinstance(spec, tuple) and isinstance(v, str) and v.lower() in spec:
        fix = f"write {json.dumps(v.lower())} (DeepSpeed matches it case-sensitively)"
    elif isinstance(spec, tuple) and isinstance(v, str) and _is_number(v):
        fix = "remove the quotes"
    report.add(path, what, fix)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _walk(node: dict, spec: dict, path: tuple, cfg: dict, report: _Report) -> None:
    for key, v in node.items():
        p = path + (key,)
        if v == "auto" and isinstance(v, str):
            if p not in _AUTO_OK:
                _auto_problem(p, report)
            continue
        if key not in spec or key == OPEN:
            if OPEN not in spec:
                _unknown(p, spec, cfg, report)
            continue
        if p in DEPRECATED:
            report.add(p, f"{key!r} is deprecated in DeepSpeed {DS_VERSION}", DEPRECATED[p])
        sub = spec[key]
        if isinstance(sub, dict):
            if isinstance(v, dict):
                _walk(v, sub, p, cfg, report)
            elif p == ("zero_optimization",) and isinstance(v, bool):
                report.add(p, f"the boolean form is deprecated (DeepSpeed reads {json.dumps(v)} as stage "
                              f"{int(v)})", f'write "zero_optimization": {{"stage": {int(v)}}}')
            elif not (v is None and sub is MAP):
                report.add(p, f"expected an object of settings, got {json.dumps(v)}")
        elif not _type_ok(v, sub):
            _type_problem(p, v, sub, report)
    if spec is ZERO:
        for name, alias in ZERO_ALIASES.items():
            if name in node and alias in node:
                report.add(path + (name,), f"set twice, as {name!r} and as its alias {alias!r}; DeepSpeed refuses "
                                           "that", f"keep {alias!r} only")


def _auto_problem(path: tuple, report: _Report) -> None:
    if path[:-1] in _PYDANTIC:
        default = json.dumps(_AUTO_DEFAULTS[path]) if path in _AUTO_DEFAULTS else "its default"
        effect = f"DeepSpeed drops it and uses {default}"
    else:
        effect = 'DeepSpeed takes the string "auto" as the value'
    report.add(path, f'"auto" is filled in by the HF Trainer, which zerobench does not run: {effect}',
               'write the value to measure (only the three batch-size keys may stay "auto")')


def _unknown(path: tuple, spec: dict, cfg: dict, report: _Report) -> None:
    key, parent = path[-1], path[:-1]
    here = "at the top level" if not parent else f"in {_fmt(parent)}"
    effect = "DeepSpeed stops on it at start-up" if parent in _PYDANTIC else \
        "DeepSpeed ignores it, so it has no effect"
    elsewhere = sorted((c for c in _WHERE_VALID.get(key, []) if c != path and not _deprecated(c)),
                       key=lambda c: (-_common(c, parent), not _has(cfg, c[:-1]), len(c), c))
    if elsewhere:
        where = " or ".join(_fmt(c) for c in elsewhere[:3])
        report.add(path, f"{key!r} does not belong {here}: {effect}", f"did you mean {where}? move it there")
        return
    if key in HINTS:
        report.add(path, f"unknown key {key!r} {here}: {effect}", f"did you mean {HINTS[key]}?")
        return
    here_keys = [k for k in spec if k != OPEN]
    # The closest name, here or anywhere (offload_optimzer at the top level is a typo *and* misplaced).
    local, global_ = _closest(key, here_keys, 0.6), _closest(key, list(_WHERE_VALID), 0.75)
    if local and (not global_ or local[1] >= global_[1]):
        fix = f"did you mean {_fmt(parent + (local[0],))}?"
    elif global_:
        fix = f"did you mean {' or '.join(_fmt(c) for c in _WHERE_VALID[global_[0]][:3])}?"
    elif len(here_keys) <= 12:
        fix = f"keys DeepSpeed {DS_VERSION} reads {here}: {', '.join(sorted(here_keys))}"
    else:
        fix = "remove it (https://www.deepspeed.ai/docs/config-json/ lists the keys)"
    report.add(path, f"unknown key {key!r} {here}: {effect}", fix)


def _closest(word: str, names: list[str], cutoff: float) -> tuple[str, float] | None:
    scored = [(n, difflib.SequenceMatcher(None, word, n).ratio()) for n in names]
    best = max(scored, key=lambda s: s[1], default=None)
    return best if best and best[1] >= cutoff else None


def _deprecated(path: tuple) -> bool:
    return any(path[:n] in DEPRECATED for n in range(1, len(path) + 1))


def _common(a: tuple, b: tuple) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _has(cfg: dict, path: tuple) -> bool:
    node: Any = cfg
    for k in path:
        if not isinstance(node, dict) or k not in node:
            return False
        node = node[k]
    return True


# -- meaning: settings that would not do what they say ----------------------------------------
def _section(d: Any, key: str) -> dict:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, dict) else {}


def _semantics(cfg: dict, report: _Report) -> None:
    zero = _section(cfg, "zero_optimization")
    stage = zero.get("stage", 0)
    if not _type_ok(stage, STAGES):
        stage = None  # already reported; the checks below need a real stage
    for name in ("offload_optimizer", "offload_param"):
        sec = zero.get(name)
        if not isinstance(sec, dict):
            continue
        path = ("zero_optimization", name)
        device = sec.get("device")
        if "device" not in sec:
            report.add(path, f"{name} has no device; DeepSpeed's default is \"none\", so nothing is offloaded",
                       'add "device": "cpu" (or "nvme" with nvme_path), or remove the section')
        if device == "nvme" and not sec.get("nvme_path"):
            report.add(path + ("device",), 'device "nvme" needs an nvme_path',
                       'add "nvme_path": "/local_nvme" (a directory on a fast local NVMe drive)')
        if device not in ("cpu", "nvme") or stage is None:
            continue
        if name == "offload_optimizer" and stage == 0:
            report.add(path, "offload_optimizer needs ZeRO stage 1, 2 or 3; at stage 0 there is no partitioned "
                             "optimizer state to offload", "set zero_optimization.stage to 1, 2 or 3, or remove it")
        if name == "offload_param" and stage != 3:
            report.add(path, f"offload_param works only at ZeRO stage 3; at stage {stage} DeepSpeed ignores it and the "
                             "parameters stay on the GPU", "set zero_optimization.stage to 3, or remove offload_param")
    ratio = _section(zero, "offload_optimizer").get("ratio", 1.0)
    if _type_ok(ratio, "number") and ratio < 1.0 and stage not in (3, None):
        report.add(("zero_optimization", "offload_optimizer", "ratio"),
                   "partial optimizer offload (ratio < 1) is only for ZeRO stage 3; DeepSpeed stops on it",
                   "set ratio to 1.0, or zero_optimization.stage to 3")

    bf16 = _section(cfg, "bf16") if "bf16" in cfg else _section(cfg, "bfloat16")
    if _section(cfg, "fp16").get("enabled") is True and bf16.get("enabled") is True:
        report.add(("fp16", "enabled"), "fp16 and bf16 are both enabled; DeepSpeed refuses to run both",
                   "keep one: set the other's enabled to false")

    if "optimizer" in cfg and isinstance(cfg["optimizer"], dict):
        _optimizer_semantics(cfg["optimizer"], stage, report)


def _optimizer_semantics(opt: dict, stage: int | None, report: _Report) -> None:
    kind = opt.get("type")
    if "type" not in opt:
        report.add(("optimizer",), 'the optimizer section has no "type"; DeepSpeed ignores it',
                   'add "type", e.g. "AdamW"')
    elif isinstance(kind, str) and kind != "auto":
        if kind.lower() not in DS_OPTIMIZERS and kind not in TORCH_OPTIMIZERS:
            names = {n.lower(): n for n in TORCH_OPTIMIZERS} | {n: n for n in DS_OPTIMIZERS}
            close = difflib.get_close_matches(kind.lower(), list(names), n=1, cutoff=0.75)
            hint = _CLASS_NAMES.get(kind.lower()) or (f"did you mean {names[close[0]]!r}? " if close else "")
            report.add(("optimizer", "type"), f"unknown optimizer type {kind!r}: neither a DeepSpeed optimizer "
                                              "nor a torch.optim class (those are case-sensitive)",
                       f"{hint}DeepSpeed's: {', '.join(DS_OPTIMIZERS)}")
        elif kind.lower() in ONEBIT and stage not in (0, None):
            report.add(("optimizer", "type"), f"{kind} does not run under ZeRO; DeepSpeed stops on it",
                       "set zero_optimization.stage to 0")
    params = _section(opt, "params")
    if "max_grad_norm" in params:
        report.add(("optimizer", "params", "max_grad_norm"), "DeepSpeed refuses max_grad_norm as an optimizer "
                                                             "parameter", "use the top-level gradient_clipping")


# -- describing and resolving -----------------------------------------------------------------
_OPTIMIZER_NAMES = {"lamb": "fusedlamb", "onebitadam": "onebitadam", "zerooneadam": "zerooneadam",
                    "onebitlamb": "onebitlamb"}


def _device(zero: dict, name: str, deprecated: str) -> str:
    sec = zero.get(name)
    if isinstance(sec, dict):
        return sec.get("device", "none")
    return "cpu" if zero.get(deprecated) is True else "none"


def describe(cfg: dict) -> dict:
    """The axis values a (checked) config amounts to, as DeepSpeed 0.19.6 would run it.

    offload is "none", "optimizer", "optimizer+params", "nvme" (either offload on NVMe), or "params"
    (parameter offload alone, a stage-3 setting the generated axes do not produce). optimizer is the
    zerobench name of the class DeepSpeed builds (engine._configure_basic_optimizer), or None when it
    builds none (no optimizer section) or one zerobench does not name (SGD, Lion, ...).
    """
    raw_zero = cfg.get("zero_optimization")
    zero = raw_zero if isinstance(raw_zero, dict) else {}
    stage = int(raw_zero) if isinstance(raw_zero, bool) else int(zero.get("stage", 0))
    opt_device = _device(zero, "offload_optimizer", "cpu_offload")
    # engine.zero_use_cpu_optimizer looks at the device only, not the stage.
    cpu_optimizer = opt_device in ("cpu", "nvme")
    opt_device = opt_device if stage >= 1 else "none"
    param_device = _device(zero, "offload_param", "cpu_offload_param") if stage == 3 else "none"
    if "nvme" in (opt_device, param_device):
        offload = "nvme"
    elif opt_device == "cpu":
        offload = "optimizer+params" if param_device == "cpu" else "optimizer"
    else:
        offload = "params" if param_device == "cpu" else "none"

    bf16 = _section(cfg, "bf16") if "bf16" in cfg else _section(cfg, "bfloat16")
    if _section(cfg, "fp16").get("enabled") is True:
        precision = "fp16"
    elif bf16.get("enabled") is True:
        precision = "bf16"
    else:
        precision = "fp32"

    return {"zero_stage": stage, "offload": offload, "precision": precision,
            "optimizer": _built_optimizer(_section(cfg, "optimizer"), cpu_optimizer, zenflow=bool(zero.get("zenflow")))}


def _built_optimizer(opt: dict, cpu_optimizer: bool, *, zenflow: bool) -> str | None:
    kind = opt.get("type")
    if not isinstance(kind, str) or kind.lower() not in DS_OPTIMIZERS:
        return None  # none, or a torch.optim class built by name
    kind, params = kind.lower(), _section(opt, "params")
    if kind in ("adam", "adamw"):
        # engine.get_optimizer_configuration: torch_adam wins over offload, then CPU Adam, then FusedAdam.
        if params.get("torch_adam"):
            adam_w = kind == "adamw" or bool(params.get("adam_w_mode", True))
            return "adamw" if adam_w else None  # torch.optim.Adam: not a zerobench optimizer
        if cpu_optimizer:
            return None if zenflow else "cpuadam"  # ZenFlowCPUAdam under zenflow
        return "fusedadam"
    return _OPTIMIZER_NAMES.get(kind)


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def resolve(cfg: dict, *, micro_batch: int, grad_accum: int) -> dict:
    """A copy ready for deepspeed.initialize: the cell's batch shape where the config says "auto".

    train_batch_size "auto" is removed so DeepSpeed derives it (micro x accumulation x GPUs). When
    train_batch_size is not given, an absent micro-batch or accumulation setting is filled from the
    cell too, so DeepSpeed steps on the batches the worker feeds it. steps_per_print is set very high
    if absent: DeepSpeed's own step log would interleave with the harness's.
    """
    out = copy.deepcopy(cfg)
    if out.get("train_micro_batch_size_per_gpu") == "auto":
        out["train_micro_batch_size_per_gpu"] = micro_batch
    if out.get("gradient_accumulation_steps") == "auto":
        out["gradient_accumulation_steps"] = grad_accum
    if out.get("train_batch_size") == "auto":
        del out["train_batch_size"]
    if "train_batch_size" not in out:
        out.setdefault("train_micro_batch_size_per_gpu", micro_batch)
        out.setdefault("gradient_accumulation_steps", grad_accum)
    out.setdefault("steps_per_print", 10**9)
    return out
