"""When a cell's warmup ends and when its measurement ends: fixed counts, or decided as the steps run.

Pure Python and deterministic: fed each step's time in turn, a `Schedule` says which phase the next
step belongs to and, at the end, why each phase ended. The worker drives it (bench/worker/measure.py,
both engines); tests feed it sequences. The settings are a cell's (bench.matrix.cells.Adaptive).

Warmup (adaptive) ends after a step when
  - "settled": at least `min_warmup` warmup steps ran, and the last `settle_window` step times each lie within
    `settle_within` of their median;
  - "step cap": the cell's warmup_steps have run;
  - "time cap": the steps have taken half of `max_seconds`.
Measurement (adaptive) ends after a measured step when
  - "converged": at least `min_steps` measured steps, and the median step time's distribution-free
    interval (bench.stats.median_ci) reaches confidence `level` with a half-width (the wider side) of at
    most `tolerance` times the median;
  - "step cap": the cell's measured_steps have run;
  - "time cap": the steps (warmup and measured, their own times summed) have taken `max_seconds`, and at
    least MIN_MEASURED measured steps ran (a median and an interval need them, so a cell whose single
    step outlasts the cap still measures that many).
Fixed counts end "fixed". Every record says which, with the steps taken and the interval (`summary`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import stats

__all__ = [
    "Schedule",
    "settled",
    "interval",
    "MIN_MEASURED",
    "FIXED",
    "SETTLED",
    "CONVERGED",
    "STEP_CAP",
    "TIME_CAP",
    "STOPPED",
    "ENDINGS",
    "WARMUP_ENDINGS",
    "MEASURED_ENDINGS",
]

FIXED, SETTLED, CONVERGED, STEP_CAP, TIME_CAP = "fixed", "settled", "converged", "step cap", "time cap"
STOPPED = "stopped"
"""The steps ended before the schedule did (a diverged loss)."""
ENDINGS = (FIXED, SETTLED, CONVERGED, STEP_CAP, TIME_CAP, STOPPED)
WARMUP_ENDINGS = (FIXED, SETTLED, STEP_CAP, TIME_CAP, STOPPED)
MEASURED_ENDINGS = (FIXED, CONVERGED, STEP_CAP, TIME_CAP, STOPPED)
PHASES = ("warmup", "measured", "done")

# Under a time cap, the fewest measured steps (3: the range covers the median with 75%).
MIN_MEASURED = 3
# The confidence of the interval a fixed schedule reports.
DEFAULT_LEVEL = 0.95


def settled(times: Sequence[float], window: int, within: float) -> bool:
    """Whether the last `window` step times each lie within `within` (a fraction) of their median."""
    if window < 1 or len(times) < window:
        return False
    last = list(times[-window:])
    m = stats.median(last)
    return bool(m) and all(abs(t - m) <= within * m for t in last)


def interval(times: Sequence[float], level: float) -> dict[str, float | None]:
    """The median of step times with its interval (bench.stats.median_ci): median, low, high, the
    confidence reached, and the half-width relative to the median (the wider of the two sides)."""
    med = stats.median(times)
    lo, hi, conf = stats.median_ci(times, level)
    half = max(med - lo, hi - med) / med if med and lo is not None and hi is not None else None
    return {"median_s": med, "ci_low_s": lo, "ci_high_s": hi, "ci_level": conf, "half_width": half}


class Schedule:
    """One cell's step schedule. Call observe(step_time) after each step; `measuring` says whether the
    next step is timed, `done` whether training stops. With adaptive=None the counts are fixed."""

    def __init__(self, warmup_steps: int, measured_steps: int, adaptive: Any = None):
        self.warmup_cap, self.measured_cap, self.a = warmup_steps, measured_steps, adaptive
        self.times: list[float] = []
        self.warmup_taken = 0
        self.warmup_ended: str | None = None
        self.ended: str | None = None
        self.phase = "warmup"
        if warmup_steps == 0 and not self._auto("warmup"):
            self._begin_measuring(FIXED)

    def _auto(self, part: str) -> bool:
        return self.a is not None and getattr(self.a, part)

    @property
    def measuring(self) -> bool:
        return self.phase == "measured"

    @property
    def done(self) -> bool:
        return self.phase == "done"

    @property
    def measured(self) -> list[float]:
        return self.times[self.warmup_taken :] if self.phase != "warmup" else []

    def _begin_measuring(self, why: str) -> None:
        self.phase, self.warmup_taken, self.warmup_ended = "measured", len(self.times), why

    def _end(self, why: str) -> None:
        self.phase, self.ended = "done", why

    def observe(self, dt: float) -> None:
        """One step ran in dt seconds: decide whether its phase is over."""
        if self.done:
            return
        self.times.append(dt)
        spent = sum(self.times)
        a = self.a
        if self.phase == "warmup":
            n = len(self.times)
            if not self._auto("warmup"):
                if n >= self.warmup_cap:
                    self._begin_measuring(FIXED)
            elif n >= a.min_warmup and settled(self.times, a.settle_window, a.settle_within):
                self._begin_measuring(SETTLED)
            elif n >= self.warmup_cap:
                self._begin_measuring(STEP_CAP)
            elif a.max_seconds is not None and spent >= a.max_seconds / 2:
                self._begin_measuring(TIME_CAP)
            return
        m = len(self.measured)
        if not self._auto("measured"):
            if m >= self.measured_cap:
                self._end(FIXED)
            return
        if m >= a.min_steps:
            iv = interval(self.measured, a.level)
            sure = iv["ci_level"] is not None and iv["ci_level"] >= a.level
            if sure and iv["half_width"] is not None and iv["half_width"] <= a.tolerance:  # None: steps of 0 s
                self._end(CONVERGED)
                return
        if m >= self.measured_cap:
            self._end(STEP_CAP)
        elif a.max_seconds is not None and spent >= a.max_seconds and m >= MIN_MEASURED:
            self._end(TIME_CAP)

    # -- ranks agree: rank 0's decision is every rank's (bench/worker/measure.py broadcasts it) ----------
    def state(self) -> list[int]:
        """The decision so far as integers (phase, why warmup ended, why measuring ended)."""
        code = {None: -1, **{e: i for i, e in enumerate(ENDINGS)}}
        return [PHASES.index(self.phase), code[self.warmup_ended], code[self.ended]]

    def impose(self, state: Sequence[int]) -> None:
        """Take another rank's decision (state()) for this one: the ranks step in lockstep."""
        phase = PHASES[int(state[0])]
        w, e = (None if i < 0 else ENDINGS[i] for i in (int(state[1]), int(state[2])))
        if phase == "warmup":
            self.phase, self.warmup_ended, self.ended = "warmup", None, None
            return
        if self.phase == "warmup":
            self._begin_measuring(w)
        self.warmup_ended = w
        self.phase, self.ended = phase, e if phase == "done" else None

    def summary(self) -> dict[str, Any]:
        """What the record says (bench.records.record.StepsTaken): steps taken, why each phase ended, the interval."""
        a = self.a
        auto = self._auto("measured")
        level = a.level if auto else DEFAULT_LEVEL
        measured = self.measured
        return {
            "warmup": self.warmup_taken if self.phase != "warmup" else len(self.times),
            "measured": len(measured),
            "warmup_ended": self.warmup_ended or STOPPED,
            "ended": self.ended or STOPPED,
            **interval(measured, level),
            "tolerance": a.tolerance if auto else None,
            "max_seconds": a.max_seconds if a is not None else None,
            "steps_s": sum(self.times),
        }
