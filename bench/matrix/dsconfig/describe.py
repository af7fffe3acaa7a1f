"""describe(cfg): the axis values (ZeRO stage, offload, precision, optimizer) a DeepSpeed config amounts to."""

from __future__ import annotations

from ..problems import ConfigError, Problem
from .read import check
from .tables import _OPTIMIZER_NAMES, DS_OPTIMIZERS, OFFLOAD_AXIS, _device, _placement, _section


def describe(cfg: dict) -> dict:
    """The axis values a checked config amounts to, as DeepSpeed would run it.

    offload is a value of the offload axis (OFFLOAD_AXIS); a config that has none raises ConfigError
    (load() and check() report it with the fix). optimizer is the zerobench name of the class DeepSpeed
    builds (engine._configure_basic_optimizer), or None when it builds none (no optimizer section) or
    one zerobench does not name (SGD, Lion, ...).
    """
    raw_zero = cfg.get("zero_optimization")
    zero = raw_zero if isinstance(raw_zero, dict) else {}
    stage = int(raw_zero) if isinstance(raw_zero, bool) else int(zero.get("stage", 0))
    placement = _placement(zero, stage)
    if placement not in OFFLOAD_AXIS:
        raise ConfigError(
            check(cfg)
            or [
                Problem(
                    "<ds_config>",
                    "zero_optimization",
                    f"no offload axis value places the optimizer state and parameters at {placement}",
                )
            ]
        )
    # engine.zero_use_cpu_optimizer looks at the device only, not the stage.
    cpu_optimizer = _device(zero, "offload_optimizer", "cpu_offload") in ("cpu", "nvme")

    bf16 = _section(cfg, "bf16") if "bf16" in cfg else _section(cfg, "bfloat16")
    fp16 = _section(cfg, "fp16")
    if fp16.get("enabled") is True:
        precision = "fp16"
    elif bf16.get("enabled") is True:
        precision = "bf16"
    elif "auto" in (fp16.get("enabled"), bf16.get("enabled")):
        precision = None  # the cell's (the Trainer takes it from its fp16/bf16 arguments)
    else:
        precision = "fp32"
    if "optimizer" in cfg:
        optimizer = _built_optimizer(_section(cfg, "optimizer"), cpu_optimizer, zenflow=bool(zero.get("zenflow")))
    else:  # resolve() adds the cell's; under optimizer offload DeepSpeed turns it into DeepSpeedCPUAdam
        optimizer = "cpuadam" if cpu_optimizer else None
    batch = {
        k: cfg[k]
        for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
        if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)
    }
    lr = _section(_section(cfg, "optimizer"), "params").get("lr")
    return {
        "zero_stage": stage,
        "offload": OFFLOAD_AXIS[placement],
        "precision": precision,
        "optimizer": optimizer,
        "micro_batch": batch.get("train_micro_batch_size_per_gpu"),
        "grad_accum": batch.get("gradient_accumulation_steps"),
        "lr": float(lr) if isinstance(lr, (int, float)) and not isinstance(lr, bool) else None,
    }


def _built_optimizer(opt: dict, cpu_optimizer: bool, *, zenflow: bool) -> str | None:
    kind = opt.get("type")
    if not isinstance(kind, str) or kind.lower() not in DS_OPTIMIZERS:
        return None  # none, or a torch.optim class built by name
    kind, params = kind.lower(), _section(opt, "params")
    if kind in ("adam", "adamw"):
        # engine.get_optimizer_configuration: torch_adam wins over offload, then CPU Adam, then FusedAdam.
        if params.get("torch_adam"):
            adam_w = kind == "adamw" or bool(params.get("adam_w_mode", True))
            return "adamw" if adam_w else None  # torch.optim.Adam: not a zerobench optimizer
        if cpu_optimizer:
            return None if zenflow else "cpuadam"  # ZenFlowCPUAdam under zenflow
        return "fusedadam"
    return _OPTIMIZER_NAMES.get(kind)
