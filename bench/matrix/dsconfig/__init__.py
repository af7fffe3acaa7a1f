"""DeepSpeed configs, both ways: a Cell's generated config, and a user's file checked and read as axis values.

- build(cell): the exact config the worker hands to deepspeed.initialize. Pure data, built in the
  orchestrator before any process starts, and stored with every result (build).
- load(path) / loads(text) / check(cfg): a user's file, checked before anything runs. DeepSpeed
  ignores top-level keys it does not know, and reads several sections key by key, so a misplaced key
  (offload_optimizer at the top level instead of under zero_optimization) silently turns the feature
  off and the benchmark measures something other than what the file says. Every problem of a file is
  reported at once, each with where the key belongs or how to fix it (read).
- describe(cfg): the axis values (ZeRO stage, offload, precision, optimizer) a config amounts to (describe).
- resolve(cfg, ...): a copy with HF-style "auto" batch sizes filled from the cell (build).

The key tables (every key DeepSpeed reads, its type, which sections are pydantic models) are
bench/matrix/dsconfig_keys.json, generated from the installed DeepSpeed's own config models by
`nox -s ds_tables` (bench/matrix/dsconfig_gen.py); tests/matrix/test_dsconfig_check.py regenerates it and fails when
DeepSpeed changed. What DeepSpeed's models cannot tell is written in tables: the types its defaults leave
open, the optimizer and scheduler kwargs, hints for misplaced names, advice for deprecated keys,
HF "auto" defaults; the checks of meaning (offload at the wrong stage, ...) are read's.
This package imports neither torch nor deepspeed: the orchestrator stays light.
"""

from .build import CLIENT_OPTIMIZERS, OPTIMIZER_SECTIONS, build, resolve
from .describe import describe
from .read import check, load, loads
from .tables import DS_OPTIMIZERS, DS_VERSION, OFFLOAD_AXIS, SCHEMA, TORCH_OPTIMIZERS, ZERO_ALIASES

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
