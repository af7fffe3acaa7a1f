"""What a cell can vary, and what each optimizer is: one table each, read by everything else.

The bottom floor: imports nothing from bench, nor torch or pydantic. The matrix schema (bench.matrix.spec),
the Cell's axis fields and readable name (bench.matrix.cells), the compatibility rules, the generated
DeepSpeed config, the op prebuild, the result columns and the report labels are all derived from
AXES and OPTIMIZERS. Adding an axis value is one entry here plus its behaviour (docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Mapping

__all__ = [
    "AUTO",
    "LARGER",
    "Axis",
    "heavier_or_equal",
    "AXES",
    "AXIS",
    "SHOWN",
    "NAME_PARTS",
    "NamePart",
    "Shown",
    "Offload",
    "optimizer_offloaded",
    "params_offloaded",
    "OptimizerSpec",
    "UnderOffload",
    "OPTIMIZERS",
    "peft_variant",
    "LORA_TARGETS",
    "lora_target_modules",
    "lora_targets_name",
    "ZERO_STAGES",
    "OFFLOADS",
    "PRECISIONS",
    "PEFTS",
    "ENGINES",
    "COMPILE_MODES",
    "KERNELS",
]


AUTO = "auto"
"""An axis value that zerobench searches (Axis.auto): micro_batch: auto."""


# -- offload ----------------------------------------------------------------------------------
class Offload:
    """The offload axis's values. Plain strings (a Cell stores the value, and its hash the JSON)."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    """Optimizer state and its step on the CPU (ZeRO-Offload), stages 1-3."""
    OPTIMIZER_PARAMS = "optimizer+params"
    """The above, and parameters in CPU memory too: ZeRO-3 only."""
    NVME = "nvme"
    """Optimizer state and parameters on an NVMe drive (ZeRO-Infinity), ZeRO-3 only; the step runs on the CPU."""


def optimizer_offloaded(offload: str) -> bool:
    """The optimizer state leaves the GPU and its step runs on the CPU."""
    return offload in (Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS, Offload.NVME)


def params_offloaded(offload: str) -> bool:
    """The parameters leave the GPU too (CPU memory or NVMe)."""
    return offload in (Offload.OPTIMIZER_PARAMS, Offload.NVME)


# -- optimizers -------------------------------------------------------------------------------
class UnderOffload:
    """What an optimizer does when ZeRO-Offload moves its step to the CPU."""

    RUNS = "runs"
    """It steps on the CPU as itself (torch AdamW on CPU tensors)."""
    REQUIRED = "required"
    """DeepSpeed builds it only under offload (without offload the same config builds FusedAdam)."""
    REPLACED = "replaced"
    """DeepSpeed silently swaps it for DeepSpeedCPUAdam, so the cell would not run it."""
    NO_CPU_STEP = "no-cpu-step"
    """It has no CPU step: it cannot run under offload."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OptimizerSpec:
    """One optimizer a cell can name: how it is built and what limits it."""

    cls: str
    """The class that must actually run: the worker refuses a cell whose engine built something else
    (DeepSpeed swaps optimizers silently, e.g. Adam -> DeepSpeedCPUAdam under offload)."""
    ds_section: Mapping[str, Any] | None = None
    """The DeepSpeed config's "optimizer" section (type, params) that makes DeepSpeed build it; None for a
    client optimizer, which the worker builds and passes to deepspeed.initialize(optimizer=...)."""
    module: str | None = None
    """The module a client optimizer's class `cls` is imported from (its package installed separately)."""
    hf_optim: str | None = None
    """TrainingArguments(optim=...) that makes the HF Trainer build a client optimizer."""
    under_offload: str = UnderOffload.NO_CPU_STEP
    """Where its step runs when the cell offloads the optimizer (UnderOffload)."""
    precisions: tuple[str, ...] = ("fp32", "fp16", "bf16")
    """Training precisions it trains in: it has kernels for them, and its loss falls in them."""
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages it runs at."""
    onebit: bool = False
    """A 1-bit (compressed-communication) optimizer: cupy over NCCL, ZeRO-0 only."""
    removed_in_deepspeed: tuple[int, ...] | None = None
    """The DeepSpeed release that no longer has it."""
    jit_op: str | None = None
    """The DeepSpeed JIT op builder it needs (compiled once before the cells, ~30-60 s)."""
    moments: int = 2
    """State tensors it keeps per parameter beside the master copy (Adam's and LAMB's first and second moments)."""
    state_bits: int = 32
    """Bits per element of each moment: 32, or bitsandbytes' 8 (blockwise-quantized, bitsandbytes.optim's
    `optim_bits`)."""
    extra_state_bytes: int = 0
    """Further fp32 buffers as large as the parameters that the optimizer keeps beside its moments (the
    1-bit optimizers' error feedback and accumulators, read off deepspeed/runtime/fp16/onebit/)."""
    paged: bool = False
    """Its state lives in CUDA managed memory (bitsandbytes' paged optimizers): outside PyTorch's
    allocator and NVML's per-process figure, paged out to the host when the GPU runs short."""
    built_as: tuple[str, ...] = ()
    """Other classes of `module` that are this optimizer when built with its state bits and paging: the HF
    Trainer builds bitsandbytes.optim.AdamW(optim_bits=8, is_paged=True) for PagedAdamW8bit, the same
    Optimizer2State("adam", ...) (transformers trainer_optimizer.py _get_bitsandbytes_optimizer)."""

    @property
    def moment_bytes(self) -> int:
        """The optimizer's own state per trainable parameter, the fp32 master copy left out (Adam's two fp32
        moments: 8; bitsandbytes' 8-bit moments: 2)."""
        return self.moments * self.state_bits // 8

    @property
    def state_bytes(self) -> int:
        """Optimizer-state bytes per trainable parameter under mixed precision (fp32 master copy + moments),
        the ZeRO paper's K."""
        return 4 + self.moment_bytes

    @property
    def client(self) -> bool:
        return self.ds_section is None

    @property
    def package(self) -> str | None:
        """The distribution a client optimizer needs (bitsandbytes)."""
        return self.module.split(".")[0] if self.module else None


def _section(kind: str, **params: Any) -> Mapping[str, Any]:
    return MappingProxyType({"type": kind, "params": MappingProxyType(params)})


# bitsandbytes' AdamW, which the HF Trainer builds for each of its AdamW variants (optim_bits, is_paged).
_BNB = ("AdamW",)
# 1-bit: run uncompressed for freeze_step steps, then compress; keep that inside warmup.
_ONEBIT_COMM = {"cuda_aware": False, "comm_backend_name": "nccl"}
# fp16 only: DeepSpeed verified their convergence in fp16, and in bf16 and fp32 they diverged (bench.matrix.rules
# onebit-needs-fp16).
_ONEBIT = dict(onebit=True, zero_stages=(0,), precisions=("fp16",), removed_in_deepspeed=(0, 19, 7))

OPTIMIZERS: Mapping[str, OptimizerSpec] = MappingProxyType(
    {
        # torch_adam makes DeepSpeed build torch.optim.AdamW instead of its fused kernel: the plain baseline.
        "adamw": OptimizerSpec(
            cls="AdamW",
            ds_section=_section("AdamW", torch_adam=True, adam_w_mode=True),
            under_offload=UnderOffload.RUNS,
        ),
        # deepspeed.ops.adam.FusedAdam: multi-tensor CUDA kernel (a C++ op on CPU).
        "fusedadam": OptimizerSpec(
            cls="FusedAdam",
            ds_section=_section("Adam", adam_w_mode=True),
            under_offload=UnderOffload.REPLACED,
            jit_op="FusedAdamBuilder",
        ),
        # ZeRO-Offload's SIMD CPU Adam: under offload DeepSpeed turns "AdamW" into DeepSpeedCPUAdam.
        "cpuadam": OptimizerSpec(
            cls="DeepSpeedCPUAdam",
            ds_section=_section("AdamW"),
            under_offload=UnderOffload.REQUIRED,
            jit_op="CPUAdamBuilder",
        ),
        # No bf16 path: DeepSpeed's "lamb_cuda_kernel" is not implemented for 'BFloat16'.
        # Not among the optimizers DeepSpeed's ZeRO takes (runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS).
        # Its trust ratio scales each layer's step to lr x the layer's weight norm: at an AdamW learning rate its
        # loss barely moves (results/README.md, the LAMB learning rates); a LAMB matrix wants a LAMB rate.
        "fusedlamb": OptimizerSpec(
            cls="FusedLamb",
            ds_section=_section("Lamb"),
            precisions=("fp32", "fp16"),
            zero_stages=(0,),
            jit_op="FusedLambBuilder",
        ),
        # worker_error (fp32, whole model) beside exp_avg and exp_avg_sq (onebit/adam.py).
        "onebitadam": OptimizerSpec(
            cls="OnebitAdam",
            ds_section=_section("OneBitAdam", freeze_step=2, **_ONEBIT_COMM),
            extra_state_bytes=4,
            **_ONEBIT,
        ),
        "zerooneadam": OptimizerSpec(
            cls="ZeroOneAdam",
            ds_section=_section(
                "ZeroOneAdam",
                var_freeze_step=2,
                var_update_scaler=1,
                local_step_scaler=1,
                local_step_clipper=2,
                **_ONEBIT_COMM,
            ),
            extra_state_bytes=8,  # worker_error and momentum_accumulator (onebit/zoadam.py)
            **_ONEBIT,
        ),
        # worker_errors and exp_avg_sq_fresh beside the moments (onebit/lamb.py).
        "onebitlamb": OptimizerSpec(
            cls="OnebitLamb",
            ds_section=_section("OneBitLamb", freeze_step=2, **_ONEBIT_COMM),
            extra_state_bytes=8,
            **_ONEBIT,
        ),
        "paged_adamw": OptimizerSpec(
            cls="PagedAdamW", module="bitsandbytes.optim", hf_optim="paged_adamw_32bit", paged=True, built_as=_BNB
        ),
        "paged_adamw_8bit": OptimizerSpec(
            cls="PagedAdamW8bit",
            module="bitsandbytes.optim",
            hf_optim="paged_adamw_8bit",
            state_bits=8,
            paged=True,
            built_as=_BNB,
        ),
        "adamw_8bit": OptimizerSpec(
            cls="AdamW8bit", module="bitsandbytes.optim", hf_optim="adamw_bnb_8bit", state_bits=8, built_as=_BNB
        ),
    }
)


# -- axes -------------------------------------------------------------------------------------
class Shown:
    """When a cell's readable name shows an axis."""

    ALWAYS = "always"
    UNLESS_DEFAULT = "unless-default"


# -- PEFT settings ----------------------------------------------------------------------------
# The lora_targets axis's named sets of a Llama block's linear layers (peft LoraConfig target_modules).
# "all-linear" is peft's own keyword: every linear layer but the LM head.
LORA_TARGETS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "qkv": ("q_proj", "k_proj", "v_proj"),
        "attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
        "mlp": ("gate_proj", "up_proj", "down_proj"),
        "all-linear": ("all-linear",),
    }
)


def lora_target_modules(name: str | list | tuple) -> tuple[str, ...]:
    """The module names a lora_targets value (a named set, or module names) adapts."""
    if isinstance(name, (list, tuple)):
        return tuple(name)
    return LORA_TARGETS.get(name) or tuple(name.split(","))


def lora_targets_name(targets: tuple[str, ...] | list[str]) -> str:
    """The lora_targets value of a LoRA block's module names: its set's name, else the names joined."""
    targets = tuple(targets)
    return next((k for k, v in LORA_TARGETS.items() if v == targets), ",".join(targets))


def peft_variant(peft: str, r: Any, quant_type: str | None) -> str:
    """none | lora-r8 | qlora-nf4-r8: the PEFT value with the settings that change its cost."""
    if peft == "none":
        return "none"
    quant = f"-{quant_type}" if peft == "qlora" and quant_type else ""
    return f"{peft}{quant}" + (f"-r{r}" if r is not None else "")


def _str(value: Any, cell: Any) -> str:
    return str(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class NamePart:
    """A Cell field shown in the cell's readable key=value name."""

    name: str
    """The Cell field."""
    short: str
    """Its key in cell names and report labels (zero=3)."""
    default: Any
    order: int
    """Position in cell names, reports and result columns (gaps leave room to insert)."""
    shown: str = Shown.ALWAYS
    """Shown.ALWAYS, or Shown.UNLESS_DEFAULT (axes added later, so older names stay as published)."""
    text: Callable[[Any, Any], str] = _str
    """The value as the name writes it, given (value, cell)."""
    unshown: Callable[[Any, Any], bool] | None = None
    """Shown.UNLESS_DEFAULT: whether (value, cell) leaves the part out, where that is more than "value is the
    default" (the rank is already in peft=lora-r8; alpha is left out at 32 and at 2r)."""

    def part(self, cell: Any) -> str | None:
        value = getattr(cell, self.name)
        if self.shown == Shown.UNLESS_DEFAULT:
            if (self.unshown or (lambda v, c: v == self.default))(value, cell):
                return None
        return f"{self.short}={self.text(value, cell)}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Axis(NamePart):
    """A dimension the matrix crosses: a Cell field, a key under `axes:`, include and exclude."""

    label: str
    """Its title in reports."""
    doc: str
    """What it trades (shown in docs; the Cell field's documentation)."""
    type: Any
    """The type of a value (the Cell field's, with None added when none_allowed)."""
    values: tuple = ()
    """The allowed values, in the order reports list them; empty for an open axis (type, minimum)."""
    minimum: int | None = None
    """Open integer axes: the smallest value allowed."""
    auto: bool = False
    """The value "auto" is allowed: `zerobench run` searches for it (micro_batch: the largest that runs)."""
    none_allowed: bool = False
    """None is a value of the axis (ds_config: None is the generated config)."""
    setting: str | None = None
    """The matrix's fixed setting (e.g. batch.micro) that gives the value when the axis is not listed."""
    ablate: bool = True
    """Reports compare its values side by side; else they only hold it equal."""
    gpu_heavier: str | tuple[tuple, ...] | None = None
    """The direction in which a value needs at least as much GPU memory as another, all else equal, where that
    is physically certain: LARGER (an integer axis), or chains of values from lightest to heaviest (a value
    is at least as heavy as those before it in a chain it shares with them). None: no certain direction.
    A cell that runs out of GPU memory implies the cells heavier than it along these (bench.execute.schedule)."""
    host_heavier: str | tuple[tuple, ...] | None = None
    """The same for host memory (a host OOM implies the cells heavier than it on the host)."""
    block: str | None = None
    """The Cell's settings block (lora, qlora) that holds the value as its field `block_field`: the block
    is what the cell hash reads, so a value set by the matrix's block and the same value on the axis are one
    cell. The matrix's block gives the value where the axis is not listed (as `setting` does)."""
    block_field: str | None = None
    applies: Callable[[Mapping[str, Any]], bool] | None = None
    """Whether the axis means anything for a cell, given its axis values (LoRA settings with peft: none do
    not). Where it does not, crossing leaves the value at its default instead of multiplying cells; an
    include that names a value there makes a cell the rules reject."""
    hashed_at_default: bool = False
    """The cell hash includes the value even at its default. Only for axes older than the first published
    results: an axis added later is left out of the hash at its default, so every existing cell keeps its
    hash (and its history, baselines and --resume)."""


LARGER = "larger"
"""Axis.gpu_heavier / host_heavier of an integer axis: a larger value is heavier."""


def heavier_or_equal(direction: str | tuple[tuple, ...] | None, a: Any, b: Any) -> bool:
    """Whether value a needs at least as much memory as value b along an axis's direction (Axis.gpu_heavier
    or host_heavier): equal values, a larger integer under LARGER, or a later value in a shared chain."""
    if a == b:
        return True
    if direction == LARGER:
        return isinstance(a, int) and isinstance(b, int) and a > b
    return any(a in chain and b in chain and chain.index(a) > chain.index(b) for chain in direction or ())


ZERO_STAGES = (0, 1, 2, 3)
OFFLOADS = (Offload.NONE, Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS, Offload.NVME)
PRECISIONS = ("fp32", "fp16", "bf16")
PEFTS = ("none", "lora", "qlora")
ENGINES = ("deepspeed", "hf_trainer")
# torch.compile modes a cell can name (True is "default"); max-autotune tunes matmul kernels at compile time.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# "hf" (transformers' modules, SDPA attention) or "liger" (Liger-Kernel's Triton RMSNorm, RoPE, SwiGLU
# and fused linear cross-entropy).
KERNELS = ("hf", "liger")

# In the order a matrix crosses them, which fixes the order its cells expand (and run) in.
AXES: tuple[Axis, ...] = (
    Axis(
        name="zero_stage",
        label="ZeRO stage",
        short="zero",
        order=10,
        type=int,
        default=0,
        values=ZERO_STAGES,
        hashed_at_default=True,
        # No heavier direction: on one GPU a lower stage is not always heavier (measured: docs/running.md, the
        # order of cells).
        doc="What ZeRO partitions across GPUs: 1 optimizer state, 2 also gradients, 3 also parameters.",
    ),
    Axis(
        name="offload",
        label="Offload",
        short="offload",
        order=20,
        type=str,
        default=Offload.NONE,
        values=OFFLOADS,
        hashed_at_default=True,
        # At the same stage, offloading more moves state off the GPU and adds none to it; onto the host it
        # moves that state (NVMe's host buffers are not certainly larger or smaller than the others').
        gpu_heavier=(
            (Offload.NVME, Offload.OPTIMIZER, Offload.NONE),
            (Offload.OPTIMIZER_PARAMS, Offload.OPTIMIZER, Offload.NONE),
        ),
        host_heavier=((Offload.NONE, Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS),),
        doc="What leaves the GPU (Offload): GPU memory for PCIe traffic and a CPU optimizer step.",
    ),
    Axis(
        name="precision",
        label="Precision",
        short="prec",
        order=30,
        type=str,
        default="bf16",
        values=PRECISIONS,
        hashed_at_default=True,
        # No heavier direction: fp32 holds fp32 weights and no master copy, bf16 half-size weights plus an
        # fp32 master copy; which is larger depends on the optimizer, PEFT and the activations.
        doc="Training precision: bf16/fp16 mixed precision, or fp32.",
    ),
    Axis(
        name="grad_ckpt",
        label="Gradient checkpointing",
        short="gc",
        order=40,
        type=bool,
        default=False,
        values=(False, True),
        hashed_at_default=True,
        text=lambda v, c: "on" if v else "off",
        gpu_heavier=((True, False),),  # off keeps every activation that on recomputes
        doc="Recompute activations in backward: less activation memory for an extra forward pass.",
    ),
    Axis(
        name="optimizer",
        label="Optimizer",
        short="opt",
        order=50,
        type=str,
        default="adamw",
        values=tuple(OPTIMIZERS),
        hashed_at_default=True,
        doc="A name in OPTIMIZERS.",
    ),
    Axis(
        name="peft",
        label="PEFT",
        short="peft",
        order=60,
        type=str,
        default="none",
        values=PEFTS,
        hashed_at_default=True,
        text=lambda v, c: peft_variant(v, c.lora.r if c.lora else "?", c.qlora.quant_type if c.qlora else None),
        doc="Train all weights, a LoRA adapter, or a LoRA adapter over 4-bit base weights (QLoRA).",
    ),
    *(
        # No gpu_heavier direction yet: a larger rank or target set is heavier on paper, but no GPU run has
        # checked it, and an implied OOM on a wrong direction would drop cells unrun.
        Axis(order=order, block=block, block_field=fld, shown=Shown.UNLESS_DEFAULT, setting=f"{block}.{fld}", **kw)
        for order, block, fld, kw in (
            (
                61,
                "lora",
                "r",
                dict(
                    name="lora_r",
                    label="LoRA rank",
                    short="r",
                    type=int,
                    default=16,
                    minimum=1,
                    applies=lambda v: v["peft"] != "none",
                    unshown=lambda v, c: v == 16 or c.lora is not None,  # peft=lora-r8 shows it
                    doc="LoRA rank r: adapter parameters, their optimizer state and activations grow linearly "
                    "with it; a small rank may not fit the data's patterns.",
                ),
            ),
            (
                62,
                "lora",
                "alpha",
                dict(
                    name="lora_alpha",
                    label="LoRA alpha",
                    short="alpha",
                    type=int,
                    default=32,
                    minimum=1,
                    applies=lambda v: v["peft"] != "none",
                    # Names leave out the default 32 and alpha/r = 2 (the default's scale, e.g. r=8 alpha=16).
                    unshown=lambda v, c: v in (32, 2 * c.lora_r),
                    doc="LoRA scale numerator: the update is scaled by alpha/r. No memory or speed effect; it "
                    "changes how fast the adapter learns (names show it unless it is 32 or 2r).",
                ),
            ),
            (
                63,
                "lora",
                "targets",
                dict(
                    name="lora_targets",
                    label="LoRA targets",
                    short="targets",
                    type=str,
                    default="all-linear",
                    values=tuple(LORA_TARGETS),
                    applies=lambda v: v["peft"] != "none",
                    doc="Which linear layers get an adapter (LORA_TARGETS): fewer layers, fewer trainable "
                    "parameters and less optimizer state, and less the adapter can change.",
                ),
            ),
            (
                64,
                "qlora",
                "quant_type",
                dict(
                    name="qlora_quant",
                    label="QLoRA quantization",
                    short="quant",
                    type=str,
                    default="nf4",
                    values=("nf4", "fp4"),
                    applies=lambda v: v["peft"] == "qlora",
                    unshown=lambda v, c: v == "nf4" or c.qlora is not None,  # peft=qlora-fp4-r16 shows it
                    doc="4-bit data type of the base weights: NF4 (normal-float, the QLoRA paper's) or FP4. "
                    "Same storage; they differ in quantization error, so in loss.",
                ),
            ),
            (
                65,
                "qlora",
                "double_quant",
                dict(
                    name="qlora_double_quant",
                    label="QLoRA double quantization",
                    short="dq",
                    type=bool,
                    default=True,
                    values=(False, True),
                    applies=lambda v: v["peft"] == "qlora",
                    text=lambda v, c: "on" if v else "off",
                    doc="Quantize the 4-bit weights' fp32 absmax constants to 8 bits: about 0.37 bit per "
                    "parameter less (0.5 -> 0.127), for a little dequantization time.",
                ),
            ),
        )
    ),
    Axis(
        name="engine",
        label="Engine",
        short="engine",
        order=70,
        type=str,
        default="deepspeed",
        values=ENGINES,
        hashed_at_default=True,
        shown=Shown.UNLESS_DEFAULT,
        doc="Who drives training: our own loop over deepspeed.initialize, or the Hugging Face Trainer.",
    ),
    Axis(
        name="compile",
        label="torch.compile",
        short="compile",
        order=80,
        type=bool | str,
        default=False,
        values=(False, True, *COMPILE_MODES),
        shown=Shown.UNLESS_DEFAULT,
        text=lambda v, c: "on" if v is True else str(v),
        doc="torch.compile the model (DeepSpeed's engine.compile(); TrainingArguments(torch_compile=True) on "
        "the HF Trainer path): True for torch.compile's default mode, or a mode name (COMPILE_MODES). The "
        "compile itself happens in the warmup steps.",
    ),
    Axis(
        name="micro_batch",
        label="Micro batch",
        short="mb",
        order=100,
        type=int,
        default=1,
        minimum=1,
        setting="batch.micro",
        hashed_at_default=True,
        auto=True,
        gpu_heavier=LARGER,  # activations grow with it; the model states do not shrink
        doc='Sequences per GPU per forward pass: activation memory grows with it. "auto": the largest that '
        "runs, found by real runs seeded by the memory model (each probe recorded).",
    ),
    Axis(
        name="grad_accum",
        label="Gradient accumulation",
        short="ga",
        order=110,
        type=int,
        default=1,
        minimum=1,
        setting="batch.grad_accum",
        hashed_at_default=True,
        shown=Shown.UNLESS_DEFAULT,
        doc="Micro-batches per optimizer step: a bigger batch for no extra memory.",
    ),
    Axis(
        name="kernels",
        label="Kernels",
        short="kernels",
        order=90,
        type=str,
        default="hf",
        values=KERNELS,
        shown=Shown.UNLESS_DEFAULT,
        doc="Which implementation of the model's own ops (KERNELS). \"liger\" patches transformers' modules "
        "with Liger-Kernel's before the model is built; what the model ran is recorded (worker.kernels).",
    ),
    Axis(
        name="ds_config",
        label="DeepSpeed config",
        short="ds_config",
        order=130,
        type=str,
        default=None,
        none_allowed=True,
        hashed_at_default=True,
        shown=Shown.UNLESS_DEFAULT,
        ablate=False,
        text=lambda v, c: v.rsplit("/", 1)[-1],
        doc="Path of a user-supplied DeepSpeed JSON, used instead of the generated one (the ZeRO, offload, "
        "precision and optimizer fields then describe that file rather than produce it).",
    ),
)
AXIS: Mapping[str, Axis] = MappingProxyType({a.name: a for a in AXES})

# Axes in the order names, reports and result columns show them.
SHOWN: tuple[Axis, ...] = tuple(sorted(AXES, key=lambda a: a.order))
# The cell name shows the GPUs per node and the nodes too, fixed settings (gpus=2,nodes=2), between the axes.
NAME_PARTS: tuple[NamePart, ...] = tuple(
    sorted(
        (
            *AXES,
            NamePart(name="gpus", short="gpus", default=1, order=120, shown=Shown.UNLESS_DEFAULT),
            NamePart(name="nodes", short="nodes", default=1, order=121, shown=Shown.UNLESS_DEFAULT),
        ),
        key=lambda p: p.order,
    )
)
