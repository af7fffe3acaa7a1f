"""How far a predicted step time may be from the measurement: the step-time model's held-out error
(leave one results file out, on the committed H200 records) published as a band, so that a search can
tell when a cell it has not measured cannot beat one it has.

`step_time_band(cell, hw)` gives (low, predicted, high) seconds per step; 95% of the records the model
was checked on without having been fitted on them measured inside their band (BAND_COVERAGE). A cell with a
trait (bench.estimate.steptime.traits: offload to NVMe, a PEFT mode, a precision, ...) that fewer than
FAMILIAR_FILES of the fitting results files showed gets the band of such records, which is wider. The
constants sit beside the fitted ones (steptime.STEP_BAND, TRAIT_FILES) and are regenerated with them
(bench.estimate.timecheck.error_band)."""

from __future__ import annotations

import math
from typing import Any

from .model import Hardware
from .steptime import STEP_BAND, TRAIT_FILES, predict_step, traits

__all__ = ["BAND_COVERAGE", "FAMILIAR_FILES", "band_group", "step_time_band"]

BAND_COVERAGE = 0.95
"""The share of held-out records whose measured step time lies inside their band."""
FAMILIAR_FILES = 3
"""A trait the fit saw in at least this many results files is familiar (one file can be one machine's
mood, two can be one matrix run twice)."""


def band_group(cell: Any, ds_config: dict | None = None, files: dict[str, int] | None = None) -> str:
    """'familiar' when every trait of the cell was in at least FAMILIAR_FILES of the results files the
    constants were fitted on (`files`: trait -> files, TRAIT_FILES by default), else 'unfamiliar'."""
    files = TRAIT_FILES if files is None else files
    return "familiar" if all(files.get(t, 0) >= FAMILIAR_FILES for t in traits(cell, ds_config)) else "unfamiliar"


def step_time_band(
    cell: Any, hw: Hardware | None = None, ds_config: dict | None = None
) -> tuple[float, float, float] | None:
    """(low, predicted, high) seconds per optimizer step at BAND_COVERAGE; None for a model whose shape is
    unknown. The band is the 2.5th to 97.5th percentile of measured / predicted on held-out records of the
    cell's group (band_group)."""
    pred = predict_step(cell, hw, ds_config=ds_config)
    if pred is None:
        return None
    b = STEP_BAND[band_group(cell, ds_config)]
    return pred * math.exp(b["low"]), pred, pred * math.exp(b["high"])
