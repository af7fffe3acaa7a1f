"""A Matrix -> its cells: the axes crossed, include and exclude picks applied, blocks and the step schedule
filled in."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from ...host import env
from .. import dsconfig
from ..axes import AUTO, AXIS, lora_target_modules, lora_targets_name
from ..axes import AXES as AXIS_TABLE
from ..cells import Adaptive, Cell, Lora, Qlora
from ..problems import ConfigError, Problem
from .schema import _A, DEFAULT_MAX_STEPS, DEFAULT_MAX_WARMUP, Matrix, Pick, Steps


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
