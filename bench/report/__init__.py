"""Reports are pure functions of results: the same results give the same files."""
from __future__ import annotations

from pathlib import Path

__all__ = ["write_reports"]


def write_reports(results: list[Path], out: Path, formats: list[str] | None = None) -> list[Path]:
    """Write out.md (and out.html when available) from results files. Returns the paths written."""
    from ..results import load
    from . import markdown

    formats = formats or ["md", "html"]
    df = load(*results)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    title = f"zerobench: {', '.join(p.stem for p in results)}"
    if "md" in formats:
        p = out.with_suffix(".md")
        p.write_text(markdown.render(df, title=title))
        written.append(p)
    return written
