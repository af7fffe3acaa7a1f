"""Reports are pure functions of results: the same results give the same files.

    results (JSONL) -> results.load() -> analysis.analyse() -> markdown / html (+ png charts)
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["write_reports"]


def _path(out: Path, suffix: str) -> Path:
    """`reports/smoke` -> `reports/smoke.md`; a trailing .md/.html the user typed is not doubled."""
    stem = out.with_suffix("") if out.suffix in (".md", ".html") else out
    return stem.with_name(stem.name + suffix)


def write_reports(results: list[Path], out: Path, formats: list[str] | None = None, *,
                  baseline: list[Path] | None = None) -> list[Path]:
    """Write out.md (with its PNG charts beside it) and out.html from results files.

    baseline: results files to compare with, cell by cell (matched by cell hash). Returns the paths written.
    """
    from ..results import load
    from . import html, markdown, png
    from .analysis import analyse

    formats = formats or ["md", "html"]
    out = Path(out)
    title = f"zerobench: {', '.join(Path(p).stem for p in results)}"
    a = analyse(load(*results), title=title, baseline=load(*baseline) if baseline else None)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    if "md" in formats:
        md = _path(out, ".md")
        charts = png.write_charts(a, md.with_suffix(""))
        written += charts.values()
        # Relative to the .md, which sits in the same folder: the links survive moving the folder.
        md.write_text(markdown.render_analysis(a, {k: p.name for k, p in charts.items()}), encoding="utf-8",
                      newline="\n")
        written.append(md)
    if "html" in formats:
        page = _path(out, ".html")
        page.write_text(html.render_analysis(a), encoding="utf-8", newline="\n")
        written.append(page)
    return written
