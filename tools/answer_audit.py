"""Pick the cells that audit an answer-mode run: the cells it left unmeasured that were likeliest to beat its
answer (the highest predicted tokens/s upper bound), and cells pruned or implied out of memory (pruned for GPU
memory alone, those predicted nearest to fitting first, one per setup: the hardest test of a prune). Prints
one `--filter` regex per kind, to run with `zerobench run MATRIX --filter REGEX` (`--no-prune` for the
out-of-memory ones).

    python -m tools.answer_audit RESULTS [--unmeasured 8] [--oom 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.estimate import Verdict
from bench.judge.results import with_cells
from bench.matrix.rules import PRUNED
from bench.records.status import Status
from bench.records.store import read_records


def pick(records: list[dict], unmeasured: int, oom: int) -> tuple[list[dict], list[dict]]:
    last = {r["cell_hash"]: r for r in records if r.get("status") != Status.STARTED.value}
    left = [r for r in last.values() if r["status"] == Status.UNMEASURED.value and not r["answer"].get("needed")]
    left.sort(key=lambda r: -((r["answer"].get("predicted_tokens_per_s") or [0, 0, 0])[2]))
    # Pruned for the GPU's memory alone: a GPU out-of-memory ends in seconds, a host one can take the host down.
    pruned = [
        r
        for r in last.values()
        if (r.get("skip") or {}).get("rule") == PRUNED
        and (r.get("predicted") or {}).get("gpu_verdict") == Verdict.PRUNE
        and r["predicted"].get("host_verdict") != Verdict.PRUNE
    ]
    pruned.sort(key=lambda r: r["predicted"]["gpu_bytes"] / r["predicted"]["gpu_memory_bytes"])
    implied = [r for r in last.values() if r["status"] == Status.IMPLIED_OOM.value]
    return left[:unmeasured], _one_per_setup(pruned + implied)[:oom]


def _one_per_setup(recs: list[dict]) -> list[dict]:
    """The first record of each setup (ZeRO stage, offload, precision, checkpointing, PEFT): different ways to
    run out of memory rather than one way with several optimizers."""
    seen, out = set(), []
    for r in recs:
        c = r["cell"]
        key = (c["zero_stage"], c["offload"], c["precision"], c["grad_ckpt"], c["peft"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _regex(recs: list[dict]) -> str:
    return "#(" + "|".join(r["cell_hash"] for r in recs) + ")$"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--unmeasured", type=int, default=8)
    ap.add_argument("--oom", type=int, default=5)
    args = ap.parse_args(argv)
    near = [Path(args.results).parent.parent, Path(args.results).parent]  # a compact record's cell: its matrix's
    left, oom = pick([r.to_dict() for r in with_cells(read_records(args.results), near)], args.unmeasured, args.oom)
    if not left and not oom:
        print("nothing to audit", file=sys.stderr)
        return 1
    for name, recs in (("unmeasured", left), ("oom", oom)):
        for r in recs:
            print(f"# {name}: {r['cell_name']}", file=sys.stderr)
        print(f"{name}='{_regex(recs)}'" if recs else f"{name}=")
    return 0


if __name__ == "__main__":
    sys.exit(main())
