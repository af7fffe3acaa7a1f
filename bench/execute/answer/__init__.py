"""Answer mode (`zerobench run M --answer`): measure only what settles the answer, then stop (see .search)."""

from .search import (  # noqa: F401
    EXTRA_ANCHORS,
    MAX_MEASUREMENTS,
    SHORT_LOOK,
    Candidate,
    Request,
    Search,
    Settings,
    Z,
    _distinct,
    _group,
    _k,
    _tps,
    agreement,
    rung_cell,
)

__all__ = ["Settings", "Candidate", "Request", "Search", "rung_cell", "agreement"]
