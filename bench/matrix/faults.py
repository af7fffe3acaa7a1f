"""Faults the test suite injects into real workers (ZEROBENCH_FAULT), parsed and checked in one place:
the orchestrator validates them against the matrix before anything runs, the worker applies them.

ZEROBENCH_FAULT=kind[=value][@step][#rank][~regex], several separated by commas (so a regex has none).
A fault applies to the ranks it names (all without #rank) of the cells whose id the regex matches (all
without ~regex); a worker applies the first that applies to it. The comparison gate's faults (slow, mem)
take a value and start at step 0 by default. Never set in a benchmark run; a record says which
fault its worker ran with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["KINDS", "Fault", "FaultError", "parse", "for_cell", "for_worker", "check"]

KINDS = {
    "hang": "the worker stops making progress at the step",
    "sigkill": "the worker SIGKILLs itself at the step (as a user or a scheduler would)",
    "raise": "the worker raises an exception with a two-line message at the step",
    "nan": "the loss becomes NaN from the step on",
    "exit": "the worker exits with code 3 at the step without writing a result",
    "oom": "the worker allocates host memory at the step until the kernel's OOM killer stops it "
    "(only under a memory cgroup limit below the host's RAM)",
    "cudaoom": "the worker allocates GPU memory at the step until the CUDA allocator runs out (a CPU cell raises "
    "its OutOfMemoryError at once)",
    # For the comparison gate: a real change it must flag (DeepSpeed-engine cells).
    "slow": "slow=PCT: every step from the step on (default 0) takes PCT percent longer; the device idles",
    "mem": "mem=MiB: MiB more held on the device (on CPU: in host memory) from before the first step to the end",
}
VALUED = ("slow", "mem")

_SPEC = re.compile(
    r"^(?P<kind>[a-z]+)(?:=(?P<value>\d+(?:\.\d+)?))?(?:@(?P<step>-?\d+))?(?:#(?P<rank>\d+))?(?:~(?P<cells>.+))?$"
)


class FaultError(ValueError):
    """ZEROBENCH_FAULT cannot be applied as written."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int = 1
    rank: int | None = None
    cells: str | None = None
    """A regular expression searched in the cell id; None: every cell."""
    value: float | None = None
    """slow's percent, mem's MiB."""

    def applies(self, rank: int, cell_id: str) -> bool:
        return (self.rank is None or self.rank == rank) and (self.cells is None or bool(re.search(self.cells, cell_id)))

    def __str__(self) -> str:
        value = f"={self.value:g}" if self.value is not None else ""
        return f"{self.kind}{value}@{self.step}" + (f"#{self.rank}" if self.rank is not None else "")


def parse(text: str | None) -> list[Fault]:
    out = []
    for spec in filter(None, (s.strip() for s in (text or "").split(","))):
        m = _SPEC.match(spec)
        if not m or m["kind"] not in KINDS:
            raise FaultError(
                f"ZEROBENCH_FAULT={spec!r}: expected kind[=value][@step][#rank][~regex] with kind one of "
                f"{', '.join(KINDS)}"
            )
        if (m["kind"] in VALUED) != (m["value"] is not None):
            raise FaultError(
                f"ZEROBENCH_FAULT={spec!r}: {'/'.join(VALUED)} take a value (slow=10, mem=512), others none"
            )
        if m["cells"]:
            try:
                re.compile(m["cells"])
            except re.error as e:
                why = f"the cell pattern is not a regular expression: {e}"
                raise FaultError(f"ZEROBENCH_FAULT={spec!r}: {why}") from None
        step = int(m["step"]) if m["step"] else (0 if m["kind"] in VALUED else 1)
        value = float(m["value"]) if m["value"] is not None else None
        out.append(Fault(m["kind"], step, int(m["rank"]) if m["rank"] else None, m["cells"], value))
    return out


def for_cell(text: str | None, cell_id: str) -> str | None:
    """The faults a cell's workers run with, as written (for its record); the raw text if it does not parse."""
    try:
        mine = [f for f in parse(text) if f.cells is None or re.search(f.cells, cell_id)]
    except FaultError:
        return text or None
    return ",".join(map(str, mine)) or None


def for_worker(text: str | None, rank: int, cell_id: str) -> Fault | None:
    """The fault this rank of this cell applies, if any."""
    return next((f for f in parse(text) if f.applies(rank, cell_id)), None)


def check(text: str | None, cells, *, memory_limited: bool = False) -> list[tuple[str, str]]:
    """Why ZEROBENCH_FAULT would not fire as written on these cells (bench.matrix.cells.Cell values that will
    run): a step past a cell's last, a rank it does not have, a fault no cell matches. Each problem is
    (the fault as written, what is wrong); [] when every fault fires.
    memory_limited: the workers run under a memory limit below the host's RAM (what `oom` needs)."""
    try:
        faults = parse(text)
    except FaultError as e:
        return [(text or "", str(e))]
    problems = []
    for f in faults:
        spec = f"{f}{'~' + f.cells if f.cells else ''}"
        mine = [c for c in cells if f.cells is None or re.search(f.cells, c.id)]
        if not mine:
            problems.append((spec, "matches no cell that runs"))
        for c in mine:
            steps = c.warmup_steps + c.measured_steps
            if not 0 <= f.step < steps:
                problems.append((spec, f"step {f.step} is past {c.name}'s steps 0-{steps - 1}: it would never fire"))
            if f.rank is not None and f.rank >= c.ranks:
                problems.append((spec, f"{c.name} has ranks 0-{c.ranks - 1}: it would never fire"))
            if f.kind in ("nan", *VALUED) and c.engine != "deepspeed":
                problems.append((spec, f"{c.name} runs the {c.engine} engine, whose loss zerobench cannot poison"))
        if f.kind == "oom" and not memory_limited:
            problems.append((spec, "needs a memory cgroup limit below the host's RAM (it would take the whole host's)"))
    return list(dict.fromkeys(problems))
