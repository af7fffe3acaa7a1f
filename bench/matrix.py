"""Matrix files: YAML -> a validated Matrix -> the list of Cells.

Every problem in a file is collected and reported together (file, line, key path, what is wrong,
how to fix it) before anything runs. pydantic does the type work in strict mode, so the string
"false" is not taken for a boolean and "2" is not taken for a ZeRO stage.
"""
from __future__ import annotations

import difflib
import re
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from . import presets
from .cells import (COMPILE_MODES, ENGINES, KERNELS, OFFLOADS, OPTIMIZERS, PEFTS, PRECISIONS, ZERO_STAGES, Cell, Lora,
                    Qlora)

__all__ = ["Matrix", "MatrixError", "Problem", "load", "loads", "expand", "PRESETS"]

# Model presets the worker knows how to build (their shapes: bench/presets.py).
PRESETS = tuple(presets.PRESETS)


@dataclass(frozen=True)
class Problem:
    file: str
    where: str  # key path, e.g. axes.optimizer[2]
    what: str
    fix: str = ""
    line: int | None = None

    def __str__(self) -> str:
        loc = f"{self.file}:{self.line}" if self.line else self.file
        s = f"{loc}: {self.where or '(top level)'}: {self.what}"
        return s + (f"\n    fix: {self.fix}" if self.fix else "")


class MatrixError(Exception):
    """All problems found in one matrix file."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        n = len(problems)
        head = f"{n} problem{'s' if n != 1 else ''} in {problems[0].file}; nothing was run:" if problems else ""
        super().__init__("\n".join([head, *(f"  {p}" for p in problems)]))


def _suggest(value: str, choices) -> str:
    close = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}? " if close else ""


def _known_optimizer(v: str) -> str:
    if v not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {v!r}; {_suggest(v, OPTIMIZERS)}known: {', '.join(OPTIMIZERS)}")
    return v


Optimizer = Annotated[str, AfterValidator(_known_optimizer)]
# The allowed values are bench.cells' own lists (Literal[tuple] lists the tuple's items).
Stage = Literal[ZERO_STAGES]
Offload = Literal[OFFLOADS]
Precision = Literal[PRECISIONS]
Peft = Literal[PEFTS]
Engine = Literal[ENGINES]
MicroBatch = Annotated[int, Field(ge=1)]
GradAccum = Annotated[int, Field(ge=1)]
Kernels = Literal[KERNELS]
# false | true (torch.compile's default mode) | a mode name
CompileChoice = Union[bool, Literal[COMPILE_MODES]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Batch(_Strict):
    micro: int = Field(1, ge=1, description="Sequences per GPU per forward pass: activation memory grows with it.")
    grad_accum: int = Field(1, ge=1, description="Micro-batches per optimizer step: bigger batch, no extra memory.")


class Steps(_Strict):
    warmup: int = Field(2, ge=0, description="Steps run but not measured (kernel autotune, allocator warm-up).")
    measured: int = Field(8, ge=2, description="Steps timed; throughput is their median.")


class LoraSettings(_Strict):
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    targets: Union[str, list[str]] = "all-linear"


class QloraSettings(_Strict):
    quant_type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    quant_storage: Literal["auto", "bf16", "fp16", "fp32", "uint8"] = "auto"


def _nonempty(v: list) -> list:
    if not v:
        raise ValueError("an axis needs at least one value")
    if len(set(map(repr, v))) != len(v):
        raise ValueError("an axis lists the same value twice")
    return v


class Axes(_Strict):
    zero_stage: Annotated[list[Stage], AfterValidator(_nonempty)] = [0]
    offload: Annotated[list[Offload], AfterValidator(_nonempty)] = ["none"]
    precision: Annotated[list[Precision], AfterValidator(_nonempty)] = ["bf16"]
    grad_ckpt: Annotated[list[bool], AfterValidator(_nonempty)] = [False]
    optimizer: Annotated[list[Optimizer], AfterValidator(_nonempty)] = ["adamw"]
    peft: Annotated[list[Peft], AfterValidator(_nonempty)] = ["none"]
    engine: Annotated[list[Engine], AfterValidator(_nonempty)] = ["deepspeed"]
    compile: Annotated[list[CompileChoice], AfterValidator(_nonempty)] = [False]
    micro_batch: Annotated[list[MicroBatch], AfterValidator(_nonempty)] | None = Field(
        None, description="Micro-batch sizes to compare; unset: batch.micro only.")
    grad_accum: Annotated[list[GradAccum], AfterValidator(_nonempty)] | None = Field(
        None, description="Gradient-accumulation steps to compare; unset: batch.grad_accum only.")
    kernels: Annotated[list[Kernels], AfterValidator(_nonempty)] = ["hf"]
    ds_config: Annotated[list[Union[str, None]], AfterValidator(_nonempty)] = [None]


def _one_or_many(t):
    return Union[t, list[t]]


class Pick(_Strict):
    """A partial assignment of axis values, used by include and exclude."""

    zero_stage: _one_or_many(Stage) | None = None
    offload: _one_or_many(Offload) | None = None
    precision: _one_or_many(Precision) | None = None
    grad_ckpt: _one_or_many(bool) | None = None
    optimizer: _one_or_many(Optimizer) | None = None
    peft: _one_or_many(Peft) | None = None
    engine: _one_or_many(Engine) | None = None
    compile: _one_or_many(CompileChoice) | None = None
    micro_batch: _one_or_many(MicroBatch) | None = None
    grad_accum: _one_or_many(GradAccum) | None = None
    kernels: _one_or_many(Kernels) | None = None
    ds_config: _one_or_many(str) | None = None

    def values(self) -> dict[str, list]:
        out = {}
        for k in AXES:
            v = getattr(self, k)
            if v is not None:
                out[k] = v if isinstance(v, list) else [v]
        return out


class Matrix(_Strict):
    """A matrix file. Fixed settings apply to every cell; axes are crossed."""

    name: str | None = None
    description: str = ""
    model: str = "llama-tiny"
    data: str = "builtin"
    tokenizer: str | None = None
    seq_len: int = Field(128, ge=8)
    batch: Batch = Batch()
    steps: Steps = Steps()
    lr: float = Field(1e-3, gt=0)
    seed: int = 0
    gpus: int = Field(1, ge=1)
    timeout_s: float = Field(1800.0, gt=0)
    nvme_path: str | None = None
    """Folder on a local NVMe drive, for cells with offload: nvme (it must exist)."""
    attn: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    axes: Axes = Axes()
    lora: LoraSettings = LoraSettings()
    qlora: QloraSettings = QloraSettings()
    include: list[Pick] = []
    exclude: list[Pick] = []


AXES = tuple(Axes.model_fields)


# -- loading ----------------------------------------------------------------------------------
def _lines(text: str) -> dict[tuple, int]:
    """Map each key path in the YAML to its 1-based line, for error messages."""
    out: dict[tuple, int] = {}

    def walk(node, path):
        out.setdefault(path, node.start_mark.line + 1)
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
    loc = tuple(p for p in err["loc"] if isinstance(p, int) or not any(c in p for c in "[]()'\"") and p not in {
        "str", "int", "bool", "float", "list", "none", "function-after", "literal"})
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
        fix = f"write {inp.strip().lower()} without quotes" if inp.strip().lower() in ("true", "false") else "use true or false"
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
    elif kind == "list_type":
        what = f"expected a list, got {inp!r}"
        fix = f"write [{inp}]" if not isinstance(inp, (dict, list)) else ""
    return Problem(file, where, what, fix, line)


# Keys people carry over from DeepSpeed configs or other tools, and where they belong here.
_MOVED = {
    "offload_optimizer": "axes.offload (values: none, optimizer, optimizer+params)",
    "offload_param": "axes.offload (value: optimizer+params)",
    "stage": "axes.zero_stage", "zero": "axes.zero_stage", "zero_optimization": "axes.zero_stage and axes.offload",
    "gradient_checkpointing": "axes.grad_ckpt", "bf16": "axes.precision", "fp16": "axes.precision",
    "micro_batch": "batch.micro (or axes.micro_batch to compare several)", "train_micro_batch_size_per_gpu": "batch.micro",
    "gradient_accumulation_steps": "batch.grad_accum (or axes.grad_accum to compare several)",
    "grad_accum": "batch.grad_accum (or axes.grad_accum to compare several)",
    "warmup": "steps.warmup", "measured": "steps.measured", "steps_per_print": None,
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


def loads(text: str, file: str = "<matrix>", ds_configs: list[str] | None = None) -> Matrix:
    """Parse and validate a matrix from YAML text; raise MatrixError listing every problem.

    ds_configs (from `zerobench run --ds-config`) replaces the ds_config axis."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise MatrixError([Problem(file, "", f"not valid YAML: {getattr(e, 'problem', e)}",
                                   "check indentation and quoting near that line", line)]) from None
    if raw is None:
        raw = {}
    if ds_configs and isinstance(raw, dict):
        axes = raw.get("axes") if isinstance(raw.get("axes"), dict) else {}
        raw = {**raw, "axes": {**axes, "ds_config": list(ds_configs)}}
    if not isinstance(raw, dict):
        raise MatrixError([Problem(file, "", f"expected a mapping of settings, got {type(raw).__name__}",
                                   "see matrices/smoke.yaml for the layout")])
    lines = _lines(text)
    try:
        m = Matrix.model_validate(raw)
    except ValidationError as e:
        problems = _dedupe([_problem_from_pydantic(file, err, lines) for err in e.errors()],
                           prefer=[err["type"] == "literal_error" for err in e.errors()])
        raise MatrixError(_dedupe(problems + _path_problems(raw, file, lines))) from None
    if m.name is None:
        m = m.model_copy(update={"name": Path(file).stem if file != "<matrix>" else "matrix"})
    problems = _semantic_problems(m, file, lines)
    if problems:
        raise MatrixError(problems)
    return m


def load(path: str | os.PathLike, ds_configs: list[str] | None = None) -> Matrix:
    p = Path(path)
    if not p.is_file():
        raise MatrixError([Problem(str(path), "", "no such matrix file", "give a path such as matrices/smoke.yaml")])
    return loads(p.read_text(), str(path), ds_configs)


def _path_problems(raw: dict, file: str, lines: dict) -> list[Problem]:
    """Model and data references, checked on the raw mapping so they are reported with type errors too."""
    out = []
    model, data = raw.get("model", "llama-tiny"), raw.get("data", "builtin")
    if isinstance(model, str) and model not in PRESETS and not Path(model).is_dir():
        out.append(Problem(file, "model", f"{model!r} is neither a preset nor a local directory",
                           f"{_suggest(model, PRESETS)}presets: {', '.join(PRESETS)}; or a path to a Hugging Face"
                           " model directory (config.json)", lines.get(("model",))))
    if isinstance(data, str) and data != "builtin":
        if not Path(data).exists():
            out.append(Problem(file, "data", f"no such data file {data!r}",
                               "use builtin, or a local .txt/.jsonl file", lines.get(("data",))))
        if not raw.get("tokenizer"):
            out.append(Problem(file, "tokenizer", "a data file needs a local tokenizer directory",
                               "set tokenizer: path/to/tokenizer", lines.get(("data",))))
    return out


def _semantic_problems(m: Matrix, file: str, lines: dict) -> list[Problem]:
    """Checks that need the whole file (cross-field) or the file system."""
    from . import dscheck

    out = _path_problems(m.model_dump(), file, lines)
    for i, path in enumerate(m.axes.ds_config):
        if path is None:
            continue
        if not Path(path).is_file():
            out.append(Problem(file, f"axes.ds_config[{i}]", f"no such file {path!r}",
                               "paths are relative to the current directory", lines.get(("axes", "ds_config", i))))
            continue
        try:
            dscheck.load(path)  # a user config is checked, not trusted: DeepSpeed ignores misplaced keys
        except MatrixError as e:
            out += e.problems
    if "nvme" in m.axes.offload or any("nvme" in (p.values().get("offload") or []) for p in m.include):
        if not m.nvme_path:
            out.append(Problem(file, "nvme_path", "offload: nvme needs a folder on an NVMe drive",
                               "set nvme_path: /path/on/nvme (it must exist)", lines.get(("axes", "offload"))))
        elif not Path(m.nvme_path).is_dir():
            out.append(Problem(file, "nvme_path", f"no such folder {m.nvme_path!r}", "create it, or fix the path",
                               lines.get(("nvme_path",))))
    for i, pick in enumerate(m.exclude):
        if not any(_matches(c, pick) for c in _cross(m)):
            out.append(Problem(file, f"exclude[{i}]", "matches no cell of the matrix",
                               "check the values against axes, or remove the entry", lines.get(("exclude", i))))
    if not out and not expand(m):
        out.append(Problem(file, "exclude", "every cell is excluded", "loosen exclude"))
    return out


# -- expansion --------------------------------------------------------------------------------
def _cross(m: Matrix) -> list[dict]:
    axes = {k: getattr(m.axes, k) for k in AXES}
    axes["micro_batch"] = axes["micro_batch"] or [m.batch.micro]
    axes["grad_accum"] = axes["grad_accum"] or [m.batch.grad_accum]
    combos = [dict(zip(axes, vals)) for vals in itertools.product(*axes.values())]
    for pick in m.include:
        # An include entry is a partial assignment: axes it leaves out take every value from axes.
        chosen = {**axes, **pick.values()}
        combos += [dict(zip(chosen, vals)) for vals in itertools.product(*chosen.values())]
    return combos


def _described(path: str, optimizer: str) -> dict:
    """A user config's own ZeRO stage, offload, precision and optimizer replace the crossed axes."""
    import hashlib

    from . import dscheck

    d = dscheck.describe(dscheck.load(path))
    return {"zero_stage": d["zero_stage"], "offload": d["offload"], "precision": d["precision"],
            "optimizer": d["optimizer"] or optimizer,
            "ds_config_sha": hashlib.sha256(Path(path).read_bytes()).hexdigest()[:10]}


def _matches(combo: dict, pick: Pick) -> bool:
    return all(combo[k] in vals for k, vals in pick.values().items())


def expand(m: Matrix) -> list[Cell]:
    """The cells of a matrix: axes crossed, plus include, minus exclude; duplicates removed, order kept."""
    lora = Lora(r=m.lora.r, alpha=m.lora.alpha, dropout=m.lora.dropout,
                targets=(m.lora.targets,) if isinstance(m.lora.targets, str) else tuple(m.lora.targets))
    qlora = Qlora(quant_type=m.qlora.quant_type, double_quant=m.qlora.double_quant,
                  quant_storage=m.qlora.quant_storage)
    fixed = dict(model=m.model, data=m.data, tokenizer=m.tokenizer, seq_len=m.seq_len,
                 warmup_steps=m.steps.warmup, measured_steps=m.steps.measured,
                 lr=m.lr, seed=m.seed, gpus=m.gpus, attn=m.attn, timeout_s=m.timeout_s, matrix=m.name or "",
                 nvme_path=m.nvme_path)
    cells, seen = [], set()
    for combo in _cross(m):
        if any(_matches(combo, pick) for pick in m.exclude):
            continue
        if combo["ds_config"] is not None:
            combo = {**combo, **_described(combo["ds_config"], combo["optimizer"])}
        peft = combo["peft"]
        cell = Cell(**combo, **fixed, lora=lora if peft != "none" else None, qlora=qlora if peft == "qlora" else None)
        if cell.hash not in seen:
            seen.add(cell.hash)
            cells.append(cell)
    return cells


assert set(Axes.model_fields) == {"zero_stage", "offload", "precision", "grad_ckpt", "optimizer", "peft", "engine",
                                  "compile", "micro_batch", "grad_accum", "kernels", "ds_config"}
