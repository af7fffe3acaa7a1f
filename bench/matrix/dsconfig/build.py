"""A Cell's DeepSpeed config: build(cell), the exact config the worker hands to deepspeed.initialize, and
resolve(cfg, ...), a user's config with HF-style "auto" batch sizes filled from the cell."""

from __future__ import annotations

import copy
from typing import Any

from .. import presets
from ..axes import OPTIMIZERS, Offload, UnderOffload
from ..cells import Cell
from .read import load
from .tables import _AUTO_OK, _auto_values, _section

# Derived from bench.matrix.axes.OPTIMIZERS (kept here as names other modules read).
# DeepSpeed-built optimizers: the "optimizer" section that makes DeepSpeed build each one.
OPTIMIZER_SECTIONS: dict[str, dict[str, Any]] = {
    name: {"type": spec.ds_section["type"], "params": dict(spec.ds_section["params"])}
    for name, spec in OPTIMIZERS.items()
    if not spec.client
}

# Built by the worker and passed to deepspeed.initialize(optimizer=...).
CLIENT_OPTIMIZERS = tuple(name for name, spec in OPTIMIZERS.items() if spec.client)


def _optimizer_section(cell: Cell) -> dict[str, Any] | None:
    """The "optimizer" section that makes DeepSpeed build the cell's optimizer; None for a client one."""
    if cell.optimizer not in OPTIMIZER_SECTIONS:
        return None
    sec = OPTIMIZER_SECTIONS[cell.optimizer]
    return {"type": sec["type"], "params": {"lr": cell.lr, "weight_decay": 0.0, **sec["params"]}}


def _optimizer_flags(cell: Cell, cfg: dict[str, Any]) -> None:
    if cell.optimizer not in OPTIMIZER_SECTIONS:
        # A client optimizer under ZeRO: DeepSpeed refuses "untested" optimizers unless told.
        cfg["zero_allow_untested_optimizer"] = True
    spec = OPTIMIZERS.get(cell.optimizer)
    if cell.offload != Offload.NONE and spec and spec.under_offload == UnderOffload.REQUIRED:
        cfg["zero_force_ds_cpu_optimizer"] = True


def build(cell: Cell) -> dict[str, Any]:
    """The DeepSpeed config for a cell: generated from its axes, or the user's file (checked, with its
    "auto" values and missing optimizer filled from the cell as the HF Trainer fills them)."""
    if cell.ds_config:
        return resolve(load(cell.ds_config), cell)
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cell.micro_batch,
        "gradient_accumulation_steps": cell.grad_accum,
        "gradient_clipping": 1.0,
        "zero_optimization": _zero_section(cell),
        "steps_per_print": 10**9,  # DeepSpeed's own step log would interleave with ours
        "wall_clock_breakdown": False,
    }
    if cell.offload == Offload.NVME:
        cfg["aio"] = {
            "block_size": 1048576,
            "queue_depth": 8,
            "intra_op_parallelism": 1,
            "single_submit": False,
            "overlap_events": True,
        }
    cfg.update(_precision_section(cell))
    section = _optimizer_section(cell)
    if section is not None:
        cfg["optimizer"] = section
    _optimizer_flags(cell, cfg)
    return cfg


def _zero_section(cell: Cell) -> dict[str, Any]:
    """The "zero_optimization" section: the stage, its communication settings and where state is offloaded."""
    zero: dict[str, Any] = {"stage": cell.zero_stage}
    if cell.zero_stage >= 1:
        # Overlap and contiguous buffers are DeepSpeed's recommended settings for throughput.
        zero.update(overlap_comm=cell.zero_stage >= 2, contiguous_gradients=cell.zero_stage >= 2)
    if cell.offload in (Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if cell.offload == Offload.OPTIMIZER_PARAMS:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if cell.offload == Offload.NVME:
        zero.update(_nvme_offload(cell))
    if cell.zero_stage == 3:
        # Gather weights for save: not needed to benchmark, and it costs a full-model gather.
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    return zero


def _nvme_offload(cell: Cell) -> dict[str, Any]:
    """ZeRO-Infinity's keys of the "zero_optimization" section: optimizer state and parameters swap to files
    under nvme_path (the worker gives each attempt its own subfolder and removes it at the end)."""
    path = cell.nvme_path or "/tmp"
    # max_in_cpu 0: every parameter of 1 MiB or more lives on the drive (smaller ones stay in CPU
    # memory: DeepSpeed's MIN_AIO_BYTES). With DeepSpeed's 1e9 elements, a model of up to 1e9
    # parameters stayed whole in pinned CPU memory, so an nvme cell of a small model measured CPU
    # parameter offload, while a larger one went wholly to the drive (stage3.py
    # _create_param_groups_fp16_flat_cpu_memory: its first sub-group, cut at sub_group_size 1e9,
    # is a little over 1e9 and never fits).
    # Each swap buffer must hold the largest weight's partition (swap_in asserts "More elements ...
    # than buffer size"): DeepSpeed's 1e8 elements is less than a 7B Llama's embedding (32000 x 4096)
    # on one GPU.
    largest = -(-(presets.largest_weight(cell.model) or 0) // max(cell.ranks, 1))
    return {
        "offload_optimizer": {"device": "nvme", "nvme_path": path, "pin_memory": True, "buffer_count": 4},
        "offload_param": {
            "device": "nvme",
            "nvme_path": path,
            "pin_memory": True,
            "buffer_count": 5,
            "buffer_size": max(100_000_000, largest),
            "max_in_cpu": 0,
        },
        # Release every parameter after its use. A parameter read from the drive holds one of the
        # buffer_count pinned swap buffers until ZeRO-3 releases it, and the default reuse distance
        # (1e9 elements) keeps each parameter whose next use is that close in the recorded trace
        # (partitioned_param_coordinator.py __params_to_release, from the second step on). At 1.1B with
        # gradient checkpointing that is layer 15 onwards, 7 swapped weights a layer against 5 buffers:
        # layer 15's first five held them all and its up_proj found none ("Not enough buffers 0 for
        # swapping 1", partitioned_param_swapper.py swap_in; DeepSpeed issue #3062). With nothing kept,
        # the buffers hold the weights in use and those the NVMe prefetcher reads ahead, which takes only
        # free ones. Costs a second read from the drive of the weights that backward uses again soon after
        # forward.
        "stage3_max_reuse_distance": 0,
    }


def _precision_section(cell: Cell) -> dict[str, Any]:
    """The "bf16" or "fp16" section that sets the cell's precision; none for fp32."""
    if cell.precision == "bf16":
        return {"bf16": {"enabled": True}}
    if cell.precision == "fp16":
        # Dynamic loss scaling; overflow steps are skipped by DeepSpeed and counted by the worker.
        return {
            "fp16": {
                "enabled": True,
                "loss_scale": 0,
                "initial_scale_power": 16,
                "loss_scale_window": 1000,
                "hysteresis": 2,
                "min_loss_scale": 1,
            }
        }
    return {}


def resolve(cfg: dict, cell: Cell) -> dict:
    """A copy ready for deepspeed.initialize, filled in as the HF Trainer fills a config, with the cell
    in the place of the TrainingArguments: every "auto" value (_auto_values), the batch sizes the config
    leaves out, and an optimizer section when it has none (the Trainer then builds its AdamW; here the
    cell's optimizer, which under optimizer offload is DeepSpeedCPUAdam, as describe() names it).
    Values the config states are kept: describe() made them the cell's. steps_per_print is set very
    high if absent: DeepSpeed's own step log would interleave with the harness's.
    """
    out = copy.deepcopy(cfg)
    values = _auto_values(cell)
    for path in _AUTO_OK:
        node = out
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(path[-1]) == "auto":
            if path in values:
                node[path[-1]] = values[path]
            else:  # a bucket size left "auto" for a model of unknown shape: DeepSpeed's default
                del node[path[-1]]
    if cfg.get("train_batch_size", "auto") == "auto":  # a stated one: DeepSpeed derives the other two from it
        out.setdefault("train_micro_batch_size_per_gpu", cell.micro_batch)
        out.setdefault("gradient_accumulation_steps", cell.grad_accum)
    # Precision left "auto" is the cell's; a config that has only the other section gets the cell's
    # enabled, as accelerate does for the Trainer (else the own loop would run fp32 with 16-bit weights).
    if "auto" in (_section(cfg, "fp16").get("enabled"), _section(cfg, "bf16").get("enabled")):
        if cell.precision in ("fp16", "bf16") and cell.precision not in out:
            out[cell.precision] = {"enabled": True}
    if "optimizer" not in out:
        section = _optimizer_section(cell)
        if section is not None:
            out["optimizer"] = section
        _optimizer_flags(cell, out)
    # DeepSpeed's default, written out: accelerate (the HF Trainer's path) refuses a config without it.
    out.setdefault("zero_optimization", {"stage": 0})
    out.setdefault("steps_per_print", 10**9)
    return out
