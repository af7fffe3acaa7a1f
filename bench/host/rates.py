"""A machine's rates: what one GPU and its host do per second, the physical step-time model's denominators.

They come from `zerobench probe` (bench.worker.probe measures them in a child process; the orchestrator caches
them per machine), or, for a machine never probed, from its GPU's data sheet (DATASHEETS, said so by `source`).
Torch-free: the orchestrator, the records and the models read them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

__all__ = ["DATASHEETS", "DEVICE_RATES", "Rates", "datasheet", "line"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rates:
    """Rates of one GPU and its host. None where the probe could not measure it (no GPU, no bitsandbytes)."""

    matmul_bf16: float | None = None
    """Dense bf16 matmul, FLOP/s, at the model's own shapes."""
    matmul_fp16: float | None = None
    """Dense fp16 matmul, FLOP/s."""
    matmul_fp32: float | None = None
    """Dense fp32 matmul, FLOP/s, at PyTorch's default precision (full fp32, not TF32)."""
    matmul_tf32: float | None = None
    """Dense fp32 matmul with TF32 allowed, FLOP/s."""
    hbm: float | None = None
    """Device memory bandwidth, bytes/s (a copy counts its read and its write)."""
    h2d_pinned: float | None = None
    """Host to device over PCIe from pinned memory, bytes/s."""
    d2h_pinned: float | None = None
    h2d_pageable: float | None = None
    d2h_pageable: float | None = None
    host_mem: float | None = None
    """Host memory bandwidth, bytes/s (one large copy, read and write counted)."""
    cpu_adam: float | None = None
    """DeepSpeed's CPU Adam, parameters updated per second at this host's threads (fp32 state)."""
    dequant_4bit: float | None = None
    """bitsandbytes NF4 dequantization, parameters per second (None without bitsandbytes or a GPU)."""
    host_overhead_s: float | None = None
    """One small kernel launched and waited on from Python, seconds: the per-step host cost a single thread pays."""
    source: str = "probe"
    """"probe" (measured on this machine), "datasheet" (the GPU vendor's figures, no host figures) or "cpu" (a
    GPU-less host: the CPU's own rates in the GPU's fields)."""
    device: str | None = None
    """The device probed: the GPU's name, or the CPU's model."""
    matmul_shape: str | None = None
    """The matmul timed, tokens x hidden x intermediate (the MLP's up projection of the run's model)."""
    threads: int | None = None
    """The host threads the probe ran with (torch's intra-op threads: CPU Adam's and the host copy's)."""
    probe_s: float | None = None
    """Seconds the measurements took."""
    notes: str | None = None
    """Why a figure is missing or was taken at another shape, one "name: why" each, "; " between."""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Rates | None:
        if not data:
            return None
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def filled(self, other: Rates | None) -> Rates:
        """These rates with other's where these have none (a probe that could not measure one, say)."""
        if other is None:
            return self
        return replace(self, **{f.name: getattr(other, f.name) for f in fields(self) if getattr(self, f.name) is None})


_FIGURES = (
    ("matmul_bf16", "bf16", "FLOP/s"),
    ("matmul_fp16", "fp16", "FLOP/s"),
    ("matmul_tf32", "tf32", "FLOP/s"),
    ("matmul_fp32", "fp32", "FLOP/s"),
    ("hbm", "HBM", "B/s"),
)


def _si(v: float, unit: str) -> str:
    """3 significant digits with an SI prefix: 612 TFLOP/s, 2.9 TB/s, 12 us."""
    for factor, prefix in (
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
        (1, ""),
        (1e-3, "m"),
        (1e-6, "u"),
    ):
        if abs(v) >= factor:
            return f"{v / factor:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


def _pair(a: float | None, b: float | None) -> str:
    return "/".join("-" if x is None else f"{x / 1e9:.3g}" for x in (a, b)) + " GB/s"


def line(r: Rates, cached: str | None = None) -> str:
    """The probe's figures in one console line, after where they came from ("cached", ...) where not just
    measured; the figures it lacks named at its end (--json says why)."""
    parts = [f"{label} {_si(v, unit)}" for name, label, unit in _FIGURES if (v := getattr(r, name)) is not None]
    if r.source == "cpu" and r.hbm is not None:
        parts[-1] = parts[-1].replace("HBM", "memory")
    if r.h2d_pinned is not None or r.h2d_pageable is not None:
        parts.append(f"PCIe h2d {_pair(r.h2d_pinned, r.h2d_pageable)}, d2h {_pair(r.d2h_pinned, r.d2h_pageable)}")
        parts[-1] += " (pinned/pageable)"
    if r.host_mem is not None:
        parts.append(f"host mem {_si(r.host_mem, 'B/s')}")
    if r.cpu_adam is not None:
        parts.append(f"CPU Adam {_si(r.cpu_adam, 'param/s')}")
    if r.dequant_4bit is not None:
        parts.append(f"NF4 dequant {_si(r.dequant_4bit, 'param/s')}")
    if r.host_overhead_s is not None:
        parts.append(f"host overhead {_si(r.host_overhead_s, 's')}")
    lacking = [f.name for f in fields(Rates) if f.type.startswith("float") and getattr(r, f.name) is None]
    lacking = [n for n in lacking if n != "probe_s"]
    pcie = [n for n in lacking if n[:4] in ("h2d_", "d2h_")]
    if len(pcie) == 4:  # no GPU: one word for the four
        lacking = [n for n in lacking if n not in pcie] + ["PCIe"]
    where = ", ".join(x for x in (r.device, f"{r.threads} threads" if r.threads else None) if x)
    tail = f" [{where}]" if where else ""
    if lacking:
        tail += f"; not measured: {', '.join(lacking)}"
    return f"probe: {cached + ': ' if cached else ''}{', '.join(parts) or 'no figures'}{tail}"


# The vendors' data sheets: dense tensor-core peaks (no sparsity), fp32 on the fp32 cores, memory bandwidth, and
# the PCIe link's one-way figure. Host figures are no GPU's data sheet: a datasheet Rates has none.
_GB = 1e9
_T = 1e12


def _sheet(device: str, bf16: float, tf32: float, fp32: float, hbm: float, pcie: float) -> Rates:
    """A data sheet's rates: dense bf16 (= fp16), TF32 and fp32 in TFLOP/s, memory bandwidth and the PCIe link's
    one-way figure (both directions alike) in GB/s."""
    return Rates(
        matmul_bf16=bf16 * _T,
        matmul_fp16=bf16 * _T,
        matmul_tf32=tf32 * _T,
        matmul_fp32=fp32 * _T,
        hbm=hbm * _GB,
        h2d_pinned=pcie * _GB,
        d2h_pinned=pcie * _GB,
        source="datasheet",
        device=device,
    )


DATASHEETS: tuple[tuple[str, Rates], ...] = (
    ("H200", _sheet("H200", bf16=989.4, tf32=494.7, fp32=66.9, hbm=4800, pcie=64)),
    ("H100", _sheet("H100", bf16=989.4, tf32=494.7, fp32=66.9, hbm=3350, pcie=64)),
    ("A100", _sheet("A100", bf16=312, tf32=156, fp32=19.5, hbm=2039, pcie=32)),
    ("L40S", _sheet("L40S", bf16=362, tf32=183, fp32=91.6, hbm=864, pcie=32)),
    ("A10", _sheet("A10", bf16=125, tf32=62.5, fp32=31.2, hbm=600, pcie=32)),
    ("4090", _sheet("RTX 4090", bf16=165.2, tf32=82.6, fp32=82.6, hbm=1008, pcie=32)),
)


DEVICE_RATES = (
    "matmul_bf16",
    "matmul_fp16",
    "matmul_fp32",
    "matmul_tf32",
    "hbm",
    "h2d_pinned",
    "d2h_pinned",
    "h2d_pageable",
    "d2h_pageable",
    "dequant_4bit",
)
"""The GPU's and its link's rates (Rates' fields a data sheet may give); the rest are the host's."""


def datasheet(gpu_name: str | None) -> Rates | None:
    """The data sheet of the GPU a name contains ("NVIDIA H100 80GB HBM3" -> H100's); None where none is known."""
    for key, rates in DATASHEETS:
        if gpu_name and key.lower() in gpu_name.lower():
            return rates
    return None
