"""What several verbs share: the matrix argument and its embedded default, --filter, --assume-gpus, sizes, and
the types of their values."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_MATRIX = Path(__file__).parent.parent / "matrices" / "smoke.yaml"


def matrix_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "matrix",
        nargs="?",
        default=None,
        help=f"matrix YAML (default: the embedded CPU smoke matrix, {DEFAULT_MATRIX.name})",
    )


def filter_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--filter",
        action="append",
        metavar="REGEX",
        help="only cells whose name or id (name#hash) matches (repeatable: all must match), e.g. --filter zero=3; "
        "'mb=8$' ends the name, '#HASH$' the id",
    )


def assume_gpus_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--assume-gpus",
        type=positive,
        metavar="N",
        help="judge the rules as on a CUDA host with N GPUs and the gpu extra, e.g. to plan a GPU run from a laptop",
    )


def shard(v: str):
    from ..execute import Shard

    try:
        return Shard.parse(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive(v: str) -> int:
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return n


def resolve(m: str | None) -> str:
    """The matrix file given, or the embedded default."""
    return str(DEFAULT_MATRIX) if m is None else m


def sizes(args) -> tuple[int | None, int | None]:
    """--gpu-mem and --host-mem in bytes (None where not given); ValueError naming a size it cannot read."""
    from ..estimate.table import parse_size

    return (
        parse_size(args.gpu_mem) if args.gpu_mem else None,
        parse_size(args.host_mem) if args.host_mem else None,
    )


def here(assumed: int | None) -> str:
    """Where the rules judged the cells, in words: on the assumed GPUs (--assume-gpus), or this host."""
    return f"on a host with {assumed} CUDA GPU(s)" if assumed else "here"


def assumed_platform(n: int | None, host_mem: int | None = None):
    """This machine's versions, but N CUDA GPUs and the gpu extra: to plan a GPU host from anywhere. Its host
    memory is host_mem (--host-mem), not this machine's: unknown (nothing pruned for it) when not given."""
    if not n:
        return None
    from ..host import env

    real = env.probe()
    versions = {**real.versions, **{d: real.versions.get(d) or "assumed" for d in ("bitsandbytes", "liger-kernel")}}
    if "+cpu" in (versions.get("torch") or ""):
        versions["torch"] = versions["torch"].replace("+cpu", "+assumed-cuda")
    gpus = tuple(env.Gpu(i, "assumed GPU", 0, f"assumed-{i}") for i in range(n))
    return env.Platform(
        gpus=gpus,
        driver="assumed",
        versions=versions,
        host_memory_bytes=host_mem or 0,
        cpu_count=real.cpu_count,
    )
