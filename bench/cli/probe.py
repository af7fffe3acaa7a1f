"""`zerobench probe`: the machine's rates (bench.execute.probe), measured once per machine and cached."""

from __future__ import annotations

import json
import sys

from ..matrix.presets import PRESETS
from .args import positive


def add_parser(sub) -> None:
    p = sub.add_parser(
        "probe",
        help="measure this machine's rates (matmul per precision, memory, PCIe, CPU Adam, host overhead) "
        "in at most 30 s, once per machine (cached)",
    )
    p.add_argument(
        "--model",
        default="llama-7b",
        choices=sorted(PRESETS),
        help="the preset whose MLP the matmul is timed at (default: llama-7b)",
    )
    p.add_argument("--tokens", type=positive, default=2048, help="tokens per micro-batch (default: 2048)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON (with why any is missing)")
    p.add_argument("--refresh", action="store_true", help="measure again, whatever the cache holds")
    p.add_argument(
        "--build-cpu-adam",
        action="store_true",
        help="first build DeepSpeed's CPU Adam op where this machine has not (once, as a run with a CPU-offload "
        "cell does; the probe itself compiles nothing and leaves CPU Adam out until the op is built)",
    )
    p.set_defaults(func=cmd_probe)


def cmd_probe(args) -> int:
    from ..execute.probe import probe_machine, shape

    dims = shape(args.model, args.tokens)
    if args.build_cpu_adam:
        _build_cpu_adam()
    # With --json the line goes to stderr and stdout is the JSON alone.
    printer = (lambda s: print(s, file=sys.stderr)) if args.json else print
    rates, cached = probe_machine(dims, refresh=args.refresh, printer=printer)
    if rates is None:
        return 1
    if args.json:
        print(json.dumps({**rates.to_dict(), "cached": cached}, indent=1))
    return 0


def _build_cpu_adam() -> None:
    """The op through the run's prebuild helper and cache; its lines on stderr (stdout may be the JSON)."""
    from ..execute.prepare import build_ops
    from ..host import env
    from ..records import cache

    logs = cache.root() / "logs"  # where the build's log stays for a look
    costs = build_ops(["CPUAdamBuilder"], logs, None, env.probe(), lambda s: print(s, file=sys.stderr))
    if (costs.get("ops") or {}).get("CPUAdamBuilder") == "failed":
        print("probe: DeepSpeed's CPU Adam op did not build: its rate is left out", file=sys.stderr)
