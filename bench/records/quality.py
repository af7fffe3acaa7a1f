"""How far one measurement of tokens/s can be trusted, from its own record: flags with their figures, and the
noise a measurement carries. Every threshold and noise figure here is measured on the committed records
(`python -m tools.noise` derives each; tests/records/test_quality.py holds them to those files; docs/comparing.md
says where each comes from):

- *host-bound*: the GPU was busy less than HOST_BOUND_UTIL_PCT of the measured steps (NVML's utilisation), in
  a cell that does not offload to the CPU or NVMe (a cell that does waits on the host by design). The
  threshold is the split of the committed repeats by utilisation that best explains their spread.
- *unstable*: the slowest tenth of the measured steps ran more than UNSTABLE_TAIL over the median step (the
  record's p90 over its median step time), the split of the same repeats by that figure.
- *throttled*: NVML reported a thermal or hardware slowdown of the clocks (THROTTLES) during the measured
  steps. No committed record has one; the power cap (sw_power_cap) is the normal state of an H200 at full
  load (most committed GPU measurements, the steadiest among them) and is no flag.

A flagged measurement is weaker evidence: its noise is NOISE["gpu_flagged"], about three times a clean one's.
Only GPU measurements are flagged: on the CI's CPU the step-time spread did not tell the noisier repeats apart.

The noise figures are standard deviations of ln(tokens/s). Within a block (one run part on one machine,
bench.records.record.Record.block) a measurement scatters by NOISE around its cell's value there. Between blocks a
machine is faster or slower as a whole (an offset, estimated from cells measured in both: bench.judge.blocks) and
each cell deviates from that offset by CROSS. Pure: no I/O.
"""

from __future__ import annotations

from .record import Record

__all__ = ["HOST_BOUND_UTIL_PCT", "UNSTABLE_TAIL", "THROTTLES", "NOISE", "CROSS", "UNTIED_SD", "kind", "flags",
           "noise_sd"]  # fmt: skip

HOST_BOUND_UTIL_PCT = 76.3
"""Below this GPU utilisation (%) over the measured steps, a cell that does not offload waited on the host."""
UNSTABLE_TAIL = 0.0435
"""Above this, (p90 step time / median step time) - 1: the steps spread beyond the noise."""
THROTTLES = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

NOISE = {"gpu": 0.0257, "gpu_flagged": 0.0721, "cpu": 0.1009}
"""Within one block, the spread of one measurement around its cell's value: an unflagged GPU measurement, a
flagged one (any flag), a CPU one (the CI machine's A/A runs, results/ci-cpu-gate/aa*.jsonl)."""
CROSS = {"gpu": 0.0394, "cpu": 0.0}
"""Between blocks, a cell's deviation from its block's offset (the machines' difference as a whole): what an
anchor's offset misses for another cell. The CPU's repeats drift together within a run, so there none is seen
beyond the noise."""
UNTIED_SD = 10.0
"""A block's offset before any cell ties it to the others: unknown (a prior so wide that only anchors move it).
Not a measurement: a machine may be anything, and a block is compared with others only through anchors."""


def kind(rec: Record) -> str:
    """ "gpu" for a measurement on a GPU host (the noise of GPU runs), else "cpu"."""
    gpus = rec.provenance.gpus if rec.provenance is not None else []
    return "gpu" if gpus or (rec.metrics is not None and rec.metrics.gpu_util_mean_pct is not None) else "cpu"


def flags(rec: Record) -> list[str]:
    """What makes an ok GPU measurement weaker evidence, each with its figures; [] for a clean one."""
    m = rec.metrics
    if m is None or kind(rec) != "gpu":
        return []
    out = []
    offloads = (rec.cell.get("offload") or "none") != "none"
    if m.gpu_util_mean_pct is not None and not offloads and m.gpu_util_mean_pct < HOST_BOUND_UTIL_PCT:
        out.append(f"host-bound: GPU busy {m.gpu_util_mean_pct:.0f}% of the measured steps (< {HOST_BOUND_UTIL_PCT}%)")
    if m.step_time_p90_s and m.step_time_median_s:
        tail = m.step_time_p90_s / m.step_time_median_s - 1
        if tail > UNSTABLE_TAIL:
            out.append(f"unstable: the p90 step {tail:.1%} over the median step (> {UNSTABLE_TAIL:.2%})")
    slowed = [t for t in m.throttle_reasons or () if t in THROTTLES]
    if slowed:
        clocks = f" (SM clock {m.sm_clock_min_mhz:.0f}-{m.sm_clock_mean_mhz:.0f} MHz)" if m.sm_clock_min_mhz else ""
        out.append(f"throttled: {', '.join(slowed)}{clocks}")
    return out


def noise_sd(rec: Record) -> float:
    """The spread of this measurement within its block (log scale): by its kind, and flagged or not."""
    k = kind(rec)
    return NOISE["gpu_flagged"] if k == "gpu" and flags(rec) else NOISE[k]
