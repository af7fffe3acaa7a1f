"""Matrix files: YAML -> a validated Matrix -> the list of Cells.

Every problem in a file is collected and reported together (file, line, key path, what is wrong,
how to fix it) before anything runs. pydantic does the type work in strict mode, so the string
"false" is not taken for a boolean and "2" is not taken for a ZeRO stage.

schema: the file's models (Matrix and its blocks); read: YAML -> Matrix (load, loads) and the problems of its
shape; checks: what a valid schema still cannot say; grid: a Matrix -> its cells (expand).
"""

from ..problems import Problem
from .checks import divisors
from .grid import expand
from .read import load, loads
from .schema import (
    PRESETS,
    Axes,
    Batch,
    CompareSettings,
    LoraSettings,
    Matrix,
    MatrixError,
    Pick,
    QloraSettings,
    SlurmSettings,
    Steps,
    duration_s,
)

__all__ = [
    "Matrix", "MatrixError", "Problem", "CompareSettings", "SlurmSettings", "duration_s", "load", "loads", "expand",
    "PRESETS", "Axes", "Batch", "LoraSettings", "Pick", "QloraSettings", "Steps", "divisors",
]  # fmt: skip
