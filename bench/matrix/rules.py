"""Compatibility rules: which cells cannot run (here, or at all), why, and what to change.

A table, not `if`s in the runner. Each rule names the combination, the reason, the fix and the
source that makes it true (a DeepSpeed version, an error seen on a real run, an issue). Rules that
depend on this machine read the Platform (GPUs, installed versions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..host.env import Platform, version_tuple
from .axes import AXES, OPTIMIZERS, Offload, OptimizerSpec, UnderOffload
from .cells import Cell
from .shapes import shape_of, trainable_params

__all__ = ["Rule", "RULES", "check", "Skip", "PRUNED", "BNB_MAX_ELEMENTS", "flat_partition"]

PRUNED = "predicted-oom"
"""The rule id of a cell the memory model predicts not to fit (bench.execute.plan.prune_skip): pruned, not ruled out."""

# Optimizer facts come from bench.matrix.axes.OPTIMIZERS; the rules say what they stop, why, and the source.
ONEBIT = tuple(name for name, spec in OPTIMIZERS.items() if spec.onebit)
BNB = tuple(name for name, spec in OPTIMIZERS.items() if spec.package == "bitsandbytes")
_PLAIN = OptimizerSpec(cls="", under_offload=UnderOffload.RUNS)  # a name outside the table: no limits known


def _set_off_default(c: Cell, block: str) -> list[str]:
    """The axes of a settings block (lora, qlora) this cell sets away from their defaults."""
    return [a.name for a in AXES if a.block == block and getattr(c, a.name) != a.default]


def _opt(c: Cell) -> OptimizerSpec:
    return OPTIMIZERS.get(c.optimizer, _PLAIN)


BNB_MAX_ELEMENTS = 2**31 - 1
"""The most elements bitsandbytes' CUDA optimizer kernels step in one call: the count crosses into C as an int32
(bitsandbytes/backends/cuda/ops.py: ct.c_int32(g.numel())). A larger count wraps around: negative, the kernel's
launch fails; past 2^32, it would silently step only part of the tensor."""


def flat_partition(c: Cell) -> int | None:
    """Elements of the one flat fp32 tensor each rank's optimizer steps at ZeRO-1/2: the cell's trainable
    parameters split over its ranks (stage_1_and_2.py steps single_partition_of_fp32_groups, one per parameter
    group; the HF Trainer's second group, the norms' weights without weight decay, is 0.004% of a 7B Llama).
    None at ZeRO-0, which steps each weight tensor as it is, and at ZeRO-3, which steps sub-groups of at most
    sub_group_size (1e9 elements) plus one weight; or where the model's shape is unknown."""
    shape = shape_of(c.model) if c.zero_stage in (1, 2) else None
    return None if shape is None else -(-trainable_params(c, shape) // c.ranks)


def _bnb_over_int32(c: Cell) -> bool:
    n = flat_partition(c) if c.optimizer in BNB else None
    return n is not None and n > BNB_MAX_ELEMENTS


@dataclass(frozen=True)
class Rule:
    name: str
    when: Callable[[Cell, Platform], bool]
    reason: str
    fix: str
    source: str


@dataclass(frozen=True)
class Skip:
    rule: str
    reason: str
    fix: str
    source: str

    def text(self) -> str:
        return f"{self.reason} (fix: {self.fix}; source: {self.source})"


RULES: tuple[Rule, ...] = (
    # -- the machine ---------------------------------------------------------------------------
    Rule(
        "gpus-available",
        lambda c, p: p.cuda and c.gpus > len(p.gpus),
        "the cell needs more GPUs than this machine has",
        "lower gpus, or run it on a larger host",
        "NVML device count",
    ),
    Rule(
        "nodes-on-one-host",
        lambda c, p: p.cuda and c.nodes > 1 and p.hosts == 1,
        "the cell spans {nodes} nodes and this run places cells on this host alone, where its nodes would run "
        "side by side on 127.0.0.1 over shared memory and PCIe: it would measure one node under a multi-node name",
        "run it where cells are placed on several hosts (a cluster executor), or as one node (nodes: 1, gpus: {ranks})",
        "bench/execute/launch/nodes.py: one host starts every node's torchrun at 127.0.0.1 (NCCL then "
        "uses the host's shared memory and P2P paths, not the network)",
    ),
    Rule(
        "nodes-available",
        lambda c, p: p.hosts is not None and p.hosts > 1 and c.nodes > p.hosts,
        "the cell spans {nodes} nodes; the cluster has {hosts}",
        "lower nodes, or run it on a larger cluster",
        "the executor's node count",
    ),
    Rule(
        "fp16-needs-cuda",
        lambda c, p: not p.cuda and c.precision == "fp16",
        "DeepSpeed's CPU accelerator has no fp16 ('Type fp16 is not supported on your device') except on CPUs "
        "where oneDNN has it (AVX512-FP16 or AMX-FP16); zerobench measures fp16 on GPUs only",
        "use bf16 or fp32 on CPU",
        "deepspeed 0.19.6 engine._do_sanity_check; seen on a CPU run (tests/test_rules_evidence.py)",
    ),
    Rule(
        "lamb-needs-cuda",
        lambda c, p: not p.cuda and c.optimizer == "fusedlamb",
        "FusedLamb is a CUDA kernel; DeepSpeed's CPU backend raises 'This op had not been implemented on CPU backend'",
        "run it on a GPU",
        "deepspeed 0.19.6 engine._configure_basic_optimizer; seen on a CPU run (tests/test_rules_evidence.py)",
    ),
    # Named for FusedLamb, the one optimizer beside the 1-bit ones with a precision limit (OptimizerSpec.precisions);
    # the name is in records.
    Rule(
        "fusedlamb-no-bf16",
        lambda c, p: c.optimizer not in ONEBIT and c.precision not in _opt(c).precisions,
        "DeepSpeed's FusedLamb kernel has no bf16 path (\"lamb_cuda_kernel\" not implemented for 'BFloat16')",
        "use precision: fp16 or fp32 with fusedlamb",
        "seen on the H200 with deepspeed 0.19.6 (results/1b-axes.jsonl)",
    ),
    Rule(
        "bnb-needs-cuda",
        lambda c, p: (c.optimizer in BNB or c.peft == "qlora") and not p.cuda,
        "bitsandbytes optimizers and 4-bit quantization need a CUDA GPU",
        "run it on a GPU",
        "bitsandbytes kernels are CUDA-only in this harness",
    ),
    # -- PEFT settings -------------------------------------------------------------------------
    Rule(
        "lora-settings-need-peft",
        lambda c, p: c.peft == "none" and bool(_set_off_default(c, "lora")),
        "LoRA settings ({lora}) do nothing with peft: none (every weight trains; there is no adapter)",
        "use peft: lora or qlora with them, or leave them out of this include",
        "peft LoraConfig applies only to an adapter (bench/worker/setup.py builds one for lora and qlora only)",
    ),
    Rule(
        "qlora-settings-need-qlora",
        lambda c, p: c.peft != "qlora" and bool(_set_off_default(c, "qlora")),
        "QLoRA settings ({qlora}) do nothing without peft: qlora (no weight is quantized to 4 bits)",
        "use peft: qlora with them, or leave them out of this include",
        "transformers BitsAndBytesConfig is built for qlora cells only (bench/worker/setup.py)",
    ),
    Rule(
        "bnb-installed",
        lambda c, p: (c.optimizer in BNB or c.peft == "qlora") and p.cuda and not p.has("bitsandbytes"),
        "bitsandbytes is not installed",
        "pip install 'zerobench[gpu]'",
        "import bitsandbytes",
    ),
    Rule(
        "liger-needs-cuda",
        lambda c, p: c.kernels == "liger" and not p.cuda,
        "Liger-Kernel's kernels are Triton GPU kernels",
        "use kernels: hf on CPU, or run it on a GPU",
        "liger-kernel requires triton, which has no CPU backend",
    ),
    Rule(
        "liger-installed",
        lambda c, p: c.kernels == "liger" and p.cuda and not p.has("liger-kernel"),
        "Liger-Kernel is not installed",
        "pip install 'zerobench[gpu]'",
        "import liger_kernel",
    ),
    Rule(
        "liger-no-compile",
        lambda c, p: (
            c.kernels == "liger"
            and bool(c.compile)
            and p.has("liger-kernel")
            and version_tuple(p.versions.get("liger-kernel")) <= (0, 8, 5)
        ),
        "torch.compile of Liger-Kernel's Triton kernels is unreliable: dynamo cannot analyse the kernels' "
        "mutations (\"'float' object has no attribute 'to'\"), and at the 1.1B shape the first step ends in "
        "'CUDA error: an illegal memory access'",
        "use kernels: liger without compile (faster than compiled kernels: hf at micro-batch 16 on the H200: "
        "results/1b-mfu-2.jsonl, 1b-mfu.jsonl), or compile with kernels: hf",
        "liger-kernel 0.8.5, torch 2.11 on the H200: 3 of 3 compiled 1.1B liger cells crashed "
        "(results/1b-mfu-2.jsonl), and a 1.1B cell at seq 512 in tests/test_gpu_rules.py; a tiny-preset cell "
        "ran (results/gpu-evidence/2026-11-30_gpu-rules-h200_liger.log)",
    ),
    # -- DeepSpeed ZeRO ------------------------------------------------------------------------
    Rule(
        "offload-needs-zero",
        lambda c, p: c.offload != Offload.NONE and c.zero_stage == 0,
        "optimizer offload needs ZeRO stage 1, 2 or 3 (stage 0 keeps no partitioned optimizer to move)",
        "set zero_stage >= 1 or offload: none",
        "DeepSpeed ZeRO-Offload docs (offload_optimizer: stages 1-3)",
    ),
    Rule(
        "nvme-needs-zero3",
        lambda c, p: c.offload == Offload.NVME and c.zero_stage != 3,
        "NVMe offload swaps parameters too, which only ZeRO stage 3 partitions",
        "set zero_stage: 3, or offload: optimizer",
        "DeepSpeed ZeRO-Infinity docs (offload_param device nvme: stage 3)",
    ),
    Rule(
        "nvme-needs-libaio",
        lambda c, p: c.offload == Offload.NVME and not p.libaio,
        "DeepSpeed's async-I/O op, which NVMe offload uses, builds against libaio, and its headers are missing",
        "apt-get install libaio-dev",
        "deepspeed 0.19.6 op_builder AsyncIOBuilder (-laio)",
    ),
    Rule(
        "param-offload-needs-zero3",
        lambda c, p: c.offload == Offload.OPTIMIZER_PARAMS and c.zero_stage != 3,
        "parameter offload exists only at ZeRO stage 3 (only stage 3 partitions parameters)",
        "set zero_stage: 3 or offload: optimizer",
        "DeepSpeed config docs (offload_param: stage 3 only)",
    ),
    Rule(
        "offload-runs-cpuadam",
        lambda c, p: c.offload != Offload.NONE and _opt(c).under_offload == UnderOffload.REPLACED,
        "with offload DeepSpeed silently replaces FusedAdam by DeepSpeedCPUAdam, so this cell would not run fusedadam",
        "use optimizer: cpuadam (or adamw: torch AdamW stepping on the CPU) for offload cells",
        "deepspeed 0.19.6 engine._configure_basic_optimizer; seen on a CPU run (tests/test_rules_evidence.py)",
    ),
    Rule(
        "cpuadam-needs-offload",
        lambda c, p: _opt(c).under_offload == UnderOffload.REQUIRED and c.offload == Offload.NONE,
        "DeepSpeed builds DeepSpeedCPUAdam only for ZeRO-Offload; without offload it builds FusedAdam",
        "use optimizer: fusedadam, or offload: optimizer",
        "deepspeed 0.19.6 engine._configure_basic_optimizer; seen on a CPU run",
    ),
    Rule(
        "offload-optimizer-kind",
        lambda c, p: c.offload != Offload.NONE and _opt(c).under_offload == UnderOffload.NO_CPU_STEP,
        "ZeRO-Offload runs the optimizer step on the CPU with DeepSpeedCPUAdam; {opt} has no CPU step",
        "use optimizer: cpuadam with offload",
        "DeepSpeed ZeRO-Offload docs",
    ),
    # -- optimizers under ZeRO ---------------------------------------------------------------
    Rule(
        "fusedlamb-needs-zero0",
        lambda c, p: c.optimizer not in ONEBIT and c.zero_stage not in _opt(c).zero_stages,
        "DeepSpeed's ZeRO refuses FusedLamb ('You are using an untested ZeRO Optimizer'), and allowing untested "
        "optimizers would not make the cell LAMB: ZeRO hands the optimizer one flat partition, so LAMB's "
        "per-layer trust ratio would be one ratio over the whole partition",
        "set zero_stage: 0 with fusedlamb, or use fusedadam with ZeRO",
        "deepspeed 0.19.6 runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS (no FusedLamb) and "
        "engine._do_optimizer_sanity_check; on the H200, 3 of 3 fusedlamb cells at ZeRO-1/2 ended so "
        "(results/7b-answer-h200.jsonl)",
    ),
    Rule(
        "bnb-over-int32",
        lambda c, p: _bnb_over_int32(c),
        "bitsandbytes' optimizer kernels take a tensor's element count as a 32-bit int, and ZeRO-{stage} hands "
        "each rank's optimizer one flat partition of {elements} elements ({trainable} trainable parameters over "
        "{ranks} rank(s)), above 2^31 - 1: the kernel's launch fails ('Error invalid argument at line 177 in file "
        "/src/csrc/ops.cu')",
        "use zero_stage: 0 (each weight stepped on its own) or 3 (sub-groups of 1e9 elements), at least "
        "{min_ranks} GPUs, or an adapter (peft: lora or qlora)",
        "bitsandbytes 0.50.1 (tag, 37d2a93) and main at 95f9af3: backends/cuda/ops.py passes "
        "ct.c_int32(g.numel()) to the 8-bit blockwise and the 32-bit optimizer kernels, and csrc/ops.cu's "
        "optimizerStatic8bitBlockwise(int n) launches n / 256 blocks, checked at line 177 (optimizer32bit takes "
        "an int n too: read, not yet run past the limit); deepspeed 0.19.6 stage_1_and_2.py steps one flat fp32 "
        "partition per rank; on the H200 with bitsandbytes 0.50.2, 5 of 5 adamw_8bit 7B full fine-tunes at "
        "ZeRO-1/2 (6.74e9 elements) ended so, and ZeRO-0 full fine-tunes and ZeRO-1 QLoRA ran "
        "(results/7b-answer-h200.jsonl, 7b.jsonl)",
    ),
    # -- 1-bit optimizers ----------------------------------------------------------------------
    Rule(
        "onebit-removed",
        lambda c, p: (
            c.optimizer in ONEBIT and version_tuple(p.versions.get("deepspeed")) >= _opt(c).removed_in_deepspeed
        ),
        "DeepSpeed {ds} removed OneBitAdam, ZeroOneAdam and OneBitLamb",
        "pip install deepspeed==0.19.6",
        "deepspeed 0.19.7 release ('OneBitAdam is not a supported DeepSpeed Optimizer')",
    ),
    Rule(
        "onebit-needs-zero0",
        lambda c, p: c.optimizer in ONEBIT and c.zero_stage not in _opt(c).zero_stages,
        "the 1-bit optimizers run only at ZeRO stage 0",
        "set zero_stage: 0",
        "DeepSpeed 1-bit Adam tutorial; fails at ZeRO-1 on the H200 "
        "(results/gpu-evidence/2026-11-30_gpu-rules-h200.log)",
    ),
    Rule(
        "onebit-needs-fp16",
        lambda c, p: c.optimizer in ONEBIT and c.precision not in _opt(c).precisions,
        "the 1-bit optimizers train only in fp16: on the H200 in bf16 their loss rose or turned NaN, and in fp32 "
        "onebitadam's loss ran away once compression began",
        "use precision: fp16, the one precision DeepSpeed verified their convergence in",
        "DeepSpeed 1-bit Adam and 1-bit LAMB tutorials ('we only verified the convergence under mixed "
        "precision/FP16 training'); on the H200 in bf16: onebitadam's loss went 7.68 -> 7.55 -> 14.42 in 3 steps "
        "(results/gpu-evidence/2026-11-30_gpu-rules-h200.log), 7B LoRA cells of onebitadam and zerooneadam "
        "reached NaN at steps 7 and 9 (results/7b-answer-h200.jsonl); in fp32 at ZeRO-0 onebitadam's loss went "
        "7.52 -> 26.0 -> 507.9 after freeze_step (results/gpu-evidence/2026-12-03_gpu-rules-h200_17-passed-8-"
        "failed.log); fp16 cells trained (results/1b-axes.jsonl)",
    ),
    Rule(
        "onebitlamb-no-adapters",
        lambda c, p: c.optimizer == "onebitlamb" and c.peft in ("lora", "qlora"),
        "OneBitLamb with LoRA adapters raised ZeroDivisionError on the H200, in fp16 and in bf16",
        "use onebitadam or zerooneadam with adapters, or onebitlamb on a full fine-tune",
        "on the H200: a tiny LoRA cell in fp16 (results/gpu-evidence/2026-12-03_gpu-rules-h200_17-passed-8-"
        "failed.log) and a 7B LoRA cell in bf16 (results/7b-answer-h200.jsonl) ended in ZeroDivisionError; "
        "deepspeed 0.19.6 runtime/fp16/onebit/lamb.py divides the mean momentum scale by each parameter's at the "
        "end of warmup, which is zero for a parameter whose momentum is (read, not traced)",
    ),
    Rule(
        "onebit-needs-cuda",
        lambda c, p: c.optimizer in ONEBIT and not p.cuda,
        "the 1-bit optimizers compress with cupy over NCCL (CPU run: 'No module named cupy')",
        "run them on a GPU host with cupy",
        "seen on a CPU run (tests/test_rules_evidence.py)",
    ),
    # Not rules, since they run on a GPU (results/README.md; tests/test_gpu_rules.py keeps them running):
    # onebitadam with LoRA, 1-bit under the HF Trainer, QLoRA in fp32, QLoRA with ZeRO-3 parameter offload.
)


def check(cell: Cell, platform: Platform) -> Skip | None:
    """The first rule that stops this cell, or None if it can run."""
    for rule in RULES:
        if rule.when(cell, platform):
            holes = _holes(cell, platform)
            return Skip(rule.name, rule.reason.format(**holes), rule.fix.format(**holes), rule.source)
    return None


def _holes(cell: Cell, platform: Platform) -> dict:
    """What a rule's reason and fix may name about the cell it stops."""
    shape, n = shape_of(cell.model), flat_partition(cell)
    trainable = trainable_params(cell, shape) if shape else None
    return {
        "nodes": cell.nodes,
        "hosts": platform.hosts,
        "opt": cell.optimizer,
        "ds": platform.versions.get("deepspeed"),
        "lora": ", ".join(_set_off_default(cell, "lora")),
        "qlora": ", ".join(_set_off_default(cell, "qlora")),
        "ranks": cell.ranks,
        "stage": cell.zero_stage,
        "elements": f"{n:,}" if n else "?",
        "trainable": f"{trainable:,}" if trainable else "?",
        "min_ranks": -(-trainable // BNB_MAX_ELEMENTS) if trainable else "?",
    }
