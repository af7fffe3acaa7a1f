"""`zerobench selfcheck`: the harness against a hand-written DeepSpeed loop and without telemetry
(bench.execute.selfcheck)."""

from __future__ import annotations

import sys

from .args import filter_arg, matrix_arg, resolve


def add_parser(sub) -> None:
    sc = sub.add_parser(
        "selfcheck",
        help="run cells beside a hand-written DeepSpeed loop and without telemetry, "
        "to check the harness's own accuracy and cost",
    )
    matrix_arg(sc)
    filter_arg(sc)
    sc.add_argument("--results", metavar="PATH", help="default: results/selfcheck-<matrix name>.jsonl")
    sc.set_defaults(func=cmd_selfcheck)


def cmd_selfcheck(args) -> int:
    from ..execute.selfcheck import selfcheck
    from ..records.store import StoreWriteError

    try:
        path, _ = selfcheck(resolve(args.matrix), filters=args.filter, results=args.results)
    except StoreWriteError as e:  # the records before it are whole on disk
        print(f"zerobench selfcheck: stopped: {e.strerror}", file=sys.stderr)
        return 1
    print(f"results: {path}")
    return 0
