"""Cell -> predicted peak memory: NVML's per-process figure on each GPU, and the host RSS of the cell's
process tree, each a sum of named terms.

The GPU figure is what NVML reports for the worker's process: the CUDA context, NCCL's buffers, and
what the caching allocator reserved; the allocator's reservation is its peak allocation plus what it
could not reuse (fragmentation). The allocation peak is the larger of two moments of a step:

- forward/backward: parameters, the optimizer's persistent state, the gradients as they accumulate,
  DeepSpeed's reduce buckets and (ZeRO-3) the gathered parameters, and the activations;
- the optimizer step: the persistent state and the step's transients (DeepSpeed flattens the
  gradients and converts them to fp32 before the step; torch's AdamW and the 1-bit optimizers make
  temporaries the size of their tensors).

Each DeepSpeed buffer is counted as DeepSpeed 0.19.6 allocates it (deepspeed/runtime/fp16/
fused_optimizer.py, unfused_optimizer.py, bf16_optimizer.py, zero/stage_1_and_2.py, zero/stage3.py);
the comments name the place. Activations are counted tensor by tensor from what autograd saves in a
Llama block (transformers' modules or Liger-Kernel's). The few constants that are not read off code
are fitted on recorded measurements: named in bench.estimate.fitted, their values in fit.json.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..host.rates import Rates
from ..matrix.axes import OPTIMIZERS, Offload, OptimizerSpec, optimizer_offloaded, params_offloaded
from ..matrix.shapes import Shape, adapted, shape_of, trainable_params
from .fitted import FITTED, Constants

__all__ = ["Hardware", "Estimate", "predict", "zero_settings", "GiB"]

GiB = 2**30
MiB = 2**20

# cuBLAS and cuBLASLt workspaces the first matmul allocates through the caching allocator (PyTorch's
# default on Hopper): what a ZeRO-0 cell holds between steps above its 14 bytes per parameter
# (docs/memory-model.md).
CUBLAS_WORKSPACE = 64 * MiB
# DeepSpeed's 1-bit compressed all-reduce (runtime/comm/nccl.py, compressed_allreduce) makes two fp32
# temporaries the size of the momentum (`buffer_m - worker_scale * buffer_m.sign()...`): 8 bytes per
# trainable parameter during the step; outside torch's allocator, cupy's memory pool keeps the packed
# signs (1 bit per parameter each: the worker's, the received ones, the server's).
ONEBIT_STEP_TEMPORARIES = 8
ONEBIT_CUPY_BYTES = 3 / 8
# bitsandbytes' 4-bit weights, NF4 and FP4 alike (qlora_quant changes the code book, not the storage): two
# 4-bit values per byte; absmax per block of 64 in 8 bits with double quantization (plus an fp32 absmax per
# 256 blocks: 0.127 bit/param), else an fp32 absmax per block of 64 (0.5 bit/param).
NF4_BYTES = 0.5
NF4_CONSTANTS_DOUBLE = 1 / 64 + 4 / (64 * 256)
NF4_CONSTANTS_SINGLE = 4 / 64


@dataclass(frozen=True, slots=True)
class Hardware:
    """What the prediction is judged against: the GPU's memory (NVML's total) and the host's."""

    gpu_memory_bytes: int | None = None
    host_memory_bytes: int | None = None
    gpu_name: str | None = None
    host_cores: int | None = None
    """The host's CPU cores (the step-time model's CPU optimizer under offload); the memory model reads none."""
    host_time: float | None = None
    """The host's time for a fixed CPU workload over the typical H200 host's, measured on it before any cell ran
    (bench.estimate.steptime.host_time_of: 0.5 is a host twice as fast); None where unmeasured, and the
    step-time model predicts for the typical host. The memory model reads none."""
    rates: Rates | None = None
    """The machine's rates (bench.host.rates: the probe's, else None and the step-time model takes the GPU's data
    sheet). The memory model reads none."""


@dataclass(frozen=True, slots=True)
class Estimate:
    """Predicted peaks of one cell, per GPU and on the host, as sums of named terms (bytes)."""

    gpu_bytes: float
    """NVML's per-process peak on each GPU (the largest rank's)."""
    host_bytes: float
    """Peak RSS of the cell's process tree on one host (each node's, for a multi-node cell)."""
    gpu_terms: dict[str, float]
    """The terms of gpu_bytes at the peak moment (they sum to it)."""
    host_terms: dict[str, float]
    phase: str
    """The moment of the allocator's peak: "forward/backward" or "step"."""
    allocated_bytes: float = 0.0
    """The allocator's peak allocation (torch.cuda.max_memory_allocated) inside gpu_bytes."""
    paged_bytes: float = 0.0
    """Optimizer state in CUDA managed memory (bitsandbytes' paged optimizers): on the GPU while it
    fits, outside the allocator and NVML's per-process figure, paged to the host under pressure."""
    moments: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)
    """Every term at every moment, whichever is the peak: persistent, backward, step, activations (by phase)."""
    basis: dict[str, float] = field(default_factory=dict, repr=False)
    """What the fitted fragmentation constants multiply (bench.estimate.check fits them)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_bytes": int(self.gpu_bytes),
            "host_bytes": int(self.host_bytes),
            "phase": self.phase,
            "paged_bytes": int(self.paged_bytes),
            "terms": {k: int(v) for k, v in self.gpu_terms.items()},
            "host_terms": {k: int(v) for k, v in self.host_terms.items()},
        }


# -- DeepSpeed's settings --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ZeroSettings:
    """The zero_optimization settings that size buffers, with DeepSpeed 0.19.6's defaults
    (deepspeed/runtime/zero/config.py)."""

    stage: int = 0
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    sub_group_size: int = 1_000_000_000
    prefetch_bucket_size: int = 50_000_000
    max_live_parameters: int = 1_000_000_000
    param_persistence_threshold: int = 100_000
    max_reuse_distance: int = 1_000_000_000
    pin_memory: bool = False
    grad_accum_fp32: bool = False
    """data_types.grad_accum_dtype fp32: bf16 at ZeRO-1 then runs BF16_Optimizer."""


def _int(v: Any, default: int) -> int:
    try:
        return int(float(v))
    except (TypeError, ValueError):
        return default  # "auto" left unresolved, or absent


def zero_settings(cfg: dict | None) -> ZeroSettings:
    """The zero_optimization settings of a DeepSpeed config; DeepSpeed's defaults where it leaves one out."""
    z = (cfg or {}).get("zero_optimization") or {}
    d = ZeroSettings()
    stage = _int(z.get("stage"), 0)
    overlap = z.get("overlap_comm")
    pin = any(
        isinstance(z.get(k), dict) and z[k].get("pin_memory", False) for k in ("offload_optimizer", "offload_param")
    )
    return ZeroSettings(
        stage=stage,
        reduce_bucket_size=_int(z.get("reduce_bucket_size"), d.reduce_bucket_size),
        allgather_bucket_size=_int(z.get("allgather_bucket_size"), d.allgather_bucket_size),
        # DeepSpeed's default: on at ZeRO-3, off below (ZeroConfig.overlap_comm_valid).
        overlap_comm=(stage == 3) if overlap is None else bool(overlap),
        contiguous_gradients=bool(z.get("contiguous_gradients", True)),
        sub_group_size=_int(z.get("sub_group_size"), d.sub_group_size),
        prefetch_bucket_size=_int(z.get("stage3_prefetch_bucket_size"), d.prefetch_bucket_size),
        max_live_parameters=_int(z.get("stage3_max_live_parameters"), d.max_live_parameters),
        param_persistence_threshold=_int(z.get("stage3_param_persistence_threshold"), d.param_persistence_threshold),
        max_reuse_distance=_int(z.get("stage3_max_reuse_distance"), d.max_reuse_distance),
        pin_memory=pin,
        grad_accum_fp32=str(((cfg or {}).get("data_types") or {}).get("grad_accum_dtype", "")).lower()
        in ("fp32", "float32", "float"),
    )


# -- what every term reads ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Setting:
    """A cell as the memory model reads it: its shape, DeepSpeed's settings, and the sizes the terms start from."""

    cell: Any
    s: Shape
    z: ZeroSettings
    n: int
    """Ranks ZeRO partitions over: every rank of every node."""
    a: int
    """Bytes of a parameter, gradient and activation as trained."""
    spec: OptimizerSpec | None
    trainable: int
    frozen: int
    """The base weights under an adapter; 0 without one."""
    lora_n: int
    """Adapted linear layers per block (0 without an adapter)."""
    lora_r: int

    @property
    def stage(self) -> int:
        return self.cell.zero_stage

    @property
    def total(self) -> int:
        return self.frozen + self.trainable

    @property
    def mixed(self) -> bool:
        return self.a == 2

    @property
    def off_opt(self) -> bool:
        return optimizer_offloaded(self.cell.offload)

    @property
    def off_par(self) -> bool:
        return params_offloaded(self.cell.offload)

    @property
    def shard_opt(self) -> int:
        """What the optimizer's state is partitioned over: every rank from ZeRO-1."""
        return self.n if self.stage >= 1 else 1

    @property
    def moment(self) -> int:
        """The optimizer's state bytes per trainable parameter."""
        return self.spec.moment_bytes if self.spec else 8

    @property
    def onebit(self) -> bool:
        return bool(self.spec and self.spec.onebit)

    @property
    def liger(self) -> bool:
        return self.cell.kernels == "liger"

    @property
    def norms_train(self) -> bool:
        return self.cell.peft not in ("lora", "qlora")  # PEFT freezes everything but the adapters

    @property
    def g16(self) -> int:
        """The gradients as backward makes them."""
        return self.a * self.trainable


def _setting(cell: Any, ds_config: dict | None) -> _Setting:
    """The cell's shape, its DeepSpeed settings and its trained and frozen parameters."""
    s = shape_of(cell.model)
    if s is None:
        raise ValueError(f"no shape for model {cell.model!r}: a preset or a local directory with config.json")
    z = zero_settings(ds_config) if ds_config is not None else ZeroSettings(stage=cell.zero_stage)
    lora_n = lora_r = frozen = 0
    if adapted(cell):
        lora_n, lora_r = s.lora_targets(tuple(cell.lora.targets)), cell.lora.r
        frozen = s.params  # the base weights under the adapter
    return _Setting(
        cell=cell,
        s=s,
        z=z,
        n=max(int(cell.ranks), 1),
        a=4 if cell.precision == "fp32" else 2,
        spec=OPTIMIZERS.get(cell.optimizer),
        trainable=trainable_params(cell, s),
        frozen=frozen,
        lora_n=lora_n,
        lora_r=lora_r,
    )


# -- parameters and optimizer state ------------------------------------------------------------------
def _weights(c: _Setting) -> tuple[float, float]:
    """Bytes of this rank's weights and of QLoRA's quantization constants (none under parameter offload)."""
    if c.off_par:
        return 0.0, 0.0
    shard3 = c.n if c.stage == 3 else 1
    if c.cell.peft == "qlora":
        double = c.cell.qlora is None or c.cell.qlora.double_quant
        const = NF4_CONSTANTS_DOUBLE if double else NF4_CONSTANTS_SINGLE
        quantized = c.s.linear_params
        # The embedding, norms and LM head stay in the compute dtype (prepare_model_for_kbit_training
        # upcasts them to fp32; DeepSpeed's engine casts every floating parameter back to the compute dtype).
        weights = (quantized * NF4_BYTES + (c.frozen - quantized + c.trainable) * c.a) / shard3
        return weights, quantized * const / shard3
    return (c.frozen + c.trainable) * c.a / shard3, 0.0


def _persistent(c: _Setting) -> tuple[dict[str, float], float]:
    """What stays allocated from init through every step, and the optimizer state paged outside the allocator."""
    weights, quant_consts = _weights(c)
    tr = c.trainable
    extra = c.spec.extra_state_bytes if c.spec else 0
    master = (4 * tr / c.shard_opt) if c.mixed else 0.0
    state = c.moment * tr / c.shard_opt
    onebit = extra * tr + (4 * tr / c.n if c.onebit else 0.0)  # worker + server error
    paged_bytes = 0.0
    if c.spec and c.spec.paged:
        paged_bytes, state = state, 0.0
    if c.off_opt:
        master, state, onebit = 0.0, 0.0, 0.0
    persistent = {
        "weights": weights,
        "qlora_quant_constants": quant_consts,
        "master_weights": master,
        "optimizer_state": state,
        "onebit_error_buffers": onebit,
        "cublas_workspace": CUBLAS_WORKSPACE,
    }
    return persistent, paged_bytes


# -- DeepSpeed's buffers and the gradients -------------------------------------------------------------
@dataclass(slots=True)
class _Buffers:
    """DeepSpeed's buffers and the gradients, as each moment of the step holds them."""

    persistent: dict[str, float] = field(default_factory=dict)
    """Allocated at init and held throughout, beside the weights and the optimizer state."""
    backward: dict[str, float] = field(default_factory=dict)
    """At the end of backward (the gathered ZeRO-3 parameters apart, in `live`)."""
    live: float = 0.0
    """ZeRO-3's gathered parameters, through forward and backward."""
    step: dict[str, float] = field(default_factory=dict)
    new_fp32: float = 0.0
    """The fp32 (and flattened 16-bit) gradient copies the step makes: what fragments."""

    def at_backward(self) -> dict[str, float]:
        """The terms at the end of backward: the gathered parameters, then the rest."""
        return {"zero3_live_parameters": self.live, **self.backward}


def _nonfused_temp(c: _Setting) -> float:
    """Bytes of the temporary a non-fused optimizer makes in its step."""
    # torch's foreach AdamW makes a temporary as large as the moments it steps (sqrt of exp_avg_sq); so
    # does FusedLamb's update.
    return 4 * c.trainable / c.shard_opt if c.cell.optimizer in ("adamw", "fusedlamb") else 0.0


def _larger(first: dict[str, float], then: dict[str, float]) -> dict[str, float]:
    """Of a step's two moments, the one that holds more (the first on a tie)."""
    return first if sum(first.values()) >= sum(then.values()) else then


def _buffers(c: _Setting) -> _Buffers:
    """DeepSpeed's buffers and the gradients at the cell's ZeRO stage, and QLoRA's dequantized weight."""
    if c.stage == 0:
        b = _stage0_buffers(c)
    elif c.stage in (1, 2):
        b = _stage12_buffers(c)
    else:
        b = _stage3_buffers(c)
    if c.cell.peft == "qlora":
        # bitsandbytes dequantizes each 4-bit weight for its matmul (forward and backward).
        b.backward["qlora_dequantized_weight"] = 2 * c.s.largest_linear * c.a
    return b


def _stage0_buffers(c: _Setting) -> _Buffers:
    """ZeRO-0: every gradient, the engine's all-reduce bucket, and the fp32 gradients the step makes."""
    tr, g16 = c.trainable, c.g16
    b = _Buffers()
    b.backward["gradients"] = g16
    # The engine all-reduces the gradients at the end of backward, even on one GPU, through flat
    # buckets of MEMORY_OPT_ALLREDUCE_SIZE (5e8) elements (engine.py, buffered_allreduce_fallback).
    b.backward["allreduce_bucket"] = min(500_000_000, tr) * c.a
    opt_temp = ONEBIT_STEP_TEMPORARIES * tr if c.onebit else _nonfused_temp(c)
    b.new_fp32 = 4 * tr if c.mixed else 0.0
    if c.mixed and c.cell.optimizer in ("fusedadam", "onebitadam", "zerooneadam"):
        # FP16_Optimizer.step (fused_optimizer.py): every 16-bit gradient .to(fp32), then all flattened
        # into one fp32 buffer; then the 16-bit gradients are freed and the optimizer steps.
        flatten = {"gradients": g16, "fp32_gradients": 8 * tr}
        b.new_fp32 = 8 * tr  # the per-parameter fp32 copies and the flat buffer, alive together
        b.step = _larger(flatten, {"fp32_gradients": 4 * tr, "optimizer_step_temporaries": opt_temp})
    elif c.mixed:
        # FP16_UnfusedOptimizer.step (unfused_optimizer.py): an fp32 gradient per parameter beside the
        # 16-bit ones, then the optimizer's own step.
        b.step = {"gradients": g16, "fp32_gradients": 4 * tr, "optimizer_step_temporaries": opt_temp}
    else:
        b.step = {"gradients": g16, "optimizer_step_temporaries": opt_temp}
    return b


def _stage12_buffers(c: _Setting) -> _Buffers:
    """ZeRO-1 and 2: the gradients, the reduce buckets, and step()'s fp32 copy of this rank's partition."""
    z, n, tr, g16 = c.z, c.n, c.trainable, c.g16
    b = _Buffers()
    bf16_opt = c.stage == 1 and c.cell.precision == "bf16" and z.grad_accum_fp32 and not c.off_opt
    ipg = 0.0
    if z.contiguous_gradients or c.off_opt:
        ipg = min(z.reduce_bucket_size * c.a, g16) * (2 if z.overlap_comm else 1)
    if bf16_opt:
        # BF16_Optimizer (bf16_optimizer.py): one fp32 gradient buffer as large as all parameters.
        b.persistent["fp32_gradient_buffer"] = 4 * tr
        b.backward["gradients"] = g16
    elif c.stage == 1:
        b.backward["gradients"] = g16  # stage 1 keeps every gradient until the end of backward
        b.backward["reduce_buckets"] = ipg if z.overlap_comm or z.contiguous_gradients else 0.0
    else:
        # stage 2: gradients of this rank's partition in one flat buffer (grads_in_partition),
        # the rest pass through the reduce buckets.
        b.backward["gradients"] = g16 / n if not c.off_opt else 0.0
        b.backward["reduce_buckets"] = ipg
    if not c.off_opt and not bf16_opt:
        # step() (stage_1_and_2.py): the partition's 16-bit gradients flattened, the flat copy converted
        # to fp32 (all three alive at once); then the flat copy and the 16-bit gradients are freed
        # before the optimizer steps, so its temporaries sit beside the fp32 gradients alone.
        flatten = {"gradients": 2 * g16 / n, "fp32_gradients": 4 * tr / n}
        b.step = _larger(flatten, {"fp32_gradients": 4 * tr / n, "optimizer_step_temporaries": _nonfused_temp(c)})
        b.new_fp32 = 6 * tr / n
    elif bf16_opt:
        b.step["optimizer_step_temporaries"] = _nonfused_temp(c)
    if c.off_opt:
        # The CPU step's updated 16-bit partition comes back through a GPU buffer.
        b.step["offload_copy_buffer"] = 0.0
    return b


def _stage3_buffers(c: _Setting) -> _Buffers:
    """ZeRO-3: the gradient partition, the reduce bucket, the gathered parameters, a sub-group's fp32 gradients."""
    z, n, a = c.z, c.n, c.a
    b = _Buffers()
    tr_part = c.trainable / n
    if not c.off_opt:
        # grad_partitions_flat_buffer (stage3.py): this rank's gradients, allocated at init.
        b.persistent["zero3_gradient_partitions"] = a * tr_part
    if z.contiguous_gradients:
        b.persistent["reduce_buckets"] = z.reduce_bucket_size * a  # the ipg bucket, allocated at init
    # Gathered parameters: up to stage3_max_live_parameters stay gathered while they will be used
    # again within stage3_max_reuse_distance (the recompute of checkpointing reuses every one);
    # with no reuse distance, a module's parameters and the prefetch bucket. One rank without
    # parameter offload gathers nothing: its partition is the whole parameter.
    if z.max_reuse_distance > 0:
        gathered = min(z.max_live_parameters, c.total)
    else:
        gathered = min(z.max_live_parameters, z.prefetch_bucket_size + c.s.largest_param)
    b.live = gathered * a if (n > 1 or c.off_par) else 0.0
    if not c.off_opt:
        # Each sub-group's gradients flattened, then converted to fp32 (_prepare_fp32_grad_for_sub_group).
        sg = min(z.sub_group_size, tr_part)
        b.step["fp32_gradients"] = 6 * sg
        b.new_fp32 = 6 * sg
        b.step["optimizer_step_temporaries"] = _nonfused_temp(c)
    else:
        b.step["fp32_gradients"] = 0.0
    return b


# -- activations -----------------------------------------------------------------------------------
def _block_saved(c: _Setting) -> int:
    """Bytes autograd keeps per token for one decoder block."""
    s, a = c.s, c.a
    h, i, kv = s.hidden, s.intermediate, s.kv_dim
    if c.liger or c.cell.compile:
        # Liger's RMSNorm keeps its input and 1/rms; its SwiGLU keeps gate and up and recomputes the
        # product; torch.compile's partitioner keeps about the same (elementwise chains recomputed).
        norms = 2 * (a * h + 4)
        mlp = a * h + 3 * a * i
    else:
        # transformers' LlamaRMSNorm: the input upcast to fp32 (kept by pow and mul) and the
        # normalized value in the input dtype, kept by the weight multiply only for the weight's gradient:
        # under LoRA and QLoRA the norms are frozen and autograd keeps nothing for them.
        norms = 2 * (4 * h + (a * h if c.norms_train else 0))
        # SwiGLU: input of gate/up, gate output (SiLU), SiLU output and up output (mul), product (down).
        mlp = a * h + 4 * a * i
    # q/k/v input, rotated q and k and v (kept by SDPA; grouped-query k and v at their own width:
    # transformers passes enable_gqa to SDPA when there is no mask), SDPA's output (o_proj's input) and
    # log-sum-exp.
    attn = a * h + a * h + 2 * a * kv + a * h + 4 * s.heads
    if c.cell.attn == "eager":
        # Eager attention materializes the scores: softmax in fp32 and its cast (both kept), k and v
        # repeated to every head.
        attn += (4 + a) * s.heads * c.cell.seq_len + 2 * a * (h - kv)
    lora = c.lora_n * a * c.lora_r  # each adapter's A output, kept by B
    return norms + attn + mlp + lora


def _logits_bytes(s: Shape, a: int, *, fused_ce: bool, liger_ce: bool) -> tuple[float, float]:
    """(forward peak, kept into backward) bytes per token of the LM head's output and the loss."""
    v = s.vocab
    if fused_ce:
        return 0.0, 0.0  # Liger's fused linear cross-entropy never materializes the logits
    if liger_ce:
        return a * v, a * v  # Liger's cross-entropy writes its gradient into the logits in place
    # transformers' loss: the logits in the compute dtype, upcast to fp32, log_softmax's output (kept).
    up = 4 * v if a != 4 else 0
    return a * v + up + 4 * v, a * v + 4 * v


def _token_scale(c: _Setting, k: Constants) -> float:
    """What per-token activation bytes are multiplied by: the micro-batch's tokens, scaled by the fitted constant."""
    tokens = c.cell.micro_batch * c.cell.seq_len
    return tokens * k.activation_scale


def _activations(c: _Setting, k: Constants) -> dict[str, float]:
    """Activation bytes at the forward pass's end, the loss's backward, and the end of backward."""
    s, a, cell = c.s, c.a, c.cell
    fused_ce = c.liger and c.stage != 3  # bench.worker.parts.models.liger_settings: no fused CE under ZeRO-3
    per_block = _block_saved(c)
    lg_fwd, lg_kept = _logits_bytes(s, a, fused_ce=fused_ce, liger_ce=c.liger and c.stage == 3)
    if cell.grad_ckpt:
        saved = s.layers * a * s.hidden  # each block's input, kept by non-reentrant checkpointing
        recompute = per_block  # one block's activations, recomputed in backward
    else:
        saved, recompute = s.layers * per_block, 0.0
    # The final norm: its fp32 input, and its output for the norm's weight and the LM head's gradients
    # (both frozen under PEFT: all-linear leaves the LM head out).
    head = 4 * s.hidden + (a * s.hidden if c.norms_train else 0)
    # Backward of the loss: the gradient of log_softmax (fp32) and of the logits, beside what is kept.
    lg_bwd = lg_kept + (4 * s.vocab + a * s.vocab if not c.liger else 0)
    scale = _token_scale(c, k)
    # "backward" is the end of backward, where the gradients are complete: autograd has freed every
    # saved tensor but the first block's (its checkpointed input and its recompute). Between the loss
    # and there, the gradients grow as the saved activations shrink (one block's of each at a time),
    # so the two ends bound the pass.
    first_block = (a * s.hidden + recompute) if cell.grad_ckpt else 0.0
    return {
        "forward": scale * (saved + head + lg_fwd),
        "loss backward": scale * (saved + head + lg_bwd),
        "backward": scale * first_block,
    }


# -- the prediction ----------------------------------------------------------------------------------
def predict(cell: Any, ds_config: dict | None = None, hw: Hardware | None = None, k: Constants = FITTED) -> Estimate:
    """Predict a cell's peaks from the cell (and its DeepSpeed config) alone."""
    c = _setting(cell, ds_config)
    persistent, paged_bytes = _persistent(c)
    b = _buffers(c)
    persistent.update(b.persistent)
    act = _activations(c, k)
    phase, peak_terms = _peak(persistent, b, act)
    basis = _basis(c, k, persistent, b, act)
    terms = _gpu_terms(c, k, peak_terms, basis)
    host_terms = _host(c, k)
    return Estimate(
        gpu_bytes=sum(terms.values()),
        host_bytes=sum(host_terms.values()),
        gpu_terms=terms,
        host_terms=host_terms,
        phase=phase,
        allocated_bytes=sum(peak_terms.values()),
        paged_bytes=paged_bytes,
        basis=basis,
        moments={
            "persistent": dict(persistent),
            "backward": b.at_backward(),
            "step": dict(b.step),
            "activations": dict(act),
        },
    )


def allocated_by_scale(cell: Any, ds_config: dict | None, ks: Sequence[Constants]) -> list[float]:
    """predict(cell, ds_config, k=k).allocated_bytes for each k of `ks`, the cell's setting and buffers worked
    out once: the activation scale's grid search (bench.estimate.check.fit) asks this of every case."""
    c = _setting(cell, ds_config)
    persistent, _ = _persistent(c)
    b = _buffers(c)
    persistent.update(b.persistent)
    return [sum(_peak(persistent, b, _activations(c, k))[1].values()) for k in ks]


def _peak(persistent: dict[str, float], b: _Buffers, act: dict[str, float]) -> tuple[str, dict[str, float]]:
    """The moment of the allocator's peak allocation, and the terms allocated then."""
    p_total = sum(persistent.values()) + b.live
    totals = {
        "forward": p_total + act["forward"],
        "loss backward": p_total + act["loss backward"],
        "backward": p_total + sum(b.backward.values()) + act["backward"],
        "step": sum(persistent.values()) + sum(b.step.values()),
    }
    phase = max(totals, key=totals.get)
    if phase == "step":
        return phase, {**persistent, **b.step}
    if phase == "backward":
        return phase, {**persistent, **b.at_backward(), "activations": act[phase]}
    return phase, {**persistent, "zero3_live_parameters": b.live, "activations": act[phase]}


def _basis(
    c: _Setting, k: Constants, persistent: dict[str, float], b: _Buffers, act: dict[str, float]
) -> dict[str, float]:
    """What the fitted fragmentation constants multiply.

    The caching allocator keeps freed blocks for reuse, but the gradient copies the step makes (fp32, and
    the flattened 16-bit partition: few tensors, each as large as a parameter or a partition) and the
    activations (many tensors the size of a layer's output) do not fit each other's blocks: the reservation
    holds both, the smaller on top of the larger's peak. With checkpointing, backward recomputes a block's
    activations into the blocks the loss and the later layers left, interleaved with their gradients, and
    what cannot be reused grows as the square root of the activations; without it, backward frees them in
    the reverse order of forward and they are reused as they were made. DeepSpeed's reduce buckets: the
    gradients that pass through them (at most the buckets)."""
    act_peak = max(act.values())
    # The loss's fp32 tensors (the upcast logits, log_softmax's output and its gradient): blocks of
    # tokens x vocab that no activation, gradient or step copy fits, so what they leave is kept apart.
    # Liger's losses, fused or not, make none.
    loss_fp32 = _token_scale(c, k) * 4 * c.s.vocab if not c.liger else 0.0
    return {
        "loss": loss_fp32,
        "shared": min(b.new_fp32, act_peak),
        "activations": math.sqrt(act_peak * GiB) if c.cell.grad_ckpt else 0.0,
        "buckets": min(b.backward.get("reduce_buckets", 0.0) + persistent.get("reduce_buckets", 0.0), c.g16),
    }


def _gpu_terms(c: _Setting, k: Constants, peak_terms: dict[str, float], basis: dict[str, float]) -> dict[str, float]:
    """NVML's per-process figure, term by term: the allocator's peak, what it could not reuse, what sits outside it."""
    frag = (
        k.frag_shared * basis["shared"]
        + k.frag_activations * basis["activations"]
        + k.frag_buckets * basis["buckets"]
        + k.frag_loss * basis["loss"]
    )
    terms = {kk: v for kk, v in peak_terms.items() if v}
    terms["allocator_fragmentation"] = frag
    terms["cuda_context"] = k.cuda_context
    if c.n > 1:
        terms["nccl"] = k.nccl
    if c.onebit:
        terms["onebit_cupy_buffers"] = ONEBIT_CUPY_BYTES * c.trainable
    return terms


# -- the host ----------------------------------------------------------------------------------------
def _pinned(nbytes: float, pin: bool) -> float:
    """Host bytes of a buffer: PyTorch's pinned-memory allocator rounds each block up to a power of two."""
    if not pin or nbytes <= 0:
        return nbytes
    return float(1 << max(int(nbytes - 1).bit_length(), 0))


def _host(c: _Setting, k: Constants) -> dict[str, float]:
    """Peak RSS of the cell's processes on one node: each of its ranks' interpreter with torch, DeepSpeed
    and transformers imported, and what offload keeps on the host (ZeRO-Offload's fp32 state and
    gradients) for those ranks. State is partitioned over all n ranks; a node holds its `cell.gpus` parts."""
    cell, a, n, pin = c.cell, c.a, c.n, c.z.pin_memory
    local = max(int(cell.gpus), 1)
    t: dict[str, float] = {"processes": k.host_process * local}
    if n > 1:
        t["launcher"] = k.host_launcher  # torchrun, on every node of a multi-rank cell
    if cell.compile:
        t["compile_workers"] = k.host_compile_workers
    if cell.peft == "qlora":
        t["qlora_checkpoint_load"] = c.s.params * a  # the 16-bit checkpoint read before quantizing
    if c.off_opt:
        part = c.trainable / c.shard_opt
        # Per rank: the fp32 master partition, the optimizer's moments, the fp32 gradients (pinned when
        # pin_memory), and the 16-bit copy of the partition for the way back.
        per_rank = _pinned(4 * part, pin) + c.moment * part + _pinned(4 * part, pin) + _pinned(a * part, pin)
        if cell.offload == Offload.NVME:
            per_rank = _pinned(4 * part, pin) + _pinned(a * part, pin)
        t["offloaded_optimizer"] = per_rank * local
    if c.off_par and cell.offload != Offload.NVME:
        t["offloaded_parameters"] = _pinned(a * c.total / n, pin) * local
    return t
