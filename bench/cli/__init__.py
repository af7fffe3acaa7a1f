"""`zerobench` (= `python -m bench`): run, cells, report, compare, export, selfcheck, schema, probe.

One module per verb, each with its parser (add_parser) and its command (cmd_*): run (dry_run: its --dry-run;
run_options: its options as one bench.execute.RunSettings), cells, report (report, export, compare), estimate,
selfcheck, schema; args: what several share."""

from __future__ import annotations

import argparse
import sys

from ..matrix.problems import ConfigError, InputError
from . import cells, estimate, probe, report, run, schema, selfcheck
from .args import DEFAULT_MATRIX

__all__ = ["DEFAULT_MATRIX", "main", "parser"]


def parser() -> argparse.ArgumentParser:
    """`zerobench`'s arguments: a parser per verb, each the verb's module's."""
    from .. import __version__

    ap = argparse.ArgumentParser(prog="zerobench", description="Benchmark and ablate DeepSpeed/PEFT training setups.")
    ap.add_argument("--version", action="version", version=f"zerobench {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for add in (
        run.add_parser,
        cells.add_parser,
        selfcheck.add_parser,
        report.add_report_parser,
        report.add_export_parser,
        estimate.add_parser,
        report.add_compare_parser,
        schema.add_parser,
        probe.add_parser,
    ):
        add(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the verb argv names; its exit code (2 for bad input, said on stderr without a traceback; 130 for a
    Ctrl-C, also one that comes while the verb is still starting)."""
    verb = ""
    try:
        args = parser().parse_args(argv)
        verb = f" {args.cmd}"
        return _verb(args)
    except KeyboardInterrupt:  # stopped at the terminal, starting or running: what a verb wrote is whole
        print(f"\nzerobench{verb}: interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def _verb(args: argparse.Namespace) -> int:
    from ..records.record import RecordVersionError

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
