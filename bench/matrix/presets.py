"""Model presets: shapes only (no torch), shared by matrix validation, the DeepSpeed config and the
worker's build. No downloads: a preset is a shape, built with random weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["PRESETS", "shape", "largest_weight"]

_LLAMA = dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=False, use_cache=False)
PRESETS: dict[str, dict[str, Any]] = {
    # CPU/CI: seconds per cell on 2 cores, still a real Llama block (RoPE, GQA, SwiGLU, RMSNorm).
    "llama-tiny": dict(
        _LLAMA,
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=2048,
        max_position_embeddings=2048,
    ),
    # CPU/CI too: the smallest shape whose weights reach DeepSpeed's 1 MiB NVMe swap minimum (in 16-bit,
    # the MLP weights and embeddings: 14 of them); llama-tiny's all stay in CPU memory under offload nvme.
    "llama-small": dict(
        _LLAMA,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=2048,
        max_position_embeddings=2048,
    ),
    # TinyLlama-1.1B shape.
    "llama-1b": dict(
        _LLAMA,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=2048,
    ),
    # Llama-2-7B and -13B shapes.
    "llama-7b": dict(
        _LLAMA,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    "llama-13b": dict(
        _LLAMA,
        hidden_size=5120,
        intermediate_size=13824,
        num_hidden_layers=40,
        num_attention_heads=40,
        num_key_value_heads=40,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
}


def shape(model: str) -> dict[str, Any] | None:
    """A preset's shape, or a local directory's config.json; None when neither says."""
    cfg: dict[str, Any] | None = PRESETS.get(model)
    if cfg is None:
        try:
            cfg = json.loads((Path(model) / "config.json").read_text())
        except (OSError, ValueError):
            return None
    return cfg if isinstance(cfg, dict) else None


def largest_weight(model: str) -> int | None:
    """Elements of the model's largest weight matrix (the embedding or LM head of a Llama, else an MLP
    projection); None when the shape is unknown."""
    cfg = shape(model)
    if cfg is None:
        return None
    try:
        return max(cfg["vocab_size"], cfg.get("intermediate_size", 0)) * cfg["hidden_size"]
    except (KeyError, TypeError):
        return None
