"""DeepSpeed configs, both ways: a Cell's generated config, and a user's file checked and read as axis values.

- build(cell): the exact config the worker hands to deepspeed.initialize. Pure data, built in the
  orchestrator before any process starts, and stored with every result.
- load(path) / loads(text) / check(cfg): a user's file, checked before anything runs. DeepSpeed
  ignores top-level keys it does not know, and reads several sections key by key, so a misplaced key
  (offload_optimizer at the top level instead of under zero_optimization) silently turns the feature
  off and the benchmark measures something other than what the file says. Every problem of a file is
  reported at once, each with where the key belongs or how to fix it.
- describe(cfg): the axis values (ZeRO stage, offload, precision, optimizer) a config amounts to.
- resolve(cfg, ...): a copy with HF-style "auto" batch sizes filled from the cell.

The key tables (every key DeepSpeed reads, its type, which sections are pydantic models) are
bench/matrix/dsconfig_keys.json, generated from the installed DeepSpeed's own config models by
`nox -s ds_tables` (bench/matrix/dsconfig_gen.py); tests/test_dsconfig_check.py regenerates it and fails when
DeepSpeed changed. What DeepSpeed's models cannot tell is written here: the types its defaults leave
open, the optimizer and scheduler kwargs, hints for misplaced names, advice for deprecated keys,
HF "auto" defaults, and the checks of meaning (offload at the wrong stage, ...).
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

from . import presets
from .axes import OFFLOADS, OPTIMIZERS, Offload, UnderOffload
from .cells import Cell
from .problems import MAX_DEPTH, ConfigError, Problem, read_text

__all__ = [
    "build",
    "OPTIMIZER_SECTIONS",
    "CLIENT_OPTIMIZERS",
    "load",
    "loads",
    "check",
    "describe",
    "resolve",
    "OFFLOAD_AXIS",
    "DS_VERSION",
    "SCHEMA",
    "ZERO_ALIASES",
    "DS_OPTIMIZERS",
    "TORCH_OPTIMIZERS",
]

# Derived from bench.matrix.axes.OPTIMIZERS (kept here as names other modules read).
# DeepSpeed-built optimizers: the "optimizer" section that makes DeepSpeed build each one.
OPTIMIZER_SECTIONS: dict[str, dict[str, Any]] = {
    name: {"type": spec.ds_section["type"], "params": dict(spec.ds_section["params"])}
    for name, spec in OPTIMIZERS.items()
    if not spec.client
}
# Built by the worker and passed to deepspeed.initialize(optimizer=...).
CLIENT_OPTIMIZERS = tuple(name for name, spec in OPTIMIZERS.items() if spec.client)


def _optimizer_section(cell: Cell) -> dict[str, Any] | None:
    """The "optimizer" section that makes DeepSpeed build the cell's optimizer; None for a client one."""
    if cell.optimizer not in OPTIMIZER_SECTIONS:
        return None
    sec = OPTIMIZER_SECTIONS[cell.optimizer]
    return {"type": sec["type"], "params": {"lr": cell.lr, "weight_decay": 0.0, **sec["params"]}}


def _optimizer_flags(cell: Cell, cfg: dict[str, Any]) -> None:
    if cell.optimizer not in OPTIMIZER_SECTIONS:
        # A client optimizer under ZeRO: DeepSpeed refuses "untested" optimizers unless told.
        cfg["zero_allow_untested_optimizer"] = True
    spec = OPTIMIZERS.get(cell.optimizer)
    if cell.offload != Offload.NONE and spec and spec.under_offload == UnderOffload.REQUIRED:
        cfg["zero_force_ds_cpu_optimizer"] = True


def build(cell: Cell) -> dict[str, Any]:
    """The DeepSpeed config for a cell: generated from its axes, or the user's file (checked, with its
    "auto" values and missing optimizer filled from the cell as the HF Trainer fills them)."""
    if cell.ds_config:
        return resolve(load(cell.ds_config), cell)
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cell.micro_batch,
        "gradient_accumulation_steps": cell.grad_accum,
        "gradient_clipping": 1.0,
        "zero_optimization": _zero_section(cell),
        "steps_per_print": 10**9,  # DeepSpeed's own step log would interleave with ours
        "wall_clock_breakdown": False,
    }
    if cell.offload == Offload.NVME:
        cfg["aio"] = {
            "block_size": 1048576,
            "queue_depth": 8,
            "intra_op_parallelism": 1,
            "single_submit": False,
            "overlap_events": True,
        }
    cfg.update(_precision_section(cell))
    section = _optimizer_section(cell)
    if section is not None:
        cfg["optimizer"] = section
    _optimizer_flags(cell, cfg)
    return cfg


def _zero_section(cell: Cell) -> dict[str, Any]:
    """The "zero_optimization" section: the stage, its communication settings and where state is offloaded."""
    zero: dict[str, Any] = {"stage": cell.zero_stage}
    if cell.zero_stage >= 1:
        # Overlap and contiguous buffers are DeepSpeed's recommended settings for throughput.
        zero.update(overlap_comm=cell.zero_stage >= 2, contiguous_gradients=cell.zero_stage >= 2)
    if cell.offload in (Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if cell.offload == Offload.OPTIMIZER_PARAMS:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if cell.offload == Offload.NVME:
        zero.update(_nvme_offload(cell))
    if cell.zero_stage == 3:
        # Gather weights for save: not needed to benchmark, and it costs a full-model gather.
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    return zero


def _nvme_offload(cell: Cell) -> dict[str, Any]:
    """ZeRO-Infinity's keys of the "zero_optimization" section: optimizer state and parameters swap to files
    under nvme_path (the worker gives each attempt its own subfolder and removes it at the end)."""
    path = cell.nvme_path or "/tmp"
    # max_in_cpu 0: every parameter of 1 MiB or more lives on the drive (smaller ones stay in CPU
    # memory: DeepSpeed's MIN_AIO_BYTES). With DeepSpeed's 1e9 elements, a model of up to 1e9
    # parameters stayed whole in pinned CPU memory, so an nvme cell of a small model measured CPU
    # parameter offload, while a larger one went wholly to the drive (stage3.py
    # _create_param_groups_fp16_flat_cpu_memory: its first sub-group, cut at sub_group_size 1e9,
    # is a little over 1e9 and never fits).
    # Each swap buffer must hold the largest weight's partition (swap_in asserts "More elements ...
    # than buffer size"): DeepSpeed's 1e8 elements is less than a 7B Llama's embedding (32000 x 4096)
    # on one GPU.
    largest = -(-(presets.largest_weight(cell.model) or 0) // max(cell.ranks, 1))
    return {
        "offload_optimizer": {"device": "nvme", "nvme_path": path, "pin_memory": True, "buffer_count": 4},
        "offload_param": {
            "device": "nvme",
            "nvme_path": path,
            "pin_memory": True,
            "buffer_count": 5,
            "buffer_size": max(100_000_000, largest),
            "max_in_cpu": 0,
        },
        # Release every parameter after its use. A parameter read from the drive holds one of the
        # buffer_count pinned swap buffers until ZeRO-3 releases it, and the default reuse distance
        # (1e9 elements) keeps each parameter whose next use is that close in the recorded trace
        # (partitioned_param_coordinator.py __params_to_release, from the second step on). At 1.1B with
        # gradient checkpointing that is layer 15 onwards, 7 swapped weights a layer against 5 buffers:
        # layer 15's first five held them all and its up_proj found none ("Not enough buffers 0 for
        # swapping 1", partitioned_param_swapper.py swap_in; DeepSpeed issue #3062). With nothing kept,
        # the buffers hold the weights in use and those the NVMe prefetcher reads ahead, which takes only
        # free ones. Costs a second read from the drive of the weights that backward uses again soon after
        # forward.
        "stage3_max_reuse_distance": 0,
    }


def _precision_section(cell: Cell) -> dict[str, Any]:
    """The "bf16" or "fp16" section that sets the cell's precision; none for fp32."""
    if cell.precision == "bf16":
        return {"bf16": {"enabled": True}}
    if cell.precision == "fp16":
        # Dynamic loss scaling; overflow steps are skipped by DeepSpeed and counted by the worker.
        return {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,
                "initial_scale_power": 16,
                "loss_scale_window": 1000,
                "hysteresis": 2,
                "min_loss_scale": 1,
            }
        }
    return {}


# == A user's config: the tables ==============================================================
# A key's spec is a type name ("int?" also allows null), a tuple of allowed values, or a nested
# section (a dict). A section holding OPEN takes keys beyond those listed (optimizer kwargs, say).
Spec = Union[str, tuple, dict]
OPEN = "*"
MAP: dict[str, Spec] = {OPEN: "any"}  # a section DeepSpeed hands on whole; its keys are not checked here

_TYPE_WORDS = {
    "bool": "true or false",
    "int": "a whole number",
    "number": "a number",
    "str": "a string",
    "list": "a list",
    "any": "any value",
}


def _spec(v: Any) -> Any:
    """A generated table entry as a spec: JSON lists of allowed values become tuples."""
    if isinstance(v, list):
        return tuple(v)
    if isinstance(v, dict):
        return {k: _spec(s) for k, s in v.items()}
    return v


_KEYS = json.loads(Path(__file__).with_name("dsconfig_keys.json").read_text())
DS_VERSION: str = _KEYS["deepspeed"]  # the DeepSpeed release the tables were generated from

# -- optimizer and scheduler: kwargs, which DeepSpeed hands to the class it builds ----------------
# DeepSpeed's own optimizers (runtime/config.py DEEPSPEED_OPTIMIZERS): matched case-insensitively.
DS_OPTIMIZERS: tuple[str, ...] = tuple(_KEYS["optimizers"])
# Any other type is looked up with getattr(torch.optim, type): case-sensitive. torch 2.13's list.
TORCH_OPTIMIZERS = (
    "Adadelta",
    "Adafactor",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "ASGD",
    "LBFGS",
    "Muon",
    "NAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "SGD",
    "SparseAdam",
)
ONEBIT = tuple(name for name, spec in OPTIMIZERS.items() if spec.onebit)
_CLASS_NAMES = {  # class names people write as the type, and the type that makes DeepSpeed build that class
    "fusedadam": 'write "Adam" (DeepSpeed builds FusedAdam for it) ',
    "cpuadam": 'write "Adam" with zero_optimization.offload_optimizer (DeepSpeed then builds DeepSpeedCPUAdam) ',
    "deepspeedcpuadam": 'write "Adam" with zero_optimization.offload_optimizer (DeepSpeed then builds '
    "DeepSpeedCPUAdam) ",
    "fusedlamb": 'write "Lamb" (DeepSpeed builds FusedLamb for it) ',
}  # engine asserts "not compatible with ZeRO"
OPTIMIZER_PARAMS: dict[str, Spec] = {
    OPEN: "any",  # passed to the optimizer's constructor; the listed ones are typed (and found when misplaced)
    "lr": "number",
    "betas": "list",
    "eps": "number",
    "weight_decay": "number",
    "bias_correction": "bool",
    "amsgrad": "bool",
    "torch_adam": "bool",
    "adam_w_mode": "bool",
    "fp32_optimizer_states": "bool",
    "max_coeff": "number",
    "min_coeff": "number",
    "freeze_step": "int",
    "cuda_aware": "bool",
    "comm_backend_name": "str",
    "var_freeze_step": "int",
    "var_update_scaler": "int",
    "local_step_scaler": "int",
    "local_step_clipper": "int",
}
OPTIMIZER: dict[str, Spec] = {"type": "str", "params": OPTIMIZER_PARAMS, "legacy_fusion": "bool"}
SCHEDULER: dict[str, Spec] = {
    "type": "str",
    "params": {
        OPEN: "any",
        "warmup_min_lr": "number",
        "warmup_max_lr": "number",
        "warmup_num_steps": "int",
        "warmup_type": "str",
        "total_num_steps": "int",
        "last_batch_iteration": "int",
    },
}

# -- what the generated tables leave open ---------------------------------------------------------
# Keys whose type DeepSpeed's default does not state (None, or a section it hands on), set here.
# tests/test_dsconfig_check.py checks that each names a key DeepSpeed reads and that none is left open.
_TYPES: dict[tuple, Spec] = {
    ("train_batch_size",): "int?",
    ("train_micro_batch_size_per_gpu",): "int?",
    ("gradient_accumulation_steps",): "int?",
    ("steps_per_print",): "int?",
    ("vocabulary_size",): "int?",
    ("communication_data_type",): "str?",
    ("log_level",): "str?",
    # DeepSpeed's default is "fp32", but it reads the key as communication_data_type, null included.
    ("seq_parallel_communication_data_type",): "str?",
    ("activation_checkpointing", "number_checkpoints"): "int?",
    ("flops_profiler", "output_file"): "str?",
    ("data_types", "grad_accum_dtype"): "str?",
    ("data_types", "param_dtype"): "str?",
    ("data_types", "buffer_dtype"): "str?",
    ("torch_autocast", "dtype"): "str?",
    ("torch_autocast", "lower_precision_safe_modules"): "list?",
    ("optimizer",): OPTIMIZER,
    ("scheduler",): SCHEDULER,
    # Sections handed on whole to subsystems this harness does not use (datastates_ckpt's default
    # is False, but it is a section).
    **{
        (k,): MAP
        for k in (
            "amp",
            "compression_training",
            "autotuning",
            "elasticity",
            "sparse_attention",
            "pipeline",
            "progressive_layer_drop",
            "curriculum_learning",
            "data_efficiency",
            "checkpoint",
            "nebula",
            "datastates_ckpt",
            "weight_quantization",
            "tensor_parallel",
            "expert_parallel",
        )
    },
}
# Top-level keys DeepSpeedConfig does not ask for: read by deepspeed.initialize (mesh setup), or
# only when another section enables them (quantize_training, with compression).
_ELSEWHERE: dict[str, Spec] = {"sequence_parallel_size": "int", "data_parallel_size": "int", "quantize_training": MAP}


def _schema() -> dict[str, Spec]:
    schema = {**_spec(_KEYS["schema"]), **_ELSEWHERE}
    for path, spec in _TYPES.items():
        node = schema
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = spec
    return schema


# Every key DeepSpeed reads, by section: SCHEMA["zero_optimization"]["offload_param"]["device"], ...
SCHEMA: dict[str, Spec] = _schema()
ZERO: dict[str, Spec] = SCHEMA["zero_optimization"]
ZERO_ALIASES: dict[str, str] = _KEYS["zero_aliases"]  # field name -> alias (the stage3_* spelling most configs use)
DEVICES: tuple = ZERO["offload_optimizer"]["device"]  # OffloadDeviceEnum: none, cpu, nvme (case-sensitive)
STAGES: tuple = ZERO["stage"]  # ZeroStageEnum

# Sections DeepSpeed builds pydantic models from: an unknown key there stops DeepSpeed at start-up, and
# an "auto" value is dropped for the default. Everywhere else DeepSpeed reads keys one by one (dict.get):
# an unknown key is ignored without a word, and "auto" is taken as the value.
_PYDANTIC = {tuple(p) for p in _KEYS["pydantic"]}

# Deprecated spellings DeepSpeed still accepts (or, for cpu_offload_use_pin_memory, drops), and what to write
# instead (the zero_optimization ones are the fields its model marks deprecated: a test keeps them in line).
DEPRECATED = {
    ("zero_optimization", "cpu_offload"): 'use zero_optimization.offload_optimizer: {"device": "cpu"}',
    ("zero_optimization", "cpu_offload_param"): 'use zero_optimization.offload_param: {"device": "cpu"}',
    (
        "zero_optimization",
        "cpu_offload_use_pin_memory",
    ): "DeepSpeed ignores it: set pin_memory inside offload_optimizer / offload_param",
    (
        "zero_optimization",
        "stage3_gather_fp16_weights_on_model_save",
    ): "use zero_optimization.stage3_gather_16bit_weights_on_model_save",
    ("bfloat16",): "rename it to bf16 (DeepSpeed reads bfloat16 only when bf16 is absent)",
}

# Names people use that the tables cannot place by themselves.
HINTS = {
    "zero_stage": "zero_optimization.stage",
    "zero": "zero_optimization",
    "gradient_checkpointing": "activation_checkpointing (DeepSpeed's), or zerobench's grad_ckpt axis for the model",
    "max_grad_norm": "gradient_clipping",
    "thread_count": "aio.intra_op_parallelism",
    "micro_batch_size": "train_micro_batch_size_per_gpu",
    "batch_size": "train_micro_batch_size_per_gpu",
    "grad_accum": "gradient_accumulation_steps",
}

# Where the HF Trainer fills in "auto" (transformers integrations/deepspeed.py, HfTrainerDeepSpeedConfig
# trainer_config_process and trainer_config_finalize), and what resolve() fills in from the cell in its
# place: the cell plays the TrainingArguments (Trainer defaults where a cell has no such setting:
# max_grad_norm 1.0, Adam betas (0.9, 0.999), eps 1e-8, weight decay 0, no warmup).
TRAINER_DEFAULTS = {
    "max_grad_norm": 1.0,
    "adam_betas": [0.9, 0.999],
    "adam_epsilon": 1e-8,
    "weight_decay": 0.0,
    "warmup_steps": 0,
}


def _auto_values(cell: Cell) -> dict[tuple, Any]:
    t = TRAINER_DEFAULTS
    out: dict[tuple, Any] = {
        ("train_micro_batch_size_per_gpu",): cell.micro_batch,
        ("gradient_accumulation_steps",): cell.grad_accum,
        ("train_batch_size",): cell.micro_batch * cell.grad_accum * cell.ranks,
        ("gradient_clipping",): t["max_grad_norm"],
        ("optimizer", "params", "lr"): cell.lr,
        ("optimizer", "params", "betas"): t["adam_betas"],
        ("optimizer", "params", "eps"): t["adam_epsilon"],
        ("optimizer", "params", "weight_decay"): t["weight_decay"],
        ("scheduler", "params", "warmup_min_lr"): 0,
        ("scheduler", "params", "warmup_max_lr"): cell.lr,
        # DeepSpeed's WarmupLR refuses 0 steps; the Trainer fills max(1, its warmup steps).
        ("scheduler", "params", "warmup_num_steps"): max(1, t["warmup_steps"]),
        ("scheduler", "params", "total_num_steps"): cell.warmup_steps + cell.measured_steps,
        ("fp16", "enabled"): cell.precision == "fp16",
        ("bf16", "enabled"): cell.precision == "bf16",
        ("bfloat16", "enabled"): cell.precision == "bf16",
    }
    hidden = (presets.shape(cell.model) or {}).get("hidden_size")
    if isinstance(hidden, int):  # trainer_config_finalize sizes these to the model
        out[("zero_optimization", "reduce_bucket_size")] = hidden * hidden
        out[("zero_optimization", "stage3_prefetch_bucket_size")] = int(0.9 * hidden * hidden)
        out[("zero_optimization", "stage3_param_persistence_threshold")] = 10 * hidden
    return out


_AUTO_OK = frozenset(_auto_values(Cell()).keys()) | {
    ("zero_optimization", "reduce_bucket_size"),
    ("zero_optimization", "stage3_prefetch_bucket_size"),
    ("zero_optimization", "stage3_param_persistence_threshold"),
}
_AUTO_DEFAULTS = {  # DeepSpeed's defaults for the keys HF-style configs most often leave "auto"
    ("zero_optimization", "reduce_bucket_size"): 500_000_000,
    ("zero_optimization", "stage3_prefetch_bucket_size"): 50_000_000,
    ("zero_optimization", "stage3_param_persistence_threshold"): 100_000,
    ("zero_optimization", "offload_optimizer", "device"): "none",
    ("zero_optimization", "offload_param", "device"): "none",
    ("fp16", "enabled"): False,
    ("bf16", "enabled"): False,
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


# == A user's config: loading and checking ====================================================
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
    """Parse and check DeepSpeed config text; raise ConfigError listing every problem."""
    try:
        cfg = json.loads(text)
    except RecursionError:
        cfg = _TOO_DEEP
    except json.JSONDecodeError as e:
        fix = next((h for prefix, h in _JSON_HINTS if e.msg.startswith(prefix)), "fix the JSON syntax there")
        raise ConfigError(
            [
                Problem(
                    file,
                    "",
                    f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
                    fix + " (zerobench reads strict JSON, not DeepSpeed's hjson)",
                    e.lineno,
                )
            ]
        ) from None
    if cfg is _TOO_DEEP or _depth(cfg) > MAX_DEPTH:  # before the walks below, which recurse
        raise ConfigError(
            [
                Problem(
                    file,
                    "",
                    f"nests deeper than {MAX_DEPTH} levels",
                    "a DeepSpeed config nests a few levels (zero_optimization.offload_optimizer.device); "
                    "check the brackets",
                )
            ]
        )
    if not isinstance(cfg, dict):
        raise ConfigError(
            [
                Problem(
                    file,
                    "",
                    f"expected a JSON object of DeepSpeed settings, got {_json_type(cfg)}",
                    "see matrices/ds_configs/zero2_offload.json",
                    1,
                )
            ]
        )
    lines, dups = _key_lines(text)
    report = _Report(file, lines)
    for path, first, again in dups:
        report.problems.append(
            Problem(
                file,
                _fmt(path),
                f"key given twice (lines {first} and {again}); DeepSpeed refuses duplicate keys",
                "keep one of them",
                again,
            )
        )
    _check(cfg, report)
    if report.problems:
        raise ConfigError(sorted(report.problems, key=lambda p: p.line or 0))
    return cfg


_TOO_DEEP = object()  # json.loads gave up (RecursionError)


def _depth(v: Any) -> int:
    """How deep a parsed JSON value nests, without recursion."""
    deepest, todo = 0, [(v, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            todo += [(x, d + 1) for x in (v.values() if isinstance(v, dict) else v)]
    return deepest


def load(path: str | os.PathLike) -> dict:
    """Read and check a DeepSpeed JSON config file; raise ConfigError listing every problem in it."""
    return loads(read_text(path, "DeepSpeed config", "matrices/ds_configs/zero2_offload.json"), str(path))


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
    return {
        bool: "a boolean",
        str: "a string",
        int: "a number",
        float: "a number",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }.get(type(v), type(v).__name__)


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
    elif isinstance(v, str) and _is_number(v) and not isinstance(spec, tuple) and spec.rstrip("?") in ("int", "number"):
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
                report.add(
                    p,
                    f"the boolean form is deprecated (DeepSpeed reads {json.dumps(v)} as stage {int(v)})",
                    f'write "zero_optimization": {{"stage": {int(v)}}}',
                )
            elif not (v is None and sub == MAP):
                report.add(p, f"expected an object of settings, got {json.dumps(v)}")
        elif not _type_ok(v, sub):
            _type_problem(p, v, sub, report)
    if spec is ZERO:
        for name, alias in ZERO_ALIASES.items():
            if name in node and alias in node:
                report.add(
                    path + (name,),
                    f"set twice, as {name!r} and as its alias {alias!r}; DeepSpeed refuses that",
                    f"keep {alias!r} only",
                )


def _auto_problem(path: tuple, report: _Report) -> None:
    if path[:-1] in _PYDANTIC:
        default = json.dumps(_AUTO_DEFAULTS[path]) if path in _AUTO_DEFAULTS else "its default"
        effect = f"DeepSpeed drops it and uses {default}"
    else:
        effect = 'DeepSpeed takes the string "auto" as the value'
    report.add(
        path,
        f'"auto" here is not one the HF Trainer fills in, so neither does zerobench: {effect}',
        'write the value to measure ("auto" is resolved for batch sizes, gradient_clipping, fp16/bf16 '
        "enabled, the optimizer's lr/betas/eps/weight_decay, the WarmupLR/WarmupDecayLR scheduler's "
        "parameters and the three ZeRO bucket sizes)",
    )


def _unknown(path: tuple, spec: dict, cfg: dict, report: _Report) -> None:
    key, parent = path[-1], path[:-1]
    here = "at the top level" if not parent else f"in {_fmt(parent)}"
    effect = "DeepSpeed stops on it at start-up" if parent in _PYDANTIC else "DeepSpeed ignores it, so it has no effect"
    elsewhere = sorted(
        (c for c in _WHERE_VALID.get(key, []) if c != path and not _deprecated(c)),
        key=lambda c: (-_common(c, parent), not _has(cfg, c[:-1]), len(c), c),
    )
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
            report.add(
                path,
                f'{name} has no device; DeepSpeed\'s default is "none", so nothing is offloaded',
                'add "device": "cpu" (or "nvme" with nvme_path), or remove the section',
            )
        if device == "nvme" and not sec.get("nvme_path"):
            report.add(
                path + ("device",),
                'device "nvme" needs an nvme_path',
                'add "nvme_path": "/local_nvme" (a directory on a fast local NVMe drive)',
            )
        if device not in ("cpu", "nvme") or stage is None:
            continue
        if name == "offload_optimizer" and stage == 0:
            report.add(
                path,
                "offload_optimizer needs ZeRO stage 1, 2 or 3; at stage 0 there is no partitioned "
                "optimizer state to offload",
                "set zero_optimization.stage to 1, 2 or 3, or remove it",
            )
        if name == "offload_param" and stage != 3:
            report.add(
                path,
                f"offload_param works only at ZeRO stage 3; at stage {stage} DeepSpeed ignores it and the "
                "parameters stay on the GPU",
                "set zero_optimization.stage to 3, or remove offload_param",
            )
        if name == "offload_optimizer" and device == "nvme" and stage in (1, 2):
            report.add(
                path + ("device",),
                f"offload_optimizer swaps to NVMe only at ZeRO stage 3; at stage {stage} "
                "DeepSpeed keeps the optimizer state in CPU memory instead",
                'write "device": "cpu" (what runs), or set zero_optimization.stage to 3',
            )
    ratio = _section(zero, "offload_optimizer").get("ratio", 1.0)
    if _type_ok(ratio, "number") and ratio < 1.0 and stage not in (3, None):
        report.add(
            ("zero_optimization", "offload_optimizer", "ratio"),
            "partial optimizer offload (ratio < 1) is only for ZeRO stage 3; DeepSpeed stops on it",
            "set ratio to 1.0, or zero_optimization.stage to 3",
        )
    if stage is not None:
        _offload_axis_problem(zero, stage, report)

    bf16 = _section(cfg, "bf16") if "bf16" in cfg else _section(cfg, "bfloat16")
    if _section(cfg, "fp16").get("enabled") is True and bf16.get("enabled") is True:
        report.add(
            ("fp16", "enabled"),
            "fp16 and bf16 are both enabled; DeepSpeed refuses to run both",
            "keep one: set the other's enabled to false",
        )

    if "optimizer" in cfg and isinstance(cfg["optimizer"], dict):
        _optimizer_semantics(cfg["optimizer"], stage, report)


def _optimizer_semantics(opt: dict, stage: int | None, report: _Report) -> None:
    kind = opt.get("type")
    if "type" not in opt:
        report.add(
            ("optimizer",), 'the optimizer section has no "type"; DeepSpeed ignores it', 'add "type", e.g. "AdamW"'
        )
    elif isinstance(kind, str) and kind != "auto":
        if kind.lower() not in DS_OPTIMIZERS and kind not in TORCH_OPTIMIZERS:
            names = {n.lower(): n for n in TORCH_OPTIMIZERS} | {n: n for n in DS_OPTIMIZERS}
            close = difflib.get_close_matches(kind.lower(), list(names), n=1, cutoff=0.75)
            hint = _CLASS_NAMES.get(kind.lower()) or (f"did you mean {names[close[0]]!r}? " if close else "")
            report.add(
                ("optimizer", "type"),
                f"unknown optimizer type {kind!r}: neither a DeepSpeed optimizer "
                "nor a torch.optim class (those are case-sensitive)",
                f"{hint}DeepSpeed's: {', '.join(DS_OPTIMIZERS)}",
            )
        elif kind.lower() in ONEBIT and stage not in (0, None):
            report.add(
                ("optimizer", "type"),
                f"{kind} does not run under ZeRO; DeepSpeed stops on it",
                "set zero_optimization.stage to 0",
            )
    params = _section(opt, "params")
    if "max_grad_norm" in params:
        report.add(
            ("optimizer", "params", "max_grad_norm"),
            "DeepSpeed refuses max_grad_norm as an optimizer parameter",
            "use the top-level gradient_clipping",
        )


# -- describing and resolving -----------------------------------------------------------------
# DeepSpeed's optimizer type -> the zerobench optimizer it builds (Adam/AdamW depend on more: _built_optimizer).
_OPTIMIZER_NAMES = {
    spec.ds_section["type"].lower(): name
    for name, spec in OPTIMIZERS.items()
    if spec.ds_section and spec.ds_section["type"].lower() not in ("adam", "adamw")
}

# Where a config keeps (the optimizer state, the parameters) between steps, as DeepSpeed runs it ("none":
# on the GPU) -> the offload axis value that says so. "nvme" is ZeRO-Infinity: both off the GPU, at least
# one on the drive (the memory estimate counts neither on the GPU, nor on the host). A placement not
# listed has no axis value, and the rules and the estimate read the axis value: check() refuses it.
OFFLOAD_AXIS: dict[tuple[str, str], str] = {
    ("none", "none"): "none",
    ("cpu", "none"): "optimizer",
    ("cpu", "cpu"): "optimizer+params",
    ("nvme", "nvme"): "nvme",
    ("nvme", "cpu"): "nvme",
    ("cpu", "nvme"): "nvme",
}


def _device(zero: dict, name: str, deprecated: str) -> str:
    sec = zero.get(name)
    if isinstance(sec, dict):
        return sec.get("device", "none")
    return "cpu" if zero.get(deprecated) is True else "none"


def _placement(zero: dict, stage: int) -> tuple[str, str]:
    """(optimizer state, parameters): "none", "cpu" or "nvme", as DeepSpeed runs the config."""
    opt = _device(zero, "offload_optimizer", "cpu_offload") if stage >= 1 else "none"
    if opt == "nvme" and stage < 3:
        opt = "cpu"  # stage_1_and_2.py offloads to CPU memory for any device but none
    return opt, _device(zero, "offload_param", "cpu_offload_param") if stage == 3 else "none"


def _offload_axis_problem(zero: dict, stage: int, report: _Report) -> None:
    opt, params = placement = _placement(zero, stage)
    if placement in OFFLOAD_AXIS or not {opt, params} <= set(DEVICES):  # a bad device is reported already
        return
    axis = (
        f"zerobench's offload axis ({', '.join(OFFLOADS)}) has no value for it, and the rules and the memory "
        "estimate go by that value"
    )
    if opt == "none":
        report.add(
            ("zero_optimization", "offload_param"),
            f"parameters offloaded ({params}) with the optimizer state on the GPU: {axis}",
            'add "offload_optimizer": {"device": "cpu"} (then it is offload: optimizer+params, or nvme with the '
            "parameters on NVMe), or remove offload_param",
        )
    else:
        report.add(
            ("zero_optimization", "offload_optimizer"),
            f"optimizer state on {opt} with the parameters on the GPU: {axis}",
            f'add "offload_param": {{"device": "{opt}", "nvme_path": ...}} (offload: nvme), or set '
            'offload_optimizer.device to "cpu" (offload: optimizer)',
        )


def describe(cfg: dict) -> dict:
    """The axis values a checked config amounts to, as DeepSpeed would run it.

    offload is a value of the offload axis (OFFLOAD_AXIS); a config that has none raises ConfigError
    (load() and check() report it with the fix). optimizer is the zerobench name of the class DeepSpeed
    builds (engine._configure_basic_optimizer), or None when it builds none (no optimizer section) or
    one zerobench does not name (SGD, Lion, ...).
    """
    raw_zero = cfg.get("zero_optimization")
    zero = raw_zero if isinstance(raw_zero, dict) else {}
    stage = int(raw_zero) if isinstance(raw_zero, bool) else int(zero.get("stage", 0))
    placement = _placement(zero, stage)
    if placement not in OFFLOAD_AXIS:
        raise ConfigError(
            check(cfg)
            or [
                Problem(
                    "<ds_config>",
                    "zero_optimization",
                    f"no offload axis value places the optimizer state and parameters at {placement}",
                )
            ]
        )
    # engine.zero_use_cpu_optimizer looks at the device only, not the stage.
    cpu_optimizer = _device(zero, "offload_optimizer", "cpu_offload") in ("cpu", "nvme")

    bf16 = _section(cfg, "bf16") if "bf16" in cfg else _section(cfg, "bfloat16")
    fp16 = _section(cfg, "fp16")
    if fp16.get("enabled") is True:
        precision = "fp16"
    elif bf16.get("enabled") is True:
        precision = "bf16"
    elif "auto" in (fp16.get("enabled"), bf16.get("enabled")):
        precision = None  # the cell's (the Trainer takes it from its fp16/bf16 arguments)
    else:
        precision = "fp32"
    if "optimizer" in cfg:
        optimizer = _built_optimizer(_section(cfg, "optimizer"), cpu_optimizer, zenflow=bool(zero.get("zenflow")))
    else:  # resolve() adds the cell's; under optimizer offload DeepSpeed turns it into DeepSpeedCPUAdam
        optimizer = "cpuadam" if cpu_optimizer else None
    batch = {
        k: cfg[k]
        for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
        if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)
    }
    lr = _section(_section(cfg, "optimizer"), "params").get("lr")
    return {
        "zero_stage": stage,
        "offload": OFFLOAD_AXIS[placement],
        "precision": precision,
        "optimizer": optimizer,
        "micro_batch": batch.get("train_micro_batch_size_per_gpu"),
        "grad_accum": batch.get("gradient_accumulation_steps"),
        "lr": float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None,
    }


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


def resolve(cfg: dict, cell: Cell) -> dict:
    """A copy ready for deepspeed.initialize, filled in as the HF Trainer fills a config, with the cell
    in the place of the TrainingArguments: every "auto" value (_auto_values), the batch sizes the config
    leaves out, and an optimizer section when it has none (the Trainer then builds its AdamW; here the
    cell's optimizer, which under optimizer offload is DeepSpeedCPUAdam, as describe() names it).
    Values the config states are kept: describe() made them the cell's. steps_per_print is set very
    high if absent: DeepSpeed's own step log would interleave with the harness's.
    """
    out = copy.deepcopy(cfg)
    values = _auto_values(cell)
    for path in _AUTO_OK:
        node = out
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(path[-1]) == "auto":
            if path in values:
                node[path[-1]] = values[path]
            else:  # a bucket size left "auto" for a model of unknown shape: DeepSpeed's default
                del node[path[-1]]
    if cfg.get("train_batch_size", "auto") == "auto":  # a stated one: DeepSpeed derives the other two from it
        out.setdefault("train_micro_batch_size_per_gpu", cell.micro_batch)
        out.setdefault("gradient_accumulation_steps", cell.grad_accum)
    # Precision left "auto" is the cell's; a config that has only the other section gets the cell's
    # enabled, as accelerate does for the Trainer (else the own loop would run fp32 with 16-bit weights).
    if "auto" in (_section(cfg, "fp16").get("enabled"), _section(cfg, "bf16").get("enabled")):
        if cell.precision in ("fp16", "bf16") and cell.precision not in out:
            out[cell.precision] = {"enabled": True}
    if "optimizer" not in out:
        section = _optimizer_section(cell)
        if section is not None:
            out["optimizer"] = section
        _optimizer_flags(cell, out)
    # DeepSpeed's default, written out: accelerate (the HF Trainer's path) refuses a config without it.
    out.setdefault("zero_optimization", {"stage": 0})
    out.setdefault("steps_per_print", 10**9)
    return out
