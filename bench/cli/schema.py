"""`zerobench schema`: the JSON Schema of a stored result record."""

from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    sp = sub.add_parser("schema", help="print the JSON Schema of a stored result record (one line of results/*.jsonl)")
    sp.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="write it here instead (the repository's copy: schema/record-v<N>.schema.json)",
    )
    sp.set_defaults(func=cmd_schema)


def cmd_schema(args) -> int:
    import json

    from ..records.record import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text)
        print(f"schema: {args.output}")
    else:
        sys.stdout.write(text)
    return 0
