"""A user's DeepSpeed config, checked before anything runs: load(path) / loads(text) / check(cfg), and the checks
of meaning (offload at the wrong stage, an optimizer the setup cannot build, ...). DeepSpeed
ignores top-level keys it does not know and reads several sections key by key, so a misplaced key silently turns
the feature off; every problem of a file is reported at once, each with where the key belongs or how to fix it."""

from __future__ import annotations

import bisect
import difflib
import json
import os
import re
from typing import Any

from ..axes import OFFLOADS
from ..problems import MAX_DEPTH, ConfigError, Problem, read_text
from .tables import (
    _AUTO_DEFAULTS,
    _AUTO_OK,
    _CLASS_NAMES,
    _PYDANTIC,
    _TYPE_WORDS,
    _WHERE_VALID,
    DEPRECATED,
    DEVICES,
    DS_OPTIMIZERS,
    DS_VERSION,
    HINTS,
    MAP,
    OFFLOAD_AXIS,
    ONEBIT,
    OPEN,
    SCHEMA,
    STAGES,
    TORCH_OPTIMIZERS,
    ZERO,
    ZERO_ALIASES,
    Spec,
    _placement,
    _section,
)

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
