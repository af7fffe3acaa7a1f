"""Writes bench/matrix/dsconfig_keys.json: every key the installed DeepSpeed's config parser reads, with its type.

    nox -s ds_tables                      # after changing the DeepSpeed pin; commit the file it writes
    python -m bench.matrix.dsconfig_gen --check  # exit 1 if the file differs from the installed DeepSpeed

Read from DeepSpeed itself: the pydantic config models (fields, aliases, annotated types, enum values,
deprecations) and, for the sections it reads key by key with dict.get(key, default), the keys a
recording dict is asked for and the types of their defaults. A type DeepSpeed does not state (a
default of None) is written as null; bench.matrix.dsconfig supplies it by hand.

Imports deepspeed, so only when run: bench.matrix.dsconfig reads the JSON and the orchestrator stays light.
tests/matrix/test_dsconfig_check.py regenerates the file in memory and compares it with the checked-in one.
"""

from __future__ import annotations

import enum
import importlib
import json
import pathlib
import sys
import types
import typing
from pathlib import Path
from typing import Any

__all__ = ["KEYS_FILE", "generate", "render", "main"]

KEYS_FILE = Path(__file__).with_name("dsconfig_keys.json")

# Where DeepSpeedConfig builds a pydantic model from a section. Models nested in these (zero's
# offload_param, say) are found through the field annotations.
PYDANTIC = (
    (("zero_optimization",), "deepspeed.runtime.zero.config", "DeepSpeedZeroConfig"),
    (("fp16",), "deepspeed.runtime.precision_config", "DeepSpeedFP16Config"),
    (("bf16",), "deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),
    (("bfloat16",), "deepspeed.runtime.precision_config", "DeepSpeedBF16Config"),  # the old name, still read
    (("comms_logger",), "deepspeed.comm.config", "CommsLoggerConfig"),
    (("tensorboard",), "deepspeed.monitor.config", "TensorBoardConfig"),
    (("csv_monitor",), "deepspeed.monitor.config", "CSVConfig"),
    (("wandb",), "deepspeed.monitor.config", "WandbConfig"),
    (("comet",), "deepspeed.monitor.config", "CometConfig"),
    (("timers", "throughput"), "deepspeed.utils.config", "DeepSpeedThroughputTimerConfig"),
    (("hybrid_engine",), "deepspeed.runtime.config", "HybridEngineConfig"),
    (("compile",), "deepspeed.compile.config", "CompileConfig"),
)
# Sections DeepSpeedConfig reads key by key: their keys are what it asks a recording dict for.
KEY_BY_KEY = ("activation_checkpointing", "aio", "data_types", "flops_profiler", "timers", "torch_autocast")

_MISSING = object()
_SIMPLE = {bool: "bool", int: "int", float: "number", str: "str", pathlib.Path: "str", list: "list"}


class _Recorder(dict):
    """A config dict that notes every key it is asked about, with the default offered (dict.get)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.asked: dict[str, Any] = {}

    def _note(self, k, default=_MISSING) -> None:
        if isinstance(k, str) and self.asked.get(k, _MISSING) is _MISSING:
            self.asked[k] = default

    def get(self, k, *default):
        self._note(k, *default[:1])
        return super().get(k, *default)

    def __getitem__(self, k):
        self._note(k)
        return super().__getitem__(k)

    def __contains__(self, k):
        self._note(k)
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


def _default_type(default: Any) -> str | None:
    """The type a key-by-key default states; None where it states none (None, a section, no default)."""
    return _SIMPLE.get(type(default)) if default is not _MISSING else None


def _field_spec(annotation: Any, path: tuple, models: list[tuple]) -> Any:
    """A pydantic field annotation as a bench.matrix.dsconfig spec."""
    from pydantic import BaseModel

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    optional = origin in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
        origin = typing.get_origin(annotation)
    q = "?" if optional else ""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _model_spec(annotation, path, models)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return list(dict.fromkeys(m.value for m in annotation))
    if annotation in _SIMPLE:
        return _SIMPLE[annotation] + q
    if origin in (list, typing.List):
        return "list" + q
    if origin in (dict, typing.Dict):
        return {"*": "any"}  # handed on whole
    return "any"  # a union of several types


def _model_spec(model: Any, path: tuple, models: list[tuple]) -> dict:
    models.append(path)
    spec: dict[str, Any] = {}
    for name, f in model.model_fields.items():
        s = _field_spec(f.annotation, path + (name,), models)
        for key in (name, f.alias):
            if key:  # pydantic takes a field by its name or its alias
                spec[key] = s
    return spec


def generate() -> dict:
    """The key tables of the installed DeepSpeed."""
    import deepspeed
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS, DeepSpeedConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    probes = {k: _Recorder() for k in KEY_BY_KEY}
    top = _Recorder(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, **probes)
    DeepSpeedConfig(top)
    schema: dict[str, Any] = {k: _default_type(d) for k, d in top.asked.items()}
    for k, rec in probes.items():
        schema[k] = {kk: _default_type(d) for kk, d in rec.asked.items()}
    models: list[tuple] = []
    for path, module, name in PYDANTIC:
        node = schema
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = _model_spec(getattr(importlib.import_module(module), name), path, models)
    fields = DeepSpeedZeroConfig.model_fields
    return {
        "_generated_by": "nox -s ds_tables (python -m bench.matrix.dsconfig_gen): do not edit",
        "deepspeed": deepspeed.__version__.split("+")[0],
        "schema": schema,
        "pydantic": sorted(list(p) for p in models),
        "zero_aliases": {n: f.alias for n, f in fields.items() if f.alias},
        "zero_deprecated": sorted(n for n, f in fields.items() if (f.json_schema_extra or {}).get("deprecated")),
        "optimizers": sorted(DEEPSPEED_OPTIMIZERS),
    }


def render(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render(generate())
    if "--check" in argv:
        same = KEYS_FILE.is_file() and KEYS_FILE.read_text() == text
        print(
            f"{KEYS_FILE} {'matches' if same else 'differs from'} the installed DeepSpeed"
            + ("" if same else ": run `nox -s ds_tables` and commit it")
        )
        return 0 if same else 1
    KEYS_FILE.write_text(text)
    print(f"wrote {KEYS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
