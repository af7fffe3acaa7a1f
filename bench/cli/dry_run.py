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
    from ..execute.run import answer_preview, target
    from ..matrix import spec

    m = spec.load(s.matrix, ds_configs=s.ds_configs)
    t = target(s, m)
    whole = decide(m, s.matrix, s.filters, t.platform)  # the summary counts the matrix's cells, a shard's too
    where = f"on Slurm partition {t.partition.name}'s nodes" if t.partition is not None else here(assumed)
    print("\n".join(skip_summary(whole, where, reasons=verbose)))
    p = whole.part(s.shard)
    print("\n".join(preview(p, s, t.platform, _recorded(s, m.name) if s.resume else frozenset(), verbose)))
    if s.answer is not None:
        print("\n".join(answer_preview(p, s, t.platform)))
    return 0


def _recorded(s: RunSettings, name: str) -> frozenset[str]:
    """Hashes of the cells the results file already has an outcome for (their first repeat): what --resume
    leaves as it is. name: the matrix's."""
    from ..execute import default_results_path
    from ..records.store import Store

    path = Path(s.results or default_results_path(name, s.shard))
    if not path.is_file():
        return frozenset()
    done, _ = Store(path).resume_state()
    return frozenset(h for h, repeat in done if repeat == 1)
