"""The step-time model's held-out error with its fit's hyperparameters chosen inside each fold: for each
results file, OVERLAP (bench.estimate.steptime), STEP_RIDGE and MACHINE_RIDGE (bench.estimate.checks.timecheck) are
picked from GRID by the leave-one-file-out p95 on the other files alone, then that file is predicted with
constants fitted on the other files at the picked values. What the shipped values (picked on the whole set's
leave-one-file-out error) would score had they been picked without seeing the file; and how many of those
errors fall inside the band derived and calibrated (bench.estimate.checks.timecheck.calibrated_levels) on the other
files' nested errors alone. Tens of minutes: a fit per grid point and pair of results files.

    python -m tools.steptime_nested [RESULTS ...]   (default: results/*.jsonl)
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import itertools
import sys
from collections.abc import Iterator, Sequence

from bench.estimate import steptime
from bench.estimate.checks import timecheck
from bench.estimate.checks.timecheck import (
    TimeCase,
    TimeRow,
    evaluate_time,
    fit_time,
    measured_on,
    ops_reference,
    time_cases,
    time_summary,
)

GRID = tuple(itertools.product((3.0, 4.0, 6.0), (0.03, 0.1), (1.0, 3.0)))
"""(OVERLAP, STEP_RIDGE, MACHINE_RIDGE) triples to pick from."""


@contextlib.contextmanager
def hyperparameters(overlap: float, ridge: float, machine_ridge: float) -> Iterator[None]:
    """The fit and the prediction at these values, restored after."""
    saved = steptime.OVERLAP, timecheck.OVERLAP, timecheck.STEP_RIDGE, timecheck.MACHINE_RIDGE
    steptime.OVERLAP = timecheck.OVERLAP = overlap
    timecheck.STEP_RIDGE, timecheck.MACHINE_RIDGE = ridge, machine_ridge
    try:
        yield
    finally:
        steptime.OVERLAP, timecheck.OVERLAP, timecheck.STEP_RIDGE, timecheck.MACHINE_RIDGE = saved


def shipped() -> tuple[float, float, float]:
    """The hyperparameters the module holds."""
    return steptime.OVERLAP, timecheck.STEP_RIDGE, timecheck.MACHINE_RIDGE


class _Fits:
    """Constants fitted without a set of results files, at a grid point, each fitted once: an outer fold
    leaving f out and its inner fold leaving g out fit on what the outer fold g's inner fold f fits on."""

    def __init__(self, cs: Sequence[TimeCase]):
        self.cs, self.cache = cs, {}

    def rows(self, point: tuple[float, float, float], left_out: frozenset[str], test: str) -> list[TimeRow]:
        """The records of file `test` (one of `left_out`) predicted without the files `left_out`, each host's
        time against their reference (timecheck.ops_reference)."""
        key = (point, left_out)
        train = [c for c in self.cs if c.file not in left_out]
        ref = ops_reference(train)
        if key not in self.cache:
            with hyperparameters(*point):
                self.cache[key] = fit_time(measured_on(train, ref))
        with hyperparameters(*point):
            return evaluate_time(measured_on([c for c in self.cs if c.file == test], ref), self.cache[key])


def nested(cs: Sequence[TimeCase], grid: Sequence[tuple[float, float, float]] = GRID, log=None):
    """(held-out rows, {file: picked (overlap, ridge, machine ridge)}): each file predicted at the values its
    inner leave-one-file-out p95 (median on a tie) picked."""
    fits, files = _Fits(cs), sorted({c.file for c in cs})
    rows, picked = [], {}
    for f in files:
        scores = []
        for point in grid:
            inner = [r for g in files if g != f for r in fits.rows(point, frozenset({f, g}), g)]
            s = time_summary(inner)
            scores.append((s["p95"], s["median"], *point))
        picked[f] = tuple(min(scores)[2:])
        rows += fits.rows(picked[f], frozenset({f}), f)
        if log:
            log(f"{f}: OVERLAP {picked[f][0]}, STEP_RIDGE {picked[f][1]}, MACHINE_RIDGE {picked[f][2]}")
    return rows, picked


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="*", help="results files (default: results/*.jsonl)")
    args = ap.parse_args(argv)
    cs = time_cases(args.results or sorted(glob.glob("results/*.jsonl")))
    rows, _ = nested(cs, log=lambda line: print(line, flush=True))
    s = time_summary(rows)
    print(f"nested leave-one-file-out: {s['n']} records, median |error| {s['median']:.1%}, p95 {s['p95']:.1%}")
    inside, n = timecheck.band_coverage(cs, rows)["all"]
    print(f"nested band: {inside} of {n} ({inside / n:.1%}) inside the band derived and calibrated without their file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
