"""Parameter counts of a model shape (bench.matrix.presets): what the memory model multiplies by bytes.

A Llama block: q, k, v, o projections (grouped-query: k and v have num_key_value_heads heads), a SwiGLU
MLP (gate, up, down), two RMSNorms; then the embedding, a final norm and the LM head (tied or not).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from . import presets

__all__ = ["Shape", "shape_of", "trainable_params", "adapted"]

# The linear layers of one block, as (name, in features, out features) given the shape's sizes.
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one block."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        return {
            "q_proj": (h, h),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (h, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def block_linear_params(self) -> int:
        return sum(a * b for a, b in self.linears().values())

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        return 0 if self.tied else self.vocab * self.hidden

    @property
    def norm_params(self) -> int:
        return (2 * self.layers + 1) * self.hidden

    @property
    def linear_params(self) -> int:
        """Every block's linear weights: what LoRA adapts and QLoRA quantizes (the LM head stays 16-bit)."""
        return self.layers * self.block_linear_params

    @property
    def params(self) -> int:
        return self.linear_params + self.embedding_params + self.head_params + self.norm_params

    @property
    def largest_linear(self) -> int:
        return max(a * b for a, b in self.linears().values())

    @property
    def largest_param(self) -> int:
        return max(self.largest_linear, self.embedding_params)

    def lora_params(self, r: int, targets: tuple[str, ...]) -> int:
        """LoRA adapter parameters: r * (in + out) for each adapted linear of each block."""
        lin = self.linears()
        names = _LINEARS if tuple(targets) == ("all-linear",) else [t for t in targets if t in lin]
        return self.layers * sum(r * (lin[n][0] + lin[n][1]) for n in names)

    def lora_targets(self, targets: tuple[str, ...]) -> int:
        """Adapted linears per block."""
        return len(_LINEARS) if tuple(targets) == ("all-linear",) else sum(t in _LINEARS for t in targets)


def adapted(cell: Any) -> bool:
    """The cell trains a LoRA adapter (lora, qlora) with its base weights frozen."""
    return cell.peft in ("lora", "qlora") and cell.lora is not None


def trainable_params(cell: Any, shape: Shape) -> int:
    """Parameters the optimizer steps: the LoRA adapters (rank and target set from the cell's lora block)
    under PEFT, else every parameter. What the memory and step-time models multiply optimizer state,
    gradients and the optimizer step by."""
    if adapted(cell):
        return shape.lora_params(cell.lora.r, tuple(cell.lora.targets))
    return shape.params


@functools.lru_cache(maxsize=64)
def shape_of(model: str) -> Shape | None:
    """A preset's or a local directory's Llama-like shape; None when neither says."""
    cfg = presets.shape(model)
    if not cfg:
        return None
    try:
        h, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        return Shape(
            hidden=h,
            intermediate=int(cfg.get("intermediate_size") or 4 * h),
            layers=int(cfg["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
        )
    except (KeyError, TypeError, ValueError):
        return None
