"""The step-time model's held-out error with its fit's hyperparameters chosen inside each fold: for each
results file, OVERLAP (bench.estimate.steptime), STEP_RIDGE and MACHINE_RIDGE (bench.estimate.timecheck) are
picked from GRID by the leave-one-file-out p95 on the other files alone, then that file is predicted with
constants fitted on the other files at the picked values. What the shipped values (picked on the whole set's
leave-one-file-out error) would score had they been picked without seeing the file; and how many of those
errors fall inside the band derived and calibrated (bench.estimate.timecheck.calibrated_levels) on the other
files' nested errors alone. An hour on two cores: every fold runs a cross-validation per grid point.

    python -m tools.steptime_nested [RESULTS ...]   (default: results/*.jsonl)
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import itertools
import sys
from collections.abc import Iterator, Sequence

from bench.estimate import steptime, timecheck
from bench.estimate.timecheck import TimeCase, TimeRow, evaluate_time, fit_time, time_cases, time_summary

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


def _held_out(train: Sequence[TimeCase], test: Sequence[TimeCase]) -> list[TimeRow]:
    return evaluate_time(test, fit_time(train))


def _cv(cs: Sequence[TimeCase]) -> list[TimeRow]:
    files = sorted({c.file for c in cs})
    return [r for f in files for r in _held_out([c for c in cs if c.file != f], [c for c in cs if c.file == f])]


def nested(cs: Sequence[TimeCase], grid: Sequence[tuple[float, float, float]] = GRID, log=None):
    """(held-out rows, {file: picked (overlap, ridge, machine ridge)}): each file predicted at the values its
    inner leave-one-file-out p95 (median on a tie) picked."""
    rows, picked = [], {}
    for f in sorted({c.file for c in cs}):
        train, test = [c for c in cs if c.file != f], [c for c in cs if c.file == f]
        scores = []
        for point in grid:
            with hyperparameters(*point):
                s = time_summary(_cv(train))
            scores.append((s["p95"], s["median"], *point))
        picked[f] = tuple(min(scores)[2:])
        with hyperparameters(*picked[f]):
            rows += _held_out(train, test)
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
