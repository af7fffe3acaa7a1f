"""The tidy results table as CSV or Parquet, for spreadsheets and notebooks outside Python."""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["to_csv", "to_parquet", "parquet_error", "ExportError"]

# Per-step lists: kept as lists in Parquet, written as JSON arrays in CSV (one cell per list).
_LIST_COLUMNS = ("losses", "step_times_s")


class ExportError(RuntimeError):
    pass


def parquet_error() -> str | None:
    """Why Parquet cannot be written here, or None when it can."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return ("zerobench report: --parquet needs pyarrow, which is not installed "
                "(pip install pyarrow), or use --csv")
    return None


def to_csv(df, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = df.copy()
    for col in _LIST_COLUMNS:
        if col in out:
            out[col] = out[col].map(lambda v: json.dumps(v) if isinstance(v, list) else "")
    out.to_csv(path, index=False, lineterminator="\n")
    return path


def to_parquet(df, path: str | Path) -> Path:
    err = parquet_error()
    if err:
        raise ExportError(err)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path, index=False)
    return path
