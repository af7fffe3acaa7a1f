"""YAML text -> a validated Matrix, every problem of the file collected and reported together (file, line, key
path, what is wrong, how to fix it) before anything runs."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ..axes import AXES as AXIS_TABLE
from ..problems import MAX_DEPTH, Problem, read_text
from .checks import _path_problems, _semantic_problems
from .schema import AXES, Matrix, MatrixError, _suggest


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


EMBEDDED = Path(__file__).resolve().parents[2] / "matrices"
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
