"""Matrix files: YAML -> a validated Matrix -> the list of Cells.

Every problem in a file is collected and reported together (file, line, key path, what is wrong,
how to fix it) before anything runs. pydantic does the type work in strict mode, so the string
"false" is not taken for a boolean and "2" is not taken for a ZeRO stage.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model

from ..host import env
from . import dsconfig, presets
from .axes import AUTO, AXIS, Offload, lora_target_modules, lora_targets_name
from .axes import AXES as AXIS_TABLE
from .cells import Adaptive, Cell, Lora, Qlora
from .problems import MAX_DEPTH, ConfigError, Problem, read_text

__all__ = [
    "Matrix", "MatrixError", "Problem", "CompareSettings", "SlurmSettings", "duration_s", "load", "loads", "expand",
    "PRESETS",
]  # fmt: skip

# Model presets the worker knows how to build (their shapes: bench/matrix/presets.py).
PRESETS = tuple(presets.PRESETS)


# The error every problem of a file travels in; MatrixError is its name here (callers and tests use it).
MatrixError = ConfigError


def _suggest(value: str, choices) -> str:
    close = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}? " if close else ""


class _Strict(BaseModel):
    # The docstring under a field is its description (docs/matrix.md is generated from them).
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, use_attribute_docstrings=True)


# A cell's defaults are the Cell's: the matrix file's fields take them from there (one place for each).
_CELL = {f.name: f.default for f in dataclasses.fields(Cell)}


def _setting_field(axis: str):
    """A fixed setting that an axis can replace: its default and description are the axis's."""
    a = AXIS[axis]
    return Field(a.default, description=a.doc)


# Sequences per optimizer step on each rank: far beyond any training batch; each divisor of the size is a
# micro-batch answer mode may plan, and finding them takes the size's square root in steps.
MAX_BATCH_SIZE = 2**20


class Batch(_Strict):
    micro: Annotated[int, Field(ge=AXIS["micro_batch"].minimum)] | Literal["auto"] = _setting_field("micro_batch")
    grad_accum: Annotated[int, Field(ge=AXIS["grad_accum"].minimum)] = _setting_field("grad_accum")
    size: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)] | None = None
    """Sequences per optimizer step on each rank (micro-batch x gradient accumulation), held where the micro-batch
    varies: each cell's accumulation is size / its micro-batch, so cells of different micro-batches train on the
    same batch. With `micro: auto` the micro-batch is searched among the divisors of size: a full run measures
    the largest that runs, answer mode (`--answer`) the largest the memory model fits and the neighbours that
    could be faster. Leave grad_accum unset beside it. At most 1,048,576 (2^20)."""


_A = {f.name: f.default for f in dataclasses.fields(Adaptive)}  # the adaptive rules' defaults, written once


class Steps(_Strict):
    """How many steps a cell runs: fixed counts, or `auto` (bench/records/adaptive.py has the rules). The keys
    after `measured` tune the adaptive rules; each applies only to the phase it names."""

    warmup: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        _CELL["warmup_steps"],
        description="Steps run but not measured (kernel autotune, allocator warm-up); auto: until step time "
        "settles (settle_window, settle_within), at most max_warmup.",
    )
    measured: Annotated[int, Field(ge=2)] | Literal["auto"] = Field(
        _CELL["measured_steps"],
        description="Steps timed; throughput is their median. auto: until the median's interval is within "
        "tolerance, at least min_steps, at most max_steps.",
    )
    max_warmup: int | None = Field(None, ge=1, description="warmup: auto: the most warmup steps (default 20).")
    min_warmup: int | None = Field(None, ge=0, description=f"warmup: auto: the fewest (default {_A['min_warmup']}).")
    settle_window: int | None = Field(
        None, ge=2, description=f"warmup: auto: how many recent step times must agree (default {_A['settle_window']})."
    )
    settle_within: float | None = Field(
        None, gt=0, lt=1, description=f"warmup: auto: ... within this fraction of their median ({_A['settle_within']})."
    )
    tolerance: float | None = Field(
        None,
        gt=0,
        lt=1,
        description=f"measured: auto: the median's interval half-width, as a fraction of it ({_A['tolerance']}).",
    )
    level: float | None = Field(
        None, gt=0, lt=1, description=f"measured: auto: the interval's confidence (default {_A['level']})."
    )
    min_steps: int | None = Field(
        None, ge=2, description=f"measured: auto: the fewest measured steps (default {_A['min_steps']})."
    )
    max_steps: int | None = Field(None, ge=2, description="measured: auto: the most measured steps (default 50).")
    max_seconds: float | None = Field(
        None,
        gt=0,
        description="auto: cap on the steps' own time, warmup and measured summed (warmup gets half); "
        "slow cells (offload at 7B) stop there and their records say so. Default: no cap.",
    )


# Which phase's `auto` each tuning key of `steps` needs.
_STEP_KEYS_FOR = {
    "warmup": ("max_warmup", "min_warmup", "settle_window", "settle_within"),
    "measured": ("tolerance", "level", "min_steps", "max_steps"),
}
DEFAULT_MAX_WARMUP, DEFAULT_MAX_STEPS = 20, 50


class LoraSettings(_Strict):
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    targets: Union[str, list[str]] = "all-linear"


class QloraSettings(_Strict):
    quant_type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    quant_storage: Literal["auto", "bf16", "fp16", "fp32", "uint8"] = "auto"


class CompareSettings(_Strict):
    """How `zerobench compare` judges this matrix's cells against a baseline (bench/judge/compare.py; the
    statistics and why these defaults: bench/stats.py). `--thresholds FILE` replaces what it names."""

    alpha: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="A noisy figure's (tokens/s, step time) interval is at 1 - 2 alpha (90%: one-sided 95% either "
        "way); it has changed when the whole interval lies beyond min_effect (bench/stats.py, the one rule of "
        "compare, the reports and answer mode; docs/comparing.md).",
    )
    min_effect: float = Field(
        0.05,
        ge=0,
        description="The relative change of a noisy figure that counts: changed when its whole interval lies beyond "
        "it; an interval that excludes no change but reaches inside it is 'not settled', shown and not flagged "
        "(TorchBench gates at 7%, Megatron at 5%).",
    )
    single_run_min_effect: float = Field(
        0.15,
        ge=0,
        description="Read so that older matrices load; it decides nothing: with one repeat on a side the interval "
        "is the noise measured on the committed runs for two measurements (bench.records.quality), and min_effect "
        "decides as for repeats.",
    )
    memory_tolerance: float = Field(
        0.01,
        ge=0,
        description="Allocator figures (peak allocated and reserved, allocated between steps) repeat to the "
        "byte with the same code and libraries: a relative change beyond this counts.",
    )
    nvml_tolerance: float = Field(
        0.02,
        ge=0,
        description="NVML's process and device peaks: sampled every 10 ms, so a short peak can be missed.",
    )
    host_rss_tolerance: float = Field(
        0.10, ge=0, description="Host RSS peak of the worker's process tree: page cache and the fork server move it."
    )
    loss_first_tolerance: float = Field(
        1e-3,
        ge=0,
        description="Absolute: the first step's loss is computed before any update, from the same seed, "
        "so it changes only when the model, data or initialisation does (either direction counts).",
    )
    loss_final_tolerance: float = Field(
        0.02,
        ge=0,
        description="Absolute: the last step's loss. The same cell ends within 0.0005 of itself across the "
        "committed runs (at most; 0.0001-0.0002 typically), so this is 40 times that, and 3.5 times below the "
        "0.07 by which ZeRO-0 ends above ZeRO-1/2 (docs/loss-parity.md). Also the loss-parity tolerance of reports.",
    )
    min_compared: float = Field(
        0.5,
        ge=0,
        le=1,
        description="The share of the baseline's cells that ran which must be compared (measured on both sides, "
        "on one schedule and one environment) for a comparison to count: below it `zerobench compare` exits 3, "
        "not 0, since a gate that compared too little (shards with no cell in common, a run of 4 of 4,320 cells, "
        "another GPU) says nothing about the rest. 0 turns the check off.",
    )


def _nonempty(v: list) -> list:
    if not v:
        raise ValueError("an axis needs at least one value")
    if len(set(map(repr, v))) != len(v):
        raise ValueError("an axis lists the same value twice")
    return v


def _value_type(axis, pick: bool = False):
    """The strict type of one value of an axis. Booleans stay `bool` (so a quoted "false" is reported
    as such, with its fix), other listed values a Literal (the error names the allowed ones, and a
    near miss gets a suggestion); open axes their type, with its minimum."""
    if axis.values:
        bools = any(isinstance(v, bool) for v in axis.values)
        rest = tuple(v for v in axis.values if not isinstance(v, bool))
        t = Union[bool, Literal[rest]] if bools and rest else bool if bools else Literal[rest]
    else:
        t = Annotated[axis.type, Field(ge=axis.minimum)] if axis.minimum is not None else axis.type
        if axis.auto:
            t = Union[t, Literal["auto"]]
    # In include/exclude an absent key already means "not picked", so None is no value there.
    return Union[t, None] if axis.none_allowed and not pick else t


def _axes_field(axis):
    listed = Annotated[list[_value_type(axis)], AfterValidator(_nonempty)]
    if axis.setting:
        return listed | None, Field(None, description=f"{axis.label} values to compare; unset: {axis.setting} only.")
    return listed, [axis.default]


def _one_or_many(t):
    return Union[t, list[t]]


# Both models are built from bench.matrix.axes.AXES: one field per axis, in its order.
Axes = create_model(
    "Axes",
    __base__=_Strict,
    __doc__="The values each axis takes; the matrix crosses them.",
    **{a.name: _axes_field(a) for a in AXIS_TABLE},
)


class _PickBase(_Strict):
    def values(self) -> dict[str, list]:
        out = {}
        for k in AXES:
            v = getattr(self, k)
            if v is not None:
                out[k] = v if isinstance(v, list) else [v]
        return out


Pick = create_model(
    "Pick",
    __base__=_PickBase,
    __doc__="A partial assignment of axis values, used by include and exclude.",
    **{a.name: (_one_or_many(_value_type(a, pick=True)) | None, None) for a in AXIS_TABLE},
)


_DURATION_RE = re.compile(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*")


def duration_s(text: str) -> float:
    """Seconds from "90", "90s", "20m", "1h", "1h30m"; ValueError naming the forms otherwise."""
    m = _DURATION_RE.fullmatch(text)
    if not text.strip() or m is None or not any(m.groups()):
        raise ValueError(f"{text!r}: a duration such as 90s, 20m, 1h or 1h30m")
    h, mins, sec = (float(x) if x else 0.0 for x in m.groups())
    return h * 3600 + mins * 60 + sec


def _time_limit(value: str | int) -> str:
    text = str(value)
    if text.strip().isdigit():  # sbatch reads a bare number as minutes, zerobench's durations as seconds
        raise ValueError(f"{text!r} has no unit: write {text.strip()}m for minutes (or 90s, 2h, 1h30m)")
    if duration_s(text) < 60:
        raise ValueError(f"{text!r} is under a minute: Slurm keeps time limits in whole minutes; give 1m or more")
    return text


def _slurm_mem(text: str) -> str:
    if not re.fullmatch(r"[1-9]\d*[KMGT]?", text):
        raise ValueError(f"{text!r} is not a Slurm memory size: a whole number with K, M, G or T, e.g. 64G or 500M")
    return text


# sbatch options zerobench sets for each job itself (docs/slurm.md); `slurm.sbatch` may not give them.
SBATCH_SET = frozenset(
    "nodes ntasks ntasks-per-node cpus-per-task gpus gpus-per-node gpus-per-task gres time partition account qos mem "
    "signal requeue no-requeue output error array job-name open-mode wrap chdir".split()
)


def _sbatch_extra(options: dict) -> dict:
    taken = sorted(k for k in options if k.replace("_", "-") in SBATCH_SET)
    if taken:
        raise ValueError(
            f"zerobench sets {', '.join(taken)} for each job itself: use the slurm keys (partition, account, qos, "
            "time_limit, mem_per_node, cpus_per_gpu), or leave it out"
        )
    return options


class SlurmSettings(_Strict):
    """Where `zerobench run --executor slurm` submits this matrix's cells: one Slurm job per cell attempt, a
    node per node of the cell (docs/slurm.md). Each key is also a `zerobench run` option (--partition,
    --account, --qos, --time-limit, --mem-per-node, --max-jobs, --slurm-folder), which overrides it."""

    partition: str | None = None
    """The partition (sbatch --partition), whose nodes' GRES, CPUs and memory the rules judge cells by (sinfo).
    Default: the cluster's default partition."""
    account: str | None = None
    """The account the jobs are charged to (sbatch --account)."""
    qos: str | None = None
    """The quality of service (sbatch --qos)."""
    time_limit: Annotated[Union[str, int], AfterValidator(_time_limit)] | None = None
    """Each job's time limit (sbatch --time), e.g. 30m, 2h, 1h30m; Slurm keeps whole minutes. A cell still
    running as it nears it is stopped and recorded as timeout. Default: the cell's timeout_s plus 10 minutes,
    so the cell's own limit stops it first."""
    mem_per_node: Annotated[str, AfterValidator(_slurm_mem)] | None = None
    """Host memory per node (sbatch --mem), e.g. 256G: the processes of a node's ranks, offloaded optimizer
    state and parameters. Default: the cluster's (DefMemPerCPU, DefMemPerGPU or DefMemPerNode)."""
    cpus_per_gpu: int | None = Field(None, ge=1)
    """CPUs per rank (the job's --cpus-per-task is this times its ranks per node): CPU offload's optimizer
    step runs on them. Default: a node's CPUs over its GPUs; on nodes without GPUs, 1."""
    max_jobs: int | None = Field(None, ge=1)
    """How many jobs zerobench keeps in Slurm at once (pending or running); the next attempt is submitted when
    one ends, so an out-of-memory end can still imply the cells behind it. Default: the partition's GPUs, or
    its nodes where they have none."""
    folder: str | None = None
    """A folder this host and every node share: each run's submitit folder (job scripts, pickles, the jobs'
    stdout and stderr) is a fresh folder in it. Default: `slurm/` in the logs folder."""
    sbatch: Annotated[dict[str, Union[str, int, bool]], AfterValidator(_sbatch_extra)] = {}
    """Further sbatch options for every job, as `option: value` (e.g. {constraint: h100, exclusive: true});
    not those zerobench sets itself (nodes, GPUs, CPUs, time, memory, requeue, output, signal...)."""


DEFAULT_MAX_CELLS = 50_000  # the largest committed matrix has a few thousand; planning costs ~0.1 ms a cell


class Matrix(_Strict):
    """A matrix file. Fixed settings apply to every cell; axes are crossed."""

    name: str | None = None
    """The matrix's name: its default results file (results/NAME.jsonl) and report; default: the file's name."""
    description: str = ""
    """What the matrix is for, in words (free text)."""
    model: str = _CELL["model"]
    """A preset (llama-tiny, llama-small, llama-1b, llama-7b, llama-13b: a shape built with random weights, no
    download) or a local Hugging Face model folder."""
    data: str = _CELL["data"]
    """builtin (a deterministic, learnable token source, the same on every machine) or a local .txt or .jsonl
    file (a "text" field per line), tokenized with `tokenizer`."""
    tokenizer: str | None = None
    """A local tokenizer folder, for `data` from a file."""
    seq_len: int = Field(_CELL["seq_len"], ge=8)
    """Tokens per sequence."""
    batch: Batch = Batch()
    """The micro-batch and gradient accumulation of every cell, unless the micro_batch or grad_accum axis lists
    values."""
    steps: Steps = Steps()
    """Warmup and measured steps per cell, fixed or auto."""
    repeats: int = Field(
        1,
        ge=1,
        description="Process-level repeats of every runnable cell, interleaved (each cell's first repeat, then "
        "each one's second, ...): each its own record with its `repeat` index. Repeats are the samples "
        "reports and `zerobench compare` estimate run-to-run noise from; one repeat cannot tell a change "
        "from noise. `zerobench run --repeats N` overrides.",
    )
    compare: CompareSettings = CompareSettings()
    """How `zerobench compare` judges these cells against a baseline."""
    lr: float = Field(_CELL["lr"], gt=0)
    """Learning rate of every cell's optimizer."""
    seed: int = _CELL["seed"]
    """Seed of the initial weights, the data and the adapters."""
    gpus: int = Field(_CELL["gpus"], ge=1)
    """GPUs (ranks) per node of every cell; on a CPU host, N gloo ranks."""
    nodes: int = Field(_CELL["nodes"], ge=1)
    """Nodes every cell spans, each with `gpus` ranks (gpus x nodes ranks in all, torchrun on each node with the
    rendezvous on the first). On one host (`--executor local`) the nodes run side by side on 127.0.0.1, which
    only a CPU host does (a test of the multi-node path, not a multi-node measurement)."""
    timeout_s: float = Field(_CELL["timeout_s"], gt=0)
    """Wall-clock limit of one cell attempt: past it the cell is stopped and recorded `timeout`."""
    nvme_path: str | None = None
    """Folder on a local NVMe drive, for cells with offload: nvme (it must exist)."""
    attn: Literal["sdpa", "eager", "flash_attention_2"] = _CELL["attn"]
    """transformers' attention implementation."""
    axes: Axes = Axes()
    """The values each axis takes; the matrix crosses them (the axes table)."""
    lora: LoraSettings = LoraSettings()
    """LoRA settings of lora and qlora cells, unless a lora_* axis lists values."""
    qlora: QloraSettings = QloraSettings()
    """4-bit settings of qlora cells, unless a qlora_* axis lists values."""
    include: list[Pick] = []
    """Extra cells: each entry a set of axis values (a value or a list each); axes it leaves out take every
    value of the matrix."""
    exclude: list[Pick] = []
    """Cells matching an entry are dropped (an entry that matches nothing is an error)."""
    slurm: SlurmSettings = SlurmSettings()
    """Where `--executor slurm` submits the cells (partition, account, QoS, time limit...); ignored by the other
    executors and no part of any cell."""
    max_cells: int = Field(
        DEFAULT_MAX_CELLS,
        ge=1,
        description="The most cells the axes and include may cross to (before exclude): a matrix past it is "
        "refused before it is expanded, as a mistyped axis can ask for millions of cells. Raise it for a "
        "matrix that is meant to be that large.",
    )


AXES = tuple(a.name for a in AXIS_TABLE)


# -- loading ----------------------------------------------------------------------------------
def _lines(text: str) -> dict[tuple, int]:
    """Map each key path in the YAML to its 1-based line, for error messages."""
    out: dict[tuple, int] = {}

    seen: set[int] = set()

    def walk(node, path):
        out.setdefault(path, node.start_mark.line + 1)
        if id(node) in seen:  # an alias: its node was walked where it was defined (and may be used 10^9 times)
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                out[path + (k.value,)] = k.start_mark.line + 1
                walk(v, path + (k.value,))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, path + (i,))

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return out
    if root is not None:
        walk(root, ())
    return out


def _fmt_loc(loc) -> str:
    s = ""
    for part in loc:
        s += f"[{part}]" if isinstance(part, int) else (f".{part}" if s else str(part))
    return s


def _problem_from_pydantic(file: str, err: dict, lines: dict) -> Problem:
    # pydantic reports each branch of a Union/Literal; strip its type tags from the path.
    loc = tuple(
        p
        for p in err["loc"]
        if isinstance(p, int)
        or not any(c in p for c in "[]()'\"")
        and p not in {"str", "int", "bool", "float", "list", "none", "function-after", "literal", "constrained-int"}
    )
    where = _fmt_loc(loc)
    line = None
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            line = lines[loc[:n]]
            break
    kind, inp = err["type"], err.get("input")
    what = err["msg"]
    fix = ""
    if kind == "extra_forbidden":
        parent_fields = _fields_at(loc[:-1])
        what = f"unknown key {loc[-1]!r}"
        fix = (_suggest(loc[-1], parent_fields) + f"allowed here: {', '.join(parent_fields)}") if parent_fields else ""
        moved = _MOVED.get(str(loc[-1])) or (f"axes.{loc[-1]}" if loc[-1] in AXES and len(loc) == 1 else None)
        if moved:
            fix = f"this belongs under {moved}"
    elif kind == "bool_type" and isinstance(inp, str):
        what = f"expected true or false, got the string {inp!r}"
        fix = (
            f"write {inp.strip().lower()} without quotes"
            if inp.strip().lower() in ("true", "false")
            else "use true or false"
        )
    elif kind in ("int_type", "float_type") and isinstance(inp, str):
        what = f"expected a number, got the string {inp!r}"
        fix = "remove the quotes"
    elif kind == "literal_error":
        what = f"{inp!r} is not allowed: {err['msg'].replace('Input should be', 'expected')}"
        names = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
        fix = _suggest(inp, names).strip() if isinstance(inp, str) else ""
    elif kind == "value_error":
        what = err["msg"].removeprefix("Value error, ")
    elif kind == "greater_than_equal":
        what = f"{inp!r} is too small: {err['msg'].replace('Input should be', 'it must be')}"
        fix = f"use {err.get('ctx', {}).get('ge')} or more"
    elif kind in ("less_than", "less_than_equal", "greater_than"):
        bound = next(iter((err.get("ctx") or {}).values()), None)
        what = f"{inp!r} is out of range: {err['msg'].replace('Input should be', 'it must be')}"
        fix = {"less_than": f"use a value below {bound}", "less_than_equal": f"use {bound} or less"}.get(
            kind, f"use a value above {bound}"
        )
    elif kind == "list_type":
        what = f"expected a list, got {inp!r}"
        fix = f"write [{inp}]" if not isinstance(inp, (dict, list)) else ""
    return Problem(file, where, what, fix, line)


# Keys people carry over from DeepSpeed configs or other tools, and where they belong here.
_MOVED = {
    "offload_optimizer": "axes.offload (values: none, optimizer, optimizer+params)",
    "offload_param": "axes.offload (value: optimizer+params)",
    "stage": "axes.zero_stage",
    "zero": "axes.zero_stage",
    "zero_optimization": "axes.zero_stage and axes.offload",
    "gradient_checkpointing": "axes.grad_ckpt",
    "bf16": "axes.precision",
    "fp16": "axes.precision",
    "train_micro_batch_size_per_gpu": "batch.micro",
    "gradient_accumulation_steps": "batch.grad_accum (or axes.grad_accum to compare several)",
    "warmup": "steps.warmup",
    "measured": "steps.measured",
    "steps_per_print": None,
    # An axis with a fixed setting behind it, written at the top level: either place is meant.
    **{a.name: f"{a.setting} (or axes.{a.name} to compare several)" for a in AXIS_TABLE if a.setting},
}


def _fields_at(loc: tuple) -> list[str]:
    model: Any = Matrix
    for part in loc:
        if isinstance(part, int):
            continue
        f = model.model_fields.get(part)
        if f is None:
            return []
        ann = f.annotation
        args = getattr(ann, "__args__", ()) or ()
        cand = [a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not cand:
            return []
        model = cand[0]
    return list(model.model_fields)


def _dedupe(problems: list[Problem], prefer: list[bool] | None = None) -> list[Problem]:
    """A Union produces one error per branch at the same place: keep one per location, in first-seen
    order, the preferred one if any. (For compile: true | max-autotune, the branch that lists the allowed
    names explains a bad string better than "expected true or false".)"""
    prefer = prefer or [False] * len(problems)
    best: dict[str, tuple[bool, Problem]] = {}
    for p, pref in zip(problems, prefer):
        if p.where not in best or (pref and not best[p.where][0]):
            best[p.where] = (pref, p)
    return [p for _, p in best.values()]


# What a matrix may expand to: aliases count each time they are used (a ten-line "billion laughs"
# expands to 10^9 values, which validation and the line-number pass would walk one by one).
MAX_VALUES = 100_000


@dataclass
class _Open:
    """A collection the YAML event stream is inside of, while _shape_problem reads it."""

    mapping: bool
    anchor: str | None
    values: int = 0  # nodes inside it so far, aliases expanded
    depth: int = 0  # deepest nesting inside it so far
    items: int = 0  # nodes directly in it (a mapping's keys and values alternate)
    part: Any = None  # the key path part of the node being read in it


def _shape_problem(text: str, file: str) -> Problem | None:
    """The first place where the YAML nests deeper than MAX_DEPTH, expands to more than MAX_VALUES values
    (aliases counted each time they are used), or contains itself. Read from the event stream, which
    needs no recursion and builds nothing, so a hostile file costs what its text costs."""
    stack = [_Open(mapping=False, anchor=None)]  # the document itself
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (values, depth) of what it names

    def problem(what: str, fix: str, ev) -> Problem:
        where = _fmt_loc(tuple(f.part for f in stack[1:] if f.part is not None))
        return Problem(file, where, what, fix, ev.start_mark.line + 1)

    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if not isinstance(ev, (yaml.NodeEvent, yaml.CollectionEndEvent)):
            continue
        if isinstance(ev, yaml.CollectionEndEvent):
            done = stack.pop()
            n, depth = done.values + 1, done.depth + 1
            if done.anchor:
                anchors[done.anchor] = (n, depth)
        else:
            top = stack[-1]
            if top.mapping and top.items % 2 == 0:
                top.part = ev.value if isinstance(ev, yaml.ScalarEvent) else "?"
            elif not top.mapping:
                top.part = top.items
            top.items += 1
            if isinstance(ev, yaml.CollectionStartEvent):
                stack.append(_Open(mapping=isinstance(ev, yaml.MappingStartEvent), anchor=ev.anchor))
                if len(stack) > MAX_DEPTH:
                    return problem(
                        f"nests deeper than {MAX_DEPTH} levels",
                        "a matrix nests a few levels (axes: {zero_stage: [0, 1]}); check the brackets",
                        ev,
                    )
                continue
            if isinstance(ev, yaml.AliasEvent):
                if any(f.anchor == ev.anchor for f in stack):
                    return problem(
                        f"the alias *{ev.anchor} is used inside the value it names",
                        "remove the alias: a value cannot contain itself",
                        ev,
                    )
                n, depth = anchors.get(ev.anchor, (1, 0))  # an unknown alias is the parser's error, next
            else:
                n, depth = 1, 0
                if ev.anchor:
                    anchors[ev.anchor] = (1, 0)
        top = stack[-1]
        top.values += n
        top.depth = max(top.depth, depth)
        if len(stack) - 1 + depth > MAX_DEPTH:
            return problem(f"nests deeper than {MAX_DEPTH} levels (through aliases)", "check the aliases here", ev)
        if sum(f.values for f in stack) > MAX_VALUES:
            return problem(
                f"expands to more than {MAX_VALUES:,} values (YAML aliases count each time they are used)",
                "write the values out; a matrix needs a few hundred at most",
                ev,
            )
    return None


def _duplicate_keys(text: str, file: str) -> list[Problem]:
    """A key given twice in one mapping (YAML loaders keep the later silently, hiding a typo'd edit)."""
    out: list[Problem] = []
    seen: set[int] = set()

    def walk(node, path):
        if id(node) in seen:  # an alias: walked where it was defined
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict = {}
            for k, v in node.value:
                key = k.value if isinstance(k, yaml.ScalarNode) else None
                if key is not None and k.tag != "tag:yaml.org,2002:merge":
                    line = k.start_mark.line + 1
                    if key in first:
                        where = _fmt_loc(path + (key,))
                        out.append(
                            Problem(
                                file,
                                where,
                                f"key {key!r} is given twice (lines {first[key]} and {line}); YAML would keep the "
                                "second silently",
                                "keep one of them",
                                line,
                            )
                        )
                    first.setdefault(key, line)
                walk(v, path + (key,))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, path + (i,))

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        walk(root, ())
    return out


def loads(text: str, file: str = "<matrix>", ds_configs: list[str] | None = None) -> Matrix:
    """Parse and validate a matrix from YAML text; raise MatrixError listing every problem.

    ds_configs (from `zerobench run --ds-config`) replaces the ds_config axis."""
    try:
        shape = _shape_problem(text, file)
        if shape:
            raise MatrixError([shape])
        dupes = _duplicate_keys(text, file)
        if dupes:
            raise MatrixError(dupes)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise MatrixError(
            [
                Problem(
                    file,
                    "",
                    f"not valid YAML: {getattr(e, 'problem', e)}",
                    "check indentation and quoting near that line",
                    line,
                )
            ]
        ) from None
    if raw is None:  # not the embedded default: an empty file is a mistake, and running 1 cell hides it
        raise MatrixError(
            [
                Problem(
                    file,
                    "",
                    "the file has no settings (it is empty or only comments)",
                    "write the matrix (see bench/matrices/smoke.yaml), or give no MATRIX to run the embedded smoke one",
                )
            ]
        )
    if ds_configs and isinstance(raw, dict):
        axes = raw.get("axes") if isinstance(raw.get("axes"), dict) else {}
        raw = {**raw, "axes": {**axes, "ds_config": list(ds_configs)}}
    if not isinstance(raw, dict):
        raise MatrixError(
            [
                Problem(
                    file,
                    "",
                    f"expected a mapping of settings, got {type(raw).__name__}",
                    "see the embedded default, bench/matrices/smoke.yaml, for the layout",
                )
            ]
        )
    lines = _lines(text)
    try:
        m = Matrix.model_validate(raw)
    except ValidationError as e:
        problems = _dedupe(
            [_problem_from_pydantic(file, err, lines) for err in e.errors()],
            prefer=[err["type"] == "literal_error" for err in e.errors()],
        )
        raise MatrixError(_dedupe(problems + _path_problems(raw, file, lines))) from None
    if m.name is None:
        m = m.model_copy(update={"name": Path(file).stem if file != "<matrix>" else "matrix"})
    problems = _semantic_problems(m, file, lines)
    if problems:
        raise MatrixError(problems)
    return m


def load(path: str | os.PathLike, ds_configs: list[str] | None = None) -> Matrix:
    example = "bench/matrices/smoke.yaml" if os.path.exists(path) else near_matrix(path)
    return loads(read_text(path, "matrix", example), str(path), ds_configs)


EMBEDDED = Path(__file__).resolve().parent.parent / "matrices"
"""The matrices shipped inside the package (the embedded default among them)."""


def near_matrix(path: str | os.PathLike) -> str:
    """The matrix file most like `path` (case ignored) among its own folder's, ./matrices/ and the embedded ones;
    the embedded default's path when none is near: what a missing path's message suggests."""
    embedded = {f"bench/matrices/{f.name}": f for f in sorted(EMBEDDED.glob("*.y*ml"))}
    folders = {Path(path).parent, Path("matrices")}
    known = [str(f) for d in folders if d.is_dir() for f in sorted(d.glob("*.y*ml"))] + list(embedded)
    by_lower = {k.lower(): k for k in known}
    near = difflib.get_close_matches(str(path).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[near[0]] if near else "bench/matrices/smoke.yaml"


_SAFE_NAME = re.compile(r"[^\w.+=@,-]+")


def _safe_name(name: str) -> bool:
    """A matrix name is a file name under results/: no separators, no '..', nothing absolute or hidden."""
    return bool(name) and len(name) <= 200 and not _SAFE_NAME.search(name) and not name.startswith(".")


def _path_problems(raw: dict, file: str, lines: dict) -> list[Problem]:
    """Model and data references, checked on the raw mapping so they are reported with type errors too."""
    out = []
    name = raw.get("name")
    if isinstance(name, str) and not _safe_name(name):
        out.append(
            Problem(
                file,
                "name",
                f"{name!r} cannot name files: results go to results/local/<name>.jsonl and logs to "
                "results/local/logs/<name>/",
                "use letters, digits and . - _ + = @ , (not starting with '.'), "
                f"e.g. {_SAFE_NAME.sub('-', name).strip('.-') or 'my-matrix'!r}",
                lines.get(("name",)),
            )
        )
    model, data = raw.get("model", "llama-tiny"), raw.get("data", "builtin")
    for key, value in (("model", model), ("data", data)):
        if isinstance(value, str) and _too_long(value):
            out.append(Problem(file, key, _TOO_LONG, "give a shorter path", lines.get((key,))))
            raw = {**raw, key: "llama-tiny" if key == "model" else "builtin"}  # said; not looked up again
    model, data = raw.get("model", "llama-tiny"), raw.get("data", "builtin")
    if isinstance(model, str) and model not in PRESETS and not Path(model).is_dir():
        out.append(
            Problem(
                file,
                "model",
                f"{model!r} is neither a preset nor a local directory",
                f"{_suggest(model, PRESETS)}presets: {', '.join(PRESETS)}; or a path to a Hugging Face"
                " model directory (config.json)",
                lines.get(("model",)),
            )
        )
    if isinstance(data, str) and data != "builtin":
        if not Path(data).exists():
            out.append(
                Problem(
                    file,
                    "data",
                    f"no such data file {data!r}",
                    "use builtin, or a local .txt/.jsonl file",
                    lines.get(("data",)),
                )
            )
        if not raw.get("tokenizer"):
            out.append(
                Problem(
                    file,
                    "tokenizer",
                    "a data file needs a local tokenizer directory",
                    "set tokenizer: path/to/tokenizer",
                    lines.get(("data",)),
                )
            )
    return out


_TOO_LONG = "a part of this path is over 255 bytes, longer than a file name can be"


def _too_long(path: str) -> bool:
    """A path the file system cannot look up (ENAMETOOLONG): said as a problem, not raised from a stat."""
    return any(len(os.fsencode(part)) > 255 for part in Path(path).parts)


def _semantic_problems(m: Matrix, file: str, lines: dict) -> list[Problem]:
    """Checks that need the whole file (cross-field) or the file system."""
    out = _path_problems(m.model_dump(), file, lines)
    for i, path in enumerate(m.axes.ds_config):
        if path is None:
            continue
        if _too_long(path):
            out.append(
                Problem(
                    file, f"axes.ds_config[{i}]", _TOO_LONG, "give a shorter path", lines.get(("axes", "ds_config"))
                )
            )
            continue
        if not Path(path).is_file():
            out.append(
                Problem(
                    file,
                    f"axes.ds_config[{i}]",
                    f"{path!r} is a folder, not a DeepSpeed config file"
                    if Path(path).is_dir()
                    else f"no such file {path!r}",
                    "paths are relative to the current directory",
                    lines.get(("axes", "ds_config", i)),
                )
            )
            continue
        try:
            dsconfig.load(path)  # a user config is checked, not trusted: DeepSpeed ignores misplaced keys
        except MatrixError as e:
            out += e.problems
    if Offload.NVME in m.axes.offload or any(Offload.NVME in (p.values().get("offload") or []) for p in m.include):
        if not m.nvme_path:
            out.append(
                Problem(
                    file,
                    "nvme_path",
                    "offload: nvme needs a folder on an NVMe drive",
                    "set nvme_path: /path/on/nvme (it must exist)",
                    lines.get(("axes", "offload")),
                )
            )
        elif not Path(m.nvme_path).is_dir():
            out.append(
                Problem(
                    file,
                    "nvme_path",
                    f"no such folder {m.nvme_path!r}",
                    "create it, or fix the path",
                    lines.get(("nvme_path",)),
                )
            )
    out += _steps_problems(m, file, lines)
    out += _batch_problems(m, file, lines)
    too_many = _size_problem(m, file, lines)
    if too_many:  # exclude and the emptiness check would expand it
        return out + [too_many]
    for i, pick in enumerate(m.exclude):
        if not any(_matches(c, pick) for c in _cross(m)):
            out.append(
                Problem(
                    file,
                    f"exclude[{i}]",
                    "matches no cell of the matrix",
                    "check the values against axes, or remove the entry",
                    lines.get(("exclude", i)),
                )
            )
    if not out and next(_cells(m), None) is None:  # the first cell says it is not empty: no whole expansion
        out.append(Problem(file, "exclude", "every cell is excluded", "loosen exclude"))
    return out


def _crossed_size(m: Matrix) -> int:
    """How many combinations _cross yields, counted without building them."""
    axes = {a.name: getattr(m.axes, a.name) or [None] if a.setting else getattr(m.axes, a.name) for a in AXIS_TABLE}
    total = math.prod(len(v) for v in axes.values())
    for pick in m.include:
        total += math.prod(len(v) for v in {**axes, **pick.values()}.values())
    return total


def _size_problem(m: Matrix, file: str, lines: dict) -> Problem | None:
    n = _crossed_size(m)
    if n <= m.max_cells:
        return None
    return Problem(
        file,
        "max_cells",
        f"the axes and include cross to {n:,} cells, more than max_cells ({m.max_cells:,})",
        f"narrow the axes (or split the matrix); if it is meant to be this large, set max_cells: {n} in the matrix",
        lines.get(("max_cells",)) or lines.get(("axes",)),
    )


def _batch_problems(m: Matrix, file: str, lines: dict) -> list[Problem]:
    """batch.size sets every cell's accumulation: no accumulation beside it, and micro-batches that divide it."""
    size = m.batch.size
    if size is None:
        return []
    out = []
    if m.batch.grad_accum != AXIS["grad_accum"].default or m.axes.grad_accum:
        where = ("axes", "grad_accum") if m.axes.grad_accum else ("batch", "grad_accum")
        out.append(Problem(file, ".".join(where), f"batch.size {size} sets the accumulation (size / micro-batch)",
                           "remove the accumulation, or batch.size", lines.get(where)))  # fmt: skip
    micros = [
        m.batch.micro,
        *(m.axes.micro_batch or []),
        *(mb for p in m.include for mb in p.values().get("micro_batch") or []),
    ]
    odd = sorted({mb for mb in micros if mb != AUTO and size % mb})
    if odd:
        what = f"micro-batch {', '.join(map(str, odd))} does not divide batch.size {size}"
        out.append(Problem(file, "batch.size", what,
                           f"use micro-batches among {_listed(divisors(size))}, or another size",
                           lines.get(("batch", "size"))))  # fmt: skip
    return out


def _listed(xs: list[int], most: int = 12) -> str:
    """Numbers for a message: the first few, then how many more and the largest."""
    if len(xs) <= most:
        return ", ".join(map(str, xs))
    return f"{', '.join(map(str, xs[: most - 1]))}, ... ({len(xs) - most} more), {xs[-1]}"


def divisors(size: int) -> list[int]:
    """The micro-batches that divide a batch of `size` sequences, smallest first (trial division up to its
    square root: each divisor below it pairs with one above)."""
    small = [k for k in range(1, math.isqrt(size) + 1) if size % k == 0]
    return small + [size // k for k in reversed(small) if k * k != size]


def _steps_problems(m: Matrix, file: str, lines: dict) -> list[Problem]:
    """A tuning key of `steps` that its phase's fixed count would silently ignore, bounds that cross, and
    a time cap the cell's timeout would cut short."""
    st, out = m.steps, []

    def problem(key: str, what: str, fix: str) -> None:
        out.append(Problem(file, f"steps.{key}", what, fix, lines.get(("steps", key)) or lines.get(("steps",))))

    for phase, keys in _STEP_KEYS_FOR.items():
        if getattr(st, phase) == "auto":
            continue
        for key in keys:
            if getattr(st, key) is not None:
                problem(
                    key,
                    f"{key} tunes `{phase}: auto`, but {phase} is fixed at {getattr(st, phase)} steps",
                    f"set `{phase}: auto`, or remove {key}",
                )
    if st.max_seconds is not None and "auto" not in (st.warmup, st.measured):
        problem("max_seconds", "max_seconds caps adaptive steps, but both counts are fixed", "set `measured: auto`")
    w, mst, a = _schedule(st)
    if a is not None:
        if a.warmup and a.min_warmup > w:
            problem("min_warmup", f"min_warmup {a.min_warmup} is above max_warmup {w}", "lower min_warmup")
        if a.warmup and a.settle_window > w:
            problem(
                "settle_window",
                f"settle_window {a.settle_window} needs more warmup steps than max_warmup {w} allows",
                f"raise max_warmup to {a.settle_window} or more, or lower settle_window",
            )
        if a.measured and a.min_steps > mst:
            problem("min_steps", f"min_steps {a.min_steps} is above max_steps {mst}", "lower min_steps")
        if a.max_seconds is not None and a.max_seconds >= m.timeout_s:
            problem(
                "max_seconds",
                f"max_seconds {a.max_seconds:g} is not below timeout_s {m.timeout_s:g}: the timeout would end the "
                "cell before the cap does, and record it as a timeout",
                f"lower max_seconds below {m.timeout_s:g}, leaving room for setup (or raise timeout_s)",
            )
    return out


def _schedule(st: Steps) -> tuple[int, int, Adaptive | None]:
    """The cell's warmup_steps and measured_steps (caps where a phase is auto) and its Adaptive settings."""
    if "auto" not in (st.warmup, st.measured):
        return st.warmup, st.measured, None
    tuning = {f: v for f in _A if f not in ("warmup", "measured") and (v := getattr(st, f)) is not None}
    adaptive = Adaptive(warmup=st.warmup == "auto", measured=st.measured == "auto", **tuning)
    warmup = (st.max_warmup or DEFAULT_MAX_WARMUP) if adaptive.warmup else st.warmup
    measured = (st.max_steps or DEFAULT_MAX_STEPS) if adaptive.measured else st.measured
    return warmup, measured, adaptive


# -- expansion --------------------------------------------------------------------------------
def _cross(m: Matrix) -> list[dict]:
    # An axis left unset takes its one value from the fixed setting behind it (batch.micro, ...).
    axes = {
        a.name: getattr(m.axes, a.name) or [_setting(m, a.setting)] if a.setting else getattr(m.axes, a.name)
        for a in AXIS_TABLE
    }
    if "lora_targets" in axes and not m.axes.lora_targets:  # the block may list module names
        axes["lora_targets"] = [lora_targets_name(lora_target_modules(axes["lora_targets"][0]))]
    combos = [_applicable(dict(zip(axes, vals)), ()) for vals in itertools.product(*axes.values())]
    for pick in m.include:
        # An include entry is a partial assignment: axes it leaves out take every value from axes.
        stated = pick.values()
        chosen = {**axes, **stated}
        combos += [_applicable(dict(zip(chosen, vals)), stated) for vals in itertools.product(*chosen.values())]
    return combos


def _applicable(combo: dict, stated) -> dict:
    """An axis that means nothing for this combination (Axis.applies: LoRA rank with peft: none) takes its
    default, so crossing it does not multiply cells; a value an include states is kept, for the rules."""
    for a in AXIS_TABLE:
        if a.name not in stated and not _applies(a.name, combo):
            combo[a.name] = a.default
    return combo


def _setting(m: Matrix, path: str):
    value: Any = m
    for key in path.split("."):
        value = getattr(value, key)
    return value


def _described(path: str, combo: dict) -> dict:
    """What a user config states replaces the crossed axes: its ZeRO stage and offload, and its precision,
    optimizer, micro-batch, accumulation and learning rate where it states them ("auto", or no optimizer
    section: the matrix's value)."""
    cfg = dsconfig.load(path)
    d = dsconfig.describe(cfg)
    if d["optimizer"] is None and "optimizer" in cfg:
        raise ConfigError(
            [
                Problem(
                    path,
                    "optimizer",
                    f"DeepSpeed would build {cfg['optimizer'].get('type')!r} from "
                    "this section, which is not one of zerobench's optimizers, so no cell can name it",
                    "remove the optimizer section (the matrix's optimizer axis then applies), or use "
                    "a type zerobench names (AdamW, Adam, Lamb, OneBitAdam, ZeroOneAdam, OneBitLamb)",
                )
            ]
        )
    out = {"zero_stage": d["zero_stage"], "offload": d["offload"], "ds_config_sha": env.file_sha(path)[:10]}
    for key in ("precision", "optimizer", "micro_batch", "grad_accum"):
        out[key] = combo[key] if d[key] is None else d[key]
    if d["lr"] is not None:
        out["lr"] = d["lr"]
    return out


def _matches(combo: dict, pick: Pick) -> bool:
    # A setting that does not apply to the combination (lora_r with peft: none) matches nothing there.
    return all(combo[k] in vals and _applies(k, combo) for k, vals in pick.values().items())


def _applies(axis: str, combo: dict) -> bool:
    a = AXIS[axis]
    return a.applies is None or a.applies(combo)


def _blocks(m: Matrix, combo: dict) -> dict:
    """The cell's LoRA and QLoRA blocks: the PEFT axes' values, the rest from the matrix's blocks."""
    peft = combo["peft"]
    lora = Lora(
        r=combo["lora_r"],
        alpha=combo["lora_alpha"],
        dropout=m.lora.dropout,
        targets=lora_target_modules(combo["lora_targets"]),
    )
    qlora = Qlora(
        quant_type=combo["qlora_quant"], double_quant=combo["qlora_double_quant"], quant_storage=m.qlora.quant_storage
    )
    return {"lora": lora if peft != "none" else None, "qlora": qlora if peft == "qlora" else None}


def expand(m: Matrix) -> list[Cell]:
    """The cells of a matrix: axes crossed, plus include, minus exclude; duplicates removed, order kept."""
    return list(_cells(m))


def _cells(m: Matrix) -> Iterator[Cell]:
    """expand(), one cell at a time."""
    fixed = dict(
        model=m.model,
        data=m.data,
        tokenizer=m.tokenizer,
        seq_len=m.seq_len,
        **dict(zip(("warmup_steps", "measured_steps", "adaptive"), _schedule(m.steps))),
        lr=m.lr,
        seed=m.seed,
        gpus=m.gpus,
        nodes=m.nodes,
        attn=m.attn,
        timeout_s=m.timeout_s,
        matrix=m.name or "",
        nvme_path=m.nvme_path,
    )
    seen = set()
    for combo in _cross(m):
        if any(_matches(combo, pick) for pick in m.exclude):
            continue
        if combo["ds_config"] is not None:
            combo = {**combo, **_described(combo["ds_config"], combo)}
        if m.batch.size is not None:  # the accumulation holds the batch; a searched micro-batch gets its own
            combo = {**combo, "grad_accum": 1 if combo["micro_batch"] == AUTO else m.batch.size // combo["micro_batch"]}
        cell = Cell(**{**fixed, **combo}, **_blocks(m, combo))
        if cell.hash not in seen:
            seen.add(cell.hash)
            yield cell
