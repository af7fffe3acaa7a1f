"""A minimal hand-written DeepSpeed training loop, the yardstick for zerobench's own step times.

It lives with the worker and reads the same spec file, but shares none of the worker's code (not its
setup, not its measurement in bench/worker/measure.py: a yardstick must not move with what it
measures), only the preset shapes and the shape of the result document it writes
(bench.records.record.WorkerDoc). It builds the same Llama shape with transformers, hands the same
DeepSpeed config to deepspeed.initialize, and times the same number of steps the plainest way
(synchronize, perf_counter). `zerobench selfcheck` runs it beside the cell.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from ..records.record import worker_document


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.worker.reference")
    ap.add_argument("--spec", required=True)
    args = ap.parse_args(argv)
    spec = json.load(open(args.spec))
    cell, ds_config = spec["cell"], spec["ds_config"]
    rank = int(os.environ.get("RANK", "0"))
    doc = {"rank": rank, "status": "error", "reason": "", "t_start": time.time()}
    try:
        import deepspeed
        import torch
        import transformers

        from ..matrix.presets import PRESETS

        cuda = torch.cuda.is_available()
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[cell["precision"]]
        cfg = transformers.LlamaConfig(**{k: v for k, v in PRESETS[cell["model"]].items() if k != "model_type"})
        cfg._attn_implementation = cell["attn"]
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        if cell["grad_ckpt"]:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        steps = cell["warmup_steps"] + cell["measured_steps"]
        x = torch.randint(
            0, cfg.vocab_size, (steps * cell["grad_accum"], cell["micro_batch"], cell["seq_len"]), device=device
        )
        times = []
        for s in range(steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for m in range(cell["grad_accum"]):
                b = x[s * cell["grad_accum"] + m]
                loss = engine(input_ids=b, labels=b).loss
                engine.backward(loss)
                engine.step()
            loss.item()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        measured = times[cell["warmup_steps"] :]
        med = statistics.median(measured)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        tokens = cell["micro_batch"] * cell["grad_accum"] * cell["seq_len"] * world
        doc.update(status="ok", step_times_s=times, metrics={"step_time_median_s": med, "tokens_per_s": tokens / med})
    except Exception as e:  # noqa: BLE001 - reported as data, like the worker does
        doc["reason"] = f"{type(e).__name__}: {e}"[:600]
    doc["t_end"] = time.time()
    tmp = spec["result"].format(rank=rank) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(worker_document(doc), f)
    os.replace(tmp, spec["result"].format(rank=rank))
    return 0 if doc["status"] == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
