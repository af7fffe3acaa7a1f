"""Worker entry: read the spec, train, write one result document per rank, exit.

Exit code 0 means the cell ran to its end (status ok or diverged); 1 means a recorded failure
(the result document says which); anything else means the worker could not even write its result,
and the parent classifies the end from the exit code and the log tail.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback

from .events import Events, watch_parent, write_result

# Faults the test suite injects into a real worker to check that the parent classifies each end
# right (ZEROBENCH_FAULT=kind[@step][#rank], several separated by commas: the first that names this
# rank, or no rank, applies). Never set in a benchmark run; recorded in the result if set.
FAULTS = ("hang", "sigkill", "raise", "nan", "exit")


def _fault() -> tuple[str | None, int]:
    rank = int(os.environ.get("RANK", "0"))
    for spec in filter(None, os.environ.get("ZEROBENCH_FAULT", "").split(",")):
        raw, _, only_rank = spec.partition("#")
        if only_rank and int(only_rank) != rank:
            continue
        kind, _, step = raw.partition("@")
        if kind not in FAULTS:
            raise SystemExit(f"ZEROBENCH_FAULT={spec!r}: kind must be one of {FAULTS}")
        return kind, int(step or 1)
    return None, -1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.worker")
    ap.add_argument("--spec", help="spec JSON written by the orchestrator")
    ap.add_argument("--prebuild", nargs="+", metavar="BUILDER",
                    help="only build (JIT-compile) these DeepSpeed op builders, e.g. FusedAdamBuilder, and exit")
    ap.add_argument("--checkpoint", nargs=2, metavar=("PRESET", "PRECISION"),
                    help="only build and cache the local checkpoint QLoRA cells quantize from, and exit")
    args = ap.parse_args(argv)
    if args.prebuild:
        return _prebuild(args.prebuild)
    if args.checkpoint:
        return _checkpoint(*args.checkpoint)
    if not args.spec:
        ap.error("--spec is required")
    t_start = time.time()
    # The parent stops a cell with SIGTERM (timeout, Ctrl-C): unwind so the result says so.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with open(args.spec) as f:
        spec = json.load(f)
    rank = int(os.environ.get("RANK", "0"))
    watch_parent(spec.get("parent_pid"))
    events = Events(spec.get("events"), enabled=rank == 0)
    events.phase("import")
    result_path = spec["result"].format(rank=rank)
    doc: dict = {"rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "status": "error", "reason": "",
                 "t_start": t_start}
    fault = _fault()
    if fault[0]:
        doc["fault_injected"] = f"{fault[0]}@{fault[1]}"
    code = 1
    try:
        from . import train

        train.run(spec, doc, events, fault)
        code = 0 if doc["status"] in ("ok", "diverged") else 1
    except BaseException as e:  # noqa: BLE001 - every failure becomes data in the result document
        _classify_exception(e, doc)
        code = 1
    finally:
        _clean_nvme(doc)
        doc["t_end"] = time.time()
        events.phase("exit")
        write_result(result_path, doc)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _clean_nvme(doc: dict) -> None:
    """Record what DeepSpeed wrote to the attempt's NVMe swap folder (evidence it really swapped),
    then remove it: swap files of a 7B can fill a drive across a matrix."""
    import shutil
    from pathlib import Path

    swap = doc.pop("nvme_swap_dir", None)
    if swap and os.path.isdir(swap):
        doc["nvme_swap_bytes"] = sum(f.stat().st_size for f in Path(swap).rglob("*") if f.is_file())
        shutil.rmtree(swap, ignore_errors=True)


def _prebuild(builders: list[str]) -> int:
    """Compile DeepSpeed's JIT ops once before the matrix, so no cell's setup time includes a compiler."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    failed = 0
    for name in builders:
        t0 = time.time()
        builder = acc.create_op_builder(name)
        if builder is None:
            print(f"prebuild: {name}: not available on the {acc.device_name()} accelerator", flush=True)
            continue
        try:
            builder.load(verbose=False)
            print(f"prebuild: {name}: ready in {time.time() - t0:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001 - the cells that need it will report it as their error
            failed += 1
            print(f"prebuild: {name}: failed: {type(e).__name__}: {e}", flush=True)
    return 1 if failed else 0


def _checkpoint(preset: str, precision: str) -> int:
    """Build a preset's random-weight checkpoint once, in one process, before the cells. Ranks of a
    multi-GPU cell must not build it themselves: save_pretrained on one rank while another waits on
    the cache lock stalled a 2-GPU QLoRA cell on the H200."""
    import torch

    from . import models

    t0 = time.time()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    path = models.checkpoint(preset, models.DTYPES[precision], device)
    print(f"checkpoint: {preset} {precision}: {path} ready in {time.time() - t0:.1f} s", flush=True)
    return 0


def _classify_exception(e: BaseException, doc: dict) -> None:
    tb = "".join(traceback.format_exception(e))
    doc["traceback"] = tb[-8000:]
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if _is_cuda_oom(e):
        doc["status"] = "cuda_oom"
        doc["reason"] = f"CUDA out of memory in phase {doc.get('phase', '?')}: {msg[:400]}"
        doc["allocator_at_failure"] = _allocator_state()
    elif isinstance(e, KeyboardInterrupt):
        doc["status"] = "interrupted"
        doc["reason"] = "interrupted"
    else:
        doc["status"] = "error"
        doc["reason"] = f"{type(e).__name__} in phase {doc.get('phase', '?')}: {msg[:600]}"


def _is_cuda_oom(e: BaseException) -> bool:
    try:
        import torch

        if isinstance(e, torch.OutOfMemoryError):
            return True
    except ImportError:
        pass
    s = str(e)
    return "CUDA out of memory" in s or "CUDA error: out of memory" in s or "CUBLAS_STATUS_ALLOC_FAILED" in s


def _allocator_state() -> dict | None:
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        st = torch.cuda.memory_stats()
        free, total = torch.cuda.mem_get_info()
        keys = ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "reserved_bytes.all.peak", "num_alloc_retries", "num_ooms", "inactive_split_bytes.all.current")
        out = {k: st.get(k) for k in keys}
        out.update(device_free_bytes=free, device_total_bytes=total)
        return out
    except Exception as e:  # noqa: BLE001 - best effort while already failing
        return {"error": repr(e)}


