"""Number formatting shared by the Markdown and HTML reports: one place decides how a figure reads.

Every function takes None/NaN and returns "" for it, since any figure can be missing (skipped cells,
CPU runs without NVML or a CUDA allocator).
"""

from __future__ import annotations

import math

# What measured a cell's peak memory (the results' `peak_memory_source`), in a word or two.
MEMORY_SOURCES = {"nvml": "NVML", "torch_reserved": "allocator", "host_rss": "host RSS"}

__all__ = ["MEMORY_SOURCES", "missing", "gib", "num", "pct", "change", "ratio", "effect", "ms", "tflops", "sort_value"]


def missing(x) -> bool:
    if x is None:
        return True
    if type(x) is float:  # the common case, checked first: a 10k-row report asks some 10^5 times
        return x != x
    try:
        return math.isnan(x)
    except TypeError:
        return False


def gib(b, digits: int = 2) -> str:
    """Bytes as GiB, the unit GPU memory is sold and reported in (nvidia-smi's MiB / 1024)."""
    return "" if missing(b) else f"{b / 2**30:,.{digits}f}"


def num(x, digits: int = 0) -> str:
    return "" if missing(x) else f"{x:,.{digits}f}"


def pct(x, digits: int = 1) -> str:
    """A fraction (0.412) as a percentage (41.2%)."""
    return "" if missing(x) else f"{x * 100:.{digits}f}%"


def change(x, digits: int = 1) -> str:
    """A relative change (0.031) as a signed percentage (+3.1%)."""
    return "" if missing(x) else f"{x * 100:+.{digits}f}%"


def ratio(x) -> str:
    return "" if missing(x) else f"×{x:.2f}"


def effect(ratio, ci=None, conf=None) -> str:
    """A ratio with its interval and the interval's confidence: ×0.56 [0.45–0.69, 95%]."""
    if missing(ratio):
        return ""
    if not ci or missing(ci[0]) or missing(ci[1]):
        return f"×{ratio:.2f}"
    level = "" if conf is None else f", {conf:.0%}"
    return f"×{ratio:.2f} [{ci[0]:.2f}–{ci[1]:.2f}{level}]"


def ms(seconds) -> str:
    return "" if missing(seconds) else f"{seconds * 1000:,.1f}"


def tflops(x) -> str:
    """A GPU does hundreds of TFLOP/s, a CPU a few hundredths: keep three significant-ish digits."""
    return "" if missing(x) else f"{x:,.1f}" if abs(x) >= 10 else f"{x:.3f}"


def sort_value(x) -> str:
    """A number as the HTML tables' sort key (data-v); '' sorts last."""
    if missing(x) or isinstance(x, str):
        return ""
    return repr(float(x))
