"""Memory a cell needs, predicted before it runs (bench.estimate.model), from the cell and the hardware
alone; checked against the measured records (bench.estimate.check). The ZeRO paper's model-state
floor (bench.estimate.paper) stays beside it."""

from .fitted import FITTED, Constants
from .model import Estimate, Hardware, predict, zero_settings
from .paper import model_states, zero_ratio
from .shapes import Shape, shape_of, trainable_params
from .verdict import DEFAULT_MARGIN, Verdict, short_of, verdict

__all__ = [
    "Constants",
    "DEFAULT_MARGIN",
    "Estimate",
    "FITTED",
    "Hardware",
    "Shape",
    "Verdict",
    "model_states",
    "predict",
    "shape_of",
    "short_of",
    "trainable_params",
    "verdict",
    "zero_ratio",
    "zero_settings",
]
