"""A cell is one configuration to measure: a frozen value with a readable id and a stable hash.

Two runs of the same cell share its hash; the hash covers everything that changes what is
measured (model, shapes, steps, seed, every axis) and nothing that does not (timeout, matrix name).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from . import axes

__all__ = ["Cell", "Lora", "Qlora", "Adaptive", "AxisValues"]

# One field per axis, in the table's order, with its default: written once, in bench.matrix.axes.
AxisValues = dataclasses.make_dataclass(
    "AxisValues",
    [(a.name, a.type | None if a.none_allowed else a.type, field(default=a.default)) for a in axes.AXES],
    frozen=True,
    kw_only=True,
    slots=True,
)
AxisValues.__module__ = __name__
AxisValues.__doc__ = "The axis values of a cell (bench.matrix.axes.AXES): " + "; ".join(
    f"{a.name}: {a.doc}" for a in axes.AXES
)


# Axes whose value lives in a settings block (bench.matrix.axes.Axis.block).
_BLOCK_AXES = tuple(a for a in axes.AXES if a.block)


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
class Adaptive:
    """Adaptive step counts (`steps: {warmup: auto, measured: auto}`): the cell's warmup_steps and
    measured_steps are then caps, and the worker decides when each phase ends (bench.records.adaptive has the
    rules). Fewer steps on a steady cell, as many as the cap on a noisy one, a bounded time on a slow one."""

    warmup: bool = True
    """Warm up until step time settles (else the fixed warmup_steps)."""
    measured: bool = True
    """Measure until the median's interval is within `tolerance` (else the fixed measured_steps)."""
    settle_window: int = 3
    """Warmup has settled when the last this-many step times ..."""
    settle_within: float = 0.05
    """... each lie within this fraction of their median."""
    min_warmup: int = 1
    """Warmup steps always run (the first step compiles kernels and fills the allocator's cache)."""
    tolerance: float = 0.02
    """Stop measuring once the median step time's interval half-width is at most this fraction of it."""
    level: float = 0.95
    """Confidence the interval must reach (bench.stats.median_ci) before it can stop the measurement."""
    min_steps: int = 6
    """Measured steps always run (6 is the fewest whose range reaches 95% for the median)."""
    max_seconds: float | None = None
    """Cap on the steps' own time, warmup and measured summed; warmup gets at most half of it. None: no cap."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cell(AxisValues):
    """One point of the matrix: the axis values (AxisValues, one field per bench.matrix.axes.AXES entry), then
    the fixed settings shared by the matrix."""

    ds_config_sha: str | None = None
    """Content hash of the ds_config file, so an edited file is a different cell."""
    # fixed settings
    model: str = "llama-tiny"
    """A preset name (llama-tiny, llama-small, llama-1b, llama-7b, llama-13b) or a local Hugging Face directory."""
    data: str = "builtin"
    tokenizer: str | None = None
    seq_len: int = 128
    warmup_steps: int = 2
    """Warmup steps run before timing; with adaptive warmup, the most it may take."""
    measured_steps: int = 8
    """Steps timed; with adaptive measurement, the most it may take."""
    adaptive: Adaptive | None = None
    """How many steps are decided as the cell runs (None: the fixed counts above). Left out of the hash when
    None, so cells with fixed steps keep the ids they had before adaptive steps existed."""
    lr: float = 1e-3
    seed: int = 0
    gpus: int = 1
    """GPUs (ranks) on each node the cell runs on: on a CPU host, CPU ranks over gloo."""
    nodes: int = 1
    """Nodes the cell spans, each with `gpus` ranks: gpus x nodes ranks in all (`ranks`). Left out of the hash at 1,
    so single-node cells keep the ids they had before multi-node cells existed."""
    attn: str = "sdpa"
    lora: Lora | None = None
    qlora: Qlora | None = None
    # not part of the identity
    nvme_path: str | None = field(default=None, compare=False)
    """Folder on the NVMe drive for offload: nvme cells swap optimizer state and parameters there."""
    timeout_s: float = field(default=1800.0, compare=False)
    matrix: str = field(default="", compare=False)
    # The hash, once computed: planning a large matrix asks for it several times per cell.
    _hash: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A settings block, where the cell has one, is what its PEFT axes read: one truth, and the hash
        # reads the block (so records written before these axes existed parse to the same cell).
        for a in _BLOCK_AXES:
            block = getattr(self, a.block)
            if block is not None:
                value = getattr(block, a.block_field)
                object.__setattr__(self, a.name, axes.lora_targets_name(value) if a.name == "lora_targets" else value)

    # -- identity -----------------------------------------------------------------------------
    def canonical(self) -> dict[str, Any]:
        """Everything that changes the measurement, as plain JSON-able data."""
        d = self.to_dict()
        for k in ("timeout_s", "matrix", "nvme_path"):
            d.pop(k)
        # Axes added after results were first published are left out at their default, so a cell
        # keeps the hash (and its history, baselines and --resume) it had before the axis existed.
        for a in axes.AXES:
            if a.name in d and not a.hashed_at_default and d[a.name] == a.default:
                d.pop(a.name)
        if d["adaptive"] is None:
            d.pop("adaptive")
        if d["nodes"] == 1:
            d.pop("nodes")
        if d["ds_config"] is not None:
            # The file's content is ds_config_sha; how its path was typed (./, absolute, ../) is not the cell.
            d["ds_config"] = PurePath(d["ds_config"]).stem
        return d

    @property
    def hash(self) -> str:
        if not self._hash:
            blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
            object.__setattr__(self, "_hash", hashlib.sha256(blob.encode()).hexdigest()[:10])
        return self._hash

    @property
    def name(self) -> str:
        """Readable key=value name of the axis values (the hash disambiguates the rest)."""
        return ",".join(p for p in (part.part(self) for part in axes.NAME_PARTS) if p is not None)

    @property
    def id(self) -> str:
        return f"{self.name}#{self.hash}"

    # -- derived ------------------------------------------------------------------------------
    @property
    def ranks(self) -> int:
        """The data-parallel world: one rank per GPU on every node (what ZeRO partitions over)."""
        return self.gpus * self.nodes

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.grad_accum * self.seq_len * self.ranks

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        # Shallow: every field is an immutable scalar, a tuple of them, or a small settings dataclass
        # (dataclasses.asdict deep-copies each value and took most of the time planning a large matrix).
        d = {f: getattr(self, f) for f in _FIELDS}
        # A PEFT axis is written once: in its block where the cell has one, else only off its default
        # (records keep the shape they had before these axes, and from_dict reads the block back).
        for a in _BLOCK_AXES:
            if d[a.block] is not None or d[a.name] == a.default:
                d.pop(a.name)
        for k in ("lora", "qlora", "adaptive"):
            if d[k] is not None:
                d[k] = {kk: list(v) if isinstance(v, tuple) else v for kk, v in dataclasses.asdict(d[k]).items()}
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
        if d.get("adaptive") is not None:
            d["adaptive"] = Adaptive(**d["adaptive"])
        return cls(**d)


_FIELDS = tuple(f.name for f in dataclasses.fields(Cell) if f.name != "_hash")
