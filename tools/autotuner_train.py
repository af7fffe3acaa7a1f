"""The training script DeepSpeed's autotuner launches for each of its experiments (tools/autotuner_baseline.py
runs the autotuner; not part of zerobench).

It trains what a zerobench cell trains, built by zerobench's worker code (the same preset shape with random
weights, LoRA/QLoRA, gradient checkpointing, its built-in learnable data, the cell's precision through the
config), but in a plain loop of its own over `deepspeed.initialize`'s engine: the autotuner, not zerobench,
measures these runs. The batch sizes and ZeRO stage are the experiment's DeepSpeed config's; under
`"autotuning": {"enabled": true}` the engine writes the autotuner's metrics file and exits by itself after its
profile steps (or, in the model-info run, after the first forward).

    deepspeed [--autotuning tune] tools/autotuner_train.py --deepspeed_config CONFIG --cell CELL.json
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # launched as a file: the repository's bench

from bench.matrix.axes import OPTIMIZERS  # noqa: E402
from bench.matrix.cells import Cell  # noqa: E402

# Steps when the config does not stop the run itself (no autotuning section): enough to see it train.
_PLAIN_STEPS = 10


def read_config(text: str) -> dict:
    """The experiment's config: a path, or the base64 JSON the autotuner puts in the path's place."""
    if os.path.exists(text):
        return json.loads(Path(text).read_text())
    return json.loads(base64.urlsafe_b64decode(text).decode())


def experiment_cell(base: Cell, cfg: dict) -> Cell:
    """The base cell with the experiment's ZeRO stage and batch sizes (what the autotuner varies)."""
    zero = cfg.get("zero_optimization") or {}
    return dataclasses.replace(
        base,
        zero_stage=int(zero.get("stage", 0)),
        micro_batch=int(cfg.get("train_micro_batch_size_per_gpu", base.micro_batch)),
        grad_accum=int(cfg.get("gradient_accumulation_steps", base.grad_accum)),
    )


def steps(cfg: dict) -> int:
    """Optimizer steps to offer the engine: under autotuning it exits after end_profile_step + 1 (DeepSpeed's
    default 5); one more as a margin, so a run that ends without the engine's exit ends all the same."""
    at = cfg.get("autotuning") or {}
    if not at.get("enabled"):
        return _PLAIN_STEPS
    return int(at.get("end_profile_step", 5)) + 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--local_rank", type=int, default=0, help="set by DeepSpeed's launcher")
    ap.add_argument("--deepspeed_config", required=True, help="a JSON file, or the autotuner's base64 of one")
    ap.add_argument("--cell", required=True, help="the zerobench cell to train, as JSON (Cell.to_dict)")
    args = ap.parse_args(argv)
    cfg = read_config(args.deepspeed_config)
    cell = experiment_cell(Cell.from_dict(json.loads(Path(args.cell).read_text())), cfg)
    train(cell, cfg, args.local_rank)
    return 0


def train(cell: Cell, cfg: dict, local_rank: int) -> None:
    import deepspeed
    import torch

    from bench.worker import setup
    from bench.worker.parts import data, models

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", verbose=False)
    torch.manual_seed(cell.seed)
    # zerobench's build: ZeRO-3 partitions the weights as they are made, under the experiment's config.
    model = setup._build_model(cell, cfg, models.DTYPES[cell.precision], device, local_rank, under_trainer=False)
    params = [p for p in model.parameters() if p.requires_grad]
    client = None
    spec = OPTIMIZERS[cell.optimizer]
    if spec.client:  # bitsandbytes' optimizers: built here, as zerobench's worker builds them
        import importlib

        client = getattr(importlib.import_module(spec.module), spec.cls)(params, lr=cell.lr, weight_decay=0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, optimizer=client, config=cfg)
    n = steps(cfg)
    rank = int(os.environ.get("RANK", "0"))
    # As many micro-batches as zerobench makes for the cell (more if the run needs more): the same batches.
    made = max(n, cell.warmup_steps + cell.measured_steps) * cell.grad_accum
    batches = data.batches(
        cell.data, cell.tokenizer, model.config.vocab_size, made, cell.micro_batch, cell.seq_len, cell.seed, rank
    ).to(device)
    engine.train()
    for i in range(n * cell.grad_accum):
        loss = engine(input_ids=batches[i], labels=batches[i]).loss
        engine.backward(loss)
        engine.step()
        if (i + 1) % cell.grad_accum == 0 and rank == 0:
            print(f"step {engine.global_steps}: loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
