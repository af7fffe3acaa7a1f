"""What DeepSpeed reads, as tables: every key and its type (bench/matrix/dsconfig_keys.json, generated from the
installed DeepSpeed's config models by `nox -s ds_tables`), and what those models cannot tell, written here: the
types their defaults leave open, the optimizer and scheduler kwargs, hints for misplaced names, advice for
deprecated keys, HF "auto" defaults, where offload places its state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

from .. import presets
from ..axes import OPTIMIZERS
from ..cells import Cell

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


_KEYS = json.loads((Path(__file__).parent.parent / "dsconfig_keys.json").read_text())

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
# tests/matrix/test_dsconfig_check.py checks that each names a key DeepSpeed reads and that none is left open.
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


def _section(d: Any, key: str) -> dict:
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, dict) else {}


# -- where a config keeps its state, and what an optimizer type builds ----------------------
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
