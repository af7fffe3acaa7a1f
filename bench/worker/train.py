"""One cell, in one process (or one rank): build, initialize DeepSpeed, warm up, measure."""
from __future__ import annotations

import math
import os
import signal
import sys
import time
from typing import Any

from ..cells import OPTIMIZERS, Cell
from ..env import version as env_version
from .events import Events


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(spec: dict, doc: dict, events: Events, fault: tuple[str | None, int]) -> None:
    doc["phase"] = "import"
    import torch
    import deepspeed
    import transformers

    from . import data as data_mod
    from . import metrics, models

    cell = Cell.from_dict(spec["cell"])
    ds_config: dict[str, Any] = spec["ds_config"]
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
    dtype = models.DTYPES[cell.precision]
    # main() measures and removes it however the attempt ends (both engines, crashes included).
    doc["nvme_swap_dir"] = _nvme_swap_dir(cell, ds_config, spec)

    # -- model --------------------------------------------------------------------------------
    t0 = time.perf_counter()
    hf_args = None
    if cell.engine == "hf_trainer":
        # Created before the model: with ZeRO-3 it registers the config, so from_config partitions
        # the weights as they are made (the way Trainer users get ZeRO-3 init).
        hf_args = _training_args(cell, ds_config)
    model = _build_model(cell, ds_config, dtype, device, local_rank, hf_args is not None, models, deepspeed)
    doc["model_build_s"] = time.perf_counter() - t0
    counts = models.count_params(model)
    doc.update(counts)
    cfg = model.config

    # -- data ---------------------------------------------------------------------------------
    steps = cell.warmup_steps + cell.measured_steps
    batches = data_mod.batches(cell.data, cell.tokenizer, cfg.vocab_size, steps * cell.grad_accum,
                               cell.micro_batch, cell.seq_len, cell.seed, rank)
    if hf_args is not None:
        losses, times, skipped = _train_hf(cell, hf_args, model, batches, doc, events, device, torch, t_setup)
        return _finish(cell, doc, losses, times, skipped, counts, cfg, world, cuda, device, torch, deepspeed,
                       transformers, metrics)
    _record_kernels(cell, model, doc)
    batches = batches.to(device)

    # -- engine -------------------------------------------------------------------------------
    t0 = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    client_opt = None
    if cell.optimizer in ("paged_adamw", "paged_adamw_8bit", "adamw_8bit"):
        import bitsandbytes as bnb

        cls = {"paged_adamw": bnb.optim.PagedAdamW, "paged_adamw_8bit": bnb.optim.PagedAdamW8bit,
               "adamw_8bit": bnb.optim.AdamW8bit}[cell.optimizer]
        client_opt = cls(params, lr=cell.lr, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, optimizer=client_opt, config=ds_config)
    if cell.compile:
        # torch.compile of the module; the compile itself runs in the first warmup step.
        engine.compile(compile_kwargs={} if cell.compile is True else {"mode": cell.compile})
    doc["compiled"] = bool(getattr(engine, "is_compiled", False))
    doc["engine_init_s"] = time.perf_counter() - t0
    basic = getattr(engine, "basic_optimizer", None) or client_opt
    ran = type(basic).__name__ if basic is not None else None
    doc["optimizer_class"] = f"{type(basic).__module__}.{ran}" if basic is not None else None
    doc["zero_optimizer_class"] = type(engine.optimizer).__name__ if engine.optimizer is not None else None
    if ran != OPTIMIZERS[cell.optimizer]:
        raise RuntimeError(f"optimizer {cell.optimizer!r} asked for {OPTIMIZERS[cell.optimizer]}, but DeepSpeed built "
                           f"{ran}: refusing to report this cell under a name it did not run")

    doc["setup_s"] = time.perf_counter() - t_setup

    # -- steps --------------------------------------------------------------------------------
    losses: list[float] = []
    times: list[float] = []
    setup_alloc = None
    resident = 0  # allocated at the start of a measured step: model states and what persists between steps
    parts = _PartPeaks(torch, device) if cuda else None
    skipped_at_measure = 0
    kind, fault_step = fault
    # from_pretrained (QLoRA, local models) returns a model in eval mode, where HF skips gradient
    # checkpointing and dropout: train as a training loop does.
    engine.train()
    doc["train_mode"] = bool(engine.module.training)
    doc["phase"] = "warmup"
    events.phase("warmup")
    for step in range(steps):
        if step == cell.warmup_steps:
            _sync(torch, device)
            if cuda:
                setup_alloc = {"torch_max_allocated_bytes": torch.cuda.max_memory_allocated(device),
                               "torch_max_reserved_bytes": torch.cuda.max_memory_reserved(device)}
                torch.cuda.reset_peak_memory_stats(device)
            skipped_at_measure = int(getattr(engine, "skipped_steps", 0))
            doc["phase"] = "measured"
            events.phase("measured")
        if kind and step == fault_step:
            _inject(kind)
        if cuda and step >= cell.warmup_steps:
            # A host-side counter (no sync): what ZeRO's model-state formulas describe, without the
            # activations, communication buckets and gathered parameters that make up the peak.
            resident = max(resident, torch.cuda.memory_allocated(device))
        t0 = time.perf_counter()
        step_losses = []
        for micro in range(cell.grad_accum):
            batch = batches[step * cell.grad_accum + micro]
            # Keep the loss only: holding the model's output would keep its logits (micro-batch x
            # seq_len x vocab) alive into the next step, adding them to every peak and to the memory
            # between steps (500 MiB per GPU at 1.1B, micro-batch 4: results/1b-2gpu-b.jsonl).
            measure = parts is not None and step >= cell.warmup_steps
            loss = engine(input_ids=batch, labels=batch).loss
            if kind == "nan" and step >= fault_step:
                loss = loss * float("nan")
            if measure:
                parts.end("forward")
            engine.backward(loss)
            if measure:
                parts.end("backward")
            engine.step()
            if measure:
                parts.end("step")
            step_losses.append(loss.detach())
        # One host sync per step, as a plain training loop has: .item() per micro-batch would stall
        # the GPU between micro-batches and be measured as the setup's cost.
        step_loss = torch.stack(step_losses).float().mean().item()
        _sync(torch, device)
        dt = time.perf_counter() - t0
        losses.append(step_loss)
        times.append(dt)
        events.emit("step", step=step, loss=step_loss, dt=dt)
        if not math.isfinite(step_loss):
            doc["status"] = "diverged"
            doc["reason"] = f"loss became {step_loss} at step {step}"
            break
    else:
        doc["status"] = "ok"
    doc["phase"] = "teardown"
    events.phase("teardown")
    _finish(cell, doc, losses, times, int(getattr(engine, "skipped_steps", 0)) - skipped_at_measure, counts, cfg,
            world, cuda, device, torch, deepspeed, transformers, metrics, setup_alloc)
    if cuda and resident:
        doc["memory_measured"]["torch_allocated_between_steps_bytes"] = resident
    if parts is not None and parts.peaks:
        parts.merge_into(doc["memory_measured"])


class _PartPeaks:
    """The allocator's peak in each part of a measured step: forward (with the loss), backward (with
    ZeRO's gradient reduction, which DeepSpeed runs inside engine.backward) and the optimizer step.
    Where the peak comes from decides what shrinks it: the ZeRO paper's model states (parameters,
    gradients, optimizer state) all exist at once only at the end of the backward pass, while the
    loss's logits or the step's fp32 gradient copy can set the cell's peak instead.
    The allocator's counters are kept on the host: reading and resetting them needs no sync."""

    def __init__(self, torch, device):
        self.cuda, self.device = torch.cuda, device
        self.peaks: dict[str, int] = {}
        self.reserved = 0

    def end(self, part: str) -> None:
        self.peaks[part] = max(self.peaks.get(part, 0), self.cuda.max_memory_allocated(self.device))
        self.reserved = max(self.reserved, self.cuda.max_memory_reserved(self.device))
        # The next part's peak starts from what is allocated now.
        self.cuda.reset_peak_memory_stats(self.device)

    def merge_into(self, mem: dict) -> None:
        """Per-part peaks into the measured figures; the whole-phase peaks stay the max over all parts
        (each reset above cleared the allocator's own)."""
        for part, v in self.peaks.items():
            mem[f"torch_max_allocated_{part}_bytes"] = v
        mem["torch_max_allocated_bytes"] = max(mem["torch_max_allocated_bytes"], *self.peaks.values())
        mem["torch_max_reserved_bytes"] = max(mem["torch_max_reserved_bytes"], self.reserved)


def _finish(cell, doc, losses, times, skipped, counts, cfg, world, cuda, device, torch, deepspeed, transformers, metrics,
            setup_alloc=None) -> None:
    measured_times = times[cell.warmup_steps:]
    doc["losses"] = losses
    doc["step_times_s"] = times
    doc["fp16_skipped_steps"] = skipped
    if cuda:
        doc["memory_setup"] = setup_alloc or doc.get("memory_setup")
        doc["memory_measured"] = {"torch_max_allocated_bytes": torch.cuda.max_memory_allocated(device),
                                  "torch_max_reserved_bytes": torch.cuda.max_memory_reserved(device)}
        doc["gpu_name"] = torch.cuda.get_device_name(device)
    if doc["status"] == "ok" and len(measured_times) >= 1:
        model_ft, hw_ft = metrics.flops_per_token(
            params_total=counts["params_total"], params_trainable=counts["params_trainable"],
            params_embedding=counts["params_embedding"], layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
            seq_len=cell.seq_len, grad_ckpt=cell.grad_ckpt)
        peak = metrics.peak_tflops(doc.get("gpu_name"), cell.precision) if cuda else None
        doc["metrics"] = metrics.summarize(
            measured_times, tokens_per_step=cell.micro_batch * cell.grad_accum * cell.seq_len * world,
            samples_per_step=cell.micro_batch * cell.grad_accum * world, model_flops_tok=model_ft,
            hw_flops_tok=hw_ft, gpus=world, peak=peak)
        doc["metrics"].update(model_flops_per_token=model_ft, hw_flops_per_token=hw_ft, peak_tflops=peak,
                              loss_first=losses[0], loss_final=losses[-1],
                              loss_measured_first=losses[cell.warmup_steps])
    doc["versions"] = {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                       "transformers": transformers.__version__, "cuda": torch.version.cuda}
    for mod, dist in (("bitsandbytes", "bitsandbytes"), ("liger_kernel", "liger-kernel"), ("triton", "triton")):
        if mod in sys.modules:  # only what the cell imported
            doc["versions"][dist] = env_version(dist)


def _build_model(cell, ds_config, dtype, device, local_rank, under_trainer, models, deepspeed):
    """Build the model for a cell: preset or local weights, QLoRA quantization, LoRA adapters, GC."""
    import torch

    if cell.kernels == "liger" and not under_trainer:
        # Class-level patch before the build, so ZeRO-3's zero.Init and from_pretrained make Liger's
        # modules directly. (The Trainer path asks the Trainer instead: TrainingArguments(use_liger_kernel).)
        models.apply_liger(models.config_for(cell.model, cell.attn).model_type, models.liger_settings(cell.zero_stage))

    if cell.peft == "qlora":
        from transformers import BitsAndBytesConfig

        q = cell.qlora
        storage = dtype if q.quant_storage == "auto" else {"uint8": torch.uint8, **models.DTYPES}[q.quant_storage]
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=q.quant_type,
                                 bnb_4bit_use_double_quant=q.double_quant, bnb_4bit_compute_dtype=dtype,
                                 bnb_4bit_quant_storage=storage)
        ckpt = models.checkpoint(cell.model, dtype, device)
        # ZeRO-3 QLoRA: from_pretrained partitions the 4-bit weights, which works because they are
        # stored in the compute dtype (quant_storage). (On the Trainer path the Trainer's own
        # arguments register the ZeRO-3 config.)
        kw = {} if cell.zero_stage == 3 else {"device_map": {"": local_rank if device.type == "cuda" else "cpu"}}
        model = models.from_checkpoint(ckpt, cell.attn, dtype, ds_config if cell.zero_stage == 3 and not under_trainer
                                       else None, quantization_config=bnb, **kw)
        if cell.zero_stage != 3:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cell.grad_ckpt,
                                                    gradient_checkpointing_kwargs={"use_reentrant": False})
        elif cell.grad_ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model = models.build(cell.model, cell.attn, dtype, device,
                             ds_config if cell.zero_stage == 3 and not under_trainer else None)
        if cell.grad_ckpt:
            # Non-reentrant checkpointing works with frozen base weights (LoRA) and ZeRO-3 hooks.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cell.peft in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        lo = cell.lora
        targets = "all-linear" if tuple(lo.targets) == ("all-linear",) else list(lo.targets)
        if cell.grad_ckpt:
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout,
                                                 target_modules=targets, task_type="CAUSAL_LM"))
    return model


def _runs_liger(module) -> bool:
    """Whether a module's forward is Liger's: a Liger class (the class-level patch before the build) or
    Liger's forward bound onto the instance (how the HF Trainer applies Liger to a built model: the
    module keeps its transformers class, found on the H200 in results/gpu-evidence/session4_gpu_tests.log)."""
    fwd = getattr(module.forward, "__func__", module.forward)
    return getattr(fwd, "__module__", "").startswith("liger_kernel")


def _record_kernels(cell, model, doc: dict) -> None:
    """Record which kernels the built model runs, and refuse a kernels=liger cell that runs none of Liger's."""
    from .models import liger_settings

    liger = sum(_runs_liger(m) for m in model.modules())
    doc["kernels"] = {"asked": cell.kernels, "liger_modules": liger,
                      "liger_settings": liger_settings(cell.zero_stage) if cell.kernels == "liger" else None}
    if cell.kernels == "liger" and not liger:
        raise RuntimeError("kernels=liger, but the built model has no Liger module: refusing to report this cell "
                           "under a name it did not run")


def _training_args(cell, ds_config):
    import tempfile

    import torch
    from transformers import TrainingArguments

    from .models import liger_settings

    optim = {"paged_adamw": "paged_adamw_32bit", "paged_adamw_8bit": "paged_adamw_8bit",
             "adamw_8bit": "adamw_bnb_8bit"}.get(cell.optimizer)
    # bench.dsconfig leaves the optimizer section out for these client optimizers, so the Trainer
    # builds them from `optim`, and the stored config is exactly the one used.
    return TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="zerobench-trainer-"), per_device_train_batch_size=cell.micro_batch,
        gradient_accumulation_steps=cell.grad_accum, max_steps=cell.warmup_steps + cell.measured_steps,
        learning_rate=cell.lr, weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0,
        bf16=cell.precision == "bf16", fp16=cell.precision == "fp16", deepspeed=ds_config,
        gradient_checkpointing=cell.grad_ckpt, gradient_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=1, report_to=[], save_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
        seed=cell.seed, remove_unused_columns=False, use_cpu=not torch.cuda.is_available(), torch_compile=bool(cell.compile),
        **({"optim": optim} if optim else {}),
        **({"use_liger_kernel": True, "liger_kernel_config": liger_settings(cell.zero_stage)}
           if cell.kernels == "liger" else {}),
        **({"torch_compile_mode": cell.compile} if isinstance(cell.compile, str) else {}))


def _train_hf(cell, args, model, batches, doc, events, device, torch, t_setup):
    """The HF Trainer path, as its users run it; steps timed by a callback with the same syncs as our loop."""
    from transformers import Trainer, TrainerCallback

    rows = batches.view(-1, cell.seq_len)

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return rows.shape[0]

        def __getitem__(self, i):
            return {"input_ids": rows[i], "labels": rows[i]}

    times: list[float] = []
    losses: list[float] = []
    state = {"t0": 0.0}
    cuda = device.type == "cuda"

    class Clock(TrainerCallback):
        def on_train_begin(self, a, s, c, **kw):
            # Recent Trainers apply Liger inside train(), so this is the first point that sees the result.
            _record_kernels(cell, kw.get("model") or model, doc)
            doc["setup_s"] = time.perf_counter() - t_setup
            doc["phase"] = "warmup"
            events.phase("warmup")

        def on_step_begin(self, a, s, c, **kw):
            if s.global_step == cell.warmup_steps:
                _sync(torch, device)
                if cuda:
                    doc["memory_setup"] = {"torch_max_allocated_bytes": torch.cuda.max_memory_allocated(device),
                                           "torch_max_reserved_bytes": torch.cuda.max_memory_reserved(device)}
                    torch.cuda.reset_peak_memory_stats(device)
                doc["phase"] = "measured"
                events.phase("measured")
            _sync(torch, device)
            state["t0"] = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            _sync(torch, device)
            times.append(time.perf_counter() - state["t0"])

        def on_log(self, a, s, c, logs=None, **kw):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))
                events.emit("step", step=len(losses) - 1, loss=losses[-1], dt=times[-1] if times else None)

    trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Clock()])
    trainer.train()
    engine = trainer.model_wrapped
    basic = getattr(engine, "basic_optimizer", None) or trainer.optimizer
    inner = getattr(basic, "optimizer", basic)
    doc["optimizer_class"] = f"{type(inner).__module__}.{type(inner).__name__}"
    # The Trainer compiles the module it wraps in place (nn.Module.compile), which leaves _compiled_call_impl.
    doc["compiled"] = getattr(trainer.model, "_compiled_call_impl", None) is not None or bool(
        getattr(engine, "is_compiled", False))
    if type(inner).__name__ != OPTIMIZERS[cell.optimizer]:
        raise RuntimeError(f"optimizer {cell.optimizer!r} asked for {OPTIMIZERS[cell.optimizer]}, but the Trainer "
                           f"built {type(inner).__name__}: refusing to report this cell under a name it did not run")
    doc["status"] = "ok" if all(math.isfinite(x) for x in losses) else "diverged"
    if doc["status"] == "diverged":
        doc["reason"] = "loss became non-finite"
    doc["phase"] = "teardown"
    events.phase("teardown")
    return losses, times, int(getattr(engine, "skipped_steps", 0) or 0)


def _nvme_swap_dir(cell, ds_config: dict, spec: dict) -> str | None:
    """Point the config's NVMe offload at this attempt's own subfolder (DeepSpeed fills it with swap files)."""
    if cell.offload != "nvme":
        return None
    zero = ds_config["zero_optimization"]
    path = os.path.join(zero["offload_param"]["nvme_path"], f"zerobench-{spec.get('attempt_id', os.getpid())}")
    os.makedirs(path, exist_ok=True)
    for key in ("offload_param", "offload_optimizer"):
        zero[key]["nvme_path"] = path
    return path


def _inject(kind: str) -> None:
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "raise":
        raise RuntimeError("injected fault")
    if kind == "exit":
        os._exit(3)
