"""Derive bench.records.quality's thresholds and noise figures from the committed records, and print how.

    python -m tools.noise

- Repeats: ok measurements grouped by block (run part x machine, bench.records.record.Record.block) and cell, selfcheck
  variants and records with an injected slowdown (a `slow=` fault) left out. In a group of n >= 2 each
  measurement's squared deviation from the group's mean ln(tokens/s), times n/(n - 1), is one sample of the
  noise within a block.
- A threshold splits those samples by a figure of the measurement; it is the split that makes the two sides'
  spreads (one normal spread each, at least 5 samples a side) likeliest. HOST_BOUND_UTIL_PCT: GPU utilisation
  over the measured steps, cells that do not offload, flagged below. UNSTABLE_TAIL: p90 step over the median
  step, all GPU measurements, flagged above.
- NOISE: the pooled spread of the GPU samples without a flag and with one; of the CPU A/A runs.
- CROSS: pairs of blocks that share at least 3 cells; per pair each shared cell's difference of mean ln tokens/s
  between the blocks; their variance around the pair's mean difference (the offset) less what the cells' own
  noise explains, halved (two blocks' deviations in each difference); pooled over pairs by degrees of freedom.
- CROSS after the host terms (`cross_hosted`): the same pairs, each shared cell's difference fitted with the pair's
  offset plus a host term times the cell's host share (bench.estimate.steptime.host_share: two machines whose hosts
  differ move a host-bound cell and a GPU-bound one apart, as answer mode's model has it,
  bench.estimate.planning.online);
  what is left beyond the noise, halved, pooled by degrees of freedom: a cell's own deviation per machine that
  neither the machine's offset nor its host explains.
- Answer mode's short look (`short_look`): each GPU ok record of an adaptive cell, its step times replayed through
  bench.records.adaptive as rung 0 runs the cell (bench.execute.answer.rung_cell); the spread of ln(that median
  over the record's own, the matrix's schedule), for records that flag nothing and for flagged ones, beside NOISE's:
  what measuring a cell on the short look adds to a measurement's noise.
"""

from __future__ import annotations

import collections
import glob
import itertools
import math
import statistics
from dataclasses import dataclass

import numpy as np

from bench.estimate.check import _cell
from bench.estimate.model import Hardware
from bench.estimate.steptime import host_share
from bench.execute.answer import rung_cell
from bench.matrix.cells import Cell
from bench.records import quality
from bench.records.adaptive import Schedule
from bench.records.status import Status
from bench.records.store import read

__all__ = ["GPU_FILES", "CPU_FILES", "Measured", "groups", "shares", "split", "derive", "short_look"]

GPU_FILES = "results/*.jsonl"
CPU_FILES = "results/ci-cpu-gate/aa*.jsonl"
MIN_SIDE = 5  # samples on each side of a split
MIN_SHARED = 3  # cells two blocks share, to estimate the interaction between blocks


@dataclass(frozen=True)
class Measured:
    log: float
    util: float | None
    offloads: bool
    tail: float | None


def groups(pattern: str, gpu: bool) -> dict[tuple[str, str], list[Measured]]:
    """(block, cell hash) -> its ok measurements, from the files matching `pattern`."""
    out: dict = collections.defaultdict(list)
    for path in sorted(glob.glob(pattern)):
        for r in read(path):
            m = r.metrics
            if r.status is not Status.OK or m is None or not m.tokens_per_s or r.variant:
                continue
            if "slow=" in str((r.worker.fault_injected if r.worker else None) or ""):
                continue
            if gpu != (m.gpu_util_mean_pct is not None):
                continue
            tail = m.step_time_p90_s / m.step_time_median_s - 1 if m.step_time_p90_s and m.step_time_median_s else None
            offloads = (r.cell.get("offload") or "none") != "none"
            out[(r.block, r.cell_hash)].append(Measured(math.log(m.tokens_per_s), m.gpu_util_mean_pct, offloads, tail))
    return dict(out)


def shares(pattern: str) -> dict[str, float]:
    """cell hash -> its predicted host share, for the ok GPU records matching `pattern` whose model the step-time
    model reads: on the GPU of the first such record of the cell (a hash's records share a GPU model: the files
    hold H200 records)."""
    out: dict[str, float] = {}
    for path in sorted(glob.glob(pattern)):
        for r in read(path):
            gpus = r.provenance.gpus if r.provenance else []
            if r.status is not Status.OK or r.cell_hash in out or not r.cell or not gpus:
                continue
            hw = Hardware(gpu_memory_bytes=gpus[0].memory_bytes, gpu_name=r.provenance.gpu_name)
            share = host_share(_cell(r.cell), hw)
            if share is not None:
                out[r.cell_hash] = share
    return out


def _samples(gs: dict) -> list[tuple[Measured, float]]:
    out = []
    for ms in gs.values():
        if len(ms) >= 2:
            mean = sum(x.log for x in ms) / len(ms)
            out += [(x, (x.log - mean) ** 2 * len(ms) / (len(ms) - 1)) for x in ms]
    return out


def _loglik(d2: list[float]) -> float:
    return -0.5 * len(d2) * (math.log(max(sum(d2) / len(d2), 1e-12)) + 1)


def split(samples: list[tuple[float, float]], flag_below: bool) -> dict:
    """The likeliest split of (figure, squared deviation) samples: the boundary, and each side's count and spread.
    The boundary is the least figure of the samples on the upper side."""
    best = None
    for u in sorted({f for f, _ in samples}):
        lo = [d for f, d in samples if f < u]
        hi = [d for f, d in samples if f >= u]
        if len(lo) < MIN_SIDE or len(hi) < MIN_SIDE:
            continue
        ll = _loglik(lo) + _loglik(hi)
        if best is None or ll > best[0]:
            best = (ll, u, lo, hi)
    _, u, lo, hi = best
    flagged, clean = (lo, hi) if flag_below else (hi, lo)
    below = max(f for f, _ in samples if f < u)
    return {
        "boundary": u,
        "below": below,
        "flagged": (len(flagged), math.sqrt(sum(flagged) / len(flagged))),
        "clean": (len(clean), math.sqrt(sum(clean) / len(clean))),
    }


def _flagged(x: Measured, util: float, tail: float) -> bool:
    return (x.util is not None and not x.offloads and x.util < util) or (x.tail is not None and x.tail > tail)


def _cross(gs: dict, noise, share: dict | None = None) -> tuple[float, int, float]:
    """The interaction between blocks (see the module's docstring), the pairs of blocks it pooled, and the
    largest offset between two of them (|mean difference|, ln). share: each cell's host share, to fit a host term
    per pair beside its offset (cells without one left out)."""
    by_block: dict = collections.defaultdict(dict)
    for (block, cell), ms in gs.items():
        by_block[block][cell] = ms
    k = 1 if share is None else 2  # parameters per pair
    excess, dof, pairs, widest = 0.0, 0, 0, 0.0
    for a, b in itertools.combinations(sorted(by_block), 2):
        shared = [c for c in sorted(set(by_block[a]) & set(by_block[b])) if share is None or c in share]
        if len(shared) < MIN_SHARED + k - 1:
            continue
        d, own = [], []
        for c in shared:
            A, B = by_block[a][c], by_block[b][c]
            d.append(sum(x.log for x in B) / len(B) - sum(x.log for x in A) / len(A))
            own.append(sum(noise(x) ** 2 for x in A) / len(A) ** 2 + sum(noise(x) ** 2 for x in B) / len(B) ** 2)
        X = np.ones((len(d), k))
        if share is not None:
            X[:, 1] = [share[c] for c in shared]
        fit, _, rank, _ = np.linalg.lstsq(X, np.array(d), rcond=None)
        resid = np.array(d) - X @ fit
        lever = np.einsum("ij,ij->i", X, np.linalg.pinv(X).T)  # each cell's pull on its own fit
        widest = max(widest, abs(sum(d) / len(d)))
        # What the noise leaves in the residuals: each cell's own, less its leverage's part (k = 1: (n - 1) / n).
        excess += float(resid @ resid) - float((1 - lever) @ np.array(own))
        dof += len(d) - rank
        pairs += 1
    return math.sqrt(max(0.0, excess / dof / 2)), pairs, widest


def derive() -> dict:
    """Every figure bench.records.quality holds, from the committed records, with what it rests on."""
    gpu = groups(GPU_FILES, gpu=True)
    samples = _samples(gpu)
    util = split([(x.util, d) for x, d in samples if not x.offloads and x.util is not None], flag_below=True)
    tail = split([(-x.tail, d) for x, d in samples if x.tail is not None], flag_below=True)  # flagged above
    u, t = util["boundary"], -tail["boundary"]
    flagged = [d for x, d in samples if _flagged(x, u, t)]
    clean = [d for x, d in samples if not _flagged(x, u, t)]
    cpu = groups(CPU_FILES, gpu=False)
    cpu_d2 = [d for _, d in _samples(cpu)]
    noise = {
        "gpu": math.sqrt(sum(clean) / len(clean)),
        "gpu_flagged": math.sqrt(sum(flagged) / len(flagged)),
        "cpu": math.sqrt(sum(cpu_d2) / len(cpu_d2)),
    }

    def gpu_noise(x: Measured) -> float:
        return noise["gpu_flagged"] if _flagged(x, u, t) else noise["gpu"]

    gpu_cross, gpu_pairs, gpu_widest = _cross(gpu, gpu_noise)
    hosted, hosted_pairs, _ = _cross(gpu, gpu_noise, shares(GPU_FILES))
    cpu_cross, cpu_pairs, cpu_widest = _cross(cpu, lambda x: noise["cpu"])
    return {
        "host_bound_util_pct": u,
        "host_bound_split": util,
        "unstable_tail": t,
        "unstable_split": tail,
        "noise": noise,
        "samples": {"gpu": len(clean), "gpu_flagged": len(flagged), "cpu": len(cpu_d2)},
        "cross": {"gpu": gpu_cross, "cpu": cpu_cross},
        "block_pairs": {"gpu": gpu_pairs, "cpu": cpu_pairs},
        "cross_hosted": {"gpu": hosted, "block_pairs": hosted_pairs},
        "widest_offset": {"gpu": gpu_widest, "cpu": cpu_widest},
    }


def short_look(pattern: str = GPU_FILES) -> dict:
    """How far answer mode's rung 0 lands from the matrix's own schedule (module docstring): per kind of record
    ("clean", "flagged": bench.records.quality.flags), how many and the spread of ln(rung 0's median over the
    record's own); "unfinished": records whose steps ran out before rung 0's replay ended."""
    d: dict = {"clean": [], "flagged": [], "unfinished": 0}
    for path in sorted(glob.glob(pattern)):
        for r in read(path):
            times = r.step_times_s or []
            if r.status is not Status.OK or not r.metrics or quality.kind(r) != "gpu" or len(times) < 6:
                continue
            cell = Cell.from_dict(r.cell)
            if cell.adaptive is None:
                continue
            look, own = _replay(rung_cell(cell, 0), times), statistics.median(times[r.steps.warmup :])
            if look is None:
                d["unfinished"] += 1
                continue
            d["flagged" if quality.flags(r) else "clean"].append(math.log(look / own))
    spread = {k: (len(d[k]), statistics.pstdev(d[k]) if len(d[k]) > 1 else None) for k in ("clean", "flagged")}
    return spread | {"unfinished": d["unfinished"]}


def _replay(cell: Cell, times: list[float]) -> float | None:
    """The median step time the cell's schedule (bench.records.adaptive) would have measured over these step
    times; None where they end before it does."""
    look = Schedule(cell.warmup_steps, cell.measured_steps, cell.adaptive)
    for t in times:
        look.observe(t)
        if look.done:
            return statistics.median(look.measured)
    return None


def main() -> None:
    d = derive()
    hb, un = d["host_bound_split"], d["unstable_split"]
    print(f"GPU repeats: {d['samples']['gpu'] + d['samples']['gpu_flagged']} samples ({GPU_FILES})")
    print(
        f"host-bound below {d['host_bound_util_pct']:.2f}% GPU utilisation (next below: {hb['below']:.2f}%): "
        f"flagged {hb['flagged'][0]} spread {hb['flagged'][1]:.4f}, clean {hb['clean'][0]} spread {hb['clean'][1]:.4f}"
    )
    print(
        f"unstable above a p90 step {d['unstable_tail']:.4f} over the median (next above: {-un['below']:.4f}): "
        f"flagged {un['flagged'][0]} spread {un['flagged'][1]:.4f}, clean {un['clean'][0]} spread {un['clean'][1]:.4f}"
    )
    n, s = d["noise"], d["samples"]
    print(f"noise within a block: GPU clean {n['gpu']:.4f} ({s['gpu']}), flagged {n['gpu_flagged']:.4f} "
          f"({s['gpu_flagged']}); CPU {n['cpu']:.4f} ({s['cpu']}, {CPU_FILES})")  # fmt: skip
    c, p = d["cross"], d["block_pairs"]
    w = d["widest_offset"]
    print(f"interaction between blocks: GPU {c['gpu']:.4f} ({p['gpu']} pairs of blocks), CPU {c['cpu']:.4f} "
          f"({p['cpu']} pairs); blocks differ as a whole by up to x{math.exp(w['gpu']):.3f} (GPU), "
          f"x{math.exp(w['cpu']):.3f} (CPU)")  # fmt: skip
    h = d["cross_hosted"]
    print(f"interaction between blocks after a host term per pair of blocks: GPU {h['gpu']:.4f} "
          f"({h['block_pairs']} pairs of blocks)")  # fmt: skip
    print(f"bench.records.quality: HOST_BOUND_UTIL_PCT {quality.HOST_BOUND_UTIL_PCT}, "
          f"UNSTABLE_TAIL {quality.UNSTABLE_TAIL}, "
          f"NOISE {quality.NOISE}, CROSS {quality.CROSS}")  # fmt: skip
    k = short_look()
    print(f"answer mode's rung 0 replayed over a record's steps against its own median: clean records "
          f"{k['clean'][0]}, sd {k['clean'][1]:.4f}; flagged {k['flagged'][0]}, sd {k['flagged'][1]:.4f}; "
          f"unfinished {k['unfinished']}")  # fmt: skip


if __name__ == "__main__":
    main()
