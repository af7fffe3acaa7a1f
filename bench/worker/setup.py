"""The setup both engines share: where the cell runs (device, process group, seed, dtype), the model
(preset or local weights, QLoRA quantization, LoRA adapters, gradient checkpointing, Liger kernels),
its data, and the check that the model runs the kernels the cell names."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..matrix.cells import Cell
from .events import Events
from .parts import data, models

__all__ = ["Setup", "gloo_safe", "start", "record_kernels"]


@dataclass
class Setup:
    """One cell's place and, after build(), its model and data."""

    cell: Cell
    ds_config: dict[str, Any]
    rank: int
    local_rank: int
    world: int
    device: torch.device
    dtype: torch.dtype
    t0: float
    """perf_counter when setup began: the document's setup_s counts from here."""
    model: Any = None
    counts: dict[str, int] = field(default_factory=dict)
    config: Any = None
    """The model's transformers config (layers and width for the FLOPs per token)."""
    batches: torch.Tensor | None = None
    """All steps' micro-batches of token ids, (steps * grad_accum, micro_batch, seq_len), on the CPU."""

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def steps(self) -> int:
        return self.cell.warmup_steps + self.cell.measured_steps

    def build(self, doc: dict, *, under_trainer: bool) -> None:
        """Build the model and the data. under_trainer: the HF Trainer applies Liger and registers the
        ZeRO-3 config itself (its TrainingArguments must exist before this)."""
        cell = self.cell
        t0 = time.perf_counter()
        self.model = _build_model(cell, self.ds_config, self.dtype, self.device, self.local_rank, under_trainer)
        doc["model_build_s"] = time.perf_counter() - t0
        if cell.model in models.PRESETS and cell.peft != "qlora":  # QLoRA quantizes the cached checkpoint
            doc["weights_init"] = models.weights_init_name()
        self.counts = models.count_params(self.model)
        doc.update(self.counts)
        self.config = self.model.config
        self.batches = data.batches(
            cell.data,
            cell.tokenizer,
            self.config.vocab_size,
            self.steps * cell.grad_accum,
            cell.micro_batch,
            cell.seq_len,
            cell.seed,
            self.rank,
        )


def start(spec: dict, doc: dict, events: Events) -> Setup:
    """Enter the setup phase: pick the device, join the process group, seed."""
    import deepspeed

    cell = Cell.from_dict(spec["cell"])
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))

    doc["phase"] = "setup"
    events.phase("setup")
    t_setup = time.perf_counter()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", verbose=False)
    torch.manual_seed(cell.seed)
    ds_config = gloo_safe(spec["ds_config"], cuda, world)
    if ds_config is not spec["ds_config"]:  # the record says what ran besides what was built
        doc["ds_config_added"] = _added(spec["ds_config"], ds_config)
    return Setup(
        cell=cell,
        ds_config=ds_config,
        rank=rank,
        local_rank=local_rank,
        world=world,
        device=device,
        dtype=models.DTYPES[cell.precision],
        t0=t_setup,
    )


def gloo_safe(ds_config: dict[str, Any], cuda: bool, world: int) -> dict[str, Any]:
    """ZeRO-3 over CPU ranks gathers one parameter at a time. DeepSpeed's coalesced gather (up to 0.19.6) waits on
    its last handle only; gloo runs each handle on a thread of its own, so the others' buffers may still be empty
    when read (deepspeedai/DeepSpeed#8539): a cell diverged at random. On CUDA one stream orders them."""
    zero = ds_config.get("zero_optimization") or {}
    said = {"stage3_allgather_sequential", "allgather_sequential"} & set(zero)  # DeepSpeed reads either name
    if cuda or world < 2 or zero.get("stage") != 3 or said:
        return ds_config
    return {**ds_config, "zero_optimization": {**zero, "stage3_allgather_sequential": True}}


def _added(given: dict, ran: dict) -> dict:
    """The keys `ran` has that `given` has not, nested settings compared key by key."""
    out = {}
    for k, v in ran.items():
        if k not in given:
            out[k] = v
        elif isinstance(v, dict) and isinstance(given[k], dict) and (sub := _added(given[k], v)):
            out[k] = sub
    return out


def _build_model(cell, ds_config, dtype, device, local_rank, under_trainer):
    """Build the model for a cell: preset or local weights, QLoRA quantization, LoRA adapters, GC."""
    if cell.kernels == "liger" and not under_trainer:
        # Class-level patch before the build, so ZeRO-3's zero.Init and from_pretrained make Liger's
        # modules directly. (The Trainer path asks the Trainer instead: TrainingArguments(use_liger_kernel).)
        models.apply_liger(models.config_for(cell.model, cell.attn).model_type, models.liger_settings(cell.zero_stage))

    if cell.peft == "qlora":
        from transformers import BitsAndBytesConfig

        q = cell.qlora
        storage = dtype if q.quant_storage == "auto" else {"uint8": torch.uint8, **models.DTYPES}[q.quant_storage]
        bnb = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=q.quant_type,
            bnb_4bit_use_double_quant=q.double_quant,
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_quant_storage=storage,
        )
        ckpt = models.checkpoint(cell.model, dtype, device)
        # ZeRO-3 QLoRA: from_pretrained partitions the 4-bit weights, which works because they are
        # stored in the compute dtype (quant_storage). (On the Trainer path the Trainer's own
        # arguments register the ZeRO-3 config.)
        kw = {} if cell.zero_stage == 3 else {"device_map": {"": local_rank if device.type == "cuda" else "cpu"}}
        model = models.from_checkpoint(
            ckpt,
            cell.attn,
            dtype,
            ds_config if cell.zero_stage == 3 and not under_trainer else None,
            quantization_config=bnb,
            **kw,
        )
        if cell.zero_stage != 3:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=cell.grad_ckpt, gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        elif cell.grad_ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model = models.build(
            cell.model,
            cell.attn,
            dtype,
            device,
            ds_config if cell.zero_stage == 3 and not under_trainer else None,
            seed=cell.seed,
        )
        torch.manual_seed(cell.seed)  # later draws (adapters, dropout) start alike whatever zero.Init drew
        if cell.grad_ckpt:
            # Non-reentrant checkpointing works with frozen base weights (LoRA) and ZeRO-3 hooks.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cell.peft in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        lo = cell.lora
        targets = "all-linear" if tuple(lo.targets) == ("all-linear",) else list(lo.targets)
        if cell.grad_ckpt:
            model.enable_input_require_grads()
        model = get_peft_model(
            model,
            LoraConfig(
                r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout, target_modules=targets, task_type="CAUSAL_LM"
            ),
        )
    return model


def _runs_liger(module) -> bool:
    """Whether a module's forward is Liger's: a Liger class (the class-level patch before the build) or
    Liger's forward bound onto the instance (how the HF Trainer applies Liger to a built model: the
    module keeps its transformers class, so a class-only check counts none of them on the Trainer path)."""
    fwd = getattr(module.forward, "__func__", module.forward)
    return getattr(fwd, "__module__", "").startswith("liger_kernel")


def record_kernels(cell, model, doc: dict) -> None:
    """Record which kernels the built model runs, and refuse a kernels=liger cell that runs none of Liger's."""
    liger = sum(_runs_liger(m) for m in model.modules())
    doc["kernels"] = {
        "asked": cell.kernels,
        "liger_modules": liger,
        "liger_settings": models.liger_settings(cell.zero_stage) if cell.kernels == "liger" else None,
    }
    if cell.kernels == "liger" and not liger:
        raise RuntimeError(
            "kernels=liger, but the built model has no Liger module: refusing to report this cell "
            "under a name it did not run"
        )
