"""How far a predicted step time may be from the measurement: the step-time model's held-out error
(leave one results file out, on the committed records) published as a band, so that a search can
tell when a cell it has not measured cannot beat one it has.

`step_time_band(cell, hw)` gives (low, predicted, high) seconds per step. The band is calibrated on held-out
files: its edges are the percentiles of the held-out errors at the level at which a band derived from the
other results files holds BAND_COVERAGE of each file's records (a file is a new machine or a new region of
cells; the nominal 95% percentiles of one set of errors hold fewer than 95% of another's). The groups:
a cell with a trait (bench.estimate.steptime.traits: offload to NVMe, a PEFT mode, a precision, ...) that
fewer than FAMILIAR_FILES of the fitting results files showed is "unfamiliar"; a familiar cell is
"host-bound" when at least HOST_BOUND of its predicted step moves with the host's speed
(bench.estimate.steptime.host_share), where machines with the same GPU differ most, "gpu-bound" when less than
GPU_BOUND does, where the GPU's work hides the host's, else "mixed". STEP_BAND also holds "familiar", the
familiar groups together (answer mode's prior width). A prediction
for a host whose time was measured before its cells (Hardware.host_time) takes STEP_BAND_HOST, the error of
predictions that took it; one for a host not measured, STEP_BAND, the error of predictions for the typical
host, wider where the host's work is: it holds the machines whose hosts were far from typical
(bands_for). The bands are data beside the fitted constants (fit.json's "step_time" section, read as
steptime.STEP_BAND, STEP_BAND_HOST, TRAIT_FILES) and are regenerated with them
(bench.estimate.checks.timecheck.error_band)."""

from __future__ import annotations

import math
from typing import Any

from .model import Hardware
from .steptime import STEP_BAND, STEP_BAND_HOST, TRAIT_FILES, host_share, predict_step, traits

__all__ = [
    "BAND_COVERAGE",
    "FAMILIAR_FILES",
    "GPU_BOUND",
    "HOST_BOUND",
    "band_group",
    "bands_for",
    "group_of",
    "step_time_band",
]

BAND_COVERAGE = 0.95
"""The share of held-out records, of files the band was neither derived nor calibrated on, it should hold."""
FAMILIAR_FILES = 3
"""A trait the fit saw in at least this many results files is familiar (one file can be one machine's
mood, two can be one matrix run twice)."""
HOST_BOUND = 0.5
"""The host share (bench.estimate.steptime.host_share) from which a familiar cell's band is the host-bound
group's: the host's parts are the larger share of what moves its step."""
GPU_BOUND = 0.1
"""The host share below which a familiar cell's band is the gpu-bound group's (between it and HOST_BOUND: the
mixed group's). Picked on the committed records' held-out errors (leave one results file out), where cells of a
small host share miss least: of the thresholds 0.1-0.3, the one whose bands are narrowest at the median over those
records, every one holding 96% of the records of files it was not derived from (docs/step-time.md, "The band")."""


def group_of(familiar: bool, share: float | None) -> str:
    """The band group of a cell whose traits are familiar or not, at this host share."""
    if not familiar:
        return "unfamiliar"
    if share is None or share < GPU_BOUND:
        return "gpu-bound"
    return "host-bound" if share >= HOST_BOUND else "mixed"


def bands_for(hw: Hardware | None) -> dict[str, dict[str, float]]:
    """The bands a prediction on this hardware carries: STEP_BAND_HOST where its host's time was measured,
    else STEP_BAND (the typical host's prediction, with every machine's host in its error)."""
    return STEP_BAND_HOST if hw is not None and hw.host_time else STEP_BAND


def band_group(
    cell: Any, ds_config: dict | None = None, files: dict[str, int] | None = None, hw: Hardware | None = None
) -> str:
    """'unfamiliar' when a trait of the cell was in fewer than FAMILIAR_FILES of the results files the
    constants were fitted on (`files`: trait -> files, TRAIT_FILES by default), else 'host-bound' or
    'gpu-bound' by its host share on `hw`."""
    files = TRAIT_FILES if files is None else files
    familiar = all(files.get(t, 0) >= FAMILIAR_FILES for t in traits(cell, ds_config))
    return group_of(familiar, host_share(cell, hw, ds_config=ds_config) if familiar else None)


def step_time_band(
    cell: Any, hw: Hardware | None = None, ds_config: dict | None = None
) -> tuple[float, float, float] | None:
    """(low, predicted, high) seconds per optimizer step; None for a model whose shape is unknown. The band
    is the calibrated percentiles of measured / predicted on held-out records of the cell's group
    (band_group), for a host whose time was measured or not (bands_for)."""
    pred = predict_step(cell, hw, ds_config=ds_config)
    if pred is None:
        return None
    b = bands_for(hw)[band_group(cell, ds_config, hw=hw)]
    return pred * math.exp(b["low"]), pred, pred * math.exp(b["high"])
