"""A cell is one configuration to measure: a frozen value with a readable id and a stable hash.

Two runs of the same cell share its hash; the hash covers everything that changes what is
measured (model, shapes, steps, seed, every axis) and nothing that does not (timeout, matrix name).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Cell", "Lora", "Qlora", "ZERO_STAGES", "OFFLOADS", "PRECISIONS", "OPTIMIZERS", "PEFTS", "ENGINES",
           "COMPILE_MODES", "KERNELS"]

ZERO_STAGES = (0, 1, 2, 3)
OFFLOADS = ("none", "optimizer", "optimizer+params", "nvme")  # nvme: optimizer and parameters, ZeRO-3
PRECISIONS = ("fp32", "fp16", "bf16")
# Each optimizer name is the class that must actually run; the worker refuses a cell whose engine
# built something else (DeepSpeed swaps optimizers silently, e.g. Adam -> DeepSpeedCPUAdam under offload).
OPTIMIZERS = {
    "adamw": "AdamW",  # torch.optim.AdamW: the plain baseline
    "fusedadam": "FusedAdam",  # deepspeed.ops.adam.FusedAdam (multi-tensor CUDA kernel; a C++ op on CPU)
    "cpuadam": "DeepSpeedCPUAdam",  # ZeRO-Offload's SIMD CPU Adam; only runs with offload
    "fusedlamb": "FusedLamb",
    "onebitadam": "OnebitAdam",
    "zerooneadam": "ZeroOneAdam",
    "onebitlamb": "OnebitLamb",
    "paged_adamw": "PagedAdamW",  # bitsandbytes
    "paged_adamw_8bit": "PagedAdamW8bit",
    "adamw_8bit": "AdamW8bit",
}
PEFTS = ("none", "lora", "qlora")
# torch.compile modes a cell can name (True is "default"); max-autotune tunes matmul kernels at compile time.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Kernel sets a cell can use for the model's own ops: "hf" (transformers' modules, SDPA attention) or
# "liger" (Liger-Kernel's Triton RMSNorm, RoPE, SwiGLU and fused linear cross-entropy).
KERNELS = ("hf", "liger")
_LATER_FIELDS = {"compile": False, "kernels": "hf"}
ENGINES = ("deepspeed", "hf_trainer")


@dataclass(frozen=True, kw_only=True, slots=True)
class Lora:
    """LoRA adapter settings (also used by QLoRA)."""

    r: int = 16
    """Rank: adapter parameters and optimizer state grow linearly with it."""
    alpha: int = 32
    """Scale numerator (scale = alpha / r); no memory or speed effect."""
    dropout: float = 0.0
    """Dropout on the adapter input; costs a little activation memory when > 0."""
    targets: tuple[str, ...] = ("all-linear",)
    """Module names to adapt, or ("all-linear",) for every linear layer but the LM head."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Qlora:
    """4-bit base-weight quantization (bitsandbytes) under a LoRA adapter."""

    quant_type: str = "nf4"
    """nf4 (normal-float, the QLoRA paper's) or fp4."""
    double_quant: bool = True
    """Quantize the quantization constants too: ~0.4 bit/param less memory, slightly slower."""
    quant_storage: str = "auto"
    """Storage dtype of packed weights; 'auto' = the compute dtype, which ZeRO-3 needs to shard them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cell:
    """One point of the matrix. Axis fields first, then the fixed settings shared by the matrix."""

    # axes
    zero_stage: int = 0
    offload: str = "none"
    precision: str = "bf16"
    grad_ckpt: bool = False
    optimizer: str = "adamw"
    peft: str = "none"
    engine: str = "deepspeed"
    compile: bool | str = False
    """torch.compile the model (DeepSpeed's engine.compile(); TrainingArguments(torch_compile=True) on the
    HF Trainer path): True for torch.compile's default mode, or a mode name (COMPILE_MODES). The compile
    itself happens in the warmup steps."""
    kernels: str = "hf"
    """Which implementation of the model's own ops (KERNELS). "liger" patches transformers' modules with
    Liger-Kernel's before the model is built; what the model ran is recorded (worker.kernels)."""
    ds_config: str | None = None
    """Path of a user-supplied DeepSpeed JSON, used instead of the generated one (the ZeRO, offload,
    precision and optimizer fields then describe that file rather than produce it)."""
    ds_config_sha: str | None = None
    """Content hash of that file, so an edited file is a different cell."""
    # fixed settings
    model: str = "llama-tiny"
    """A preset name (llama-tiny, llama-small, llama-1b, llama-7b, llama-13b) or a local Hugging Face directory."""
    data: str = "builtin"
    tokenizer: str | None = None
    seq_len: int = 128
    micro_batch: int = 1
    grad_accum: int = 1
    warmup_steps: int = 2
    measured_steps: int = 8
    lr: float = 1e-3
    seed: int = 0
    gpus: int = 1
    attn: str = "sdpa"
    lora: Lora | None = None
    qlora: Qlora | None = None
    # not part of the identity
    nvme_path: str | None = field(default=None, compare=False)
    """Folder on the NVMe drive for offload: nvme cells swap optimizer state and parameters there."""
    timeout_s: float = field(default=1800.0, compare=False)
    matrix: str = field(default="", compare=False)

    # -- identity -----------------------------------------------------------------------------
    def canonical(self) -> dict[str, Any]:
        """Everything that changes the measurement, as plain JSON-able data."""
        d = self.to_dict()
        for k in ("timeout_s", "matrix", "nvme_path"):
            d.pop(k)
        # Fields added after results were first published are left out at their default, so a cell
        # keeps the hash (and its history, baselines and --resume) it had before the field existed.
        for k, default in _LATER_FIELDS.items():
            if d[k] == default:
                d.pop(k)
        return d

    @property
    def hash(self) -> str:
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    @property
    def name(self) -> str:
        """Readable key=value name of the axis values (the hash disambiguates the rest)."""
        parts = [f"zero={self.zero_stage}", f"offload={self.offload}", f"prec={self.precision}",
                 f"gc={'on' if self.grad_ckpt else 'off'}", f"opt={self.optimizer}"]
        if self.peft == "none":
            parts.append("peft=none")
        else:
            r = self.lora.r if self.lora else "?"
            quant = f"-{self.qlora.quant_type}" if self.peft == "qlora" and self.qlora else ""
            parts.append(f"peft={self.peft}{quant}-r{r}")
        if self.engine != "deepspeed":
            parts.append(f"engine={self.engine}")
        if self.compile is True:
            parts.append("compile=on")
        elif self.compile:
            parts.append(f"compile={self.compile}")
        if self.kernels != "hf":
            parts.append(f"kernels={self.kernels}")
        parts.append(f"mb={self.micro_batch}")
        if self.grad_accum != 1:
            parts.append(f"ga={self.grad_accum}")
        if self.gpus != 1:
            parts.append(f"gpus={self.gpus}")
        if self.ds_config:
            parts.append(f"ds_config={self.ds_config.rsplit('/', 1)[-1]}")
        return ",".join(parts)

    @property
    def id(self) -> str:
        return f"{self.name}#{self.hash}"

    # -- derived ------------------------------------------------------------------------------
    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.grad_accum * self.seq_len * self.gpus

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("lora", "qlora"):
            if d[k] is not None:
                d[k] = {kk: list(v) if isinstance(v, tuple) else v for kk, v in d[k].items()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Cell":
        d = dict(d)
        if d.get("lora") is not None:
            lo = dict(d["lora"])
            lo["targets"] = tuple(lo.get("targets", ("all-linear",)))
            d["lora"] = Lora(**lo)
        if d.get("qlora") is not None:
            d["qlora"] = Qlora(**d["qlora"])
        return cls(**d)
