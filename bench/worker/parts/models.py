"""Model presets built from their config with random weights, directly on the target device and dtype.

No downloads: a preset is a shape. A local Hugging Face directory may be given instead.
"""

from __future__ import annotations

import os

import torch

from ...matrix.presets import PRESETS
from ...records import cache

__all__ = ["PRESETS", "config_for", "build", "from_checkpoint", "liger_settings", "apply_liger"]

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def config_for(model: str, attn: str):
    from transformers import AutoConfig, LlamaConfig

    if model in PRESETS:
        cfg = LlamaConfig(**{k: v for k, v in PRESETS[model].items() if k != "model_type"})
    else:
        cfg = AutoConfig.from_pretrained(model, local_files_only=True)
    cfg._attn_implementation = attn
    cfg.use_cache = False
    return cfg


def liger_settings(zero_stage: int) -> dict[str, bool]:
    """Which of Liger-Kernel's kernels a kernels=liger cell uses.

    All of them, except that under ZeRO-3 the fused linear cross-entropy gives way to Liger's plain
    cross-entropy: the fused kernel reads lm_head.weight directly instead of calling the module, so
    ZeRO-3's gather hook never fires and it multiplies by an empty shard (huggingface/trl#5891,
    "size mismatch ... vec (0)"). The settings used are recorded with the result."""
    fused = zero_stage != 3
    return {
        "rope": True,
        "rms_norm": True,
        "swiglu": True,
        "fused_linear_cross_entropy": fused,
        "cross_entropy": not fused,
    }


def apply_liger(model_type: str, settings: dict[str, bool]) -> None:
    """Patch transformers' modules for `model_type` with Liger's; call before the model is built.

    Liger skips a model type it has no kernels for with a log line; here that is an error, so no cell
    is reported as kernels=liger when it ran transformers' own modules."""
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN, _apply_liger_kernel

    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise RuntimeError(
            f"Liger-Kernel has no kernels for model type {model_type!r}: refusing to report this cell as kernels=liger"
        )
    _apply_liger_kernel(model_type, **settings)


def build(
    model: str,
    attn: str,
    dtype: torch.dtype,
    device: torch.device,
    zero3_config: dict | None = None,
    seed: int | None = None,
):
    """Build the model. Presets get random weights made in `dtype` on `device` (no fp32 transient, no
    copy); a local checkpoint is loaded. With a ZeRO-3 config, the weights are partitioned as they are
    made (remote_device None: the config's offload_param device, cpu or nvme, decides). With a seed, a
    preset's weights are drawn per parameter name from it (seeded_init), the same at every ZeRO stage,
    offload and engine; without one, from the global RNG as transformers draws them."""
    from transformers import AutoModelForCausalLM

    cfg = config_for(model, attn)
    if model in PRESETS:
        import deepspeed

        ctx = (
            deepspeed.zero.Init(config_dict_or_path=zero3_config, dtype=dtype) if zero3_config else torch.device(device)
        )
        # Make weights in the target dtype directly: a 7B in fp32 then cast would briefly need 2x the memory.
        old = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with ctx:
                m = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
            if seed is not None:
                # Partitioned also when the HF Trainer's registered ZeRO-3 config made from_config use zero.Init.
                seeded_init(m, seed, partitioned=any(hasattr(p, "ds_id") for p in m.parameters()))
            elif zero3_config:
                _hf_init_partitioned(m)
        finally:
            torch.set_default_dtype(old)
    elif zero3_config:
        m = from_checkpoint(model, attn, dtype, zero3_config)
    else:
        with torch.device(device):
            m = from_checkpoint(model, attn, dtype)
    m.config.use_cache = False
    return m


def from_checkpoint(path: str, attn: str, dtype: torch.dtype, zero3_config: dict | None = None, **kw):
    """Load a local checkpoint (kw: from_pretrained's, e.g. a quantization config). With a ZeRO-3
    config, transformers partitions the weights as it loads them, through the config registered for
    the load (HfDeepSpeedConfig); inside our own zero.Init every weight would meet an
    already-partitioned (empty) parameter and the load would fail on the size mismatch."""
    from transformers import AutoModelForCausalLM

    keep = None
    if zero3_config:
        from transformers.integrations import HfDeepSpeedConfig

        keep = HfDeepSpeedConfig(zero3_config)  # noqa: F841 - must stay alive while loading
    m = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype, attn_implementation=attn, **kw)
    del keep
    m.config.use_cache = False
    return m


def _name_seed(seed: int, name: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def _initial(module, pname: str, shape: torch.Size, std: float, g: torch.Generator) -> torch.Tensor:
    """transformers' Llama init, drawn from g on its device in fp32: normal(0, initializer_range) for
    linear and embedding weights (the padding row zero), ones for norm weights, zeros for biases."""
    if pname == "weight" and len(shape) >= 2:
        t = torch.empty(shape, device=g.device).normal_(0.0, std, generator=g)
        pad = getattr(module, "padding_idx", None)
        if isinstance(module, torch.nn.Embedding) and pad is not None:
            t[pad] = 0
        return t
    if pname == "weight" and "norm" in type(module).__name__.lower():
        return torch.ones(shape, device=g.device)
    return torch.zeros(shape, device=g.device)


def draw_device() -> torch.device:
    """Where initial weights are drawn: the GPU where there is one (a 7B model's 6.7e9 normal draws took 205 s
    on the H200 host's CPU), else the CPU. Every cell on one kind of host draws on the same kind of device,
    so they start from the same weights; a GPU's draws differ from a CPU's (other generators)."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def weights_init_name() -> str:
    """The record's worker.weights_init: how the weights were drawn."""
    return "seeded-per-name" if draw_device().type == "cpu" else "seeded-per-name-cuda"


def seeded_init(model, seed: int, partitioned: bool) -> None:
    """Give every parameter weights drawn from its own generator, seeded from (seed, its name), on
    draw_device(): the same tensors whatever the stage, offload or engine, and whether the weights are
    partitioned (ZeRO-3: each module's parameters gathered in turn, one module at a time, never the whole
    model)."""
    import contextlib

    import deepspeed

    std = float(getattr(model.config, "initializer_range", 0.02))
    dev = draw_device()
    seen: set[int] = set()
    for mname, module in model.named_modules():
        params = [(n, p) for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        if not params:
            continue
        seen.update(id(p) for _, p in params)
        gather = (
            deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=0)
            if partitioned
            else contextlib.nullcontext()
        )
        with gather, torch.no_grad():
            for pname, p in params:
                g = torch.Generator(device=dev).manual_seed(_name_seed(seed, f"{mname}.{pname}" if mname else pname))
                p.copy_(_initial(module, pname, p.shape, std, g).to(p.dtype))


def _hf_init_partitioned(model) -> None:
    """Give a model built under deepspeed.zero.Init the same initial weights as the other cells.

    transformers runs its _init_weights after the constructor, when zero.Init has already
    partitioned every parameter to an empty tensor, so ZeRO-3 models would keep PyTorch's default
    init instead (and their loss curves would not be comparable with the other stages'). Re-run the
    same init, module by module in the same order (children first, as transformers does), with the
    module's own parameters gathered: one module's weights at a time, never the whole model.
    """
    import deepspeed
    from transformers import PreTrainedModel

    def visit(module, owner):
        for child in module.children():
            visit(child, child if isinstance(child, PreTrainedModel) else owner)
        params = list(module.parameters(recurse=False))
        if not params:
            return
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0), torch.no_grad():
            for p in params:  # transformers' init helpers skip tensors already flagged as initialized
                if hasattr(p, "_is_hf_initialized"):
                    p._is_hf_initialized = False
            owner._init_weights(module)

    visit(model, model)


def checkpoint(model: str, dtype: torch.dtype, device: torch.device) -> str:
    """A local checkpoint of a preset with random weights, built once per machine and cached
    (bench.records.cache: keyed by shape, precision, seed and versions; QLoRA quantizes from a checkpoint).
    Returns its directory. Safe when several ranks ask at once; an entry that does not check out is
    built again."""
    import fcntl
    import shutil

    if model not in PRESETS:
        return model
    precision = {v: k for k, v in DTYPES.items()}[dtype]
    key = cache.checkpoint_key(model, precision)
    path = str(cache.checkpoint_dir(model, precision))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cache.checkpoint_problem(path, key) is not None:
            # Its own seed, and the caller's random state left as it was: the weights do not depend on
            # which process built them, nor a cell's later draws on whether it built them.
            with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
                torch.manual_seed(cache.CHECKPOINT_SEED)
                m = build(model, "sdpa", dtype, device, None)
            tmp = path + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            m.save_pretrained(tmp, safe_serialization=True)
            del m
            cache.write_checkpoint_manifest(tmp, key)
            shutil.rmtree(path, ignore_errors=True)
            os.replace(tmp, path)
    return path


def count_params(model) -> dict[str, int]:
    """Total, trainable, and the input-embedding count (which does no matmul FLOPs). ZeRO-3 aware."""
    total = trainable = embed = 0
    emb = model.get_input_embeddings()
    emb_ids = {id(p) for p in emb.parameters()} if emb is not None else set()
    for p in model.parameters():
        n = getattr(p, "ds_numel", None) or p.numel()
        quant = getattr(p, "quant_state", None)  # bitsandbytes packs 4-bit weights: count the real shape
        if quant is not None and getattr(quant, "shape", None) is not None:
            n = int(torch.Size(quant.shape).numel())
        total += n
        if p.requires_grad:
            trainable += n
        if id(p) in emb_ids:
            embed += n
    return {"params_total": total, "params_trainable": trainable, "params_embedding": embed}


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false")
