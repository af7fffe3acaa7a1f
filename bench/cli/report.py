"""`zerobench report`, `export` and `compare`: what results files say, as reports, as exports (W&B,
pytest-benchmark) and against a baseline."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..records.status import Status

if TYPE_CHECKING:
    from ..records.record import Record


def add_report_parser(sub) -> None:
    rp = sub.add_parser("report", help="write Markdown and HTML reports from results files")
    rp.add_argument("results", nargs="+", help="results .jsonl files (or folders of them)")
    rp.add_argument(
        "-o",
        "--output",
        help="output path without suffix: writes NAME.md (with NAME.*.png charts "
        "beside it) and NAME.html (default: reports/<first results name>)",
    )
    rp.add_argument("--format", action="append", choices=["md", "html"], help="default: both (repeatable)")
    rp.add_argument(
        "--baseline",
        action="append",
        metavar="RESULTS",
        help="results to compare with: tokens/s and peak memory deltas per matching cell (repeatable)",
    )
    rp.add_argument("--csv", metavar="PATH", help="also write the tidy table (one row per cell attempt) as CSV")
    rp.add_argument("--parquet", metavar="PATH", help="also write it as Parquet (needs pyarrow)")
    rp.set_defaults(func=cmd_report)


def add_export_parser(sub) -> None:
    ex = sub.add_parser(
        "export",
        help="log results to Weights & Biases (one run per cell: config, summary, loss and step-time history, "
        "grouped by matrix), or write them in pytest-benchmark's JSON format",
    )
    ex.add_argument("results", nargs="+", help="results .jsonl files")
    target = ex.add_mutually_exclusive_group(required=True)
    target.add_argument("--wandb", action="store_true", help="export to W&B")
    target.add_argument(
        "--pytest-benchmark",
        metavar="PATH",
        help="write pytest-benchmark's JSON (one benchmark per ok cell, rounds = measured step times) for "
        "`pytest-benchmark compare PATH ...`",
    )
    ex.add_argument("--project", default="zerobench", help="W&B project (default: zerobench)")
    ex.add_argument("--entity", help="W&B entity (team or user; default: yours)")
    ex.add_argument("--dir", metavar="DIR", help="where W&B writes its run folders (default: ./wandb)")
    ex.add_argument(
        "--mode",
        choices=["online", "offline"],
        help="default: WANDB_MODE, else online when WANDB_API_KEY is set, else offline (wandb sync DIR uploads later)",
    )
    ex.add_argument("--all-attempts", action="store_true", help="one run per attempt, not only each cell's last")
    ex.set_defaults(func=cmd_export)


def add_compare_parser(sub) -> None:
    cp = sub.add_parser(
        "compare",
        help="compare results against a baseline, cell by cell, with the noise in mind; exit 1 on a regression, "
        "3 when it compared too little (less than half the baseline's cells that ran: `min_compared`)",
    )
    cp.add_argument("baseline", help="baseline results .jsonl (or a folder of them)")
    cp.add_argument("current", help="current results .jsonl (or a folder of them)")
    cp.add_argument("--md", metavar="PATH", help="write the Markdown (fit for a pull-request comment) here")
    cp.add_argument(
        "--thresholds",
        metavar="FILE",
        help="YAML with the compare settings to use (a matrix file's compare: section, or just that mapping); "
        "default: the current results' matrix's compare: section, else the defaults",
    )
    cp.set_defaults(func=cmd_compare)


def cmd_report(args) -> int:
    from ..report import write_reports
    from ..report.export import parquet_error

    paths = [Path(p) for p in args.results]
    baseline = [Path(p) for p in args.baseline or []]
    missing = [str(p) for p in paths + baseline if not p.exists()]
    if missing:
        print(f"zerobench report: no such results file: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.parquet and parquet_error():  # before writing anything, so a failed call leaves no half output
        print(parquet_error(), file=sys.stderr)
        return 2
    out = Path(args.output or (Path("reports") / paths[0].stem))
    try:
        written = write_reports(paths, out, formats=args.format, baseline=baseline or None)
        if args.csv or args.parquet:
            from ..judge.results import load
            from ..report import export

            df = load(*paths)
            written += [export.to_csv(df, args.csv)] if args.csv else []
            written += [export.to_parquet(df, args.parquet)] if args.parquet else []
    except OSError as e:  # a full or read-only disk: say where, without a traceback
        print(f"zerobench report: cannot write {e.filename or out}: {e.strerror}", file=sys.stderr)
        return 1
    print("report: " + ", ".join(str(x) for x in written))
    return 0


def _latest_records(paths: list[str]) -> list[Record]:
    """The last attempt of each cell (per matrix), in first-seen order."""
    from ..records.store import read

    last: dict[tuple, Record] = {}
    for path in paths:
        for rec in read(path):
            if rec.status is not Status.STARTED:
                last[(rec.matrix, rec.cell_hash, rec.variant)] = rec
    return list(last.values())


def cmd_export(args) -> int:
    from ..records.store import read
    from ..report.tracking import TrackerError, to_wandb

    missing = [p for p in args.results if not Path(p).is_file()]
    if missing:
        print(f"zerobench export: no such results file: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.pytest_benchmark:
        from ..judge.results import load
        from ..report.export import to_pytest_benchmark

        df = load(*args.results)
        path, n, left = to_pytest_benchmark(df, args.pytest_benchmark)
        print(
            f"pytest-benchmark: {n} cells written to {path}" + (f" ({left} without an ok run left out)" if left else "")
        )
        _say_replayed(df["replay_source"].dropna() if "replay_source" in df else [])
        return 0
    records = (
        [r for p in args.results for r in read(p) if r.status is not Status.STARTED]
        if args.all_attempts
        else _latest_records(args.results)
    )
    try:
        folders = to_wandb(records, project=args.project, entity=args.entity, directory=args.dir, mode=args.mode)
    except TrackerError as e:
        print(f"zerobench export: {e}", file=sys.stderr)
        return 2
    where = f" under {args.dir}" if args.dir else ""
    print(f"W&B: {len(folders)} runs logged to project {args.project!r}{where}")
    _say_replayed([r.replay.source for r in records if r.replay])
    return 0


def _say_replayed(sources) -> None:
    """An export of replayed records says so: their measurements were recorded earlier, nothing ran anew."""
    sources = list(sources)
    if sources:
        print(
            f"  {len(sources)} replayed record(s) among them, marked as such (zerobench run --replay: nothing ran "
            "anew), from " + ", ".join(sorted(set(map(str, sources))))
        )


def _results_files(path: str) -> list[Path]:
    p = Path(path)
    return sorted(p.glob("*.jsonl")) if p.is_dir() else [p]


def cmd_compare(args) -> int:
    """Exit 0: no regression; 1: a regression; 2: bad input (no such file, no records, bad thresholds); 3: it
    compared too little (compare.Comparison.too_little)."""
    from ..judge import compare, comparetext
    from ..judge.results import load
    from ..records.store import read

    sides = {}
    for name, path in (("baseline", args.baseline), ("current", args.current)):
        files = _results_files(path)
        if not Path(path).exists() or not files:
            print(f"zerobench compare: no such results file or folder: {path}", file=sys.stderr)
            return 2
        try:
            df = load(*files)
        except Exception as e:  # noqa: BLE001 - an unreadable file is bad input, said as such
            print(f"zerobench compare: cannot read {path}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        if df.empty:
            print(f"zerobench compare: {path} holds no finished cell", file=sys.stderr)
            return 2
        sides[name] = df
    matrix_files = sorted({r.matrix_file for f in _results_files(args.current) for r in read(f) if r.matrix_file})
    settings, source = compare.settings(matrix_files, args.thresholds)
    cmp = compare.compare(
        sides["baseline"],
        sides["current"],
        settings=settings,
        settings_source=source,
        baseline=args.baseline,
        current=args.current,
    )
    text = comparetext.markdown(cmp)
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        from ..host.safefile import write_atomic

        with write_atomic(args.md) as f:  # a link at the path is replaced, not written through
            f.write(text)
        counts = ", ".join(f"{n} {v}" for v, n in cmp.counts().items())
        print(f"compare: {counts}; {cmp.coverage_line()}; Markdown: {args.md}")
        for line in cmp.replay_lines():
            print(f"  {line}")
        for c in cmp.regressions:
            print(f"  regression: {c.cell_name}: {'; '.join(c.reasons)}")
    else:
        sys.stdout.write(text)
    if cmp.too_little and not cmp.regressions:
        print(f"zerobench compare: {cmp.coverage_line()}", file=sys.stderr)
    return cmp.exit_code
