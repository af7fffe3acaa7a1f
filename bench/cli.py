"""`zerobench` (= `python -m bench`): run, cells, report, compare, export, selfcheck, schema."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .matrix.problems import ConfigError, InputError

DEFAULT_MATRIX = Path(__file__).parent / "matrices" / "smoke.yaml"
LOCAL = "local"
"""The embedded default's own folder under results/ and reports/ (git-ignored in this repository): what it writes
is the user's, not the repository's committed results, so the repository's checks never read it."""


def _matrix_arg(p):
    p.add_argument(
        "matrix",
        nargs="?",
        default=None,
        help=f"matrix YAML (default: the embedded CPU smoke matrix, {DEFAULT_MATRIX.name})",
    )


def _executors() -> list[str]:
    from .execute.registry import EXECUTORS

    return sorted(EXECUTORS)


def _filter_arg(p):
    p.add_argument(
        "--filter",
        action="append",
        metavar="REGEX",
        help="only cells whose name or id (name#hash) matches (repeatable: all must match), e.g. --filter zero=3; "
        "'mb=8$' ends the name, '#HASH$' the id",
    )


def _assume_gpus_arg(p):
    p.add_argument(
        "--assume-gpus",
        type=_positive,
        metavar="N",
        help="judge the rules as on a CUDA host with N GPUs and the gpu extra, e.g. to plan a GPU run from a laptop",
    )


def _shard(v: str):
    from .execute import Shard

    try:
        return Shard.parse(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive(v: str) -> int:
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return n


def _resolve(m: str | None) -> str:
    return str(DEFAULT_MATRIX) if m is None else m


def _assumed_platform(n: int | None, host_mem: int | None = None):
    """This machine's versions, but N CUDA GPUs and the gpu extra: to plan a GPU host from anywhere. Its host
    memory is host_mem (--host-mem), not this machine's: unknown (nothing pruned for it) when not given."""
    if not n:
        return None
    from .host import env

    real = env.probe()
    versions = {**real.versions, **{d: real.versions.get(d) or "assumed" for d in ("bitsandbytes", "liger-kernel")}}
    if "+cpu" in (versions.get("torch") or ""):
        versions["torch"] = versions["torch"].replace("+cpu", "+assumed-cuda")
    gpus = tuple(env.Gpu(i, "assumed GPU", 0, f"assumed-{i}") for i in range(n))
    return env.Platform(
        gpus=gpus,
        driver="assumed",
        versions=versions,
        host_memory_bytes=host_mem or 0,
        cpu_count=real.cpu_count,
    )


def cmd_cells(args, platform=None, where: str | None = None) -> int:
    """platform, where: judge the cells as on this platform, described so (a Slurm run's partition). Each rule's
    reason once, then one line per cell."""
    p = _plan_of(args, platform)
    print("\n".join(_skip_summary(p, args, where, reasons=True)))
    for it in p.items:
        print(f"  run   {it.cell.id}" if it.skip is None else f"  skip  {it.cell.id}  ({it.skip.rule})")
    return 0


def _plan_of(args, platform=None):
    from .execute import plan

    return plan(
        _resolve(args.matrix),
        args.filter,
        ds_configs=getattr(args, "ds_config", None),
        platform=platform or _assumed_platform(getattr(args, "assume_gpus", None)),
    )


def _skip_summary(p, args, where: str | None, reasons: bool) -> list[str]:
    """How many cells, how many runnable, and how many each rule skips; reasons: each rule's why, fix and
    source once (the first cell it skips says them)."""
    from collections import Counter

    assumed = getattr(args, "assume_gpus", None)
    skips = [it.skip for it in p.items if it.skip]
    where = where or (f"on a host with {assumed} CUDA GPU(s)" if assumed else "here")
    lines = [f"{p.source}: {len(p.items)} cells, {len(p.items) - len(skips)} runnable {where}, {len(skips)} skipped"]
    said: dict[str, dict[str, object]] = {}  # rule -> its reasons as worded for each cell (a rule may name a setting)
    for s in skips:
        said.setdefault(s.rule, {}).setdefault(s.reason, s)
    for rule, n in Counter(s.rule for s in skips).most_common():
        lines.append(f"  {n:6d} skipped by {rule}")
        if reasons:
            s, k = next(iter(said[rule].values())), len(said[rule])
            more = f"  [one of its {k} wordings, by the cell's settings]" if k > 1 else ""
            lines += [f"           why: {s.reason}{more}", f"           fix: {s.fix}", f"           source: {s.source}"]
    return lines


def _duration(text: str) -> float:
    """Seconds from "90", "90s", "20m", "1h", "1h30m"."""
    from .matrix.spec import duration_s

    try:
        return duration_s(text)
    except ValueError as e:
        raise ValueError(f"--budget {e}") from None


def _answer_settings(args):
    """--answer and its options as bench.execute.answer.Settings; None without --answer."""
    options = (("--budget", args.budget), ("--group-by", args.group_by), ("--pairs", args.pairs))
    given = [f for f, v in (*options, ("--settle", args.settle)) if v]
    if not args.answer:
        if given:
            raise ValueError(f"{', '.join(given)} only with --answer")
        return None
    if args.repeats:
        raise ValueError("--repeats with --answer: answer mode measures a cell again only while it is in contention")
    from .execute.answer import Settings
    from .matrix.axes import AXIS

    group_by = tuple(g.strip() for g in (args.group_by or "peft").split(",") if g.strip())
    unknown = [g for g in group_by if g not in AXIS]
    if unknown:
        raise ValueError(f"--group-by {','.join(unknown)}: not an axis; one of {', '.join(AXIS)}")
    return Settings(
        group_by=group_by,
        budget_s=_duration(args.budget) if args.budget else None,
        pairs=args.pairs or Settings.pairs,
        settle=_level(args.settle) if args.settle else Settings.settle,
    )


def _level(text: str) -> float:
    """A chance from "5%" or "0.05", strictly between 0 and 1."""
    try:
        v = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        v = -1.0
    if not 0 < v < 1:
        raise ValueError(f"--settle {text}: a chance between 0 and 1, such as 5% or 0.05")
    return v


# zerobench run's Slurm options: the matrix's slurm block keys they override (bench.matrix.spec.SlurmSettings).
_SLURM_OPTIONS = {
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "time_limit": "--time-limit",
    "mem_per_node": "--mem-per-node",
    "max_jobs": "--max-jobs",
    "folder": "--slurm-folder",
}


def _slurm_options(args) -> dict | None:
    """The Slurm options given, checked as the matrix's slurm block checks them; ValueError naming the option."""
    given = {k: getattr(args, "slurm_folder" if k == "folder" else k) for k in _SLURM_OPTIONS}
    given = {k: v for k, v in given.items() if v is not None}
    if args.executor != "slurm":
        if given:
            raise ValueError(f"{', '.join(_SLURM_OPTIONS[k] for k in given)} only with --executor slurm")
        return None
    if args.assume_gpus:
        raise ValueError("--assume-gpus with --executor slurm: the partition's nodes say what a cell has (sinfo)")
    from pydantic import ValidationError

    from .matrix.spec import SlurmSettings

    try:
        SlurmSettings.model_validate(given)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"{_SLURM_OPTIONS[str(err['loc'][0])]} {err['msg'].removeprefix('Value error, ')}") from None
    return given


def _slurm_platform(args, options: dict):
    """A Slurm dry run: the partition's platform (the matrix's slurm block under the command line's options)."""
    from .execute import slurm
    from .matrix.spec import load

    block = load(_resolve(args.matrix), ds_configs=args.ds_config).slurm.model_copy(update=options)
    part = slurm.partition(block.partition)
    return slurm.platform_of(part), f"on Slurm partition {part.name}'s nodes"


def _embedded_default_paths(args) -> None:
    """No matrix given: the embedded default's results and report go to results/local/ and reports/local/."""
    if args.matrix is not None:
        return
    from .execute import default_results_path
    from .matrix.spec import load

    path = default_results_path(load(str(DEFAULT_MATRIX)).name, args.shard)
    args.results = args.results or str(path.parent / LOCAL / path.name)
    args.report = args.report or str(Path("reports") / LOCAL / path.stem)


def cmd_run(args) -> int:
    from . import report as _  # noqa: F401 - fail early if the report stack is broken
    from .execute import Stopped, run, stop_on_signals

    _embedded_default_paths(args)
    src = _resolve(args.matrix)
    try:
        slurm_options = _slurm_options(args)
    except ValueError as e:
        print(f"zerobench run: {e}", file=sys.stderr)
        return 2
    from .estimate.table import parse_size

    try:
        gpu_mem = parse_size(args.gpu_mem) if args.gpu_mem else None
        host_mem = parse_size(args.host_mem) if args.host_mem else None
    except ValueError as e:
        print(f"zerobench run: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        return _dry_run(args, src, slurm_options, gpu_mem, host_mem)
    if args.assume_gpus:
        print("zerobench run: --assume-gpus plans a run (with --dry-run); a real run uses this host's GPUs",
              file=sys.stderr)  # fmt: skip
        return 2
    on_record = None
    if args.wandb:
        import importlib.util

        from .report.tracking import to_wandb

        if importlib.util.find_spec("wandb") is None:  # before any cell runs: an input error
            print("zerobench run: --wandb needs wandb: pip install 'zerobench[wandb]'", file=sys.stderr)
            return 2

        def on_record(rec):
            to_wandb([rec], project=args.wandb_project, directory=args.wandb_dir)

    from .execute import HarnessError
    from .records.store import StoreWriteError

    try:
        answer = _answer_settings(args)
    except ValueError as e:
        print(f"zerobench run: {e}", file=sys.stderr)
        return 2
    stopped = None
    # SIGTERM (kill, a job scheduler) ends a run as Ctrl-C does: the running cell recorded as
    # interrupted, the report of what finished written, exit code 128 + the signal's number.
    with stop_on_signals():
        try:
            p, results_path, written = run(
                src,
                prune=not args.no_prune,
                gpu_mem=gpu_mem,
                host_mem=host_mem,
                results=args.results,
                filters=args.filter,
                resume=args.resume,
                progress=not args.no_progress,
                ds_configs=args.ds_config,
                logs_dir=args.logs,
                on_record=on_record,
                repeats=args.repeats,
                order=args.order,
                gpus_available=args.gpus_available,
                pack=args.pack,
                executor=args.executor,
                answer=answer,
                replay=args.replay,
                address=args.address,
                shard=args.shard,
                slurm=slurm_options,
            )
        except Stopped as e:
            print(
                f"\nzerobench: stopped by {e.signame}; results so far are saved. Continue with --resume.",
                file=sys.stderr,
            )
            if e.results_path is not None and e.results_path.exists() and not args.no_report:
                _write_run_report(args, e.results_path)
            return e.exit_code
        except HarnessError as e:  # run() said why it stopped and what --resume does
            stopped, results_path, written = e, Path(e.results_path or args.results or "results"), []
        except StoreWriteError as e:  # run() said what was written and what was lost, once cells began
            if not getattr(e, "reported", False):
                print(f"zerobench run: stopped before any cell: {e.strerror}", file=sys.stderr)
            stopped, results_path, written = e, Path(e.filename), []
        print(f"results: {results_path}" + (" (incomplete: the run stopped, see above)" if stopped else ""), flush=True)
        if not args.no_report and results_path.is_file():
            try:
                if not _write_run_report(args, results_path):
                    return 1
            except Stopped as e:
                print(
                    f"\nzerobench: stopped by {e.signame} while writing the report; every record is saved "
                    f"(`zerobench report {results_path}` writes the report).",
                    file=sys.stderr,
                )
                return e.exit_code
    if stopped:
        return 1
    bad = [r for r in written if r["status"] not in ("ok", "skipped")]
    return 1 if (bad and args.strict) else 0


def _dry_run(args, src: str, slurm_options: dict | None, gpu_mem: int | None, host_mem: int | None) -> int:
    """What the run would do, its summary last: the cells and each rule's count (its reason and every cell in run
    order with --verbose), then what would run, its predicted GPU time and frontier."""
    from .execute import preview

    platform, where = _slurm_platform(args, slurm_options) if slurm_options is not None else (None, None)
    platform = platform or _assumed_platform(args.assume_gpus, host_mem)
    if args.executor == "ray":
        from .execute.plan import host_platform, placed_by

        platform = placed_by(platform or host_platform(args.gpus_available), "ray")
    print("\n".join(_skip_summary(_plan_of(args, platform), args, where, reasons=args.verbose)))
    print("\n".join(preview(src, filters=args.filter, ds_configs=args.ds_config, gpu_mem=gpu_mem, host_mem=host_mem,
                             prune=not args.no_prune, order=args.order, gpus_available=args.gpus_available,
                             platform=platform, shard=args.shard, verbose=args.verbose,
                             recorded=_recorded(args, src) if args.resume else frozenset())))  # fmt: skip
    if args.answer:
        from .execute.plan import host_platform
        from .execute.run import answer_preview

        try:
            settings = _answer_settings(args)
            lines = answer_preview(src, settings, platform or host_platform(args.gpus_available), args.filter,
                                   gpu_mem, host_mem)  # fmt: skip
        except (ValueError, InputError) as e:
            print(f"zerobench run: {e}", file=sys.stderr)
            return 2
        print("\n".join(lines))
    return 0


def _recorded(args, src: str) -> frozenset[str]:
    """Hashes of the cells the results file already has an outcome for (their first repeat): what --resume
    leaves as it is."""
    from .execute import default_results_path
    from .matrix import spec
    from .records.store import Store

    path = Path(args.results or default_results_path(spec.load(src, args.ds_config).name, args.shard))
    if not path.is_file():
        return frozenset()
    done, _ = Store(path).resume_state()
    return frozenset(h for h, repeat in done if repeat == 1)


def _write_run_report(args, results_path: Path) -> bool:
    """The run's report; False (said why) when it could not be written: the results are saved regardless."""
    from .report import write_reports

    out = Path(args.report or (Path("reports") / results_path.stem))
    try:
        paths = write_reports([results_path], out)
    except OSError as e:
        print(
            f"zerobench: the report was not written ({e.filename or out}: {e.strerror}); "
            f"the results are saved: `zerobench report {results_path} -o PATH` writes it elsewhere",
            file=sys.stderr,
        )
        return False
    print("report: " + ", ".join(str(x) for x in paths), flush=True)
    return True


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
    try:
        written = write_reports(paths, out, formats=args.format, baseline=baseline or None)
        if args.csv or args.parquet:
            from .judge.results import load
            from .report import export

            df = load(*paths)
            written += [export.to_csv(df, args.csv)] if args.csv else []
            written += [export.to_parquet(df, args.parquet)] if args.parquet else []
    except OSError as e:  # a full or read-only disk: say where, without a traceback
        print(f"zerobench report: cannot write {e.filename or out}: {e.strerror}", file=sys.stderr)
        return 1
    print("report: " + ", ".join(str(x) for x in written))
    return 0


def _latest_records(paths: list[str]) -> list[dict]:
    """The last attempt of each cell (per matrix), in first-seen order."""
    from .records.store import read

    last: dict[tuple, dict] = {}
    for path in paths:
        for rec in read(path):
            if rec.get("status") != "started":
                last[(rec.get("matrix"), rec.get("cell_hash"), rec.get("variant"))] = rec
    return list(last.values())


def cmd_export(args) -> int:
    from .records.store import read
    from .report.tracking import TrackerError, to_wandb

    missing = [p for p in args.results if not Path(p).is_file()]
    if missing:
        print(f"zerobench export: no such results file: {', '.join(missing)}", file=sys.stderr)
        return 2
    if args.pytest_benchmark:
        from .judge.results import load
        from .report.export import to_pytest_benchmark

        df = load(*args.results)
        path, n, left = to_pytest_benchmark(df, args.pytest_benchmark)
        print(
            f"pytest-benchmark: {n} cells written to {path}" + (f" ({left} without an ok run left out)" if left else "")
        )
        _say_replayed(df["replay_source"].dropna() if "replay_source" in df else [])
        return 0
    records = (
        [r for p in args.results for r in read(p) if r.get("status") != "started"]
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
    _say_replayed([r["replay"]["source"] for r in records if r.get("replay")])
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
    from .judge import compare
    from .judge.results import load
    from .records.store import read

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
    matrix_files = sorted(
        {r["matrix_file"] for f in _results_files(args.current) for r in read(f) if r.get("matrix_file")}
    )
    settings, source = compare.settings(matrix_files, args.thresholds)
    cmp = compare.compare(
        sides["baseline"],
        sides["current"],
        settings=settings,
        settings_source=source,
        baseline=args.baseline,
        current=args.current,
    )
    text = compare.markdown(cmp)
    if args.md:
        Path(args.md).parent.mkdir(parents=True, exist_ok=True)
        from .host.safefile import write_atomic

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


def cmd_selfcheck(args) -> int:
    from .execute.selfcheck import selfcheck
    from .records.store import StoreWriteError

    try:
        path, _ = selfcheck(_resolve(args.matrix), filters=args.filter, results=args.results)
    except StoreWriteError as e:  # the records before it are whole on disk
        print(f"zerobench selfcheck: stopped: {e.strerror}", file=sys.stderr)
        return 1
    print(f"results: {path}")
    return 0


def cmd_estimate(args) -> int:
    from .estimate import Hardware
    from .estimate.table import parse_size

    try:
        gpu_mem = parse_size(args.gpu_mem) if args.gpu_mem else None
        host_mem = parse_size(args.host_mem) if args.host_mem else None
    except ValueError as e:
        print(f"zerobench estimate: {e}", file=sys.stderr)
        return 2
    if args.check:
        return _estimate_check(args)
    from .estimate.table import as_json, estimate_cells, text
    from .execute.plan import select
    from .host import env
    from .matrix import spec

    if gpu_mem is None or host_mem is None:
        here = env.probe()  # this machine's GPU and host memory, unless given
        gpu_mem = gpu_mem or (here.gpus[0].memory_bytes if here.gpus else None)
        host_mem = host_mem or here.host_memory_bytes or None
    m = spec.load(_resolve(args.matrix), ds_configs=args.ds_config)
    cells = select(spec.expand(m), args.filter)
    hw = Hardware(gpu_memory_bytes=gpu_mem, host_memory_bytes=host_mem)
    rows = estimate_cells(cells, hw, gpus=args.gpus)
    print(as_json(rows, hw, args.margin) if args.json else text(rows, hw, args.margin))
    if not args.json:
        _print_run_time(args, cells, rows, hw)
    return 0


def _print_run_time(args, cells, rows, hw) -> None:
    """The predicted GPU time of the cells a run would run (not skipped by a rule, not pruned by the memory
    model), on one GPU and on this host's GPUs side by side, and their predicted memory/speed frontier."""
    from .estimate import Verdict, verdict
    from .estimate.frontier import frontier_lines
    from .estimate.steptime import run_time_line
    from .execute.plan import host_platform, plan

    platform = host_platform(None)
    runnable = {
        it.cell.hash: it.ds_config for it in plan(_resolve(args.matrix), args.filter, platform, args.ds_config).runnable
    }
    kept = [
        (c, est)
        for orig, (c, est, _) in zip(cells, rows)
        if orig.hash in runnable
        and (est is None or verdict(est.gpu_bytes, hw.gpu_memory_bytes, args.margin) != Verdict.PRUNE)
    ]
    print(run_time_line([c for c, _ in kept], hw, max(len(platform.gpus), 1)))
    for line in frontier_lines([(c, runnable.get(c.hash), est and est.gpu_bytes) for c, est in kept], hw):
        print(line)


def _estimate_check(args) -> int:
    import dataclasses

    from .estimate import check

    missing = [p for p in (*args.check, *(args.held_out or ())) if not Path(p).exists()]
    if missing:
        print(f"zerobench estimate: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    # A folder stands for its *.jsonl files.
    files = [str(f) for p in args.check for f in (sorted(Path(p).glob("*.jsonl")) if Path(p).is_dir() else [p])]
    every = check.cases(files, gpu=args.gpu_name, unfitted=True)
    cs = [c for c in every if check.fitted_on(c.run)]
    if not every:
        print(f"zerobench estimate: no ok or out-of-memory {args.gpu_name} records in these files", file=sys.stderr)
        return 2
    if args.refit:  # on every record given: a refit takes in what the constants were not fitted on
        k = check.fit(every)
        print("# bench/estimate/fitted.py")
        for f in dataclasses.fields(k):
            v = getattr(k, f.name)
            print(f"{f.name} = {v / 2**30:.3f} GiB" if v > 1e6 else f"{f.name} = {v:.3f}")
        print(check.runs_literal(every), end="")
        from .estimate import timecheck

        tc = timecheck.time_cases(files, gpu=args.gpu_name)
        if tc:  # the step-time model's literals, as bench/estimate/steptime.py holds them
            print("# bench/estimate/steptime.py")
            print(timecheck.literals(tc), end="")
        return 0
    rows = check.evaluate(cs, margin=args.margin)
    cv = check.cross_validate(cs, margin=args.margin)
    if rows:
        print(check.text_table(check.table(rows, cv)))
        print()
        print(check.text_table(check.category_table(rows, cv)))
        print()
        print(check.summary_line(check.summarize(rows), "in-sample"))
        print(check.summary_line(check.summarize(cv), "held out (leave one results file out)"))
    unfit_rows = check.evaluate([c for c in every if not check.fitted_on(c.run)], margin=args.margin)
    if unfit_rows:
        print(check.unfitted_line(unfit_rows))
    if len({c.file for c in every}) == 1:
        print(ONE_FILE.format(file=every[0].file))
    from .estimate import timecheck

    steps: dict[str, list[float]] = {}
    for t in timecheck.time_cases(files, gpu=args.gpu_name) if args.held_out else ():
        steps.setdefault(t.cell.hash, []).append(t.step_s)
    held = [(p, check.held_out(p, every, steps)) for p in args.held_out or ()]
    if held:
        print()
        print(check.text_table(check.held_out_table([h for _, h in held])))
    _time_check(files, args.gpu_name)
    if args.markdown:
        from .estimate.fitted import FITTED

        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        text = check.markdown(args.check, files, rows, cv, FITTED, args.margin, held, unfit_rows)
        Path(args.markdown).write_text(text)
        print(f"report: {args.markdown}")
    return 0


ONE_FILE = (
    "note: these records are all from {file}: leaving it out leaves nothing to fit on, so neither model has "
    "leave-one-file-out figures here; give records of two or more results files to cross-validate"
)


def _time_check(files: list[str], gpu: str) -> None:
    """The step-time model's check beside the memory model's (ok records on one or two GPUs)."""
    from .estimate import timecheck

    check = timecheck.time_check(files, gpu=gpu)
    if check.held_out or check.rows:
        print(timecheck.time_text(check))


def cmd_schema(args) -> int:
    import json

    from .records.record import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        print(f"schema: {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    from . import __version__
    from .execute import schedule

    ap = argparse.ArgumentParser(prog="zerobench", description="Benchmark and ablate DeepSpeed/PEFT training setups.")
    ap.add_argument("--version", action="version", version=f"zerobench {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="run a matrix: every valid cell in its own process; results appended")
    _matrix_arg(r)
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="run nothing: validate the matrix and say what a run would do, ending with what would run, its "
        "predicted GPU time and frontier",
    )
    r.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="with --dry-run: each rule's reason, fix and source, and every cell in run order, one line each",
    )
    _filter_arg(r)
    _assume_gpus_arg(r)
    r.add_argument(
        "--resume",
        action="store_true",
        help="skip cells (each repeat of a cell) that already have a result in the results file",
    )
    r.add_argument(
        "--repeats",
        type=_positive,
        metavar="N",
        help="run every cell N times, interleaved, each its own record (default: the matrix's repeats, else 1)",
    )
    r.add_argument(
        "--order",
        choices=schedule.ORDERS,
        default="early",
        help="early (default): cells recorded without running first, then a prior for the speed/memory frontier "
        "(no offload, no checkpointing, less predicted memory first), lighter before heavier where a cell may run "
        "out of memory, so one out-of-memory end implies the heavier cells; matrix: the order the matrix expands in",
    )
    r.add_argument(
        "--gpus-available",
        type=_positive,
        metavar="N",
        help="use this host's first N GPUs (default: all NVML shows, within CUDA_VISIBLE_DEVICES); on a CPU host, "
        "N slots that run N cells side by side (default 1)",
    )
    r.add_argument(
        "--pack",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run cells side by side, each on its own GPUs, at most one cell per GPU; each record names its GPUs, "
        "port and the cells beside it (default: pack when more than one GPU is available)",
    )
    r.add_argument(
        "--executor",
        choices=_executors(),
        default="local",
        help="what runs the cells: local (this host, cells packed on its GPUs), ray (a Ray cluster, one task per "
        "cell attempt: pip install 'zerobench[ray]'; docs/executors.md) or slurm (one Slurm job per cell attempt "
        "through submitit: docs/slurm.md); this process writes every record whichever runs them, so --resume works "
        "across executors (default: local)",
    )
    r.add_argument(
        "--address",
        metavar="ADDR",
        help="with --executor ray: the cluster's head, host:port (or auto: one started on this host with `ray "
        "start`); default: RAY_ADDRESS, else a new local Ray instance for this run",
    )
    r.add_argument(
        "--shard",
        type=_shard,
        metavar="I/N",
        help="run only part I of N of the matrix's cells (split by cell hash, so the same whatever the matrix's "
        "order), into its own results file (default: results/<matrix name>.shard-I-of-N.jsonl): one CI job per "
        "part; `zerobench report` and --resume take the parts' files together",
    )
    sl = r.add_argument_group("with --executor slurm (each overrides the matrix's slurm: block; docs/slurm.md)")
    sl.add_argument("--partition", metavar="P", help="the partition (default: the cluster's default)")
    sl.add_argument("--account", metavar="A", help="the account charged (sbatch --account)")
    sl.add_argument("--qos", metavar="Q", help="the quality of service (sbatch --qos)")
    sl.add_argument(
        "--time-limit",
        metavar="TIME",
        help="each job's time limit, e.g. 30m, 2h (default: the cell's timeout_s plus 10 minutes); a cell near it is "
        "stopped and recorded as timeout",
    )
    sl.add_argument("--mem-per-node", metavar="SIZE", help="host memory per node, e.g. 256G (sbatch --mem)")
    sl.add_argument(
        "--max-jobs",
        type=_positive,
        metavar="N",
        help="jobs in Slurm at once, pending or running (default: the partition's GPUs, or its nodes without GPUs)",
    )
    sl.add_argument(
        "--slurm-folder",
        metavar="DIR",
        help="a folder every node shares: a fresh folder of job files per run (default: the logs folder's slurm/)",
    )
    r.add_argument(
        "--answer",
        action="store_true",
        help="measure only what settles the answer: the fastest cell that fits per group, the memory/speed frontier "
        "and each knob's effect with a 95%% interval; every other cell is recorded as unmeasured, saying why",
    )
    r.add_argument(
        "--replay",
        nargs="+",
        metavar="RESULTS",
        help="run nothing: serve these results files' recorded ends as if the cells ran (to check --answer against "
        "a grid measured in full); judged as on the recorded machine; written to results/<matrix name>.replay.jsonl "
        "unless --results says where (never into a replayed file); every record and report says it is a replay",
    )
    r.add_argument("--budget", metavar="TIME", help="with --answer: cell time to spend at most, e.g. 20m, 1h, 90s")
    r.add_argument("--group-by", metavar="AXES", help="with --answer: comma-separated axes to group by (default peft)")
    r.add_argument(
        "--settle",
        metavar="P",
        help="with --answer: stop once the chance that some unmeasured cell beats its group's fastest by more than the "
        "minimum effect, and that one adds a frontier point, are each below P (default 5%%)",
    )
    r.add_argument(
        "--pairs", type=_positive, metavar="N", help="with --answer: measured pairs per knob value (default 1)"
    )
    r.add_argument(
        "--results",
        metavar="PATH",
        help=f"results file (default: results/<matrix name>.jsonl; the embedded default's: "
        f"results/{LOCAL}/smoke.jsonl)",
    )
    r.add_argument("--logs", metavar="DIR", help="worker logs (default: logs/<results name>/ beside the results file)")
    r.add_argument(
        "--report",
        metavar="PATH",
        help=f"report path without suffix (default: reports/<results name>; the embedded default's: "
        f"reports/{LOCAL}/smoke)",
    )
    r.add_argument("--no-report", action="store_true", help="do not write the reports at the end")
    r.add_argument("--no-progress", action="store_true", help="no progress bar (one line per cell still printed)")
    r.add_argument("--strict", action="store_true", help="exit 1 if any cell failed (for CI jobs)")
    r.add_argument(
        "--no-prune",
        action="store_true",
        help="run cells the memory model predicts not to fit (default: recorded as skipped, with the prediction), "
        "and the cells a lighter cell's out-of-memory end implies (default: recorded as implied_oom, naming it)",
    )
    r.add_argument(
        "--gpu-mem",
        metavar="SIZE",
        help="judge cells against this much GPU memory, e.g. 80GiB (default: NVML's total of the first GPU; "
        "with neither, nothing is pruned)",
    )
    r.add_argument(
        "--host-mem",
        metavar="SIZE",
        help="judge cells against this much host memory, e.g. 512GiB (default: this host's; with --assume-gpus, "
        "none: host memory is not judged)",
    )
    r.add_argument(
        "--ds-config",
        nargs="+",
        metavar="JSON",
        help="run these DeepSpeed config files as cells (checked first: misplaced keys are errors)",
    )
    r.add_argument(
        "--wandb", action="store_true", help="log each cell to Weights & Biases as it ends (as export --wandb)"
    )
    r.add_argument(
        "--wandb-project", default="zerobench", metavar="P", help="W&B project for --wandb (default zerobench)"
    )
    r.add_argument("--wandb-dir", metavar="DIR", help="where W&B writes its run folders for --wandb (default ./wandb)")
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("cells", help="list a matrix's cells, with the reason each skipped one is skipped")
    _matrix_arg(c)
    _filter_arg(c)
    c.add_argument("--ds-config", nargs="+", metavar="JSON", help="list these DeepSpeed config files as cells")
    _assume_gpus_arg(c)
    c.set_defaults(func=cmd_cells)

    sc = sub.add_parser(
        "selfcheck",
        help="run cells beside a hand-written DeepSpeed loop and without telemetry, "
        "to check the harness's own accuracy and cost",
    )
    _matrix_arg(sc)
    _filter_arg(sc)
    sc.add_argument("--results", metavar="PATH", help="default: results/selfcheck-<matrix name>.jsonl")
    sc.set_defaults(func=cmd_selfcheck)

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

    es = sub.add_parser(
        "estimate",
        help="predict each cell's peak GPU memory (NVML per process) and host memory as named terms; "
        "--check: against recorded measurements",
    )
    _matrix_arg(es)
    _filter_arg(es)
    es.add_argument("--ds-config", nargs="+", metavar="JSON", help="estimate these DeepSpeed config files as cells")
    es.add_argument("--gpus", type=int, metavar="N", help="GPUs per cell (default: the matrix's)")
    es.add_argument("--gpu-mem", metavar="SIZE", help="GPU memory to judge against, e.g. 80GiB (default: this GPU's)")
    es.add_argument("--host-mem", metavar="SIZE", help="host memory to judge against (default: this host's)")
    es.add_argument(
        "--margin",
        type=float,
        default=0.10,
        help="fits below (1 - margin) of the memory, pruned above (1 + margin), uncertain between (default 0.10)",
    )
    es.add_argument("--json", action="store_true", help="every term of every cell, as JSON")
    es.add_argument(
        "--check",
        nargs="+",
        metavar="RESULTS",
        help="predict each recorded cell from its cell and GPU alone, beside what was measured",
    )
    es.add_argument(
        "--held-out",
        nargs="+",
        metavar="PREDICTIONS",
        help="with --check: also score these `zerobench estimate MATRIX` outputs, committed before their cells ran, "
        "against the records of those cells",
    )
    es.add_argument("--markdown", metavar="PATH", help="with --check: also write the check as Markdown")
    es.add_argument(
        "--refit",
        action="store_true",
        help="with --check: print the constants fitted on these results (the memory model's; the step-time model's "
        "and its error band as bench/estimate/steptime.py holds them)",
    )
    es.add_argument("--gpu-name", default="H200", help="with --check: the GPU whose records count (default H200)")
    es.set_defaults(func=cmd_estimate)
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

    sp = sub.add_parser("schema", help="print the JSON Schema of a stored result record (one line of results/*.jsonl)")
    sp.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="write it here instead (the repository's copy: schema/record-v<N>.schema.json)",
    )
    sp.set_defaults(func=cmd_schema)

    args = ap.parse_args(argv)
    from .records.record import RecordVersionError

    try:
        return args.func(args)
    except ConfigError as e:  # it names its file, every problem and the fix
        print(e, file=sys.stderr)
        return 2
    except (InputError, RecordVersionError) as e:
        print(f"zerobench {args.cmd}: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `zerobench cells ... | head`
        return 0
    except KeyboardInterrupt:  # a report or a compare stopped at the terminal: what was written is whole
        print(f"\nzerobench {args.cmd}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
