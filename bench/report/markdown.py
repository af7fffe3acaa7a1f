"""Markdown report (GitHub-flavoured) from a results DataFrame."""
from __future__ import annotations

import html
import math
import re

__all__ = ["render", "escape"]


def escape(s) -> str:
    """Escape text for a Markdown table cell: HTML-escape, then neutralise Markdown syntax."""
    s = html.escape("" if s is None else str(s), quote=False)
    return re.sub(r"([\\`*_\[\]|#!~])", r"\\\1", s).replace("\n", " ")


def _gib(b) -> str:
    try:
        return "" if b is None or math.isnan(b) else f"{b / 2**30:.2f}"
    except TypeError:
        return ""


def _num(x, fmt="{:,.0f}") -> str:
    try:
        return "" if x is None or math.isnan(x) else fmt.format(x)
    except (TypeError, ValueError):
        return ""


def _peak(row):
    for k in ("nvml_proc_peak_bytes", "torch_max_reserved_bytes", "host_rss_peak_bytes"):
        v = row.get(k)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            return v, k
    return None, None


def render(df, title: str = "zerobench report") -> str:
    from ..results import latest

    cur = latest(df)
    lines = [f"# {escape(title)}", ""]
    n = len(cur)
    counts = cur["status"].value_counts().to_dict() if n else {}
    lines.append(f"{n} cells: " + ", ".join(f"{v} {escape(k)}" for k, v in sorted(counts.items())) if n else "No results.")
    lines.append("")
    lines += ["## Cells", "", "| cell | status | peak memory (GiB) | tokens/s | MFU | final loss |",
              "|---|---|---:|---:|---:|---:|"]
    for _, r in cur.iterrows():
        peak, kind = _peak(r)
        kind_s = {"nvml_proc_peak_bytes": " (NVML)", "torch_max_reserved_bytes": " (torch)",
                  "host_rss_peak_bytes": " (host RSS)"}.get(kind, "")
        mfu = r.get("mfu")
        loss = r.get("loss_final")
        lines.append(f"| {escape(r['cell_name'])} | {escape(r['status'])} | {_gib(peak)}{kind_s if peak else ''} | "
                     f"{_num(r.get('tokens_per_s'))} | {_num(mfu * 100 if mfu is not None else None, '{:.1f}%')} | "
                     f"{_num(loss, '{:.3f}')} |")
    bad = cur[cur["status"] != "ok"]
    if len(bad):
        lines += ["", "## Skipped and failed cells", "", "| cell | status | reason |", "|---|---|---|"]
        for _, r in bad.iterrows():
            lines.append(f"| {escape(r['cell_name'])} | {escape(r['status'])} | {escape(r['reason'])} |")
    lines += ["", "## Environment", ""]
    envcols = ["host", "gpu_name", "gpu_count", "torch_version", "deepspeed_version", "transformers_version",
               "peft_version", "bitsandbytes_version", "git_commit"]
    for c in envcols:
        if c in cur:
            vals = sorted({str(v) for v in cur[c].dropna()})
            if vals:
                lines.append(f"- {c.replace('_', ' ')}: {escape(', '.join(vals))}")
    return "\n".join(lines) + "\n"
