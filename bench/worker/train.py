"""One cell, in one process (or one rank): build, initialize DeepSpeed, warm up, measure."""
from __future__ import annotations

import math
import os
import signal
import time
from typing import Any

from ..cells import OPTIMIZERS, Cell
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

    # -- model --------------------------------------------------------------------------------
    t0 = time.perf_counter()
    zero3 = None
    if cell.zero_stage == 3 and cell.peft != "qlora":
        zero3 = deepspeed.zero.Init(config_dict_or_path=ds_config, dtype=dtype,
                                    remote_device="cpu" if cell.offload == "optimizer+params" else None)
    model = models.build(cell.model, cell.attn, dtype, device, zero3)
    if cell.grad_ckpt:
        # Non-reentrant checkpointing works with frozen base weights (LoRA) and ZeRO-3 hooks.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cell.peft == "lora":
        from peft import LoraConfig, get_peft_model

        lo = cell.lora
        targets = "all-linear" if tuple(lo.targets) == ("all-linear",) else list(lo.targets)
        model = get_peft_model(model, LoraConfig(r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout,
                                                 target_modules=targets, task_type="CAUSAL_LM"))
    elif cell.peft == "qlora":
        raise NotImplementedError("QLoRA cells are not implemented yet")
    doc["model_build_s"] = time.perf_counter() - t0
    counts = models.count_params(model)
    doc.update(counts)

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
    doc["engine_init_s"] = time.perf_counter() - t0
    basic = getattr(engine, "basic_optimizer", None) or client_opt
    ran = type(basic).__name__ if basic is not None else None
    doc["optimizer_class"] = f"{type(basic).__module__}.{ran}" if basic is not None else None
    doc["zero_optimizer_class"] = type(engine.optimizer).__name__ if engine.optimizer is not None else None
    if ran != OPTIMIZERS[cell.optimizer]:
        raise RuntimeError(f"optimizer {cell.optimizer!r} asked for {OPTIMIZERS[cell.optimizer]}, but DeepSpeed built "
                           f"{ran}: refusing to report this cell under a name it did not run")

    # -- data ---------------------------------------------------------------------------------
    steps = cell.warmup_steps + cell.measured_steps
    n_micro = steps * cell.grad_accum
    cfg = model.config
    vocab = cfg.vocab_size
    batches = data_mod.batches(cell.data, cell.tokenizer, vocab, n_micro, cell.micro_batch, cell.seq_len,
                               cell.seed, rank).to(device)
    doc["setup_s"] = time.perf_counter() - t_setup

    # -- steps --------------------------------------------------------------------------------
    losses: list[float] = []
    times: list[float] = []
    setup_alloc = None
    skipped_at_measure = 0
    kind, fault_step = fault
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
        t0 = time.perf_counter()
        step_loss = 0.0
        for micro in range(cell.grad_accum):
            batch = batches[step * cell.grad_accum + micro]
            out = engine(input_ids=batch, labels=batch)
            loss = out.loss
            if kind == "nan" and step >= fault_step:
                loss = loss * float("nan")
            engine.backward(loss)
            engine.step()
            step_loss += loss.detach().float().item() / cell.grad_accum
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

    measured_times = times[cell.warmup_steps:]
    doc["losses"] = losses
    doc["step_times_s"] = times
    doc["fp16_skipped_steps"] = int(getattr(engine, "skipped_steps", 0)) - skipped_at_measure
    if cuda:
        doc["memory_setup"] = setup_alloc
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
                              loss_measured_first=losses[cell.warmup_steps], )
    doc["versions"] = {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                       "transformers": transformers.__version__, "cuda": torch.version.cuda}


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
