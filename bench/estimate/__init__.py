"""Memory a cell needs, predicted before it runs (bench.estimate.model), from the cell and the hardware
alone; checked against the measured records (bench.estimate.check). Its time beside it: seconds per step and
per cell (bench.estimate.steptime), checked by bench.estimate.checks.timecheck, with its held-out error as a band
(bench.estimate.band). The ZeRO paper's model-state floor (bench.estimate.paper) stays beside it."""

from ..matrix.shapes import Shape, shape_of, trainable_params
from .band import bands_for, step_time_band
from .fitted import FITTED, Constants
from .model import Estimate, Hardware, predict, zero_settings
from .paper import model_states, zero_ratio
from .steptime import FITTED_TIME, TimeConstants, host_time_of, predict_setup, predict_start, predict_step, predict_wall
from .verdict import DEFAULT_MARGIN, Verdict, short_of, verdict

__all__ = [
    "Constants",
    "DEFAULT_MARGIN",
    "Estimate",
    "FITTED",
    "FITTED_TIME",
    "TimeConstants",
    "Hardware",
    "Shape",
    "Verdict",
    "bands_for",
    "host_time_of",
    "model_states",
    "predict",
    "predict_setup",
    "predict_start",
    "predict_step",
    "predict_wall",
    "shape_of",
    "short_of",
    "step_time_band",
    "trainable_params",
    "verdict",
    "zero_ratio",
    "zero_settings",
]
