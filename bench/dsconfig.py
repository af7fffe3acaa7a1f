"""Cell -> the exact DeepSpeed config JSON the worker hands to deepspeed.initialize.

Pure data, built in the orchestrator before any process starts, and stored with every result.
"""
from __future__ import annotations

from typing import Any

from . import presets
from .cells import Cell

__all__ = ["build", "OPTIMIZER_SECTIONS", "CLIENT_OPTIMIZERS"]

# DeepSpeed-built optimizers: the "optimizer" section that makes DeepSpeed build each one.
OPTIMIZER_SECTIONS: dict[str, dict[str, Any]] = {
    # torch_adam makes DeepSpeed build torch.optim.AdamW instead of its fused kernel: the baseline.
    "adamw": {"type": "AdamW", "params": {"torch_adam": True, "adam_w_mode": True}},
    "fusedadam": {"type": "Adam", "params": {"adam_w_mode": True}},
    # Under ZeRO-Offload DeepSpeed turns "AdamW" into DeepSpeedCPUAdam (rules keep it to offload cells).
    "cpuadam": {"type": "AdamW", "params": {}},
    "fusedlamb": {"type": "Lamb", "params": {}},
    # 1-bit: run uncompressed for freeze_step steps, then compress; keep that inside warmup.
    "onebitadam": {"type": "OneBitAdam", "params": {"freeze_step": 2, "cuda_aware": False, "comm_backend_name": "nccl"}},
    "zerooneadam": {"type": "ZeroOneAdam", "params": {"var_freeze_step": 2, "var_update_scaler": 1,
                                                      "local_step_scaler": 1, "local_step_clipper": 2,
                                                      "cuda_aware": False, "comm_backend_name": "nccl"}},
    "onebitlamb": {"type": "OneBitLamb", "params": {"freeze_step": 2, "cuda_aware": False, "comm_backend_name": "nccl"}},
}
# Built by the worker and passed to deepspeed.initialize(optimizer=...).
CLIENT_OPTIMIZERS = ("paged_adamw", "paged_adamw_8bit", "adamw_8bit")


def build(cell: Cell) -> dict[str, Any]:
    """The DeepSpeed config for a cell: generated from its axes, or the user's file (checked, with
    HF-style "auto" batch sizes filled from the cell)."""
    if cell.ds_config:
        from . import dscheck

        return dscheck.resolve(dscheck.load(cell.ds_config), micro_batch=cell.micro_batch, grad_accum=cell.grad_accum)
    zero: dict[str, Any] = {"stage": cell.zero_stage}
    if cell.zero_stage >= 1:
        # Overlap and contiguous buffers are DeepSpeed's recommended settings for throughput.
        zero.update(overlap_comm=cell.zero_stage >= 2, contiguous_gradients=cell.zero_stage >= 2)
    if cell.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if cell.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if cell.offload == "nvme":
        # ZeRO-Infinity: optimizer state and parameters swap to files under nvme_path (the worker
        # gives each attempt its own subfolder and removes it at the end).
        path = cell.nvme_path or "/tmp"
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": path, "pin_memory": True, "buffer_count": 4}
        # max_in_cpu 0: every parameter of 1 MiB or more lives on the drive (smaller ones stay in CPU
        # memory: DeepSpeed's MIN_AIO_BYTES). With DeepSpeed's 1e9 elements, a model of up to 1e9
        # parameters stayed whole in pinned CPU memory, so an nvme cell of a small model measured CPU
        # parameter offload, while a larger one went wholly to the drive (stage3.py
        # _create_param_groups_fp16_flat_cpu_memory: its first sub-group, cut at sub_group_size 1e9,
        # is a little over 1e9 and never fits).
        # Each swap buffer must hold the largest weight's partition (swap_in asserts "More elements ...
        # than buffer size"): DeepSpeed's 1e8 elements is less than a 7B Llama's embedding (32000 x 4096)
        # on one GPU.
        largest = -(-(presets.largest_weight(cell.model) or 0) // max(cell.gpus, 1))
        zero["offload_param"] = {"device": "nvme", "nvme_path": path, "pin_memory": True, "buffer_count": 5,
                                 "buffer_size": max(100_000_000, largest), "max_in_cpu": 0}
        # Release every parameter after its use. A parameter read from the drive holds one of the
        # buffer_count pinned swap buffers until ZeRO-3 releases it, and the default reuse distance
        # (1e9 elements) keeps each parameter whose next use is that close in the recorded trace
        # (partitioned_param_coordinator.py __params_to_release, from the second step on). At 1.1B with
        # gradient checkpointing that is layer 15 onwards, 7 swapped weights a layer against 5 buffers:
        # layer 15's first five held them all and its up_proj found none ("Not enough buffers 0 for
        # swapping 1", partitioned_param_swapper.py swap_in; results/nvme-1b.jsonl; DeepSpeed issue
        # #3062). With nothing kept, the buffers hold the weights in use and those the NVMe prefetcher
        # reads ahead, which takes only free ones. Costs a second read from the drive of the weights
        # that backward uses again soon after forward.
        zero["stage3_max_reuse_distance"] = 0
    if cell.zero_stage == 3:
        # Gather weights for save: not needed to benchmark, and it costs a full-model gather.
        zero["stage3_gather_16bit_weights_on_model_save"] = False

    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cell.micro_batch,
        "gradient_accumulation_steps": cell.grad_accum,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "steps_per_print": 10**9,  # DeepSpeed's own step log would interleave with ours
        "wall_clock_breakdown": False,
    }
    if cell.offload == "nvme":
        cfg["aio"] = {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1, "single_submit": False,
                      "overlap_events": True}
    if cell.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif cell.precision == "fp16":
        # Dynamic loss scaling; overflow steps are skipped by DeepSpeed and counted by the worker.
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                       "hysteresis": 2, "min_loss_scale": 1}
    if cell.optimizer in OPTIMIZER_SECTIONS:
        sec = OPTIMIZER_SECTIONS[cell.optimizer]
        cfg["optimizer"] = {"type": sec["type"], "params": {"lr": cell.lr, "weight_decay": 0.0, **sec["params"]}}
    else:
        # A client optimizer under ZeRO: DeepSpeed refuses "untested" optimizers unless told.
        cfg["zero_allow_untested_optimizer"] = True
    if cell.offload != "none" and cell.optimizer == "cpuadam":
        cfg["zero_force_ds_cpu_optimizer"] = True
    return cfg
