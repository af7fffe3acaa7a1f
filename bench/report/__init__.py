"""Reports are pure functions of results: the same results give the same files.

results (JSONL) -> results.load() -> analysis.analyse() -> charts.build() -> markdown (+ PNG charts) / html
                                      (effects: a knob's        (figures draws each chart as PNG or SVG)
                                       pairs -> ratio, interval)
"""

from __future__ import annotations

from pathlib import Path

from ..host.safefile import write_atomic

__all__ = ["write_reports"]


def _path(out: Path, suffix: str) -> Path:
    """`reports/smoke` -> `reports/smoke.md`; a trailing .md/.html the user typed is not doubled."""
    stem = out.with_suffix("") if out.suffix in (".md", ".html") else out
    return stem.with_name(stem.name + suffix)


def _write(path: Path, text: str) -> None:
    """Whole or not at all (a full disk must not leave an empty report where a good one was); written
    beside under a name nobody can plant a link at, then renamed over path (a link there is replaced)."""
    try:
        with write_atomic(path) as f:
            f.write(text)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from None


def write_reports(
    results: list[Path], out: Path, formats: list[str] | None = None, *, baseline: list[Path] | None = None
) -> list[Path]:
    """Write out.md (with its PNG charts beside it) and out.html from results files.

    baseline: results files to compare with, cell by cell (matched by cell hash). Returns the paths written.
    """
    from ..judge.results import load
    from . import charts as charts_
    from . import figures, html, markdown
    from .analysis import analyse

    formats = formats or ["md", "html"]
    out = Path(out)
    title = f"zerobench: {', '.join(Path(p).stem for p in results)}"
    a = analyse(load(*results), title=title, baseline=load(*baseline) if baseline else None)
    charts = charts_.build(a)
    # Both rendered before anything is written: a failure leaves no report half written.
    md, page = _path(out, ".md"), _path(out, ".html")
    pngs = {name: md.with_name(f"{md.stem}.{name}.png") for name in charts}
    # Relative to the .md, which sits in the same folder: the links survive moving the folder.
    md_text = markdown.render_analysis(a, {k: p.name for k, p in pngs.items()}) if "md" in formats else None
    page_text = html.render_analysis(a, charts) if "html" in formats else None
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    if md_text is not None:
        written += [figures.write_png(charts[name], path) for name, path in pngs.items()]
        _write(md, md_text)
        written.append(md)
    if page_text is not None:
        _write(page, page_text)
        written.append(page)
    return written
