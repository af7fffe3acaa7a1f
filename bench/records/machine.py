"""Where a record's attempt ran: the host's provenance (bench.host.env.provenance) and the machine it names, as a
stable identity that tells which measurements compare directly (bench.judge.blocks). Part of the record
(bench.records.record)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from .measured import CLOSED, OPEN

__all__ = ["Gpu", "Provenance", "Machine", "machine_of", "with_rates"]


class Gpu(BaseModel):
    model_config = OPEN
    index: int
    """NVML's index."""
    name: str
    """NVML's name."""
    memory_bytes: int | None = None
    """Total memory, as NVML reports it."""
    uuid: str | None = None
    """NVML's UUID."""


class Provenance(BaseModel):
    """Where a record came from (bench.host.env.provenance()): host, hardware, versions, git commit."""

    model_config = OPEN
    host: str | None = None
    """Host name."""
    boot_id: str | None = None
    """The host's boot id (bench.host.env.boot_id): new at every boot; absent from records before schema v3."""
    os: str | None = None
    """platform.platform()."""
    python: str | None = None
    """Python version."""
    cpu: str | None = None
    """CPU model."""
    cpu_count: int | None = None
    """Logical CPUs."""
    host_memory_bytes: int | None = None
    """Total host memory."""
    gpus: list[Gpu] = []
    """The GPUs NVML shows (within CUDA_VISIBLE_DEVICES)."""
    gpu_name: str | None = None
    """The first GPU's name."""
    gpu_count: int | None = None
    """How many GPUs NVML shows."""
    driver: str | None = None
    """NVIDIA driver version."""
    nvml: bool | None = None
    """Whether NVML answered (False on a GPU host without nvidia-ml-py: no NVML figures)."""
    versions: dict[str, str | None] = {}
    """The orchestrator's library versions; the worker's own are in worker.versions."""
    zerobench_version: str | None = None
    """The installed zerobench's version."""
    source_sha256: str | None = None
    """sha256 of the bench package's files: which code ran, whether or not it came from a git checkout."""
    git_commit: str | None = None
    """Only when zerobench ran from its own git checkout (never an enclosing repository's commit)."""
    git_dirty: bool | None = None
    """The checkout had uncommitted changes."""


class Machine(BaseModel):
    """Where an attempt ran, as a stable identity: measurements from one machine in one run part (a block,
    `Record.block`) compare directly; across blocks only through cells measured in both (bench.judge.blocks)."""

    model_config = CLOSED
    id: str
    """A short hash of the host's identity: boot id, host name, CPU model and count, the UUIDs of the GPUs it
    shows. Two records with one id ran on one machine (one boot of one host)."""
    gpus: list[str] = []
    """The UUIDs of the GPUs the attempt's ranks held (its placement's), else every GPU the host showed."""
    host: str | None = None
    boot_id: str | None = None
    """None where it is unknown (records before schema v3, a system without one)."""
    cpu: str | None = None
    cpu_count: int | None = None
    rates: dict[str, float | str] | None = None
    """The machine's rates as `zerobench probe` measured them (bench.host.rates.Rates.to_dict), where probed."""


def with_rates(m: Machine | None, rates: dict | None) -> Machine | None:
    """m with the probe's figures, validated as a record's (a thread count is a number like the rest)."""
    return Machine.model_validate({**m.model_dump(), "rates": rates}) if m is not None and rates else m


def machine_of(provenance: Any, held: list[int] | None = None) -> Machine | None:
    """The machine a provenance (Provenance or its dict) names, with the GPUs of `held` (NVML indexes, the
    placement's) as the attempt's; None where it names neither a boot id nor a GPU UUID (unknown)."""
    if provenance is None:
        return None
    p = provenance if isinstance(provenance, Provenance) else Provenance.model_validate(provenance)
    uuids = {g.index: g.uuid for g in p.gpus if g.uuid}
    if not p.boot_id and not uuids:
        return None
    key = [p.boot_id, p.host, p.cpu, p.cpu_count, sorted(uuids.values())]
    mine = [uuids[i] for i in held or () if i in uuids] or sorted(uuids.values())
    return Machine(
        id=hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12],
        gpus=mine,
        host=p.host,
        boot_id=p.boot_id,
        cpu=p.cpu,
        cpu_count=p.cpu_count,
    )
