"""The replay executor (`zerobench run M --replay FILE...`): recorded measurements served as if the cells
ran, so a search (answer mode) can be checked against a grid that was measured in full, at no GPU cost.

Nothing runs. Each attempt of a cell gets that cell's next recorded end from the files (an end that ran:
ok or a failure, in the order recorded; past the last, the last again, marked reused). The plan is judged
as on the recorded machine (its GPUs, memory and library versions, from the records' provenance), and a
cell of the matrix with no recorded end is skipped by the rule `not-recorded`. Every record this makes
carries `replay` (the file and the record it replays) and keeps the recorded provenance: a report made
from it says it is a replay.

Refused before anything is served (InputError), since the replayed answer would otherwise depend on the
order the files are given in: files recorded on different machines (a CPU host and an H200: the plan can
be judged as on one of them only), and cells whose recorded ends disagree (an ok end and a failure).
"""

from __future__ import annotations

import dataclasses
import queue
from dataclasses import dataclass
from pathlib import Path

from ...host import env
from ...matrix import rules
from ...matrix.problems import InputError
from ...records import store
from ...records.record import Provenance
from ..plan import Plan
from .executor import Attempt, Finished, Handle
from .local import Slots

__all__ = ["NOT_RECORDED", "Recording", "Replayed", "ReplayExecutor"]

NOT_RECORDED = "not-recorded"
"""The rule id of a cell the replayed files have no end for."""


@dataclass(frozen=True)
class Replayed:
    """What a replayed attempt comes back with: a recorded end, where it was read, and whether an earlier
    attempt of this run was already served it."""

    record: dict
    source: str
    reused: bool = False


class Recording:
    """The ends recorded in results files, by cell hash, in file order."""

    def __init__(self, paths: list[str]):
        self.paths = [str(p) for p in paths]
        self.ends: dict[str, list[tuple[dict, str]]] = {}
        self.where: dict[str, list[str]] = {}  # cell hash -> each end's file:line, as ends
        self.first: dict | None = None
        machines: dict[str, dict[str, int]] = {}  # machine -> file -> ends recorded there
        for path in self.paths:
            for line, r in store.numbered_records(Path(path)):
                if r.status.ran and r.status.is_outcome:
                    rec = r.to_dict()
                    self.ends.setdefault(r.cell_hash, []).append((rec, path))
                    self.where.setdefault(r.cell_hash, []).append(f"{path}:{line}")
                    if r.provenance is not None:
                        files = machines.setdefault(machine(r.provenance), {})
                        files[path] = files.get(path, 0) + 1
                        self.first = self.first or rec
        self.served: dict[str, int] = {}
        _check_one_machine(machines)
        self._check_ends_agree()

    def _check_ends_agree(self) -> None:
        """InputError when a cell's recorded ends disagree (it ran ok, and it failed): which end the replay
        serves first would decide the answer, and the full grid (which sees both) would not show it."""
        mixed = [h for h, ends in self.ends.items() if len({rec["status"] == "ok" for rec, _ in ends}) > 1]
        if not mixed:
            return
        said = [
            f"{self.ends[h][0][0]['cell_name']}: "
            + ", ".join(f"{rec['status']} ({at})" for (rec, _), at in zip(self.ends[h], self.where[h]))
            for h in mixed[:3]
        ]
        raise InputError(
            f"--replay: the recorded ends of {len(mixed)} cell(s) disagree (ok and a failure), so the replayed answer "
            f"would depend on which is served first: {'; '.join(said)}{'; ...' if len(mixed) > 3 else ''}; keep one "
            "end per cell (remove the records that should not count)"
        )

    def platform(self) -> env.Platform:
        """The machine the records were made on, as far as rules and the memory model need it (one machine:
        files of several are refused)."""
        prov = (self.first or {}).get("provenance") or {}
        gpus = tuple(
            env.Gpu(g["index"], g["name"], g.get("memory_bytes") or 0, g.get("uuid") or f"recorded-{g['index']}")
            for g in prov.get("gpus") or []
        )
        return env.Platform(
            gpus=gpus,
            driver=prov.get("driver"),
            versions=dict(prov.get("versions") or {}),
            host_memory_bytes=prov.get("host_memory_bytes") or 0,
            cpu_count=prov.get("cpu_count") or 0,
            nvml=bool(prov.get("nvml", True)),
        )

    def restrict(self, p: Plan) -> Plan:
        """The plan with every runnable cell that has no recorded end skipped, saying so."""
        why = rules.Skip(
            NOT_RECORDED,
            f"no recorded end of this cell in {', '.join(self.paths)}",
            "measure it: run the matrix without --replay",
            "the replayed results files",
        )
        items = tuple(
            it if it.skip is not None or it.cell.hash in self.ends else dataclasses.replace(it, skip=why)
            for it in p.items
        )
        return dataclasses.replace(p, items=items)

    def here(self, run_id: str) -> str | None:
        """The block a run's attempts measure in, where the recording knows it in advance: none here (each
        recorded end keeps the block it was measured in). A recording that plays one machine per run (a
        simulation's, tools/answer_sim.py) says it, so a resumed search ties its new block to the others."""
        return None

    def serve(self, attempt: Attempt) -> Replayed:
        """What an attempt comes back with: its cell's next recorded end."""
        return self.next_end(attempt.cell.hash)

    def next_end(self, cell_hash: str) -> Replayed:
        ends = self.ends[cell_hash]
        k = self.served.get(cell_hash, 0)
        self.served[cell_hash] = k + 1
        rec, path = ends[min(k, len(ends) - 1)]
        return Replayed(rec, path, reused=k >= len(ends))


def machine(prov: Provenance) -> str:
    """The kind of machine a record was made on, as far as a plan's rules and memory model judge it: a CPU
    host, or its GPUs (count, name, memory). Hosts of one kind (three H200 machines) are one."""
    gpus = prov.gpus
    if not gpus or "+cpu" in (prov.versions.get("torch") or ""):
        return "a CPU host"
    mem = f" ({gpus[0].memory_bytes / 2**30:.0f} GiB)" if gpus[0].memory_bytes else ""
    return f"{len(gpus)} x {gpus[0].name}{mem}"


def _check_one_machine(machines: dict[str, dict[str, int]]) -> None:
    """InputError when the recorded ends come from more than one kind of machine: the plan is judged as on one
    (the first file's would skip the other's cells, and the answer would depend on the files' order)."""
    if len(machines) < 2:
        return
    said = "; ".join(
        f"{m}: " + ", ".join(f"{f} ({n} end{'s' if n != 1 else ''})" for f, n in files.items())
        for m, files in machines.items()
    )
    raise InputError(
        f"--replay: these files were recorded on {len(machines)} kinds of machine, and a replay judges the plan as "
        f"on one: {said}; replay the files of one machine at a time"
    )


class ReplayExecutor:
    """Serves recorded ends in place of running jobs; as many at once as the run has slots."""

    prepares = False  # nothing to build or start: no cell runs here
    forkservers = None

    def __init__(self, slots: Slots, cuda: bool = True, recording: Recording | None = None):
        if recording is None:
            raise ValueError("the replay executor needs the results files to replay (--replay FILE...)")
        self.slots, self.recording = slots.max_cells, recording
        self._ended: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        self._in_flight = 0

    def room(self) -> bool:
        return self._in_flight < self.slots

    def running(self) -> int:
        return self._in_flight

    def place(self, attempt: Attempt) -> Handle | None:
        return Handle(attempt, None) if self.room() else None

    def start(self, handle: Handle) -> None:
        self._in_flight += 1
        self._ended.put(Finished(handle, value=self.recording.serve(handle.attempt)))

    def release(self, handle: Handle) -> None:
        pass

    def collect(self, timeout_s: float) -> list[Finished]:
        out = []
        while not self._ended.empty():
            out.append(self._ended.get())
        self._in_flight -= len(out)
        return out

    def cancel(self, why: BaseException) -> list[Finished]:
        return self.collect(0)

    def close(self) -> None:
        pass
