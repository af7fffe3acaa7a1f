"""How the step-time model's misses on cells measured on one machine split into knobs' main effects, shared by every
cell that holds a value, and each cell's own: the question that decides whether an answer can learn an unmeasured
cell's miss from its neighbours (docs/answer-mode.md, "What the records say of the misses cells share").

    python -m tools.misses FILE [--axes optimizer zero_stage micro_batch]

Each ok record's miss is ln(predicted / measured median step time), predicted by the fitted constants at its
machine's rates and host (bench.estimate.checks.timecheck.evaluate_time: a file no constant was fitted on). A least
squares fit of the misses on a level and one effect per axis value (the first value of each axis the reference)
leaves each cell's own; the measurements' noise (bench.records.quality.NOISE, flagged or not) is part of it.
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass

import numpy as np

from bench.estimate.checks.timecheck import evaluate_time, time_cases

AXES = ("optimizer", "zero_stage", "micro_batch")


@dataclass
class Split:
    cells: list[dict]  # each record's value of each axis
    misses: np.ndarray
    effects: dict[str, float]  # "level" and "axis=value" (against each axis's first value)
    own: np.ndarray  # each cell's miss less the level and its values' effects
    df: int  # records less the fitted effects
    noise: float  # rms of the records' measurement noise

    @property
    def own_sd(self) -> float:
        return math.sqrt(float((self.own**2).sum()) / self.df) if self.df > 0 else float("nan")

    @property
    def own_beyond_noise(self) -> float:
        return math.sqrt(max(self.own_sd**2 - self.noise**2, 0.0))


def split(path: str, axes: tuple[str, ...] = AXES) -> Split:
    rows = evaluate_time(time_cases([path]))
    values = [[getattr(r.case.cell, a) for a in axes] for r in rows]
    misses = np.array([math.log(r.step / r.case.step_s) for r in rows])
    columns, names = [np.ones(len(rows))], ["level"]
    for k, axis in enumerate(axes):
        for v in sorted({vs[k] for vs in values}, key=str)[1:]:
            columns.append(np.array([float(vs[k] == v) for vs in values]))
            names.append(f"{axis}={v}")
    X = np.array(columns).T
    beta, *_ = np.linalg.lstsq(X, misses, rcond=None)
    noise = math.sqrt(statistics.fmean(r.case.noise**2 for r in rows))
    return Split(
        [dict(zip(axes, vs)) for vs in values], misses, dict(zip(names, map(float, beta))), misses - X @ beta,
        len(rows) - X.shape[1], noise,
    )  # fmt: skip


def text(s: Split) -> str:
    lines = [
        f"{len(s.misses)} ok records; the miss ln(predicted / measured step time): mean {s.misses.mean():+.3f}, sd "
        f"{s.misses.std(ddof=1):.3f}, {s.misses.min():+.3f} to {s.misses.max():+.3f}",
        "main effects: " + ", ".join(f"{k} {v:+.3f}" for k, v in s.effects.items()),
        f"each cell's own, after them: sd {s.own_sd:.3f} on {s.df} df, largest {abs(s.own).max():.3f}; the "
        f"measurements' noise {s.noise:.3f} (rms); own beyond the noise {s.own_beyond_noise:.3f}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.misses", description=__doc__.split("\n\n")[0])
    ap.add_argument("file", help="a results file (.jsonl, .jsonl.gz) of one machine's cells")
    ap.add_argument("--axes", nargs="+", default=list(AXES), help="the axes whose values get an effect each")
    a = ap.parse_args(argv)
    print(text(split(a.file, tuple(a.axes))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
