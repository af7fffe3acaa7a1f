"""`zerobench cells`: a matrix's cells, each rule's reason once, then one line per cell; the summary a dry run
starts with."""

from __future__ import annotations

from collections import Counter

from .args import assume_gpus_arg, assumed_platform, filter_arg, here, matrix_arg, resolve


def add_parser(sub) -> None:
    c = sub.add_parser("cells", help="list a matrix's cells, with the reason each skipped one is skipped")
    matrix_arg(c)
    filter_arg(c)
    c.add_argument("--ds-config", nargs="+", metavar="JSON", help="list these DeepSpeed config files as cells")
    assume_gpus_arg(c)
    c.set_defaults(func=cmd_cells)


def cmd_cells(args) -> int:
    """Each rule's reason once, then one line per cell."""
    from ..execute import plan

    p = plan(resolve(args.matrix), args.filter, platform=assumed_platform(args.assume_gpus), ds_configs=args.ds_config)
    print("\n".join(skip_summary(p, here(args.assume_gpus), reasons=True)))
    for it in p.items:
        print(f"  run   {it.cell.id}" if it.skip is None else f"  skip  {it.cell.id}  ({it.skip.rule})")
    return 0


def skip_summary(p, where: str, reasons: bool) -> list[str]:
    """How many cells, how many runnable (where: judged where, in words), and how many each rule skips; reasons:
    each rule's why, fix and source once (the first cell it skips says them)."""
    skips = [it.skip for it in p.items if it.skip]
    lines = [f"{p.source}: {len(p.items)} cells, {len(p.items) - len(skips)} runnable {where}, {len(skips)} skipped"]
    said: dict[str, dict[str, object]] = {}  # rule -> its reasons as worded for each cell (a rule may name a setting)
    for s in skips:
        said.setdefault(s.rule, {}).setdefault(s.reason, s)
    for rule, n in Counter(s.rule for s in skips).most_common():
        lines.append(f"  {n:6d} skipped by {rule}")
        if reasons:
            s, k = next(iter(said[rule].values())), len(said[rule])
            more = f"  [one of its {k} wordings, by the cell's settings]" if k > 1 else ""
            lines += [f"           why: {s.reason}{more}", f"           fix: {s.fix}", f"           source: {s.source}"]
    return lines
