"""Baseline against current: per cell (matched by cell hash), is anything worse beyond the noise?

results (store) -> results.load() -> samples() per side -> compare() -> Comparison -> markdown() / exit code

What each figure is held to (thresholds: bench.matrix.spec.CompareSettings, per matrix, `--thresholds`):
- noisy figures (tokens/s, median step time): bench.stats.judge_noisy, the one rule of the reports and answer
  mode: the ratio of the two sides' geometric means over their process-level repeats, with an interval at
  1 - 2 alpha (90%: one-sided 95% either way) whose variance is the larger of what the measurements' noise
  allows (bench.records.quality, measured on the committed runs; one repeat a side is judged by that noise) and what
  the repeats' spread shows; changed only when the whole interval lies beyond the minimum effect;
- machines (bench.records.record.Machine): the sides ran on one machine (or no record of either side says which):
  compared directly. On different machines, or where some records say and some do not (unknown is not the same),
  a machine is faster or slower as a whole: the difference is estimated from the cells measured ok on both sides
  (anchors; their median log ratio, at least MIN_ANCHORS of them), taken out of each cell's ratio and added to
  its uncertainty with each cell's own deviation from it (bench.records.quality.CROSS).
  A change common to every cell cannot be told from the machines' difference, and the Markdown says so;
- figures that repeat exactly or nearly (allocator peaks and the memory between steps, NVML peaks,
  host RSS, first and final loss): bench.stats.judge_bound, a tight bound widened to the spread the
  repeats themselves show; the final loss is each side's loss at the last step every repeat of both
  sides ran (`common_step`), so cells whose adaptive schedules ran different numbers of steps compare
  the same point of training;
- status: a cell ok in the baseline that fails now (in any repeat) is a regression; one that failed
  and now runs is an improvement;
- environment: a different GPU, driver, CUDA or library version makes a cell "not comparable", never
  a regression (its figures are still shown); so does another step schedule (answer mode's short
  schedule against the matrix's: the built-in data of a run of other length differs from its first
  batch, so even the first loss moves). A side with records of both schedules is judged on the matrix's;
- coverage: a comparison counts only when it compared at least `min_compared` of the baseline's cells
  that ran; a side served by the replay executor (`zerobench run --replay`) is named as a replay.
Exit code for CI: 0 no regression, 1 regression, 2 bad input (bench.cli), 3 compared too little.

"""

from __future__ import annotations

import dataclasses
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .. import stats
from ..matrix.problems import ConfigError, Problem
from ..matrix.spec import CompareSettings
from ..records import quality
from ..records.status import Status

__all__ = [
    "FIGURES",
    "ENVIRONMENT",
    "Figure",
    "CellComparison",
    "Comparison",
    "CellSamples",
    "samples",
    "cell_key",
    "common_step",
    "compare",
    "settings",
    "escape",
    "clip",
    "REGRESSION",
    "NOT_COMPARABLE",
]


MIN_ANCHORS = 3  # cells measured on both machines, to tell a machine's difference from one cell's change

REGRESSION = stats.REGRESSION

IMPROVEMENT = stats.IMPROVEMENT

UNCHANGED = "unchanged"

NOT_SETTLED = stats.NOT_SETTLED

NOT_COMPARABLE = "not comparable"

NOT_RUN = "not run"

NEW, MISSING = "new", "missing"

# Worst first: a cell's verdict is the worst of its figures'.
VERDICT_ORDER = [REGRESSION, NOT_COMPARABLE, NOT_SETTLED, IMPROVEMENT, UNCHANGED, NOT_RUN, NEW, MISSING]

COMPARED = (REGRESSION, NOT_SETTLED, IMPROVEMENT, UNCHANGED)
"""Verdicts of cells that were compared: measured (or failing) on both sides, in one schedule and environment."""

# Statuses that are no measurement of the cell (a rule or the memory model, a lighter cell's out-of-memory
# end, the orchestrator stopping, answer mode leaving it out): the cell that ran out is compared itself.
NOT_RUN_STATUSES = (
    Status.SKIPPED.value, Status.IMPLIED_OOM.value, Status.INTERRUPTED.value, Status.UNMEASURED.value,
    Status.STARTED.value,
)  # fmt: skip

SHORT_SCHEDULE = "answer mode's short schedule (rung 0)"

EXIT_TOO_LITTLE = 3


@dataclass(frozen=True)
class Figure:
    column: str
    label: str
    kind: str
    """"noisy" (test + minimum effect) or "bound" (a tolerance)."""
    tolerance: str | None = None
    """The CompareSettings field that bounds it (bound figures)."""
    higher_is_better: bool = False
    relative: bool = True
    both_ways: bool = False
    unit: str = ""


FIGURES = [
    Figure("tokens_per_s", "tokens/s", "noisy", higher_is_better=True),
    Figure("step_time_median_s", "step time", "noisy", unit="s"),
    Figure("torch_max_allocated_bytes", "allocator peak", "bound", "memory_tolerance", unit="bytes"),
    Figure("torch_max_reserved_bytes", "allocator reserved peak", "bound", "memory_tolerance", unit="bytes"),
    Figure("torch_allocated_between_steps_bytes", "between steps", "bound", "memory_tolerance", unit="bytes"),
    Figure("nvml_proc_peak_bytes", "NVML process peak", "bound", "nvml_tolerance", unit="bytes"),
    Figure("host_rss_peak_bytes", "host RSS peak", "bound", "host_rss_tolerance", unit="bytes"),
    Figure("loss_first", "first loss", "bound", "loss_first_tolerance", relative=False, both_ways=True),
    Figure("loss_final", "final loss", "bound", "loss_final_tolerance", relative=False),
]

# What must be equal for two measurements to be comparable at all (results frame columns).
ENVIRONMENT = [
    ("gpu_name", "GPU"),
    ("gpu_count", "GPU count"),
    ("gpu_driver", "driver"),
    ("cuda_version", "CUDA"),
    ("torch_version", "torch"),
    ("deepspeed_version", "DeepSpeed"),
    ("transformers_version", "transformers"),
    ("peft_version", "peft"),
]

# -- samples per side -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CellSamples:
    """One cell's repeats on one side: the last record of each repeat index."""

    key: str
    cell_name: str
    status: str
    """ok when every repeat ended ok; else the first failing repeat's status (skipped if it was skipped)."""
    reason: str
    repeats: int
    values: dict[str, list[float]]
    """Per figure column, the ok repeats' values (finite ones)."""
    environment: dict[str, tuple]
    """Per ENVIRONMENT column, the distinct values the repeats ran with (sorted, as strings)."""
    noise: list[float] = field(default_factory=list)
    """Each ok repeat's noise on the log scale (bench.records.quality.noise_sd), in the order of `values`' tokens/s."""
    machines: tuple = ()
    """The machines its repeats that ran were measured on (bench.records.record.Machine ids; None: unknown)."""
    blocks: tuple = ()
    """The blocks (run part x machine) of those repeats."""
    step_times: list[list[float]] = field(default_factory=list)
    """Each ok repeat's measured step times (the within-run view)."""
    losses: list[list[float]] = field(default_factory=list)
    """Each ok repeat's loss per step, warmup included (adaptive repeats may differ in length)."""
    schedule: tuple[str, ...] = ()
    """The step schedules the repeats that ran asked for (`steps_schedule`; answer mode's rung 0 named)."""


def common_step(*sides: CellSamples | None) -> int | None:
    """The last step (1-based) that every ok repeat of every side ran, where some repeat ran more: losses
    compare there. None when all ran the same steps (the final loss is then that step's) or a repeat
    has no loss curve (records that predate it: the final loss stands)."""
    curves = [ls for s in sides if s is not None for ls in s.losses]
    if not curves or any(not ls for ls in curves) or len({len(ls) for ls in curves}) == 1:
        return None
    return min(len(ls) for ls in curves)


def loss_at(s: CellSamples, step: int) -> list[float]:
    """Each ok repeat's loss at a step (1-based)."""
    return stats.finite(ls[step - 1] for ls in s.losses if len(ls) >= step)


def cell_key(row: dict) -> str:
    """How a cell is matched across results: its hash (and selfcheck's variant, which runs it several ways)."""
    v = row.get("variant")
    return f"{row['cell_hash']}:{v}" if isinstance(v, str) and v else str(row["cell_hash"])


def _present(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _text(v) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _ran(r: dict) -> bool:
    return r["status"] not in NOT_RUN_STATUSES


def _schedule(r: dict) -> str:
    """The steps a record's attempt asked for: the cell's schedule, or answer mode's short one (rung 0), whose
    record keeps the matrix's cell (a replay's rung 0 served a recorded end: that end's schedule)."""
    rung, full = r.get("answer_rung"), str(r.get("steps_schedule") or "")
    short = _present(rung) and int(rung) == 0 and not isinstance(r.get("replay_source"), str)
    return f"{full}, {SHORT_SCHEDULE}" if short else full


def _one_schedule(recs: list[dict]) -> list[dict]:
    """A cell's repeats on one schedule: where answer mode measured it on both, the matrix's (its rung-0
    records left out), so a side's samples are of one schedule."""
    full = [r for r in recs if SHORT_SCHEDULE not in _schedule(r)]
    return full if full and len(full) < len(recs) and any(_ran(r) for r in full) else recs


def samples(df, one_schedule: bool = False) -> dict[str, CellSamples]:
    """A results frame (bench.judge.results.load) -> per cell key, its repeats' figures, in first-seen order.

    A repeat's last record stands for it (a re-run after an interruption replaces the attempt); records
    without a repeat index are repeat 1, so an old results file gives one sample per cell. Repeats are counted
    per results file (the frame's `results_file`, from bench.judge.results.load): each file's are its own.
    one_schedule: of a cell answer mode measured on both its schedules, the matrix's only (what compare judges;
    answer mode itself counts both as measurements of its tokens/s)."""

    if df is None or df.empty:
        return {}
    need = ["cell_hash", "variant", "repeat", "status", "reason", "cell_name", "warmup_steps", "step_times_s", "losses"]
    need += ["noise_sd", "machine", "block", "steps_schedule", "answer_rung", "replay_source", "results_file"]
    need += [f.column for f in FIGURES] + [col for col, _ in ENVIRONMENT]
    cols = [c for c in need if c in df]
    # Column lists zipped, not to_dict("records") over the frame: a 10k-row report stays fast.
    rows = [dict(zip(cols, vals)) for vals in zip(*(df[c].tolist() for c in cols))]
    per_cell: dict[str, dict[tuple[int, int], dict]] = {}
    files: dict[str, int] = {}  # the order the results files came in
    for r in rows:
        rep = r.get("repeat")
        # Repeats are numbered per results file: two files' repeat 1 are two samples (two runs), not one replaced.
        src = files.setdefault(str(r.get("results_file") or ""), len(files))
        per_cell.setdefault(cell_key(r), {})[(src, int(rep) if _present(rep) else 1)] = r
    out = {}
    for key, reps in per_cell.items():
        recs = [reps[i] for i in sorted(reps)]
        recs = _one_schedule(recs) if one_schedule else recs
        failing = [r for r in recs if r["status"] != Status.OK.value]
        ok = [r for r in recs if r["status"] == Status.OK.value]
        first_bad = failing[0] if failing else None
        ran = [r for r in recs if _ran(r)]
        steps = []
        losses = [ls for r in ok if isinstance(ls := r.get("losses"), list)]
        if len(losses) != len(ok):  # one repeat without a curve: none is used (the final loss stands)
            losses = []
        for r in ok:
            t = r.get("step_times_s")
            w = int(r["warmup_steps"]) if _present(r.get("warmup_steps")) else 0
            if isinstance(t, list):
                steps.append(stats.finite(t[w:]))
        out[key] = CellSamples(
            key=key,
            cell_name=str(recs[-1]["cell_name"]),
            status=first_bad["status"] if first_bad is not None else Status.OK.value,
            reason=str(first_bad.get("reason") or "") if first_bad is not None else "",
            repeats=len(recs),
            values={f.column: stats.finite(r.get(f.column) for r in ok) for f in FIGURES},
            noise=[float(r["noise_sd"]) for r in ok if _present(r.get("noise_sd")) and _present(r.get("tokens_per_s"))],
            machines=tuple(dict.fromkeys(r.get("machine") if _present(r.get("machine")) else None for r in ran)),
            blocks=tuple(dict.fromkeys(r.get("block") for r in ran if _present(r.get("block")))),
            # From the repeats that ran: a skipped or interrupted record says nothing about the software that measures.
            environment={
                col: tuple(sorted({_text(r[col]) for r in ran if _present(r.get(col))})) for col, _ in ENVIRONMENT
            },
            step_times=steps,
            losses=losses,
            schedule=tuple(sorted({_schedule(r) for r in ran})),
        )
    return out


# -- the comparison ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Machines:
    """Where the two sides ran, and what that does to the comparison."""

    baseline: tuple = ()
    """The machine ids of the baseline's attempts (None: a record that does not say)."""
    current: tuple = ()
    blocks: tuple[int, int] = (0, 0)
    """How many blocks (run parts on one machine) each side's attempts come from."""
    same: bool = True
    """One machine on both sides, or no record of either side says: compared directly."""
    anchors: int = 0
    """Across machines: the cells measured ok on both sides, whose median log ratio is the machines' difference."""
    offset: float | None = None
    """ln(current machine's speed / baseline machine's), from the anchors (None: one machine, or too few)."""
    offset_var: float = 0.0
    cross: float = 0.0
    """Each cell's own deviation from the machines' difference (bench.records.quality.CROSS), on each side."""


@dataclass(frozen=True, kw_only=True)
class CellComparison:
    key: str
    cell_name: str
    verdict: str
    base: CellSamples | None
    cur: CellSamples | None
    figures: dict[str, stats.Judgement] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    """Why the verdict (one line per regression, status change or environment difference)."""
    environment_diff: list[tuple[str, str, str]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Comparison:
    baseline: str
    current: str
    settings: CompareSettings
    settings_source: str
    cells: list[CellComparison]
    machines: Machines = field(default_factory=Machines)
    replayed: dict[str, list[str]] = field(default_factory=dict)
    """Per side ("baseline", "current") with replayed records: the files the replay executor served them from."""

    @property
    def regressions(self) -> list[CellComparison]:
        return [c for c in self.cells if c.verdict == REGRESSION]

    @property
    def coverage(self) -> tuple[int, int]:
        """(cells compared, baseline cells that ran): what `min_compared` holds the comparison to."""
        ran = [c for c in self.cells if c.base is not None and c.base.status not in NOT_RUN_STATUSES]
        return sum(c.verdict in COMPARED for c in ran), len(ran)

    @property
    def too_little(self) -> bool:
        """Fewer than `min_compared` of the baseline's cells that ran were compared (or none at all)."""
        done, ran = self.coverage
        return self.settings.min_compared > 0 and (done == 0 or done < self.settings.min_compared * ran)

    @property
    def exit_code(self) -> int:
        """1 on a regression; else 3 when it compared too little; else 0."""
        return 1 if self.regressions else EXIT_TOO_LITTLE if self.too_little else 0

    def coverage_line(self) -> str:
        """What was compared, against the threshold."""
        done, ran = self.coverage
        if not ran:
            return "compared nothing: no cell of the baseline ran (each was skipped, implied or left unmeasured)"
        line = f"compared {done} of the baseline's {ran} cells that ran"
        if not self.too_little:
            return line
        return (
            f"{line}: too little (at least {self.settings.min_compared:.0%} must be; `min_compared`): cells in "
            "common, measured on both sides in one schedule and environment; check that both sides ran the same "
            "matrix (or shard) on the same kind of machine"
        )

    def replay_lines(self) -> list[str]:
        """Each side that is a replay, said as such."""
        return [
            f"{side} ({getattr(self, side)}) is a replay: nothing in it ran anew; its measurements were recorded "
            f"earlier and served by `zerobench run --replay` from {', '.join(files)}"
            for side, files in self.replayed.items()
        ]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in VERDICT_ORDER:
            n = sum(1 for c in self.cells if c.verdict == v)
            if n:
                out[v] = n
        return out

    @property
    def single_repeat(self) -> list[CellComparison]:
        """Compared cells with one ok repeat on a side: their noise could not be estimated."""
        return [c for c in self.cells if c.figures and min(c.figures["tokens_per_s"].n or (0,)) < 2]


def _env_diff(b: CellSamples, c: CellSamples) -> list[tuple[str, str, str]]:
    out = []
    for col, label in ENVIRONMENT:
        vb, vc = b.environment.get(col, ()), c.environment.get(col, ())
        if vb and vc and vb != vc:  # a side that did not say (a CPU run has no driver) is no difference
            out.append((label, ", ".join(map(clip, vb)) or "none", ", ".join(map(clip, vc)) or "none"))
    return out


def machines(b: dict[str, CellSamples], c: dict[str, CellSamples]) -> Machines:
    """The sides' machines, and across machines their difference in speed from the anchors."""
    mb = tuple(dict.fromkeys(m for x in b.values() for m in x.machines))
    mc = tuple(dict.fromkeys(m for x in c.values() for m in x.machines))
    n = (len({k for x in b.values() for k in x.blocks}), len({k for x in c.values() for k in x.blocks}))
    known = {m for m in mb + mc if m}
    # Unknown is not the same machine: only records that name none on either side (before machine ids) compare
    # directly; any that do, and one that does not, leave the sides' machines to the anchors.
    if not known or (len(known) == 1 and None not in mb + mc):
        return Machines(baseline=mb, current=mc, blocks=n)
    gpu = any(x.environment.get("gpu_name") for x in [*b.values(), *c.values()])
    cross = quality.CROSS["gpu" if gpu else "cpu"]
    diffs = [_log_ratio(b[k], c[k]) for k in b if k in c and b[k].status == c[k].status == Status.OK.value]
    diffs = [d for d in diffs if d is not None]
    if len(diffs) < MIN_ANCHORS:
        return Machines(baseline=mb, current=mc, blocks=n, same=False, anchors=len(diffs), cross=cross)
    offset = stats.median([d for d, _ in diffs])
    # The median's variance: pi/2 times a mean's, for normal errors.
    var = math.pi / 2 * (sum(v for _, v in diffs) / len(diffs) + 2 * cross**2) / len(diffs)
    return Machines(
        baseline=mb, current=mc, blocks=n, same=False, anchors=len(diffs), offset=offset, offset_var=var, cross=cross
    )


def _log_ratio(b: CellSamples, c: CellSamples) -> tuple[float, float] | None:
    """ln(current tokens/s over baseline's), the means of the repeats' logs, and its variance (the one rule)."""
    vb, vc = b.values["tokens_per_s"], c.values["tokens_per_s"]
    if not vb or not vc or min(vb + vc) <= 0:
        return None
    return stats.log_diff([math.log(x) for x in vb], _sd(b, vb), [math.log(x) for x in vc], _sd(c, vc))


def _sd(side: CellSamples, values: list[float]) -> list[float]:
    """Each value's noise: the repeats' own where the record had it, else the noisiest kind's (a clean GPU
    measurement's where the side ran on a GPU)."""
    if len(side.noise) == len(values):
        return side.noise
    fallback = quality.NOISE["gpu" if side.environment.get("gpu_name") else "cpu"]
    return [max(side.noise, default=fallback)] * len(values)


def _judge(
    f: Figure, b: CellSamples, c: CellSamples, s: CompareSettings, m: Machines, vb=None, vc=None
) -> stats.Judgement:
    vb = b.values[f.column] if vb is None else vb
    vc = c.values[f.column] if vc is None else vc
    if f.kind == "noisy" and not m.same and m.offset is None:
        base, cur = stats.median(vb), stats.median(vc)
        return stats.Judgement(
            verdict=stats.NO_DATA, base=base, cur=cur, ratio=cur / base if base and cur else None, n=(len(vb), len(vc)),
            why=f"not compared: different machines, fewer than {MIN_ANCHORS} cells measured on both",
        )  # fmt: skip
    if f.kind == "noisy":
        # Across machines, the machines' difference out of each cell's ratio (step time moves the other way).
        offset = (
            (0.0, 0.0)
            if m.offset is None
            else (m.offset if f.higher_is_better else -m.offset, m.offset_var + 2 * m.cross**2)
        )
        return stats.judge_noisy(
            vb, vc, higher_is_better=f.higher_is_better, conf=1 - 2 * s.alpha, min_effect=s.min_effect,
            base_sd=_sd(b, vb), cur_sd=_sd(c, vc), offset=offset,
        )  # fmt: skip
    return stats.judge_bound(vb, vc, tolerance=getattr(s, f.tolerance), relative=f.relative, both_ways=f.both_ways)


def _verdict(
    b: CellSamples, c: CellSamples, env: list, m: Machines, figures: dict[str, stats.Judgement]
) -> tuple[str, list[str]]:
    """A cell's verdict from its statuses, environments, machines and figures, and why."""
    ok = Status.OK.value
    if b.status in NOT_RUN_STATUSES or c.status in NOT_RUN_STATUSES:
        return NOT_RUN, [f"{b.status} in the baseline, {c.status} now"]
    if b.schedule and c.schedule and b.schedule != c.schedule:
        return NOT_COMPARABLE, [
            f"steps: {'; '.join(b.schedule)} -> {'; '.join(c.schedule)}: another schedule trains on other batches "
            "(its first loss too); compare runs of one schedule"
        ]
    if env:
        return NOT_COMPARABLE, [f"{label}: {vb} -> {vc}" for label, vb, vc in env]
    if b.status == ok and c.status != ok:
        return REGRESSION, [f"ok in the baseline, {c.status} now: {c.reason[:200]}"]
    if b.status != ok and c.status == ok:
        return IMPROVEMENT, [f"{b.status} in the baseline, ok now"]
    if b.status != ok:
        return UNCHANGED, [f"failing on both sides ({b.status} -> {c.status})"]
    untied = not m.same and m.offset is None  # across machines with too few anchors: the noisy figures wait
    judged = [f for f in FIGURES if not (untied and f.kind == "noisy")]
    worst = [f for f in judged if figures[f.column].verdict == REGRESSION]
    better = [f for f in judged if figures[f.column].verdict == IMPROVEMENT]
    unsure = [f for f in judged if figures[f.column].verdict == NOT_SETTLED]
    reasons = [f"{f.label}: {figures[f.column].why}" for f in worst or unsure or better]
    if untied and not worst:
        why = f"different machines, and {m.anchors} cell(s) measured on both: at least {MIN_ANCHORS} are needed "
        return NOT_COMPARABLE, [why + "to tell the machines' difference from a change of this cell", *reasons]
    return (REGRESSION if worst else NOT_SETTLED if unsure else IMPROVEMENT if better else UNCHANGED), reasons


def _compare_cell(
    key: str, b: CellSamples | None, c: CellSamples | None, s: CompareSettings, m: Machines
) -> CellComparison:
    if b is None or c is None:
        one = b or c
        return CellComparison(
            key=key,
            cell_name=one.cell_name,
            verdict=NEW if b is None else MISSING,
            base=b,
            cur=c,
            reasons=["not in the baseline" if b is None else "in the baseline, not in the current results"],
        )
    ok = Status.OK.value
    env = _env_diff(b, c)
    figures = {}
    if b.status == ok and c.status == ok:
        figures = {f.column: _judge(f, b, c, s, m) for f in FIGURES}
        step = common_step(b, c)
        if step is not None:  # not each side's own last step: the same point of training on both
            f = next(f for f in FIGURES if f.column == "loss_final")
            j = _judge(f, b, c, s, m, loss_at(b, step), loss_at(c, step))
            figures[f.column] = dataclasses.replace(j, why=f"at step {step}, the last both sides ran: {j.why}")
    verdict, reasons = _verdict(b, c, env, m, figures)
    return CellComparison(
        key=key,
        cell_name=c.cell_name,
        verdict=verdict,
        base=b,
        cur=c,
        figures=figures,
        reasons=reasons,
        environment_diff=env,
    )


def compare(
    base_df,
    cur_df,
    *,
    settings: CompareSettings | None = None,
    settings_source: str = "defaults",
    baseline: str = "baseline",
    current: str = "current",
) -> Comparison:
    """Every cell of either side, baseline order first, then cells only the current results have."""
    s = settings or CompareSettings()
    b, c = samples(base_df, one_schedule=True), samples(cur_df, one_schedule=True)
    keys = list(b) + [k for k in c if k not in b]
    m = machines(b, c)
    return Comparison(
        baseline=baseline,
        current=current,
        settings=s,
        settings_source=settings_source,
        cells=[_compare_cell(k, b.get(k), c.get(k), s, m) for k in keys],
        machines=m,
        replayed={side: files for side, df in (("baseline", base_df), ("current", cur_df)) if (files := _replayed(df))},
    )


def _replayed(df) -> list[str]:
    """The files a side's replayed records were served from (none: nothing in it is a replay)."""
    if df is None or "replay_source" not in df:
        return []
    return sorted(str(x) for x in df["replay_source"].dropna().unique())


# -- thresholds -------------------------------------------------------------------------------------


def _section(path: Path) -> dict:
    """The compare mapping of a file: a matrix's `compare:` section, or a file that is only that mapping."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError([Problem(str(path), "", f"cannot read thresholds: {e}", "give a YAML file")]) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            [Problem(str(path), "", "expected a mapping", "see CompareSettings in bench/matrix/spec/schema.py")]
        )
    if "compare" in raw or "axes" in raw or "model" in raw:  # a matrix file
        return raw.get("compare") or {}
    return raw


def settings(matrix_files: list[str], thresholds: str | None) -> tuple[CompareSettings, str]:
    """Defaults, then the current results' matrix's `compare:` section (where the file is here), then
    --thresholds: each replaces what it names. Returns the settings and where they came from."""
    merged: dict[str, Any] = {}
    sources = []
    for f in matrix_files:
        p = Path(f)
        if p.is_file():
            try:
                sec = _section(p)
            except ConfigError:
                continue  # the matrix of a results file is context, not input: unreadable means defaults
            if sec:
                merged.update(sec)
                sources.append(str(p))
    if thresholds:
        p = Path(thresholds)
        if not p.is_file():
            raise ConfigError([Problem(thresholds, "", "no such thresholds file", "give a YAML file")])
        merged.update(_section(p))
        sources.append(str(p))
    try:
        s = CompareSettings.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(
            [
                Problem(sources[-1] if sources else "<thresholds>", ".".join(map(str, x["loc"])), x["msg"], "")
                for x in e.errors()
            ]
        ) from None
    return s, (" + ".join(["defaults", *sources]))


# -- recorded strings as output prints them ---------------------------------------------------------
CLIP = 200
"""The most characters of one recorded string (a host, CPU, driver or OS name) that a report or the console shows."""


def clip(s, most: int = CLIP) -> str:
    """A recorded string for output: whole when short, else its start and how long it was (a record may hold a
    field of 64 KiB, bench.records.store.MAX_TEXT_CHARS, which no line of a report should print whole)."""
    s = "" if s is None else str(s)
    return s if len(s) <= most else f"{s[:most]}… ({len(s):,} characters)"


def escape(s) -> str:
    """Text for Markdown (a table cell, a line): HTML-escaped, then Markdown's syntax neutralised, on one line. A
    cell name, a driver string or a reason is data: rendered as text, never as markup (the reports' escape too)."""
    s = html.escape("" if s is None else str(s), quote=False)
    return re.sub(r"([\\`*_\[\]|#!~])", r"\\\1", s).replace("\r", " ").replace("\n", " ")
