"""The probe of the machine: the rates of one GPU and its host (bench.host.rates.Rates), measured in a helper
process the orchestrator starts (`python -m bench.worker --probe REPORT`; bench.execute.probe caches them).

Each figure is a median of a few timed repeats after a warmup, each repeat long enough for its timer (CUDA events
on a GPU, perf_counter on the host) and the whole bounded by a deadline: what the deadline leaves out is said in
`notes`, as is every figure the machine cannot give (no GPU, no bitsandbytes, DeepSpeed's CPU Adam not built).
On a GPU-less host the CPU's own rates fill the same fields (source "cpu"): its matmul, its memory as "hbm"."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["PARTS", "measure"]

PARTS = frozenset({"matmul", "memory", "cpu_adam"})
"""What a probe times, each part alone where the others are known: the matmuls (per shape), memory (device, PCIe,
host, NF4 dequantize and the host's overhead), DeepSpeed's CPU Adam (once its op is built)."""

_REPEATS = 5
_REPEAT_S = 0.02  # each timed repeat on a GPU: long against the events' resolution, short for the budget
_CPU_REPEAT_S = 0.15  # on the host, against perf_counter and other processes' noise
_COPY_BYTES = 256 << 20  # device and PCIe copies: past every cache, a few ms on any link
_HOST_COPY_BYTES = 128 << 20
_CPU_SMALL_FLOP = 2e8  # a CPU matmul this small is timed at the run's shape whatever the CPU's speed
_ADAM_PARAMS = 32 << 20  # DeepSpeed CPU Adam: 512 MiB of fp32 parameter, gradient and moments, past the caches


class _Deadline:
    def __init__(self, budget_s: float) -> None:
        self.end = time.perf_counter() + budget_s

    def left(self) -> float:
        return self.end - time.perf_counter()


def _gpu_seconds(fn: Callable[[], object], deadline: _Deadline) -> float:
    """Seconds one call of fn takes on the GPU: warmed up, calls batched per repeat, the median repeat."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    inner = max(1, min(200, int(_REPEAT_S / one)))
    times = []
    for _ in range(_REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / inner)
        if deadline.left() < 0:
            break
    return statistics.median(times)


def _host_seconds(fn: Callable[[], object], deadline: _Deadline) -> float:
    """Seconds one call of fn takes by the host's clock: warmed up, each repeat as many calls as fit in
    _CPU_REPEAT_S (a count fixed from one call would run far over on a loaded host, where a call's threads wait
    their turn), the median repeat."""
    fn()
    times = []
    for _ in range(_REPEATS):
        n, t0 = 0, time.perf_counter()
        while n == 0 or time.perf_counter() - t0 < _CPU_REPEAT_S:
            fn()
            n += 1
        times.append((time.perf_counter() - t0) / n)
        if deadline.left() < 0 or times[-1] > 1:  # a call that takes seconds is timed once
            break
    return statistics.median(times)


def _matmul(tokens: int, hidden: int, inter: int, dtype, device, deadline: _Deadline) -> float:
    """FLOP/s of (tokens x hidden) @ (hidden x intermediate) in dtype: the MLP's up projection at the run's shape."""
    a = torch.randn(tokens, hidden, dtype=dtype, device=device)
    b = torch.randn(hidden, inter, dtype=dtype, device=device)
    c = torch.empty(tokens, inter, dtype=dtype, device=device)
    fn = lambda: torch.mm(a, b, out=c)  # noqa: E731
    s = _gpu_seconds(fn, deadline) if device.type == "cuda" else _host_seconds(fn, deadline)
    return 2.0 * tokens * hidden * inter / s


def _once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cpu_shape(tokens: int, hidden: int, inter: int, dtype) -> tuple[int, int, int]:
    """The shape a CPU matmul in dtype is timed at: the run's where it is small, or fewer tokens where a call
    would take past ~0.2 s, and a smaller weight too where even 16 tokens would (a CPU's fp16 can be a hundred
    times slower than its fp32). From a 16-token call at a quarter of the weight's sides (a smaller one is far
    below the CPU's rate: a few MFLOP mostly pay the call)."""
    if 2 * tokens * hidden * inter <= _CPU_SMALL_FLOP:
        return tokens, hidden, inter
    h, i = min(hidden, max(64, hidden // 4)), min(inter, max(64, inter // 4))
    a, b = torch.randn(16, h, dtype=dtype), torch.randn(h, i, dtype=dtype)
    torch.mm(a, b)
    s = max(min(_once(lambda: torch.mm(a, b)) for _ in range(2)), 1e-7)  # the less disturbed of two
    flops = 0.2 * 2 * 16 * h * i / s  # what 0.2 s does at that rate
    t = int(flops / (2 * hidden * inter))
    if t >= 16:
        return min(tokens, t), hidden, inter
    k = (2 * 16 * hidden * inter / flops) ** 0.5
    return 16, max(64, int(hidden / k)), max(64, int(inter / k))


def _copy_rate(dst: torch.Tensor, src: torch.Tensor, deadline: _Deadline, both: bool) -> float:
    """Bytes/s of dst.copy_(src); both: the read and the write counted (a copy within one memory)."""
    if dst.is_cuda or src.is_cuda:
        pinned = src.is_pinned() or dst.is_pinned()
        fn = lambda: dst.copy_(src, non_blocking=pinned)  # noqa: E731
        s = _gpu_seconds(fn, deadline)
    else:
        s = _host_seconds(lambda: dst.copy_(src), deadline)
    return src.numel() * src.element_size() * (2 if both else 1) / s


def _pcie(dev: torch.Tensor, deadline: _Deadline) -> dict[str, float]:
    out = {}
    for kind, pin in (("pinned", True), ("pageable", False)):
        host = torch.empty(dev.numel(), dtype=torch.uint8, pin_memory=pin)
        host.fill_(1)  # pages touched before they are timed
        out[f"h2d_{kind}"] = _copy_rate(dev, host, deadline, both=False)
        out[f"d2h_{kind}"] = _copy_rate(host, dev, deadline, both=False)
        del host
    return out


def _cpu_adam(deadline: _Deadline) -> float:
    """Parameters per second DeepSpeed's CPU Adam updates (fp32 parameter, gradient and moments) at this
    process's threads. Only called where the op loads without a compile."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    p = torch.nn.Parameter(torch.randn(_ADAM_PARAMS))
    p.grad = torch.randn(_ADAM_PARAMS)
    opt = DeepSpeedCPUAdam([p], lr=1e-4)
    opt.step()  # the moments are allocated and touched by the first step
    return _ADAM_PARAMS / _host_seconds(opt.step, deadline)


def _dequant_4bit(hidden: int, inter: int, deadline: _Deadline) -> float:
    """Parameters per second bitsandbytes dequantizes from NF4 to bf16 on the GPU, one (hidden x intermediate)
    weight at a time, as QLoRA's forward does each layer."""
    import bitsandbytes.functional as bnbf

    w = torch.randn(inter, hidden, dtype=torch.bfloat16, device="cuda")
    q, state = bnbf.quantize_4bit(w, quant_type="nf4", compress_statistics=True)
    del w
    return hidden * inter / _gpu_seconds(lambda: bnbf.dequantize_4bit(q, state), deadline)


def _overhead(device) -> float:
    """Seconds from Python to launch one tiny op and wait for it: the floor of each of a step's many small
    launches and syncs, one thread's figure."""
    x = torch.zeros(1, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def one() -> None:
        x.add_(1)
        sync()

    for _ in range(50):
        one()
    times = []
    for _ in range(_REPEATS):
        t0 = time.perf_counter()
        for _ in range(200):
            one()
        times.append((time.perf_counter() - t0) / 200)
    return statistics.median(times)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class _Probe:
    """One probe's figures and notes, each figure taken under the deadline: one that fails or that the deadline
    leaves no time for is None, with why in the notes."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = _Deadline(budget_s)
        self.figures: dict[str, float | str | None] = {}
        self.notes: list[str] = []

    def take(self, name: str, fn: Callable[[], float | dict[str, float]]) -> None:
        if self.deadline.left() <= 0:
            self.notes.append(f"{name}: not measured, the probe's time was spent")
            return
        try:
            value = fn()
        except Exception as e:  # noqa: BLE001 - a figure the machine cannot give is None, said why
            self.notes.append(f"{name}: {type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e) else ''}")
            return
        self.figures.update(value if isinstance(value, dict) else {name: value})

    def lacks(self, name: str, why: str) -> None:
        self.notes.append(f"{name}: {why}")


def measure(
    tokens: int, hidden: int, inter: int, *, budget_s: float = 20.0, cpu_adam: bool = False, parts=PARTS
) -> dict:
    """The machine's rates as a bench.host.rates.Rates dict. cpu_adam: DeepSpeed's CPU Adam op loads without a
    compile (installed with DeepSpeed, or built and in the op cache: bench.records.cache): time it; it is never
    compiled here. parts: which of PARTS to time (the others' figures are known)."""
    t0 = time.perf_counter()
    p = _Probe(budget_s)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if "matmul" in parts:
        (_gpu_matmuls if cuda else _cpu_matmuls)(p, tokens, hidden, inter, device)
    if "memory" in parts:
        _memory(p, device, hidden, inter)
    if "cpu_adam" in parts and cpu_adam:
        p.take("cpu_adam", lambda: _cpu_adam(p.deadline))
    elif "cpu_adam" in parts:
        p.lacks(
            "cpu_adam",
            "its op is not built on this machine (a run with a CPU-offload cell builds it once; "
            "the probe compiles nothing)",
        )
    out = {k: v for k, v in p.figures.items() if v is not None}
    out.update(
        source="probe" if cuda else "cpu",
        device=torch.cuda.get_device_name(device) if cuda else _cpu_name(),
        matmul_shape=f"{tokens}x{hidden}x{inter}",
        threads=torch.get_num_threads(),
        probe_s=round(time.perf_counter() - t0, 2),
    )
    if p.notes:
        out["notes"] = "; ".join(p.notes)
    return out


def _memory(p: _Probe, device, hidden: int, inter: int) -> None:
    """Every figure but the matmuls and CPU Adam: memory, PCIe, NF4 dequantize, the host's overhead."""
    if device.type == "cuda":
        _copies(p, device)
        torch.cuda.empty_cache()
        _nf4(p, hidden, inter)
    else:
        p.lacks("pcie", "no GPU")
        p.lacks("dequant_4bit", "no GPU")
    p.take("host_mem", lambda: _host_mem(p.deadline))
    if device.type != "cuda":  # a CPU's device memory is the host's
        p.figures["hbm"] = p.figures.get("host_mem")
    p.take("host_overhead_s", lambda: _overhead(device))


def _host_mem(deadline: _Deadline) -> float:
    src = torch.ones(_HOST_COPY_BYTES, dtype=torch.uint8)
    dst = torch.zeros_like(src)
    return _copy_rate(dst, src, deadline, both=True)


def _gpu_matmuls(p: _Probe, tokens: int, hidden: int, inter: int, device) -> None:
    for dtype, name in ((torch.bfloat16, "matmul_bf16"), (torch.float16, "matmul_fp16")):
        p.take(name, lambda dtype=dtype: _matmul(tokens, hidden, inter, dtype, device, p.deadline))
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        for tf32, name in ((False, "matmul_fp32"), (True, "matmul_tf32")):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            p.take(name, lambda: _matmul(tokens, hidden, inter, torch.float32, device, p.deadline))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    torch.cuda.empty_cache()


def _nf4(p: _Probe, hidden: int, inter: int) -> None:
    try:
        import bitsandbytes  # noqa: F401
    except Exception as e:  # noqa: BLE001 - missing, or present and broken: either way no figure
        p.lacks("dequant_4bit", f"bitsandbytes does not import ({type(e).__name__})")
    else:
        p.take("dequant_4bit", lambda: _dequant_4bit(hidden, inter, p.deadline))


def _copies(p: _Probe, device) -> None:
    """Device memory (one device-to-device copy) and PCIe each way, from a buffer of _COPY_BYTES."""
    dev = torch.empty(_COPY_BYTES, dtype=torch.uint8, device=device)
    dev2 = torch.empty_like(dev)
    p.take("hbm", lambda: _copy_rate(dev2, dev, p.deadline, both=True))
    p.take("pcie", lambda: _pcie(dev, p.deadline))


def _cpu_matmuls(p: _Probe, tokens: int, hidden: int, inter: int, cpu) -> None:
    for dtype, name in (
        (torch.float32, "matmul_fp32"),
        (torch.bfloat16, "matmul_bf16"),
        (torch.float16, "matmul_fp16"),
    ):
        shape = _cpu_shape(tokens, hidden, inter, dtype)
        if shape != (tokens, hidden, inter):
            p.lacks(name, "timed at {}x{}x{} (the run's shape would take long on this CPU)".format(*shape))
        p.take(name, lambda dtype=dtype, shape=shape: _matmul(*shape, dtype, cpu, p.deadline))
    p.lacks("matmul_tf32", "no TF32 on a CPU")


def main(report: str, shape: list[int], cpu_adam: bool, parts: list[str] | None) -> int:
    """The helper's entry (bench.worker.main --probe): measure, print the figures, write them to report as JSON."""
    import json

    tokens, hidden, inter = shape
    out = measure(tokens, hidden, inter, cpu_adam=cpu_adam, parts=frozenset(parts or PARTS))
    print(json.dumps(out), flush=True)
    tmp = f"{report}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, report)
    return 0
