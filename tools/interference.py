"""What packing costs a cell: run one cell alone, then N copies of it side by side (one per GPU), and
report tokens/s and step time beside against alone.

    python3 tools/interference.py MATRIX --filter REGEX [--gpus N] [--repeats R] [--out DIR] [--md PATH]

The filter must select one runnable cell. Alone: R repeats, one at a time (`--no-pack`). Beside: R x N
repeats packed on N GPUs (`--pack --gpus-available N`), so N copies run at once, each on its own GPU.
Only records whose measured phase had a neighbour (`placement.beside` not empty) count as beside. On a
CPU host, N is CPU slots, and the answer is about two cells sharing the cores, not GPUs.
Both runs go through `zerobench run` as a user's would; their results stay in DIR.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.execute import plan  # noqa: E402
from bench.records.store import read  # noqa: E402


def _zerobench(*args: str) -> int:
    e = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "bench", "run", *args], env=e).returncode


def _figures(recs: list[dict]) -> dict:
    tps = [r["metrics"]["tokens_per_s"] for r in recs]
    step = [statistics.median(r["step_times_s"]) for r in recs if r.get("step_times_s")]
    return {
        "n": len(recs),
        "tokens_per_s": statistics.median(tps) if tps else None,
        "step_s": statistics.median(step) if step else None,
        "spread": (min(tps), max(tps)) if tps else None,
    }


def summarize(alone: list[dict], beside: list[dict], gpus: int) -> str:
    """A Markdown table: alone, beside, and the ratio (beside / alone)."""
    a = _figures([r for r in alone if r["status"] == "ok" and not (r.get("placement") or {}).get("beside")])
    b = _figures([r for r in beside if r["status"] == "ok" and (r.get("placement") or {}).get("beside")])
    name = (alone or beside)[0]["cell_name"] if (alone or beside) else "?"
    where = "GPUs" if any((r.get("placement") or {}).get("gpus") for r in alone + beside) else "CPU slots"
    lines = [
        f"Interference of `{name}`: alone vs {gpus} copies side by side ({where})",
        "",
        "| | cells | tokens/s (median) | tokens/s range | step time (median of medians) |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, f in (("alone", a), ("beside", b)):
        rng = f"{f['spread'][0]:,.0f}-{f['spread'][1]:,.0f}" if f["spread"] else "-"
        tps = f"{f['tokens_per_s']:,.0f}" if f["tokens_per_s"] else "-"
        st = f"{f['step_s'] * 1e3:.2f} ms" if f["step_s"] else "-"
        lines.append(f"| {label} | {f['n']} | {tps} | {rng} | {st} |")
    if a["tokens_per_s"] and b["tokens_per_s"]:
        lines += [
            "",
            f"ratio beside/alone: tokens/s {b['tokens_per_s'] / a['tokens_per_s']:.3f}, "
            f"step time {b['step_s'] / a['step_s']:.3f}",
        ]
    else:
        lines += ["", "no ratio: a side has no ok record (see the results files)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("matrix")
    ap.add_argument("--filter", action="append", required=True, metavar="REGEX", help="select one cell")
    ap.add_argument("--gpus", type=int, default=2, metavar="N", help="copies side by side (default 2)")
    ap.add_argument("--repeats", type=int, default=3, metavar="R", help="runs alone; beside: R x N (default 3)")
    ap.add_argument("--out", default="results/interference", metavar="DIR", help="where the two results files go")
    ap.add_argument("--md", metavar="PATH", help="also write the table here")
    args = ap.parse_args(argv)

    p = plan(args.matrix, args.filter)
    cells = p.runnable
    if len(cells) != 1 or cells[0].cell.gpus != 1:
        print(
            f"interference: the filter must select one runnable single-GPU cell; it selects "
            f"{[it.cell.name for it in cells]}",
            file=sys.stderr,
        )
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    alone, beside = out / "alone.jsonl", out / "beside.jsonl"
    common = [args.matrix, *[x for f in args.filter for x in ("--filter", f)], "--no-report", "--no-progress"]
    common += ["--gpus-available", str(args.gpus)]
    for path, extra in (
        (alone, ["--no-pack", "--repeats", str(args.repeats)]),
        (beside, ["--pack", "--repeats", str(args.repeats * args.gpus)]),
    ):
        code = _zerobench(*common, *extra, "--results", str(path))
        if code != 0:
            print(f"interference: zerobench run ({path.stem}) exited {code}", file=sys.stderr)
            return code
    run_ids = {}
    for path in (alone, beside):  # this call's records only: the files may hold earlier runs
        recs = [r.to_dict() for r in read(path)]
        last = recs[-1]["run_id"] if recs else None
        run_ids[path] = [r for r in recs if r["run_id"] == last]
    text = summarize(run_ids[alone], run_ids[beside], args.gpus)
    print(text)
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
