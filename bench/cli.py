"""`zerobench` (= `python -m bench`): run, cells, report."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .matrix import MatrixError

DEFAULT_MATRIX = Path(__file__).parent / "matrices" / "smoke.yaml"


def _matrix_arg(p):
    p.add_argument("matrix", nargs="?", default=None,
                   help=f"matrix YAML (default: the embedded CPU smoke matrix, {DEFAULT_MATRIX.name})")


def _resolve(m: str | None) -> str:
    return str(DEFAULT_MATRIX) if m is None else m


def _assumed_platform(n: int | None):
    """This machine's versions, but N CUDA GPUs and the gpu extra: to plan a GPU host from anywhere."""
    if not n:
        return None
    from . import env

    real = env.probe()
    versions = {**real.versions, **{d: real.versions.get(d) or "assumed" for d in ("bitsandbytes", "liger-kernel")}}
    if "+cpu" in (versions.get("torch") or ""):
        versions["torch"] = versions["torch"].replace("+cpu", "+assumed-cuda")
    gpus = tuple(env.Gpu(i, "assumed GPU", 0, f"assumed-{i}") for i in range(n))
    return env.Platform(gpus=gpus, driver="assumed", versions=versions, host_memory_bytes=real.host_memory_bytes,
                        cpu_count=real.cpu_count)


def cmd_cells(args) -> int:
    from collections import Counter

    from .run import plan

    assumed = getattr(args, "assume_gpus", None)
    p = plan(_resolve(args.matrix), args.filter, ds_configs=getattr(args, "ds_config", None),
             platform=_assumed_platform(assumed))
    n_skip = sum(1 for it in p.items if it.skip)
    where = f"on a host with {assumed} CUDA GPU(s)" if assumed else "here"
    print(f"{p.source}: {len(p.items)} cells, {len(p.items) - n_skip} runnable {where}, {n_skip} skipped")
    if n_skip:
        for rule, n in Counter(it.skip.rule for it in p.items if it.skip).most_common():
            print(f"  {n:6d} skipped by {rule}")
    for it in p.items:
        mark = "run " if it.skip is None else "skip"
        print(f"  {mark}  {it.cell.id}")
        if it.skip is not None:
            print(f"        why: {it.skip.reason}\n        fix: {it.skip.fix}\n        source: {it.skip.source}")
    return 0


def cmd_run(args) -> int:
    from . import report as _  # noqa: F401 - fail early if the report stack is broken
    from .run import run

    src = _resolve(args.matrix)
    if args.dry_run:
        return cmd_cells(args)
    try:
        p, results_path, written = run(src, results=args.results, filters=args.filter, resume=args.resume,
                                       progress=not args.no_progress, ds_configs=args.ds_config,
                                       logs_dir=args.logs)
    except KeyboardInterrupt:
        print("\nzerobench: interrupted; results so far are saved. Continue with --resume.", file=sys.stderr)
        return 130
    print(f"results: {results_path}")
    if not args.no_report:
        from .report import write_reports

        out = Path(args.report or (Path("reports") / results_path.stem))
        paths = write_reports([results_path], out)
        print("report: " + ", ".join(str(x) for x in paths))
    bad = [r for r in written if r["status"] not in ("ok", "skipped")]
    return 1 if (bad and args.strict) else 0


def cmd_report(args) -> int:
    from .report import write_reports
    from .report.export import parquet_error

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
    written = write_reports(paths, out, formats=args.format, baseline=baseline or None)
    if args.csv or args.parquet:
        from .report import export
        from .results import load

        df = load(*paths)
        written += [export.to_csv(df, args.csv)] if args.csv else []
        written += [export.to_parquet(df, args.parquet)] if args.parquet else []
    print("report: " + ", ".join(str(x) for x in written))
    return 0


def cmd_selfcheck(args) -> int:
    from .selfcheck import selfcheck

    path, _ = selfcheck(_resolve(args.matrix), filters=args.filter, results=args.results)
    print(f"results: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="zerobench", description="Benchmark and ablate DeepSpeed/PEFT training setups.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run a matrix: every valid cell in its own process; results appended")
    _matrix_arg(r)
    r.add_argument("--dry-run", action="store_true", help="validate and list the cells, run nothing")
    r.add_argument("--filter", action="append", metavar="REGEX",
                   help="only cells whose id matches (repeatable: all must match), e.g. --filter zero=3")
    r.add_argument("--resume", action="store_true", help="skip cells that already have a result in the results file")
    r.add_argument("--results", metavar="PATH", help="results file (default: results/<matrix name>.jsonl)")
    r.add_argument("--logs", metavar="DIR", help="worker logs (default: results/logs/<results name>/)")
    r.add_argument("--report", metavar="PATH", help="report path without suffix (default: reports/<results name>)")
    r.add_argument("--no-report", action="store_true", help="do not write the reports at the end")
    r.add_argument("--no-progress", action="store_true", help="no progress bar (one line per cell still printed)")
    r.add_argument("--strict", action="store_true", help="exit 1 if any cell failed (for CI jobs)")
    r.add_argument("--ds-config", nargs="+", metavar="JSON",
                   help="run these DeepSpeed config files as cells (checked first: misplaced keys are errors)")
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("cells", help="list a matrix's cells, with the reason each skipped one is skipped")
    _matrix_arg(c)
    c.add_argument("--filter", action="append", metavar="REGEX")
    c.add_argument("--ds-config", nargs="+", metavar="JSON", help="list these DeepSpeed config files as cells")
    c.add_argument("--assume-gpus", type=int, metavar="N",
                   help="judge the rules as on a CUDA host with N GPUs and the gpu extra, e.g. to plan a GPU run")
    c.set_defaults(func=cmd_cells)

    sc = sub.add_parser("selfcheck", help="run cells beside a hand-written DeepSpeed loop and without telemetry, "
                                          "to check the harness's own accuracy and cost")
    _matrix_arg(sc)
    sc.add_argument("--filter", action="append", metavar="REGEX")
    sc.add_argument("--results", metavar="PATH", help="default: results/selfcheck-<matrix name>.jsonl")
    sc.set_defaults(func=cmd_selfcheck)

    rp = sub.add_parser("report", help="write Markdown and HTML reports from results files")
    rp.add_argument("results", nargs="+", help="results .jsonl files (or folders of them)")
    rp.add_argument("-o", "--output", help="output path without suffix: writes NAME.md (with NAME.*.png charts "
                    "beside it) and NAME.html (default: reports/<first results name>)")
    rp.add_argument("--format", action="append", choices=["md", "html"], help="default: both (repeatable)")
    rp.add_argument("--baseline", action="append", metavar="RESULTS",
                    help="results to compare with: tokens/s and peak memory deltas per matching cell (repeatable)")
    rp.add_argument("--csv", metavar="PATH", help="also write the tidy table (one row per cell attempt) as CSV")
    rp.add_argument("--parquet", metavar="PATH", help="also write it as Parquet (needs pyarrow)")
    rp.set_defaults(func=cmd_report)

    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except MatrixError as e:
        print(e, file=sys.stderr)
        return 2
    except BrokenPipeError:  # `zerobench cells ... | head`
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
