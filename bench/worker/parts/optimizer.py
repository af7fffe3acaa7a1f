"""The optimizer an engine built, against the one the cell names: checked before the first step, so a cell is
never reported under the name of an optimizer it did not run, and a wrong one costs seconds, not a measurement.

What is compared: the class (or, for bitsandbytes, a class that is the same optimizer: the HF Trainer builds
bitsandbytes.optim.AdamW(optim_bits=8, is_paged=True) for PagedAdamW8bit), bitsandbytes' state bits and paging,
and the learning rate and betas the optimizer starts from. Reads attributes only (no torch import): the tests
check it on stand-ins.
"""

from __future__ import annotations

import math
from typing import Any

from ...matrix.axes import OPTIMIZERS

__all__ = ["DEFAULT_BETAS", "facts", "asked", "refusal"]

DEFAULT_BETAS = (0.9, 0.999)
"""Adam's betas where the cell's DeepSpeed config states none: torch's, DeepSpeed's, bitsandbytes' and the HF
Trainer's default alike."""


def facts(opt: Any) -> dict:
    """What a built optimizer is: its class, bitsandbytes' state bits and paging (None for other optimizers), and
    the learning rate (before any scheduler's first change: `initial_lr`) and betas of its first parameter group."""
    groups = getattr(opt, "param_groups", None) or [{}]
    group = groups[0]
    betas = group.get("betas")
    return {
        "class": f"{type(opt).__module__}.{type(opt).__name__}",
        "optim_bits": getattr(getattr(opt, "args", None), "optim_bits", None),
        "is_paged": getattr(opt, "is_paged", None),
        "lr": group.get("initial_lr", group.get("lr")),
        "betas": tuple(float(b) for b in betas) if betas is not None else None,
    }


def asked(cell: Any, ds_config: dict) -> dict:
    """What the cell asks its optimizer to be, in facts()'s terms; lr None where the config has a scheduler (it
    sets the learning rate as steps go, from before the first step)."""
    spec = OPTIMIZERS[cell.optimizer]
    params = (ds_config.get("optimizer") or {}).get("params") or {}
    lr = params.get("lr", cell.lr)
    betas = params.get("betas", DEFAULT_BETAS)
    bnb = spec.package == "bitsandbytes"
    return {
        "classes": (spec.cls, *spec.built_as),
        "module": spec.module,
        "optim_bits": spec.state_bits if bnb else None,
        "is_paged": spec.paged if bnb else None,
        "lr": None if "scheduler" in ds_config or not isinstance(lr, (int, float)) else float(lr),
        "betas": tuple(float(b) for b in betas) if isinstance(betas, (list, tuple)) else None,
    }


def refusal(cell: Any, built: dict, ds_config: dict, builder: str) -> str | None:
    """Why the optimizer `builder` built (facts()) is not the one the cell names, or None when it is."""
    want = asked(cell, ds_config)
    module, _, name = built["class"].rpartition(".")
    other_module = bool(want["module"]) and not module.startswith(want["module"])
    differs = [
        f"{key}={built[key]} (asked {want[key]})"
        for key in ("optim_bits", "is_paged")
        if want[key] is not None and built[key] != want[key]
    ]
    if want["lr"] is not None and not _close(built["lr"], want["lr"]):
        differs.append(f"lr={built['lr']} (asked {want['lr']})")
    if want["betas"] is not None and built["betas"] is not None and not _close(built["betas"], want["betas"]):
        differs.append(f"betas={built['betas']} (asked {want['betas']})")
    if name in want["classes"] and not other_module and not differs:
        return None
    shown = built["class"] if other_module else name
    return (
        f"optimizer {cell.optimizer!r} asked for {OPTIMIZERS[cell.optimizer].cls}, but {builder} built {shown}"
        + (f" with {', '.join(differs)}" if differs else "")
        + ": refusing to report this cell under a name it did not run"
    )


def _close(a: Any, b: Any) -> bool:
    if isinstance(b, tuple):
        return isinstance(a, tuple) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=1e-6)
