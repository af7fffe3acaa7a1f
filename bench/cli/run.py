"""`zerobench run`: its options (the matrix and its cells, where they run, answer mode, what is written, the
memory judged) and the run itself, or with --dry-run what it would do."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .args import assume_gpus_arg, filter_arg, matrix_arg, positive, shard
from .dry_run import dry_run
from .run_options import settings_of

if TYPE_CHECKING:
    from ..execute import RunSettings


def add_parser(sub) -> None:
    r = sub.add_parser("run", help="run a matrix: every valid cell in its own process; results appended")
    matrix_arg(r)
    _add_plan(r)
    _add_where(r)
    _add_slurm(r)
    _add_answer(r)
    _add_outputs(r)
    _add_memory(r)
    _add_wandb(r)
    r.set_defaults(func=cmd_run)


def _add_plan(r: argparse.ArgumentParser) -> None:
    """What the run does with the matrix's cells: which, how often, in which order; or only say it (--dry-run)."""
    from ..execute import schedule

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
    filter_arg(r)
    assume_gpus_arg(r)
    r.add_argument(
        "--resume",
        action="store_true",
        help="skip cells (each repeat of a cell) that already have a result in the results file",
    )
    r.add_argument(
        "--repeats",
        type=positive,
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


def _add_where(r: argparse.ArgumentParser) -> None:
    """Where the cells run: this host's GPUs, packed or not; a Ray cluster; Slurm; one shard of them."""
    from ..execute.executors.registry import EXECUTORS

    r.add_argument(
        "--gpus-available",
        type=positive,
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
        choices=sorted(EXECUTORS),
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
        type=shard,
        metavar="I/N",
        help="run only part I of N of the matrix's cells (split by cell hash, so the same whatever the matrix's "
        "order), into its own results file (default: results/local/<matrix name>.shard-I-of-N.jsonl): one CI job per "
        "part; `zerobench report` and --resume take the parts' files together",
    )


def _add_slurm(r: argparse.ArgumentParser) -> None:
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
        type=positive,
        metavar="N",
        help="jobs in Slurm at once, pending or running (default: the partition's GPUs, or its nodes without GPUs)",
    )
    sl.add_argument(
        "--slurm-folder",
        metavar="DIR",
        help="a folder every node shares: a fresh folder of job files per run (default: the logs folder's slurm/)",
    )


def _add_answer(r: argparse.ArgumentParser) -> None:
    """Answer mode and its options; --replay, which serves recorded ends to check it."""
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
        "a grid measured in full); judged as on the recorded machine; written to "
        "results/local/<matrix name>.replay.jsonl unless --results says where (never into a replayed file); every "
        "record and report says it is a replay",
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
        "--pairs", type=positive, metavar="N", help="with --answer: measured pairs per knob value (default 1)"
    )
    r.add_argument(
        "--screen",
        type=positive,
        metavar="N",
        help="with --answer: once each group has its leader, first measure N pairs for every knob value, in the "
        "cheapest cells that pair (default: no screen)",
    )
    r.add_argument(
        "--collapse",
        action="store_true",
        help="with --answer: treat a knob's values as one within a group where its measured pairs put the effect "
        "inside the minimum effect either way (the answer names each value it collapses)",
    )
    r.add_argument(
        "--no-frontier",
        action="store_true",
        help="with --answer: settle who leads alone; the memory/speed frontier is given as measured, not settled",
    )


def _add_outputs(r: argparse.ArgumentParser) -> None:
    """What the run writes and says: results, logs, the report, the console, the exit code."""
    r.add_argument(
        "--results",
        metavar="PATH",
        help="results file (default: results/local/<matrix name>.jsonl, a folder of the user's own: this repository "
        "ignores it, and its committed results are never appended to); a file holding records of another version "
        "of the matrix file is refused unless --other-matrix",
    )
    r.add_argument(
        "--other-matrix",
        action="store_true",
        help="append to (and with --resume, resume from) a results file whose records of this matrix were written "
        "from another version of the matrix file: its cells and outcomes count as this run's",
    )
    r.add_argument("--logs", metavar="DIR", help="worker logs (default: logs/<results name>/ beside the results file)")
    r.add_argument(
        "--report",
        metavar="PATH",
        help="report path without suffix (default: reports/<results name>; for results in results/local/, "
        "reports/local/<results name>)",
    )
    r.add_argument("--no-report", action="store_true", help="do not write the reports at the end")
    r.add_argument("--no-progress", action="store_true", help="no progress bar (one line per cell still printed)")
    r.add_argument("--strict", action="store_true", help="exit 1 if any cell failed (for CI jobs)")


def _add_memory(r: argparse.ArgumentParser) -> None:
    """What the memory model judges cells against, and what it prunes; the DeepSpeed configs run as cells."""
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


def _add_wandb(r: argparse.ArgumentParser) -> None:
    r.add_argument(
        "--wandb", action="store_true", help="log each cell to Weights & Biases as it ends (as export --wandb)"
    )
    r.add_argument(
        "--wandb-project", default="zerobench", metavar="P", help="W&B project for --wandb (default zerobench)"
    )
    r.add_argument("--wandb-dir", metavar="DIR", help="where W&B writes its run folders for --wandb (default ./wandb)")


def cmd_run(args) -> int:
    from .. import report as _  # noqa: F401 - fail early if the report stack is broken

    try:
        s = settings_of(args)
    except ValueError as e:
        print(f"zerobench run: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        return dry_run(s, args.verbose, args.assume_gpus)
    if args.assume_gpus:
        print("zerobench run: --assume-gpus plans a run (with --dry-run); a real run uses this host's GPUs",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.wandb:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:  # before any cell runs: an input error
            print("zerobench run: --wandb needs wandb: pip install 'zerobench[wandb]'", file=sys.stderr)
            return 2
    return _run(args, s)


def _run(args, s: RunSettings) -> int:
    """Run s, then write its report: exit 0, or 1 when it stopped (or with --strict, a
    cell failed), or 128 + the signal's number."""
    from ..execute import HarnessError, Stopped, run, stop_on_signals
    from ..records.store import StoreWriteError

    stopped = None
    # SIGTERM (kill, a job scheduler) ends a run as Ctrl-C does: the running cell recorded as
    # interrupted, the report of what finished written, exit code 128 + the signal's number.
    with stop_on_signals():
        try:
            _, results_path, written = run(s, on_record=_to_wandb(args) if args.wandb else None)
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
    bad = [r for r in written if r.status.value not in ("ok", "skipped")]
    return 1 if (bad and args.strict) else 0


def _to_wandb(args):
    """on_record for --wandb: each record logged to W&B as it is stored."""
    from ..report.tracking import to_wandb

    def on_record(rec):
        to_wandb([rec], project=args.wandb_project, directory=args.wandb_dir)

    return on_record


def _write_run_report(args, results_path: Path) -> bool:
    """The run's report; False (said why) when it could not be written: the results are saved regardless."""
    from ..execute import default_report_path
    from ..report import write_reports

    out = Path(args.report) if args.report else default_report_path(results_path)
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
