"""Parent-side sampling of the worker's process tree: host RSS and, where NVML exists, GPU memory
(device and per process), utilisation, power and energy, and the GPU's state: SM and memory clocks,
temperature and clock-throttle reasons (a cell that ran hot or power-capped is not comparable with
one that did not; bench.judge.compare reads them).

It runs in the orchestrator, not in the worker, so it costs the measured step nothing (no GIL
contention, no CUDA context). The worker's events file gives the phase boundaries; samples are
split by phase afterwards, so each phase has its own peaks.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import psutil

__all__ = [
    "Sampler",
    "gpu_snapshot",
    "nvml_available",
    "interval_for",
    "THROTTLE_REASONS",
    "throttle_names",
    "across_nodes",
]

# NVML's clock event ("throttle") reason bits (nvml.h, nvmlClocksEventReason*; stable since NVML 10).
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Idle between steps, and clocks an administrator pinned, are states rather than slowdowns of a cell.
_NOT_THROTTLING = 0x1 | 0x2


def throttle_names(mask: int) -> list[str]:
    """The slowdown reasons set in an NVML reason bitmask, in bit order (idle and pinned clocks left out)."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit and not bit & _NOT_THROTTLING]


def interval_for(cuda: bool) -> float:
    """Sampling period: 10 ms catches GPU memory spikes; on a CPU host the sampler would compete with
    the cell for the cores, and RSS moves slowly, so 50 ms. Runs and selfcheck use the same."""
    return 0.01 if cuda else 0.05


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no library or no driver: a CPU machine
        return None


def nvml_available() -> bool:
    return _nvml() is not None


def gpu_snapshot(indices: list[int]) -> dict:
    """Used memory and compute processes per GPU, to check the GPU is back to baseline between cells."""
    nv = _nvml()
    if nv is None:
        return {}
    out = {}
    try:
        for i in indices:
            h = nv.nvmlDeviceGetHandleByIndex(i)
            procs = [(p.pid, int(p.usedGpuMemory or 0)) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)]
            out[i] = {"used_bytes": int(nv.nvmlDeviceGetMemoryInfo(h).used), "procs": procs}
    except Exception:  # noqa: BLE001 - NVML started but cannot read a GPU: no snapshot, the cell still runs
        return {}
    return out


@dataclass
class Series:
    t: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    gpu_used: list[list[int]] = field(default_factory=list)  # per sample, per GPU
    gpu_proc: list[list[int]] = field(default_factory=list)  # our tree's memory per GPU
    slow_t: list[float] = field(default_factory=list)
    util: list[list[int]] = field(default_factory=list)
    power_w: list[list[float]] = field(default_factory=list)
    energy_j: list[list[float]] = field(default_factory=list)
    # Per slow sample, per GPU; None where the driver does not answer that query.
    sm_clock: list[list[int | None]] = field(default_factory=list)
    mem_clock: list[list[int | None]] = field(default_factory=list)
    temperature: list[list[int | None]] = field(default_factory=list)
    throttle: list[list[int | None]] = field(default_factory=list)


def _ask(fn, *args):
    """One NVML query that a driver or GPU may not support: None instead of an exception."""
    try:
        return int(fn(*args))
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends: the figure is simply absent
        return None


class Sampler(threading.Thread):
    """Sample every `interval_s`; process list, utilisation, power and energy every tenth tick."""

    def __init__(self, root_pid: int, gpu_indices: list[int], interval_s: float = 0.01):
        super().__init__(name="zerobench-telemetry", daemon=True)
        self.root_pid = root_pid
        self.interval = interval_s
        self.nv = _nvml() if gpu_indices else None
        try:
            self.handles = [self.nv.nvmlDeviceGetHandleByIndex(i) for i in gpu_indices] if self.nv else []
        except Exception:  # noqa: BLE001 - a GPU NVML cannot read: host memory only, as without NVML
            self.nv, self.handles = None, []
        self.series = Series()
        self._halt = threading.Event()
        self._procs: dict[int, psutil.Process] = {}
        self._proc_gpu = [0] * len(self.handles)

    def _refresh_tree(self) -> None:
        try:
            root = psutil.Process(self.root_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        self._procs = {p.pid: self._procs.get(p.pid, p) for p in tree}

    def run(self) -> None:
        tick = 0
        while not self._halt.is_set():
            if tick % 10 == 0:
                self._refresh_tree()
            rss = 0
            for p in list(self._procs.values()):
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            s = self.series
            now = time.time()
            s.t.append(now)
            s.rss.append(rss)
            if self.nv:
                nv = self.nv
                s.gpu_used.append([int(nv.nvmlDeviceGetMemoryInfo(h).used) for h in self.handles])
                if tick % 10 == 0:
                    pids = set(self._procs)
                    self._proc_gpu = [
                        sum(
                            int(p.usedGpuMemory or 0)
                            for p in nv.nvmlDeviceGetComputeRunningProcesses(h)
                            if p.pid in pids
                        )
                        for h in self.handles
                    ]
                    s.slow_t.append(now)
                    s.util.append([int(nv.nvmlDeviceGetUtilizationRates(h).gpu) for h in self.handles])
                    s.power_w.append([nv.nvmlDeviceGetPowerUsage(h) / 1000.0 for h in self.handles])
                    s.energy_j.append([nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0 for h in self.handles])
                    self._gpu_state(nv)
                s.gpu_proc.append(list(self._proc_gpu))
            tick += 1
            self._halt.wait(self.interval)

    def _gpu_state(self, nv) -> None:
        """Clocks, temperature and throttle reasons (NVML constants by value: nvml.h's, stable)."""
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        s = self.series
        s.sm_clock.append([_ask(nv.nvmlDeviceGetClockInfo, h, 1) for h in self.handles])  # NVML_CLOCK_SM
        s.mem_clock.append([_ask(nv.nvmlDeviceGetClockInfo, h, 2) for h in self.handles])  # NVML_CLOCK_MEM
        s.temperature.append([_ask(nv.nvmlDeviceGetTemperature, h, 0) for h in self.handles])  # NVML_TEMPERATURE_GPU
        s.throttle.append([_ask(reasons, h) if reasons else None for h in self.handles])

    def stop(self) -> Series:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)
        return self.series


def summarize(series: Series, phases: list[tuple[str, float]], end_t: float) -> dict:
    """Peaks per phase and for the whole cell. phases: (name, start time) in order."""
    bounds = [
        (name, start, phases[i + 1][1] if i + 1 < len(phases) else end_t) for i, (name, start) in enumerate(phases)
    ]
    out: dict = {"samples": len(series.t), "nvml": bool(series.gpu_used)}
    out["all"] = _window(series, 0.0, float("inf"))
    out["phases"] = {name: _window(series, a, b) for name, a, b in bounds if name not in ("exit",)}
    return out


def _window(s: Series, a: float, b: float) -> dict:
    idx = [i for i, t in enumerate(s.t) if a <= t < b]
    w: dict = {"host_rss_peak_bytes": max((s.rss[i] for i in idx), default=None), "duration_s": None}
    if idx:
        w["duration_s"] = s.t[idx[-1]] - s.t[idx[0]]
    if s.gpu_used and idx:
        per_gpu_used = [max(s.gpu_used[i][g] for i in idx) for g in range(len(s.gpu_used[0]))]
        per_gpu_proc = [max(s.gpu_proc[i][g] for i in idx) for g in range(len(s.gpu_proc[0]))]
        w.update(
            nvml_used_peak_bytes=max(per_gpu_used),
            nvml_used_peak_per_gpu=per_gpu_used,
            nvml_proc_peak_bytes=max(per_gpu_proc),
            nvml_proc_peak_per_gpu=per_gpu_proc,
            nvml_proc_peak_total_bytes=sum(per_gpu_proc),
        )
        sl = [i for i, t in enumerate(s.slow_t) if a <= t < b]
        if sl:
            w["gpu_util_mean_pct"] = sum(sum(s.util[i]) / len(s.util[i]) for i in sl) / len(sl)
            w["power_mean_w"] = sum(sum(s.power_w[i]) for i in sl) / len(sl)
            if len(sl) >= 2:
                w["energy_j"] = sum(s.energy_j[sl[-1]]) - sum(s.energy_j[sl[0]])
            w["power_max_w"] = max(max(s.power_w[i]) for i in sl)
            w.update(_gpu_state(s, sl))
    return w


def _gpu_state(s: Series, sl: list[int]) -> dict:
    """Clock, temperature and throttle figures over the slow samples `sl` (all GPUs together)."""

    def values(series):
        return [v for i in sl if i < len(series) for v in series[i] if v is not None]

    out: dict = {}
    sm, mem, temp = values(s.sm_clock), values(s.mem_clock), values(s.temperature)
    if sm:
        out.update(sm_clock_mean_mhz=sum(sm) / len(sm), sm_clock_min_mhz=min(sm))
    if mem:
        out["mem_clock_mean_mhz"] = sum(mem) / len(mem)
    if temp:
        out["temperature_max_c"] = max(temp)
    masks = values(s.throttle)
    if masks:
        seen = 0
        for m in masks:
            seen |= m
        out["throttle_reasons"] = throttle_names(seen)
    return out


def _union(values: list) -> list:
    return sorted({x for v in values for x in v})


# How one figure of a window combines over the nodes of a cell: per GPU and per node it is the largest
# (a figure per GPU, or per host, as on one node), what adds up adds up, the GPUs' lists follow node order.
_ACROSS = {
    "host_rss_peak_bytes": max,
    "duration_s": lambda v: v[0],  # node 0's, where rank 0 ran
    "nvml_used_peak_bytes": max,
    "nvml_used_peak_per_gpu": lambda v: [x for per in v for x in per],
    "nvml_proc_peak_bytes": max,
    "nvml_proc_peak_per_gpu": lambda v: [x for per in v for x in per],
    "nvml_proc_peak_total_bytes": sum,
    "gpu_util_mean_pct": lambda v: sum(v) / len(v),
    "power_mean_w": sum,
    "energy_j": sum,
    "power_max_w": max,
    "sm_clock_mean_mhz": lambda v: sum(v) / len(v),
    "sm_clock_min_mhz": min,
    "mem_clock_mean_mhz": lambda v: sum(v) / len(v),
    "temperature_max_c": max,
    "throttle_reasons": _union,
}


def _across(windows: list[dict]) -> dict:
    keys = dict.fromkeys(k for w in windows for k in w)
    out = {}
    for k in keys:
        values = [w[k] for w in windows if w.get(k) is not None]
        out[k] = _ACROSS.get(k, lambda v: v[0])(values) if values else None
    return out


def across_nodes(summaries: list[dict]) -> dict:
    """One summary (summarize's shape) for a cell's nodes, node 0 first: each window (the whole cell, each
    of node 0's phases, every node split by its own first rank's phases) combined figure by figure (_ACROSS).
    Host RSS is then the largest node's: what one host held, as the memory model predicts it."""
    if len(summaries) == 1:
        return summaries[0]
    out: dict = {"samples": sum(s.get("samples", 0) for s in summaries), "nvml": any(s.get("nvml") for s in summaries)}
    out["all"] = _across([s.get("all", {}) for s in summaries])
    phases = summaries[0].get("phases", {})
    out["phases"] = {name: _across([s.get("phases", {}).get(name, {}) for s in summaries]) for name in phases}
    return out
