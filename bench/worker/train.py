"""One cell, in one process (or one rank): the shared setup, then one of two engines drives the
steps (DeepSpeed's engine in our own loop, or the HF Trainer as its users run it), measured by one
Measure (bench/worker/measure.py)."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from ..host.env import version as env_version
from ..matrix.axes import OPTIMIZERS
from ..matrix.faults import VALUED
from .events import Events

if TYPE_CHECKING:
    from ..matrix.faults import Fault
    from .measure import Measure
    from .setup import Setup


def run(spec: dict, doc: dict, events: Events, fault: Fault | None) -> None:
    doc["phase"] = "import"
    import deepspeed
    import torch
    import transformers

    from . import setup as setup_mod
    from .measure import Measure

    # A worker forked from the fork server has torch's thread pool as sized there: the thread count its
    # launch gave it (OMP_NUM_THREADS: cells sharing a CPU host's cores) is applied here.
    if (n := os.environ.get("OMP_NUM_THREADS", "")).isdigit() and int(n) > 0:
        torch.set_num_threads(int(n))
    s = setup_mod.start(spec, doc, events)
    cell, ds_config = s.cell, s.ds_config
    # main() measures and removes it however the attempt ends (both engines, crashes included).
    doc["nvme_swap_dirs"] = _nvme_swap_dirs(ds_config, spec)
    hf_args = None
    if cell.engine == "hf_trainer":
        # Created before the model: with ZeRO-3 it registers the config, so from_config partitions
        # the weights as they are made (the way Trainer users get ZeRO-3 init).
        hf_args = _training_args(cell, ds_config, _scratch(spec))
    s.build(doc, under_trainer=hf_args is not None)
    measure = Measure(cell, doc, events, s.device, s.t0, own_loop=hf_args is None, world=s.world)
    if hf_args is not None:
        _train_hf(s, hf_args, measure, doc, fault)
    else:
        _train_deepspeed(s, measure, doc, fault)
    measure.finish(s.counts, s.config, s.world)
    doc["versions"] = {
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
    }
    for mod, dist in (("bitsandbytes", "bitsandbytes"), ("liger_kernel", "liger-kernel"), ("triton", "triton")):
        if mod in sys.modules:  # only what the cell imported
            doc["versions"][dist] = env_version(dist)


def _train_deepspeed(s: Setup, measure: Measure, doc: dict, fault: Fault | None) -> None:
    """Our own loop around deepspeed.initialize's engine: forward, backward, step per micro-batch."""
    import deepspeed
    import torch

    from .setup import record_kernels

    cell, ds_config, model = s.cell, s.ds_config, s.model
    record_kernels(cell, model, doc)
    batches = s.batches.to(s.device)

    # -- engine -------------------------------------------------------------------------------
    t0 = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    client_opt = None
    opt = OPTIMIZERS[cell.optimizer]
    if opt.client:
        import importlib

        client_opt = getattr(importlib.import_module(opt.module), opt.cls)(params, lr=cell.lr, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, optimizer=client_opt, config=ds_config)
    if cell.compile:
        # torch.compile of the module; the compile itself runs in the first warmup step.
        engine.compile(compile_kwargs={} if cell.compile is True else {"mode": cell.compile})
    doc["compiled"] = bool(getattr(engine, "is_compiled", False))
    doc["engine_init_s"] = time.perf_counter() - t0
    basic = getattr(engine, "basic_optimizer", None) or client_opt
    doc["zero_optimizer_class"] = type(engine.optimizer).__name__ if engine.optimizer is not None else None
    _check_optimizer(cell, basic, ds_config, doc, "DeepSpeed")
    measure.skipped = lambda: int(getattr(engine, "skipped_steps", 0) or 0)
    measure.loss_scale = lambda: _loss_scale(engine, cell)

    # -- steps --------------------------------------------------------------------------------
    kind, fault_step, fault_value = (fault.kind, fault.step, fault.value) if fault else (None, -1, None)
    # Held from before the first step to the end: a cell that needs that much more memory (bench.judge.compare's check).
    ballast = _ballast(torch, s.device, fault_value) if kind == "mem" else None
    # from_pretrained (QLoRA, local models) returns a model in eval mode, where HF skips gradient
    # checkpointing and dropout: train as a training loop does.
    engine.train()
    doc["train_mode"] = bool(engine.module.training)
    measure.warmup()
    for step in range(s.steps):
        measure.step_start(step)
        t_step = time.perf_counter()
        if kind and kind not in VALUED and step == fault_step:
            _inject(kind)
        step_losses = []
        for micro in range(cell.grad_accum):
            batch = batches[step * cell.grad_accum + micro]
            # Keep the loss only: holding the model's output would keep its logits (micro-batch x
            # seq_len x vocab) alive into the next step, adding them to every peak and to the memory
            # between steps.
            loss = engine(input_ids=batch, labels=batch).loss
            if kind == "nan" and step >= fault_step:
                loss = loss * float("nan")
            measure.part("forward")
            engine.backward(loss)
            measure.part("backward")
            engine.step()
            measure.part("step")
            step_losses.append(loss.detach())
        # One host sync per step, as a plain training loop has: .item() per micro-batch would stall
        # the GPU between micro-batches and be measured as the setup's cost.
        step_loss = torch.stack(step_losses).float().mean().item()
        if kind == "slow" and step >= fault_step:
            doc.setdefault("fault_wait_s", []).append(_slow(torch, s.device, t_step, fault_value))
        measure.step_end()
        if not measure.loss(step_loss) or measure.done:
            break
    del ballast


def _loss_scale(engine, cell) -> float | None:
    """The fp16 loss scale the engine's optimizer holds at the end (DeepSpeed's own accessor, private)."""
    if cell.precision != "fp16":
        return None
    get = getattr(engine, "_get_optimizer_loss_scale", None)
    return get() if get is not None else None


def _check_optimizer(cell, opt, ds_config: dict, doc: dict, builder: str) -> None:
    """Record the optimizer that was built and refuse it, before the first step, unless it is the cell's
    (bench/worker/parts/optimizer.py: class, bitsandbytes' bits and paging, learning rate, betas)."""
    from .parts.optimizer import facts, refusal

    built = facts(opt)
    doc["optimizer_class"] = built["class"] if opt is not None else None
    why = refusal(cell, built, ds_config, builder)
    if why:
        raise RuntimeError(why)


def _scratch(spec: dict) -> str:
    """A folder of this attempt's that the orchestrator removes however the attempt ends."""
    import tempfile

    events = spec.get("events")
    return os.path.dirname(events) if events else tempfile.mkdtemp(prefix="zerobench-trainer-")


def _training_args(cell, ds_config, scratch: str):
    import torch
    from transformers import TrainingArguments

    from .parts.models import liger_settings

    optim = OPTIMIZERS[cell.optimizer].hf_optim
    # bench.matrix.dsconfig leaves the optimizer section out for these client optimizers, so the Trainer
    # builds them from `optim`, and the stored config is exactly the one used.
    # The arguments say what the config says: the Trainer refuses a config whose stated values differ
    # from its arguments (trainer_config_finalize's mismatches), as a user's own run would be refused.
    opt = (ds_config.get("optimizer") or {}).get("params") or {}
    sched = (ds_config.get("scheduler") or {}).get("params") or {}
    # What the config states, and nothing where it states nothing (the Trainer's defaults, the same
    # that dsconfig.resolve() filled "auto" with); the cell's lr is the config's when it states one.
    stated = {}
    if "betas" in opt:
        stated["adam_beta1"], stated["adam_beta2"] = opt["betas"]
    if "eps" in opt:
        stated["adam_epsilon"] = opt["eps"]
    if "weight_decay" in opt:
        stated["weight_decay"] = opt["weight_decay"]
    if "gradient_clipping" in ds_config:
        stated["max_grad_norm"] = ds_config["gradient_clipping"]
    if "warmup_num_steps" in sched:
        stated["warmup_steps"] = sched["warmup_num_steps"]
    return TrainingArguments(
        output_dir=os.path.join(scratch, "trainer"),
        per_device_train_batch_size=cell.micro_batch,
        gradient_accumulation_steps=cell.grad_accum,
        # The most it may run: an adaptive schedule stops it sooner (the Clock callback).
        max_steps=cell.warmup_steps + cell.measured_steps,
        learning_rate=cell.lr,
        **stated,
        lr_scheduler_type="constant",
        bf16=cell.precision == "bf16",
        fp16=cell.precision == "fp16",
        deepspeed=ds_config,
        gradient_checkpointing=cell.grad_ckpt,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=cell.seed,
        remove_unused_columns=False,
        use_cpu=not torch.cuda.is_available(),
        torch_compile=bool(cell.compile),
        **({"optim": optim} if optim else {}),
        **(
            {"use_liger_kernel": True, "liger_kernel_config": liger_settings(cell.zero_stage)}
            if cell.kernels == "liger"
            else {}
        ),
        **({"torch_compile_mode": cell.compile} if isinstance(cell.compile, str) else {}),
    )


def _train_hf(s: Setup, args, measure: Measure, doc: dict, fault: Fault | None) -> None:
    """The HF Trainer path, as its users run it; its callback calls the measurement at each step's bounds."""
    import torch
    from transformers import Trainer, TrainerCallback

    from .setup import record_kernels

    cell, model = s.cell, s.model
    rows = s.batches.view(-1, cell.seq_len)

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return rows.shape[0]

        def __getitem__(self, i):
            return {"input_ids": rows[i], "labels": rows[i]}

    class Clock(TrainerCallback):
        def on_train_begin(self, a, st, c, **kw):
            # The engine and its optimizer exist from here on: a wrong optimizer ends the attempt before any step.
            _check_optimizer(cell, _trainer_optimizer(trainer), s.ds_config, doc, "the Trainer")
            # Recent Trainers apply Liger inside train(), so this is the first point that sees the result.
            record_kernels(cell, kw.get("model") or model, doc)
            measure.warmup()

        def on_step_begin(self, a, st, c, **kw):
            measure.step_start(st.global_step)
            if fault is not None and st.global_step == fault.step:
                _inject(fault.kind)  # nan is refused for this engine when the faults are checked

        def on_step_end(self, a, st, c, **kw):
            measure.step_end()
            # The Trainer still logs this step's loss (on_log), then leaves its loop.
            c.should_training_stop = c.should_training_stop or measure.done

        def on_log(self, a, st, c, logs=None, **kw):
            if logs and "loss" in logs:
                measure.loss(float(logs["loss"]))

    class InOrder(Trainer):
        # The rows in the order the DeepSpeed loop feeds them (not shuffled): both engines see the same
        # batches, so cells that differ only in engine start from the same first loss.
        def _get_train_sampler(self, *a, **kw):
            return torch.utils.data.SequentialSampler(self.train_dataset)

    trainer = InOrder(model=model, args=args, train_dataset=Rows(), callbacks=[Clock()])
    # The Trainer wraps the model in DeepSpeed's engine inside train(): read its counter there.
    measure.skipped = lambda: int(getattr(trainer.model_wrapped, "skipped_steps", 0) or 0)
    measure.loss_scale = lambda: _loss_scale(trainer.model_wrapped, cell)
    trainer.train()
    # The Trainer compiles the module it wraps in place (nn.Module.compile), which leaves _compiled_call_impl.
    doc["compiled"] = getattr(trainer.model, "_compiled_call_impl", None) is not None or bool(
        getattr(trainer.model_wrapped, "is_compiled", False)
    )


def _trainer_optimizer(trainer):
    """The optimizer the Trainer built, under DeepSpeed's and Accelerate's wrappers (the engine keeps it as
    basic_optimizer)."""
    basic = getattr(trainer.model_wrapped, "basic_optimizer", None) or trainer.optimizer
    return getattr(basic, "optimizer", basic)


def _nvme_swap_dirs(ds_config: dict, spec: dict) -> list[str]:
    """Point each offload section on NVMe at this attempt's own subfolder of its nvme_path (DeepSpeed
    fills it with swap files). Read from the config, not the cell: a user's file may put only the
    optimizer state on the drive, or the two sections on different drives."""
    zero = ds_config.get("zero_optimization")
    dirs: list[str] = []
    for key in ("offload_optimizer", "offload_param"):
        sec = zero.get(key) if isinstance(zero, dict) else None
        if isinstance(sec, dict) and sec.get("device") == "nvme":
            sec["nvme_path"] = os.path.join(sec["nvme_path"], f"zerobench-{spec.get('attempt_id', os.getpid())}")
            os.makedirs(sec["nvme_path"], exist_ok=True)
            if sec["nvme_path"] not in dirs:
                dirs.append(sec["nvme_path"])
    return dirs


def _slow(torch, device, t_step: float, pct: float) -> float:
    """Stretch this step by pct percent of its own time: the host waits while the device idles, as a
    slower kernel or a data stall would look from outside. Returns the wait as timed."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    time.sleep((t - t_step) * pct / 100.0)
    return time.perf_counter() - t


def _ballast(torch, device, mib: float):
    """mib MiB allocated and written on the cell's device (written, so host pages are really resident)."""
    return torch.ones(int(mib * 2**20), dtype=torch.uint8, device=device)


def _inject(kind: str) -> None:
    if kind == "hang":
        while True:
            time.sleep(3600)
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "raise":
        # Two lines: a reason must keep every line of a message (a Trainer's config mismatches are a list).
        raise RuntimeError("injected fault\nsecond line of the injected fault's message")
    if kind == "exit":
        os._exit(3)
    if kind == "oom":
        _eat_memory()
    if kind == "cudaoom":
        _eat_gpu_memory()


def _eat_gpu_memory() -> None:
    """Allocate GPU memory until the CUDA allocator raises its OutOfMemoryError (a real one, classified
    as any cell's); on a CPU cell, raise that error at once."""
    import torch

    if not torch.cuda.is_available():
        # A CPU cell has no GPU memory to exhaust: raise the allocator's error as it would, so the
        # orchestrator's handling of a CUDA OOM (implied outcomes, bench.execute.schedule) is testable on CPU.
        raise torch.OutOfMemoryError("CUDA out of memory (ZEROBENCH_FAULT cudaoom on a CPU cell: raised at once)")
    hoard = []
    while True:
        hoard.append(torch.empty(2**30, dtype=torch.uint8, device="cuda"))


def _eat_memory() -> None:
    """Allocate and touch host memory until the kernel's OOM killer stops this process; only under a
    memory cgroup limit below the host's RAM, so the host itself is never at risk."""
    from ..host import hostmem

    limit, total = hostmem.cgroup_limit(), hostmem.host_memory()
    if not limit or not total or limit >= total:
        raise RuntimeError("ZEROBENCH_FAULT oom needs a memory cgroup limit below the host's RAM")
    hoard = []
    for _ in range(2 * limit // 2**26 + 1):
        hoard.append(b"\x01" * 2**26)  # 64 MiB, every page written
    raise RuntimeError(f"ZEROBENCH_FAULT oom: allocated twice the {limit / 2**30:.1f} GiB limit without an OOM kill")
