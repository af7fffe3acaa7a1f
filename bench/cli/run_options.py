"""`zerobench run`'s options as one value, bench.execute.RunSettings, built once and read alike by the dry run
and the run; each option the run cannot take is said as a ValueError naming it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .args import assumed_platform, resolve, sizes

if TYPE_CHECKING:
    from ..execute import AnswerSettings, RunSettings

# zerobench run's Slurm options: the matrix's slurm block keys they override (bench.matrix.spec.SlurmSettings).
_SLURM_OPTIONS = {
    "partition": "--partition",
    "account": "--account",
    "qos": "--qos",
    "time_limit": "--time-limit",
    "mem_per_node": "--mem-per-node",
    "max_jobs": "--max-jobs",
    "folder": "--slurm-folder",
}


def settings_of(args) -> RunSettings:
    """The run the command line asks for; ValueError naming an option it cannot take."""
    from ..execute import RunSettings

    slurm = _slurm_options(args)
    gpu_mem, host_mem = sizes(args)
    return RunSettings(
        matrix=resolve(args.matrix),
        filters=tuple(args.filter or ()),
        ds_configs=tuple(args.ds_config) if args.ds_config else None,
        shard=args.shard,
        results=args.results,
        other_matrix=args.other_matrix,
        logs=args.logs,
        resume=args.resume,
        repeats=args.repeats,
        order=args.order,
        prune=not args.no_prune,
        gpu_mem=gpu_mem,
        host_mem=host_mem,
        executor=args.executor,
        gpus_available=args.gpus_available,
        pack=args.pack,
        address=args.address,
        slurm=slurm,
        platform=assumed_platform(args.assume_gpus, host_mem),
        answer=_answer_settings(args),
        replay=tuple(args.replay or ()),
        progress=not args.no_progress,
    )


def _answer_settings(args) -> AnswerSettings | None:
    """--answer and its options; None without --answer."""
    options = (
        ("--budget", args.budget),
        ("--group-by", args.group_by),
        ("--pairs", args.pairs),
        ("--screen", args.screen),
    )
    options += tuple((f, True) for f, on in (("--collapse", args.collapse), ("--no-frontier", args.no_frontier)) if on)
    given = [f for f, v in (*options, ("--settle", args.settle)) if v is not None]  # "" is given too: refused below
    if not args.answer:
        if given:
            raise ValueError(f"{', '.join(given)} only with --answer")
        return None
    if args.repeats:
        raise ValueError("--repeats with --answer: answer mode measures a cell again only while it is in contention")
    from ..execute import AnswerSettings
    from ..matrix.axes import AXIS

    text = "peft" if args.group_by is None else args.group_by
    group_by = tuple(g.strip() for g in text.split(",") if g.strip())
    if not group_by:
        raise ValueError(f"--group-by {args.group_by!r}: name the axes to group by, e.g. peft or peft,zero_stage")
    unknown = [g for g in group_by if g not in AXIS]
    if unknown:
        raise ValueError(f"--group-by {','.join(unknown)}: not an axis; one of {', '.join(AXIS)}")
    return AnswerSettings(
        group_by=group_by,
        budget_s=_duration(args.budget) if args.budget is not None else None,
        pairs=args.pairs or AnswerSettings.pairs,
        settle=chance_level(args.settle) if args.settle is not None else AnswerSettings.settle,
        screen=args.screen or 0,
        collapse=args.collapse,
        frontier=not args.no_frontier,
    )


def _duration(text: str) -> float:
    """Seconds from "90s", "20m", "1h", "1h30m": a unit is required (a bare 20 could mean seconds or minutes)."""
    from ..matrix.spec import duration_s

    if text.strip().replace(".", "", 1).isdigit():
        raise ValueError(f"--budget {text}: give a unit, e.g. {text.strip()}m or {text.strip()}s")
    try:
        return duration_s(text)
    except ValueError as e:
        raise ValueError(f"--budget {e}") from None


def chance_level(text: str) -> float:
    """A chance from "5%" or "0.05", from one in the settling draws (bench.execute.answer.settle.DRAWS: below that no
    chance is told from none, and the search would never settle) to one half (above, "settled" would allow a cell that
    more likely than not beats the leader)."""
    from ..execute.answer.settle import DRAWS

    try:
        v = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        v = -1.0
    if not 1 / DRAWS <= v <= 0.5:
        raise ValueError(
            f"--settle {text}: a chance from {100 / DRAWS:g}% to 50%, such as 5% or 0.05 (below {100 / DRAWS:g}%, one "
            f"in the search's {DRAWS} joint draws, no chance is told from none)"
        )
    return v


def _slurm_options(args) -> dict | None:
    """The Slurm options given, checked as the matrix's slurm block checks them; ValueError naming the option."""
    given = {k: getattr(args, "slurm_folder" if k == "folder" else k) for k in _SLURM_OPTIONS}
    given = {k: v for k, v in given.items() if v is not None}
    if args.executor != "slurm":
        if given:
            raise ValueError(f"{', '.join(_SLURM_OPTIONS[k] for k in given)} only with --executor slurm")
        return None
    if args.assume_gpus:
        raise ValueError("--assume-gpus with --executor slurm: the partition's nodes say what a cell has (sinfo)")
    from pydantic import ValidationError

    from ..matrix.spec import SlurmSettings

    try:
        SlurmSettings.model_validate(given)
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"{_SLURM_OPTIONS[str(err['loc'][0])]} {err['msg'].removeprefix('Value error, ')}") from None
    return given
