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
        help="with --check: print the constants fitted on these results (the memory model's) and write the "
        "step-time model's fit and its error band into bench/estimate/fit.json",
    )
    es.add_argument(
        "--gpu-name",
        default=None,
        help="with --check: the GPU whose records count (default: H200 for the memory model, every GPU for the "
        "step-time model, whose rates are each GPU's)",
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
    from ..estimate.table import as_json, estimate_cells, text
    from ..execute.plan import select
    from ..host import env
    from ..matrix import spec

    if gpu_mem is None or host_mem is None:
        here = env.probe()  # this machine's GPU and host memory, unless given
        gpu_mem = gpu_mem or (here.gpus[0].memory_bytes if here.gpus else None)
        host_mem = host_mem or here.host_memory_bytes or None
    m = spec.load(resolve(args.matrix), ds_configs=args.ds_config)
    cells = select(spec.expand(m), args.filter)
    hw = Hardware(gpu_memory_bytes=gpu_mem, host_memory_bytes=host_mem)
    rows = estimate_cells(cells, hw, gpus=args.gpus)
    print(as_json(rows, hw, args.margin) if args.json else text(rows, hw, args.margin))
    if not args.json:
        _print_run_time(args, m, cells, rows, hw)
    return 0


def _print_run_time(args, m, cells, rows, hw) -> None:
    """The predicted GPU time of the cells a run would run (not skipped by a rule, not pruned by the memory
    model), on one GPU and on this host's GPUs side by side, and their predicted memory/speed frontier. m: the
    matrix loaded."""
    from ..estimate import Verdict, verdict
    from ..estimate.frontier import frontier_lines
    from ..estimate.steptime import run_time_line
    from ..execute.plan import decide, host_platform

    platform = host_platform(None)
    runnable = {it.cell.hash: it.ds_config for it in decide(m, resolve(args.matrix), args.filter, platform).runnable}
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

    from ..estimate import check

    missing = [p for p in (*args.check, *(args.held_out or ())) if not Path(p).exists()]
    if missing:
        print(f"zerobench estimate: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    # A folder stands for its *.jsonl files.
    files = [str(f) for p in args.check for f in (sorted(Path(p).glob("*.jsonl")) if Path(p).is_dir() else [p])]
    every = check.cases(files, gpu=args.gpu_name or "H200", unfitted=True)
    cs = [c for c in every if check.fitted_on(c.run)]
    if not every:
        print(
            f"zerobench estimate: no ok or out-of-memory {args.gpu_name or 'H200'} records in these files",
            file=sys.stderr,
        )
        return 2
    if args.refit:  # on every record given: a refit takes in what the constants were not fitted on
        k = check.fit(every)
        print("# bench/estimate/fitted.py")
        for f in dataclasses.fields(k):
            v = getattr(k, f.name)
            print(f"{f.name} = {v / 2**30:.3f} GiB" if v > 1e6 else f"{f.name} = {v:.3f}")
        print(check.runs_literal(every), end="")
        from ..estimate import timecheck

        if timecheck.time_cases(files, gpu=args.gpu_name):  # the step-time model's fit, into fit.json
            fit = timecheck.refit(files, gpu=args.gpu_name)
            print(
                f"bench/estimate/fit.json step_time: fitted on {fit['records']} records of {len(fit['runs'])} runs "
                f"({', '.join(fit['gpus'])}; rates: {', '.join(fit['rates'])})"
            )
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
    from ..estimate import timecheck

    steps: dict[str, list[float]] = {}
    for t in timecheck.time_cases(files, gpu=args.gpu_name) if args.held_out else ():
        steps.setdefault(t.cell.hash, []).append(t.step_s)
    held = [(p, check.held_out(p, every, steps)) for p in args.held_out or ()]
    if held:
        print()
        print(check.text_table(check.held_out_table([h for _, h in held])))
    _time_check(files, args.gpu_name)
    if args.markdown:
        from ..estimate.fitted import FITTED

        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        text = check.markdown(args.check, files, rows, cv, FITTED, args.margin, held, unfit_rows)
        Path(args.markdown).write_text(text)
        print(f"report: {args.markdown}")
    return 0


ONE_FILE = (
    "note: these records are all from {file}: leaving it out leaves nothing to fit on, so neither model has "
    "leave-one-file-out figures here; give records of two or more results files to cross-validate"
)


def _time_check(files: list[str], gpu: str | None) -> None:
    """The step-time model's check beside the memory model's (ok records on one or two GPUs)."""
    from ..estimate import timecheck

    check = timecheck.time_check(files, gpu=gpu)
    if check.held_out or check.rows:
        print(timecheck.time_text(check))
