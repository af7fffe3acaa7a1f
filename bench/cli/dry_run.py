"""`zerobench run --dry-run`: what the run would do, from one plan of the matrix (loaded once), judged where the
run would judge it (bench.execute.run.target)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .args import here
from .cells import skip_summary

if TYPE_CHECKING:
    from ..execute import RunSettings


def dry_run(s: RunSettings, verbose: bool, assumed: int | None = None) -> int:
    """What the run s would do, its summary last: the cells and each rule's count (its
    reason and every cell in run order with verbose), then what would run, its predicted GPU time and frontier,
    and in answer mode what it would measure first. assumed: the GPUs s.platform assumes (--assume-gpus)."""
    from ..execute.plan import decide, preview
    from ..execute.run import answer_preview, check_same_matrix, target
    from ..matrix import spec

    m = spec.load(s.matrix, ds_configs=s.ds_configs)
    if not s.other_matrix:  # what the run would refuse, before the plan is printed
        check_same_matrix(_results_path(s, m.name), m.name, s.matrix, s.resume)
    t = target(s, m)
    whole = decide(m, s.matrix, s.filters, t.platform)  # the summary counts the matrix's cells, a shard's too
    where = f"on Slurm partition {t.partition.name}'s nodes" if t.partition is not None else here(assumed)
    print("\n".join(skip_summary(whole, where, reasons=verbose)))
    if not t.platform.cuda and t.partition is None:
        print(NO_GPU_HINT)
    p = whole.part(s.shard)
    recorded = _recorded(s, m.name) if s.resume else frozenset()
    print("\n".join(preview(p, s, t.platform, recorded, verbose)))
    if s.answer is not None:
        print("\n".join(answer_preview(p, s, t.platform)))
    else:
        for line in _answer_instead(p, s, t.platform, recorded):
            print(line)
    return 0


NO_GPU_HINT = (
    "no GPU here: the cells that need CUDA are skipped and the plan is a CPU run's; `--assume-gpus N` plans the "
    "run as on a host with N GPUs (`--gpu-mem SIZE`: each GPU's memory, e.g. 80GiB)"
)
LONG_RUN_S = 3600
"""A full run predicted longer than this is told what answer mode would do instead."""
ANSWER_BUDGET = ("20m", 1200.0)
"""The budget the long-run hint prices (docs/answer-mode.md's example)."""


def _answer_instead(p, s: RunSettings, platform, recorded: frozenset[str]) -> list[str]:
    """For a full run predicted to take long: one line of what it costs and what answer mode would do instead."""
    from ..execute.plan import run_seconds_of
    from ..execute.run import answer_budget_cells

    total = run_seconds_of(p, s, platform, recorded)
    if total <= LONG_RUN_S:
        return []
    text, budget_s = ANSWER_BUDGET
    k, each = answer_budget_cells(p, s, platform, budget_s)
    if not k:
        return []
    return [
        f"the full run: ~{_rough(total)} on 1 GPU; `--answer --budget {text}` measures about {k} cells (about "
        f"{each:.0f} s each, predicted) and stops sooner if the answer settles (docs/answer-mode.md)"
    ]


def _rough(seconds: float) -> str:
    """A duration to two figures at most: 45h, 3.5h, 50m."""
    h = seconds / 3600
    return f"{h:.0f}h" if h >= 10 else f"{h:.1f}h" if h >= 1 else f"{seconds / 60:.0f}m"


def _results_path(s: RunSettings, name: str) -> Path:
    from ..execute import default_results_path

    return Path(s.results or default_results_path(name, s.shard))


def _recorded(s: RunSettings, name: str) -> frozenset[str]:
    """Hashes of the cells the results file already has an outcome for (their first repeat): what --resume
    leaves as it is. name: the matrix's."""
    from ..records.store import Store

    path = _results_path(s, name)
    if not path.is_file():
        return frozenset()
    done, _ = Store(path).resume_state()
    return frozenset(h for h, repeat in done if repeat == 1)
