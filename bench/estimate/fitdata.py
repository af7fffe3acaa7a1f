"""The models' fitted constants as data: one JSON file beside this module (fit.json), a section per model
("memory", "step_time"), each with the values and the records they were fitted on. `zerobench estimate --check
--refit` writes it (write_section); the models read it (section). No fitted figure lives in Python source."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["FIT_FILE", "section", "write_section"]

FIT_FILE = "fit.json"


def _path() -> Path:
    return Path(str(resources.files(__package__).joinpath(FIT_FILE)))


def section(name: str) -> dict[str, Any]:
    """One model's fitted constants and their provenance; {} where the file has none yet."""
    data = json.loads(_path().read_text())
    return data.get(name, {})


def write_section(name: str, values: dict[str, Any]) -> Path:
    """Replace one model's section (the others kept), keys sorted so a refit's diff shows what moved."""
    path = _path()
    data = json.loads(path.read_text())
    data[name] = values
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path
