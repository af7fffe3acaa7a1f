"""Worker entry: read the spec, train, write one result document per rank, exit.

The result document is a bench.records.record.WorkerDoc, checked before it is written. Exit code 0 means
the cell ran to its end (status ok or diverged); 1 means a recorded failure (the result document
says which); anything else means the worker could not even write its result,
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
from pathlib import Path

from ..matrix import faults
from ..matrix.cells import Cell
from ..records.record import worker_document
from .events import Events, watch_parent, write_result

# Longest failure reason kept in a result (the traceback is kept apart): long enough for a Trainer's
# list of config mismatches, short enough for a report's table.
REASON_MAX = 2000


def short_message(e: BaseException, limit: int = REASON_MAX) -> str:
    """The exception's whole message (every line), bounded; what it leaves out is said."""
    msg = str(e).strip()
    if len(msg) > limit:
        msg = msg[: limit - 60].rstrip() + f" ... ({len(msg) - limit + 60} more characters in the traceback)"
    return msg


def main(argv: list[str] | None = None) -> int:
    """A one-off helper of the orchestrator (--prebuild, --checkpoint), or one rank of a cell (--spec)."""
    ap = _parser()
    args = ap.parse_args(argv)
    # The parent stops a cell or a helper with SIGTERM (timeout, Ctrl-C): unwind, so the result says so
    # and a build in progress releases its lock in the extensions folder.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.prebuild or args.checkpoint or args.probe:
        # A one-off helper of the orchestrator (bench.execute.launch.run_tool): if the orchestrator dies, stop
        # with everything this started (the compiler of a prebuild), not minutes later.
        watch_parent(int(os.environ.get("ZEROBENCH_PARENT_PID") or 0) or None, group=True)
    if args.prebuild:
        if len(args.prebuild) > 1:
            return _prebuild_side_by_side(args.prebuild, args.report)
        return _prebuild(args.prebuild, args.report)
    if args.checkpoint:
        return _checkpoint(*args.checkpoint)
    if args.probe:
        from . import probe

        return probe.main(args.probe, args.shape, args.cpu_adam, args.only)
    if not args.spec:
        ap.error("--spec is required")
    t_start = time.time()
    try:
        with open(args.spec) as f:
            spec = json.load(f)
    except (OSError, ValueError) as e:  # no result path to write to: the message goes to the log
        raise SystemExit(f"zerobench worker: cannot read the spec {args.spec}: {e}") from None
    code = _run_rank(spec, t_start)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def _parser() -> argparse.ArgumentParser:
    """The worker's command line."""
    ap = argparse.ArgumentParser(prog="python -m bench.worker")
    ap.add_argument("--spec", help="spec JSON written by the orchestrator")
    ap.add_argument(
        "--prebuild",
        nargs="+",
        metavar="BUILDER",
        help="only build (JIT-compile) these DeepSpeed op builders, e.g. FusedAdamBuilder, and exit",
    )
    ap.add_argument(
        "--report",
        metavar="PATH",
        help="with --prebuild: write what each builder left ready (its folder and libraries) as JSON here",
    )
    ap.add_argument(
        "--checkpoint",
        nargs=2,
        metavar=("PRESET", "PRECISION"),
        help="only build and cache the local checkpoint QLoRA cells quantize from, and exit",
    )
    ap.add_argument("--probe", metavar="REPORT", help="only measure the machine's rates, write them here as JSON")
    ap.add_argument(
        "--shape",
        nargs=3,
        type=int,
        default=[2048, 4096, 11008],
        metavar=("TOKENS", "HIDDEN", "INTERMEDIATE"),
        help="with --probe: the matmul's shape (default: a 7B's MLP at 2048 tokens)",
    )
    ap.add_argument(
        "--cpu-adam",
        action="store_true",
        help="with --probe: DeepSpeed's CPU Adam op is built (the probe never compiles it): time it",
    )
    ap.add_argument(
        "--only",
        action="append",
        choices=("matmul", "memory", "cpu_adam"),
        help="with --probe: time only this part (repeatable; default: all)",
    )
    return ap


def _run_rank(spec: dict, t_start: float) -> int:
    """Train this rank's part of the cell and write its result document, whatever happens; the exit code."""
    rank = int(os.environ.get("RANK", "0"))
    # A rank of several stays in torchrun's group; a single worker leads its own and takes its
    # children (a compiler building an op) with it.
    watch_parent(spec.get("parent_pid"), group=int(os.environ.get("WORLD_SIZE", "1")) == 1)
    # The first rank of each node writes its node's events (every node's launcher watches its own): on one
    # node that is rank 0.
    events = Events(spec.get("events"), enabled=int(os.environ.get("LOCAL_RANK", "0")) == 0)
    events.phase("import")
    result_path = spec["result"].format(rank=rank)
    doc: dict = {
        "rank": rank,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "status": "error",
        "reason": "",
        "t_start": t_start,
    }
    code = 1
    try:
        from . import ops, train

        fault = faults.for_worker(os.environ.get("ZEROBENCH_FAULT"), rank, Cell.from_dict(spec["cell"]).id)
        if fault is not None:
            doc["fault_injected"] = str(fault)
        ops.instrument()
        train.run(spec, doc, events, fault)
        code = 0 if doc["status"] in ("ok", "diverged") else 1
    except BaseException as e:  # noqa: BLE001 - every failure becomes data in the result document
        _defer_stop_signals()
        _classify_exception(e, doc)
        code = 1
    finally:
        _defer_stop_signals()
        _clean_nvme(doc)
        _ops(doc)
        doc["t_end"] = time.time()
        events.phase("exit")
        write_result(result_path, worker_document(doc))
    return code


def _defer_stop_signals() -> None:
    """From here on the cell has ended; a SIGTERM now (torchrun stopping this rank because its peer died)
    must not cut short the document that says how: a KeyboardInterrupt raised while the reason was
    being written left an error with no reason, which outranked the peer's real end. Signals that
    arrive now are ignored: the process exits right after writing."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def _ops(doc: dict) -> None:
    """The ops this worker compiled and the stale locks it removed (bench.worker.ops), if any."""
    ops = sys.modules.get("bench.worker.ops")
    if ops is not None and ops.BUILT:
        doc["ops_built"] = list(ops.BUILT)
    if ops is not None and ops.CLEARED:
        doc["stale_locks_removed"] = list(ops.CLEARED)


def _clean_nvme(doc: dict) -> None:
    """Record what DeepSpeed wrote to the attempt's NVMe swap folders (evidence it really swapped),
    then remove them: swap files of a 7B can fill a drive across a matrix."""
    import shutil

    swaps = [d for d in doc.pop("nvme_swap_dirs", None) or () if os.path.isdir(d)]
    if swaps:
        doc["nvme_swap_bytes"] = sum(f.stat().st_size for d in swaps for f in Path(d).rglob("*") if f.is_file())
    for d in swaps:
        shutil.rmtree(d, ignore_errors=True)


def _prebuild(builders: list[str], report_path: str | None = None) -> int:
    """Compile DeepSpeed's JIT ops once before the matrix, so no cell's setup time includes a compiler.
    The report (builder -> {ok, unavailable, dir, libs, s}) is what the orchestrator's per-machine
    cache records (bench.records.cache), so the next run can skip this process."""
    from deepspeed.accelerator import get_accelerator

    from . import ops

    ops.instrument()
    acc = get_accelerator()
    failed = 0
    report: dict[str, dict] = {}
    for name in builders:
        t0 = time.time()
        builder = acc.create_op_builder(name)
        if builder is None:
            print(f"prebuild: {name}: not available on the {acc.device_name()} accelerator", flush=True)
            report[name] = {"ok": True, "unavailable": True, "libs": [], "s": 0.0}
            continue
        first = len(ops.LOADED)
        try:
            builder.load(verbose=False)
            built = any(b["op"] == builder.name for b in ops.BUILT)
            print(f"prebuild: {name}: {'built' if built else 'ready'} in {time.time() - t0:.1f} s", flush=True)
            d = ops.build_dir(builder.name)
            dirs = list(dict.fromkeys([*ops.LOADED[first:], str(d)]))
            report[name] = {
                "ok": True,
                "built": built,
                "dir": str(d),
                "dirs": dirs,
                "libs": sorted(str(p) for x in dirs for p in Path(x).glob("*.so")),
                "s": round(time.time() - t0, 1),
            }
        except Exception as e:  # noqa: BLE001 - the cells that need it will report it as their error
            failed += 1
            print(f"prebuild: {name}: failed: {type(e).__name__}: {e}", flush=True)
            report[name] = {"ok": False, "s": round(time.time() - t0, 1)}
    if report_path:
        with open(report_path, "w") as f:
            json.dump(report, f)
    return 1 if failed else 0


def _prebuild_side_by_side(builders: list[str], report_path: str | None) -> int:
    """Each op in a process of its own, all at once: a compile uses few cores and the ops do not share a build
    folder, so three ops take about as long as the slowest, not their sum. One report, merged; their lines go to
    this process's log."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="zerobench-prebuild-") as tmp:
        parts = {name: os.path.join(tmp, f"{name}.json") for name in builders}
        procs = [
            subprocess.Popen([sys.executable, "-m", "bench.worker", "--prebuild", name, "--report", part])
            for name, part in parts.items()
        ]
        codes = [p.wait() for p in procs]
        report: dict[str, dict] = {}
        for name, part in parts.items():
            try:
                with open(part) as f:
                    report.update(json.load(f))
            except (OSError, ValueError):
                report[name] = {"ok": False, "s": 0.0}
    if report_path:
        with open(report_path, "w") as f:
            json.dump(report, f)
    return 1 if any(codes) else 0


def _checkpoint(preset: str, precision: str) -> int:
    """Build a preset's random-weight checkpoint once, in one process, before the cells. Ranks of a
    multi-GPU cell must not build it themselves: save_pretrained on one rank while another waits on
    the cache lock stalls the cell."""
    import torch

    from .parts import models

    t0 = time.time()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    path = models.checkpoint(preset, models.DTYPES[precision], device)
    print(f"checkpoint: {preset} {precision}: {path} ready in {time.time() - t0:.1f} s", flush=True)
    return 0


def _classify_exception(e: BaseException, doc: dict) -> None:
    tb = "".join(traceback.format_exception(e))
    doc["traceback"] = tb[-8000:]
    msg = short_message(e)
    if _is_cuda_oom(e):
        doc["status"] = "cuda_oom"
        doc["reason"] = f"CUDA out of memory in phase {doc.get('phase', '?')}: {msg}"
        doc["allocator_at_failure"] = _allocator_state()
    elif isinstance(e, KeyboardInterrupt):
        doc["status"] = "interrupted"
        doc["reason"] = f"stopped by SIGINT or SIGTERM in phase {doc.get('phase', '?')}"
    else:
        doc["status"] = "error"
        doc["reason"] = f"{type(e).__name__} in phase {doc.get('phase', '?')}: {msg}"


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
        keys = (
            "allocated_bytes.all.current",
            "allocated_bytes.all.peak",
            "reserved_bytes.all.current",
            "reserved_bytes.all.peak",
            "num_alloc_retries",
            "num_ooms",
            "inactive_split_bytes.all.current",
        )
        out = {k: st.get(k) for k in keys}
        out.update(device_free_bytes=free, device_total_bytes=total)
        return out
    except Exception as e:  # noqa: BLE001 - best effort while already failing
        return {"error": repr(e)}
