"""The matrix file's schema: pydantic models in strict mode, so the string "false" is not taken for a boolean
and "2" is not taken for a ZeRO stage. The docstring under each field is its description (docs/matrix.md)."""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model

from .. import presets
from ..axes import AXES as AXIS_TABLE
from ..axes import AXIS
from ..cells import Adaptive, Cell
from ..problems import ConfigError

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
