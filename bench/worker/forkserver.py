"""A pre-imported parent for single-rank workers: import torch, DeepSpeed and transformers once per run,
then fork one fresh process per cell.

Why: importing the stack is most of a cell's fixed cost (its seconds per cell: results/README.md). A fork
of a process that has the modules in memory starts training at once, and each cell is still its own
process (own CUDA context, own allocator, own crash).

Fork safety, checked here rather than assumed:
- CUDA must be untouched before the fork (a forked child cannot use a CUDA driver its parent
  initialised). PYTORCH_NVML_BASED_CUDA_CHECK=1 makes torch's availability checks use NVML, and the
  server refuses to serve if torch reports CUDA initialised anyway.
- No unknown thread may run at the fork (a lock held by another thread stays locked in the child
  forever; libgomp's thread pool is the classic case). Some libraries that the stack imports start
  threads that are known to survive a fork: OpenBLAS pools (numpy's and scipy's; they stop themselves
  around a fork with pthread_atfork handlers), jemalloc's background thread (pyarrow; atfork handlers
  too), and NVML's thread (DeepSpeed calls nvmlInit at import; NVML is not CUDA and a child needs
  no state from it). The server starts those first, counts its threads, and refuses to serve if
  anything imported afterwards adds one (on a GPU host a forked child so started ran CUDA, NCCL and a
  fused optimizer: results/README.md).
A refusal is not an error: the parent falls back to starting each worker from scratch, and the
result records which way the cell was started.

Protocol (JSON lines): the parent writes requests on stdin, the server answers on stdout.
  server -> {"ready": true, "import_s": ..., "pid": ...} | {"ready": false, "why": "..."}
  parent -> {"id": N, "argv": [...], "env": {...}, "cwd": "...", "log": "path"}
  server -> {"id": N, "pid": PID}              the child started, in its own session (pgid = PID)
  server -> {"exit": PID, "code": C}           C as subprocess reports it (negative: killed by a signal)
The server exits when its stdin closes (the parent ended, however it ended).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

# Imported before the fork: what every cell needs. bitsandbytes and peft are left to the cells
# that use them: importing bitsandbytes initialises CUDA (it reads the device's capability).
PRELOAD = (
    "torch",
    "deepspeed",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "bench.worker.train",
    "bench.worker.setup",
    "bench.worker.measure",
    "bench.worker.parts.models",
    "bench.worker.parts.data",
    "bench.worker.metrics",
)


_PROTO = 1  # the fd of the answers to the parent; serve() moves it off stdout


def _send(msg: dict) -> None:
    # os.write, not print: a buffered sys.stdout would be copied into every child and flushed twice.
    os.write(_PROTO, (json.dumps(msg) + "\n").encode())


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _why_unsafe(allowed_threads: int, after: str = "the imports") -> str | None:
    import torch

    if torch.cuda.is_initialized():
        return f"CUDA was initialised by {after}, so a forked child could not use it"
    extra = _threads() - allowed_threads
    if extra > 0:
        return (
            f"{extra} thread(s) besides the known fork-safe ones were started by {after}, so a fork could "
            f"inherit a held lock"
        )
    return None


def _child(req: dict) -> None:
    """In the forked child: become the worker of one cell. Never returns."""
    code = 70
    try:
        os.setsid()  # its own process group, so the parent can stop the whole tree as with a spawned worker
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.close(_PROTO)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.argv = ["python -m bench.worker", *req["argv"]]
        from .main import main

        code = main(req["argv"])
    except SystemExit as e:
        # As the interpreter does at exit: None is 0, a number is the code, anything else is a message
        # for stderr (the cell's log) and code 1. os._exit below skips the interpreter's own handling.
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            code = 1
            try:
                print(e.code, file=sys.stderr)
            except Exception:  # noqa: BLE001 - a message that cannot be printed must not change the code
                pass
    except BaseException:  # noqa: BLE001 - the worker's own errors are already in its result document
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            # _exit: the server's atexit handlers and open objects belong to the server, not to this cell.
            os._exit(code)


# Started before counting threads: their threads are known to survive a fork (see the docstring).
_KNOWN_THREAD_OWNERS = ("numpy", "scipy.linalg", "pyarrow")


def _start_known_threads() -> None:
    import importlib.util

    for name in _KNOWN_THREAD_OWNERS:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            __import__(name)
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML (a CPU host): nothing to start
        pass


def serve() -> int:
    global _PROTO
    # Libraries print to stdout while importing (DeepSpeed logs there): keep the answers on a private
    # copy of the pipe and send stdout to the server's log with stderr.
    _PROTO = os.dup(1)
    os.dup2(2, 1)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    t0 = time.time()
    import importlib

    from .events import watch_parent

    # The end of stdin tells the server its parent is gone, but only once the imports are done (tens of
    # seconds): a parent killed while the server imports must not leave it behind that long. The
    # watcher only sleeps and signals (no lock a forked child could inherit held); counted as known below.
    watch_parent(int(os.environ.pop("ZEROBENCH_PARENT_PID", "0")) or os.getppid())
    try:
        _start_known_threads()
        allowed_threads = _threads()
        for name in PRELOAD:
            importlib.import_module(name)
            # Checked after each module, so a refusal names the import to blame.
            why = _why_unsafe(allowed_threads, f"importing {name}")
            if why:
                _send({"ready": False, "why": why})
                return 1
    except BaseException as e:  # noqa: BLE001 - the parent falls back to spawning, and says why
        _send({"ready": False, "why": f"import failed: {type(e).__name__}: {e}"})
        return 1
    # Python 3.12 warns on every fork of a process with threads; the threads here were checked above.
    import warnings

    warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks", category=DeprecationWarning)
    _send({"ready": True, "import_s": round(time.time() - t0, 3), "pid": os.getpid()})
    sys.stdout.flush()
    sys.stderr.flush()
    buf = b""
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        if readable:
            chunk = os.read(0, 65536)
            if not chunk:
                # The parent is gone (the children watch the orchestrator themselves). _exit: a normal
                # interpreter exit spends seconds finalising torch for nothing.
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(req)
                children.add(pid)
                _send({"id": req["id"], "pid": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    sys.exit(serve())
