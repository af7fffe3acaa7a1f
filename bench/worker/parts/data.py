"""Training data. The built-in source is deterministic on every machine and learnable, so the loss
falls as the model learns; a local text or JSONL file with a local tokenizer can be used instead."""

from __future__ import annotations

import json
from pathlib import Path

import torch

__all__ = ["batches"]

_ACTIVE_VOCAB = 512  # tokens the source uses: the model first learns to stop predicting the rest
_BRANCHING = 4  # successors per token: the best achievable loss is ln(4) ~ 1.39


def _builtin(vocab: int, n: int, micro: int, seq: int, seed: int) -> torch.Tensor:
    """A Markov chain over a fixed sparse transition table; CPU generator, so identical everywhere."""
    active = min(vocab, _ACTIVE_VOCAB)
    table = torch.randint(0, active, (active, _BRANCHING), generator=torch.Generator().manual_seed(20240611))
    g = torch.Generator().manual_seed(seed)
    rows = n * micro
    out = torch.empty(rows, seq, dtype=torch.long)
    out[:, 0] = torch.randint(0, active, (rows,), generator=g)
    choice = torch.randint(0, _BRANCHING, (rows, seq), generator=g)
    for t in range(1, seq):
        out[:, t] = table[out[:, t - 1], choice[:, t]]
    return out.view(n, micro, seq)


def _from_file(path: str, tokenizer: str, n: int, micro: int, seq: int) -> torch.Tensor:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)
    p = Path(path)
    if p.suffix == ".jsonl":
        texts = [json.loads(line).get("text", "") for line in p.read_text().splitlines() if line.strip()]
    else:
        texts = [p.read_text()]
    ids: list[int] = []
    for t in texts:
        ids += tok(t)["input_ids"] + ([tok.eos_token_id] if tok.eos_token_id is not None else [])
    need = n * micro * seq
    if len(ids) < seq:
        raise ValueError(f"{path}: {len(ids)} tokens, fewer than one sequence of {seq}")
    reps = -(-need // len(ids))
    flat = torch.tensor((ids * reps)[:need], dtype=torch.long)  # wrap around: benchmarking, not epochs
    return flat.view(n, micro, seq)


def batches(
    data: str, tokenizer: str | None, vocab: int, n: int, micro: int, seq: int, seed: int, rank: int
) -> torch.Tensor:
    """n micro-batches of shape (micro, seq), made before timing starts."""
    if data == "builtin":
        return _builtin(vocab, n, micro, seq, seed * 1009 + rank)
    return _from_file(data, tokenizer, n, micro, seq)
