"""What a valid schema still cannot say: paths and names, the matrix's size, batch and step settings, crossed
settings that cannot hold together. Each problem says which key and how to fix it."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from .. import dsconfig
from ..axes import AUTO, AXIS, Offload
from ..axes import AXES as AXIS_TABLE
from ..problems import Problem
from .grid import _cells, _cross, _matches, _schedule
from .schema import _STEP_KEYS_FOR, PRESETS, Matrix, MatrixError, _suggest

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
