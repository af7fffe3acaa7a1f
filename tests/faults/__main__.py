"""One command for the fault suite: runs tests/faults with a ledger and prints (and writes) its summary.

python -m tests.faults [--md PATH] [pytest args...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def summarise(entries: list[dict]) -> str:
    faults = {e["fault"] for e in entries if e["fault"]}
    survived = {e["fault"] for e in entries if e["fault"] and e["outcome"] == "passed"}
    unnamed = [e["test"] for e in entries if not e["fault"]]
    tot = {k: sum(e[k] for e in entries) for k in ("cells", "lost", "duplicated", "wrong")}
    lines = [
        "# Fault suite",
        "",
        f"Faults injected: **{len(faults)}** distinct, survived: **{len(survived)}**, "
        f"records lost: **{tot['lost']}**, duplicated: **{tot['duplicated']}**, statuses wrong: **{tot['wrong']}** "
        f"(over {tot['cells']} cell outcomes accounted).",
        "",
        "| fault | what is injected | outcome | cells | lost | duplicated | wrong |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for e in sorted(entries, key=lambda e: e["fault"]):
        lines.append(
            f"| `{e['fault'] or '?'}` | {e['description']} | {e['outcome']} | {e['cells']} | {e['lost']} | "
            f"{e['duplicated']} | {e['wrong']} |"
        )
    failed = [e for e in entries if e["outcome"] != "passed"]
    if failed:
        lines += ["", "## Not survived", ""] + [
            f"- `{e['fault']}` ({e['test']}): {'; '.join(e['details'])}" for e in failed
        ]
    if unnamed:
        lines += ["", "Tests without a named fault: " + ", ".join(unnamed)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__.splitlines()[0])
    ap.add_argument("--md", type=Path, help="also write the summary as Markdown here")
    args, rest = ap.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as td:
        led = Path(td) / "ledger.jsonl"
        env = {**os.environ, "ZEROBENCH_FAULT_LEDGER": str(led)}
        rc = subprocess.call(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(HERE), *rest], cwd=ROOT, env=env
        )
        entries = [json.loads(x) for x in led.read_text().splitlines()] if led.exists() else []
    text = summarise(entries)
    print(text)
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
