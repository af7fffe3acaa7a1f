"""`zerobench estimate`: each cell's predicted peak GPU and host memory as named terms, the predicted GPU time
and frontier of what a run would run; --check: the memory and step-time models against recorded measurements."""

from __future__ import annotations

import sys
from pathlib import Path

from .args import filter_arg, matrix_arg, resolve, sizes


def add_parser(sub) -> None:
    es = sub.add_parser(
        "estimate",
        help="predict each cell's peak GPU memory (NVML per process) and host memory as named terms; "
        "--check: against recorded measurements",
    )
    matrix_arg(es)
    filter_arg(es)
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
        help="predict each recorded cell (of any GPU; .jsonl or .jsonl.gz, a folder for its results files) from its "
        "cell and GPU alone, beside what was measured; held out by results file, machine and GPU model",
    )
    es.add_argument(
        "--held-out",
        nargs="+",
        metavar="FILE",
        help="with --check: results files (.jsonl, .jsonl.gz) to predict with constants fitted on the --check files "
        "alone (left out of them; with --refit, left out of the fit); `zerobench estimate MATRIX` outputs, "
        "committed before their cells ran, to score against the records of those cells",
    )
    es.add_argument("--markdown", metavar="PATH", help="with --check: also write the check as Markdown")
    es.add_argument(
        "--refit",
        nargs="?",
        const="all",
        choices=("all", "memory", "step_time"),
        help="with --check: fit the memory model's and the step-time model's constants (or one model's) on these "
        "results (less --held-out files) and write them to their sections of bench/estimate/fit.json, each with the "
        "command that wrote it",
    )
    es.add_argument(
        "--gpu-name",
        metavar="TEXT",
        help="with --check: only the records of GPUs whose name contains TEXT (default: any)",
    )
    es.add_argument(
        "--rates",
        metavar="JSON",
        help="a machine's rates as `zerobench probe --json` printed them: predict for that GPU and host (with "
        "--check: for the records of that GPU model that carry no rates of their own)",
    )
    es.set_defaults(func=cmd_estimate)


def cmd_estimate(args) -> int:
    from ..estimate import Hardware

    try:
        gpu_mem, host_mem = sizes(args)
    except ValueError as e:
        print(f"zerobench estimate: {e}", file=sys.stderr)
        return 2
    if args.check:
        return _estimate_check(args)
    from ..estimate.table import as_json, estimates, text
    from ..execute.plan import select
    from ..host import env
    from ..matrix import spec

    if gpu_mem is None or host_mem is None:
        here = env.probe()  # this machine's GPU and host memory, unless given
        gpu_mem = gpu_mem or (here.gpus[0].memory_bytes if here.gpus else None)
        host_mem = host_mem or here.host_memory_bytes or None
    m = spec.load(resolve(args.matrix), ds_configs=args.ds_config)
    cells = select(spec.expand(m), args.filter)
    rates = _rates(args.rates)
    hw = Hardware(
        gpu_memory_bytes=gpu_mem,
        host_memory_bytes=host_mem,
        gpu_name=rates.device if rates else None,
        host_cores=rates.threads if rates else None,
        rates=rates,
    )
    if len(cells) >= PROGRESS_FROM:
        print(f"zerobench estimate: {len(cells):,} cells; --filter narrows them", file=sys.stderr, flush=True)
    rows = estimates(_progress(cells, "predicted"), hw, gpus=args.gpus)
    if args.json:
        print(as_json(list(rows), hw, args.margin))
        return 0
    peaks: list[tuple] = []  # each cell as estimated and its predicted GPU peak: all the run time needs

    def kept(rows):
        for cell, e, why in rows:
            peaks.append((cell, e.gpu_bytes if e is not None else None))
            yield cell, e, why

    print(text(kept(rows), hw, args.margin))
    _print_run_time(args, m, cells, peaks, hw)
    return 0


def _rates(path: str | None):
    """The rates a `zerobench probe --json` file holds; None where no file is given."""
    if not path:
        return None
    import json

    from ..host.rates import Rates
    from ..matrix.problems import InputError

    try:
        rates = Rates.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, TypeError) as e:
        raise InputError(f"--rates {path}: not a `zerobench probe --json` file ({e})") from None
    if rates is None or not rates.device:
        raise InputError(f"--rates {path}: no rates in it (give what `zerobench probe --json` printed)")
    return rates


PROGRESS_FROM = 20_000
"""Cells from which estimate says how far it got (on stderr): some 2 ms a cell on one core, a matrix of a million
cells takes many minutes."""


def _progress(items, what: str):
    """The items, saying on stderr each tenth of the way (of a large matrix only)."""
    n = len(items)
    if n < PROGRESS_FROM:
        yield from items
        return
    step = -(-n // 10)
    for i, x in enumerate(items, 1):
        yield x
        if i % step == 0 or i == n:
            print(f"zerobench estimate: {what} {i:,} of {n:,} cells", file=sys.stderr, flush=True)


def _print_run_time(args, m, cells, rows, hw) -> None:
    """The predicted GPU time of the cells a run would run (not skipped by a rule, not pruned by the memory
    model), on one GPU and on this host's GPUs side by side, and their predicted memory/speed frontier. m: the
    matrix loaded; rows: per cell of `cells`, the cell as estimated and its predicted GPU peak (None: unknown)."""
    from ..estimate import Verdict, verdict
    from ..estimate.planning.frontier import frontier_lines
    from ..estimate.steptime import run_time_line
    from ..execute.plan import decide, host_platform

    platform = host_platform(None)
    planned = decide(m, resolve(args.matrix), args.filter, platform, cells=cells)  # the cells expanded once
    runnable = {it.cell.hash: it.ds_config for it in planned.runnable}
    kept = [
        (c, peak)
        for orig, (c, peak) in zip(cells, rows)
        if orig.hash in runnable and (peak is None or verdict(peak, hw.gpu_memory_bytes, args.margin) != Verdict.PRUNE)
    ]
    print(run_time_line([c for c, _ in kept], hw, max(len(platform.gpus), 1)))
    for line in frontier_lines([(c, runnable.get(c.hash), peak) for c, peak in kept], hw):
        print(line)


def _is_results(path: str) -> bool:
    return Path(path).is_dir() or path.endswith((".jsonl", ".jsonl.gz"))


def _results_files(paths: list[str]) -> list[str]:
    """The results files given: a folder stands for its *.jsonl and *.jsonl.gz files."""
    out = []
    for p in paths:
        if Path(p).is_dir():
            out += sorted(str(f) for pat in ("*.jsonl", "*.jsonl.gz") for f in Path(p).glob(pat))
        else:
            out.append(p)
    return out


def _estimate_check(args) -> int:
    from ..estimate import check

    missing = [p for p in (*args.check, *(args.held_out or ())) if not Path(p).exists()]
    if missing:
        print(f"zerobench estimate: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    held_files = _results_files([p for p in args.held_out or () if _is_results(p)])
    predictions = [p for p in args.held_out or () if not _is_results(p)]
    left_out = {Path(f).resolve() for f in held_files}
    files = [f for f in _results_files(args.check) if Path(f).resolve() not in left_out]
    if args.refit:
        return _refit(args, files)
    if held_files:
        return _check_held_out(args, files, held_files, predictions)
    every = check.cases(files, gpu=args.gpu_name, unfitted=True)
    cs = [c for c in every if check.fitted_on(c.run)]
    if not every:
        print(f"zerobench estimate: no ok or out-of-memory {_gpu(args)}records in these files", file=sys.stderr)
        return 2
    rows = check.evaluate(cs, margin=args.margin)
    cv = check.cross_validate(cs, margin=args.margin)
    unfit = [c for c in every if not check.fitted_on(c.run)]
    unfit_rows = check.evaluate(unfit, margin=args.margin)
    # Every record's line: held out, its file's leave-one-out prediction; a run not fitted on, its prediction.
    print(check.text_table(check.table([*rows, *unfit_rows], [*cv, *unfit_rows])))
    if rows:
        print()
        print(check.text_table(check.category_table(rows, cv)))
        print()
        print(check.summary_line(check.summarize(rows), "in-sample"))
        print(check.summary_line(check.summarize(cv), "held out (leave one results file out)"))
    if unfit_rows:
        print(check.unfitted_line(unfit_rows))
    if len({c.file for c in every}) == 1:
        print(ONE_FILE.format(file=every[0].file))
    groups = _heldout_memory(cs, unfit, args.margin)
    _memory_groups(groups)
    from ..estimate.checks import timecheck

    steps: dict[str, list[float]] = {}
    for t in timecheck.time_cases(files, gpu=args.gpu_name or "") if predictions else ():
        steps.setdefault(t.cell.hash, []).append(t.step_s)
    held = [(p, check.held_out(p, every, steps)) for p in predictions]
    if held:
        print()
        print(check.text_table(check.held_out_table([h for _, h in held])))
    _time_check(files, args.gpu_name or "", _rates(args.rates))
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        from ..estimate.checks import heldout

        tables = [(name, heldout.memory_table(groups[by])) for by, name in heldout.BY.items()]
        text = check.markdown(args.check, files, rows, cv, args.margin, held, unfit_rows, tables)
        Path(args.markdown).write_text(text)
        print(f"report: {args.markdown}")
    return 0


def _gpu(args) -> str:
    return f"{args.gpu_name} " if args.gpu_name else ""


def _heldout_memory(cs, unfit, margin: float) -> dict:
    """The memory model held out by GPU model and machine, for the constants it ships (fit.json)."""
    from ..estimate.checks import heldout
    from ..estimate.fitted import FIT

    return heldout.memory_groups(cs, unfit, {"gpu": FIT.gpus or {}, "machine": FIT.machines or {}}, margin=margin)


def _memory_groups(groups: dict) -> None:
    from ..estimate.check import text_table
    from ..estimate.checks import heldout

    for by, name in heldout.BY.items():
        print(f"\nMemory model, held out by {name} (NVML process peak):\n")
        print(text_table(heldout.memory_table(groups[by])))
    print(heldout.STRONGEST)


def _time_groups(groups: dict, complete: bool = True) -> None:
    """`complete`: the groups' fitted counts are over every record the constants were fitted on."""
    from ..estimate.check import text_table
    from ..estimate.checks import heldout

    for by, name in heldout.BY.items():
        if any(g.rows for g in groups[by]):
            print(
                f"\nStep-time model, held out by {name} (median step time; the band the model ships, around each "
                "prediction):\n"
            )
            print(text_table(heldout.time_table(groups[by], complete)))


def _refit(args, files: list[str]) -> int:
    """Write the constants fitted on `files` into fit.json: the memory model's section, the step-time model's, or
    both (--refit's choice), each with the command that wrote it."""
    from ..matrix.problems import InputError

    held = " ".join(p for p in args.held_out or () if _is_results(p))
    command = " ".join(
        [
            "zerobench estimate --check",
            *args.check,
            *([f"--held-out {held}"] if held else []),
            *([f"--gpu-name {args.gpu_name!r}"] if args.gpu_name else []),
            "--refit" + ("" if args.refit == "all" else f" {args.refit}"),
        ]
    )
    try:
        if args.refit in ("all", "memory"):
            _refit_memory(files, command, args.gpu_name)
        if args.refit in ("all", "step_time"):
            _refit_time(files, command, args.gpu_name)
    except InputError as e:
        print(f"zerobench estimate: {e}", file=sys.stderr)
        return 2
    return 0


def _refit_memory(files: list[str], command: str, gpu: str | None) -> None:
    from ..estimate import check, fitdata

    data = check.refit(files, command, gpu=gpu)
    print(f"# bench/estimate/{fitdata.FIT_FILE}, section {check.SECTION!r}: written")
    for name, v in data["constants"].items():
        print(f"{name} = {v / 2**30:.3f} GiB" if v > 1e6 else f"{name} = {v:.3f}")
    gpus = ", ".join(f"{g} ({n})" for g, n in data["gpus"].items())
    print(
        f"fitted on {sum(data['gpus'].values())} records of {len(data['runs'])} runs in {len(data['files'])} "
        f"files; GPU models: {gpus}"
    )


def _refit_time(files: list[str], command: str, gpu: str | None) -> None:
    from ..estimate import fitdata
    from ..estimate.checks import timecheck
    from ..matrix.problems import InputError

    if not timecheck.time_cases(files, gpu=gpu or ""):
        raise InputError(f"no ok record with a step time in {', '.join(files)} to fit the step-time model on")
    fit = timecheck.refit(files, command, gpu=gpu or "")
    print(
        f"# bench/estimate/{fitdata.FIT_FILE}, section 'step_time': written, fitted on {fit['records']} records "
        f"of {len(fit['runs'])} runs ({', '.join(fit['gpus'])}; rates: {', '.join(fit['rates'])})"
    )


def _check_held_out(args, files: list[str], held_files: list[str], predictions: list[str]) -> int:
    """The held-out results files predicted with constants fitted on `files` alone (none of them held out),
    memory and step time, by GPU model and machine; predictions files scored against both's records."""
    from ..estimate import check
    from ..estimate.checks import heldout, timecheck
    from ..estimate.fitted import NEUTRAL

    train = check.cases(files, gpu=args.gpu_name, unfitted=True)
    test = check.cases(held_files, gpu=args.gpu_name, unfitted=True)
    if not train or not test:
        which = ", ".join(files if not train else held_files) or "(no results files left to fit on)"
        print(f"zerobench estimate: no ok or out-of-memory {_gpu(args)}records in {which}", file=sys.stderr)
        return 2
    if args.markdown:
        print(
            "zerobench estimate: --markdown writes the check of --check files; not written with --held-out "
            "results files",
            file=sys.stderr,
        )
    k = check.fit(train, NEUTRAL)
    names = ", ".join(sorted({c.file for c in test}))
    seen = heldout.seen_in(train)
    gpus = ", ".join(f"{g} ({n})" for g, n in sorted(seen["gpu"].items()))
    print(
        f"Held out: {names}, predicted by constants fitted on the --check files alone: {len(train)} records of "
        f"{len({c.run for c in train})} runs in {len({c.file for c in train})} files; GPU models: {gpus}"
    )
    unshown = check.unshown(train)
    if unshown:
        print(f"  no record fitted on shows {', '.join(unshown)}: left at nothing (bench.estimate.fitted.NEUTRAL)")
    rows = check.evaluate(test, k, args.margin)
    print()
    print(check.text_table(check.table(rows, rows)))
    print()
    print(check.summary_line(check.summarize(rows), f"memory, held out ({names})"))
    _memory_groups(heldout.memory_groups([], test, seen, k, args.margin))
    t_train = timecheck.time_cases(files, gpu=args.gpu_name or "")
    t_test = timecheck.time_cases(held_files, gpu=args.gpu_name or "", rates=_rates(args.rates))
    t_rows = heldout.time_fit_rows(t_train, t_test)
    if t_rows:
        print()
        print(heldout.summary_line(f"step time, held out ({names})", t_rows))
        _time_groups(heldout.grouped(t_test, t_rows, heldout.seen_in(t_train)))
    elif t_test:
        print(f"step time: no ok record of {', '.join(files)} to fit the step-time model on")
    if predictions:
        steps: dict[str, list[float]] = {}
        for t in t_test:
            steps.setdefault(t.cell.hash, []).append(t.step_s)
        held = [check.held_out(p, [*train, *test], steps) for p in predictions]
        print()
        print(check.text_table(check.held_out_table(held)))
    return 0


ONE_FILE = (
    "note: these records are all from {file}: leaving it out leaves nothing to fit on, so neither model has "
    "leave-one-file-out figures here; give records of two or more results files to cross-validate"
)


def _time_check(files: list[str], gpu: str | None, rates=None) -> None:
    """The step-time model's check beside the memory model's (ok records on one or two GPUs), held out by
    results file, machine and GPU model."""
    from ..estimate.checks import heldout, timecheck, timetext

    check = timecheck.time_check(files, gpu=gpu, rates=rates)
    if check.held_out or check.rows:
        print(timetext.time_text(check))
        _time_groups(heldout.time_groups(check), complete=False)
