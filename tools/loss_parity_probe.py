"""Probe behind docs/loss-parity.md: why ZeRO-0 ends at a higher loss than ZeRO-1/2 under DeepSpeed 0.19.6.

Runs on CPU in one process (gloo, one rank): a tiny model, DeepSpeed's engine at ZeRO-0 and ZeRO-1 in bf16,
the same client AdamW (DeepSpeed refuses fp16 on a CPU). Prints, for each: the optimizer wrapper DeepSpeed
built, Adam's step counter before the first real step, the low-precision gradient after engine.backward()
against a plain fp32 backward's (1.0: the loss was not scaled), the loss scale the wrapper divides the
gradients by, and the first update of the fp32 master weights over the learning rate (AdamW's first step
is lr per element; less is a smaller step).

    python -m tools.loss_parity_probe
"""

from __future__ import annotations

import os


def _engine(stage: int, precision: str):
    import deepspeed
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ref = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    cfg = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        precision: {"enabled": True, **({"initial_scale_power": 16} if precision == "fp16" else {})},
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return engine, opt, ref


def probe(stage: int, precision: str) -> dict:
    import torch

    engine, opt, ref = _engine(stage, precision)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
    steps_before = [int(s["step"]) for s in opt.state.values() if "step" in s]
    # The gradient a plain fp32 backward gives, from the same weights.
    fp32 = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        for p, r in zip(fp32.parameters(), ref):
            p.copy_(r)
    torch.nn.functional.mse_loss(fp32(x), y).backward()
    true_grad = fp32[2].weight.grad.abs().mean().item()
    loss = torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), y)
    engine.backward(loss)
    lp = engine.module[2].weight
    seen_grad = lp.grad.float().abs().mean().item() if lp.grad is not None else None
    # The optimizer's own (fp32 master) parameters: the low-precision copy would round the update away.
    masters = [p for grp in opt.param_groups for p in grp["params"]]
    before = [p.detach().clone() for p in masters]
    engine.step()
    cfg = getattr(engine.optimizer, "loss_scale_config", None)
    scale = cfg.cur_scale if cfg is not None else getattr(engine.optimizer, "loss_scale", None)
    # AdamW's first update is lr * g / |g| = lr per element (eps aside): a ratio under 1 is a smaller step.
    moved = torch.cat([(p.detach() - b).abs().flatten() for p, b in zip(masters, before)])
    moved = moved[moved > 0].mean().item()
    return {
        "stage": stage,
        "precision": precision,
        "wrapper": type(engine.optimizer).__name__,
        "adam_steps_before_first_update": steps_before or [0],
        "grad_after_backward_over_fp32_grad": None if seen_grad is None else round(seen_grad / true_grad, 1),
        "loss_scale_divided_out": scale,
        "first_update_over_lr": round(moved / 1e-3, 3),
    }


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    # fp16 needs an accelerator DeepSpeed supports it on (not the CPU): its mechanism is read from the code.
    for precision in ("bf16",):
        for stage in (0, 1):
            try:
                print(probe(stage, precision), flush=True)
            except Exception as e:  # noqa: BLE001 - a combination the CPU cannot run is printed, not fatal
                print({"stage": stage, "precision": precision, "error": f"{type(e).__name__}: {e}"[:300]}, flush=True)


if __name__ == "__main__":
    main()
