"""The probe of the machine, from the orchestrator's side: run once per machine and kept in the per-machine
cache (bench.records.cache), measured by a helper process (bench.worker.probe, started as the op prebuild is,
launch.run_tool), read as bench.host.rates.Rates. `zerobench probe` runs it alone; a run runs it before its cells
at its largest model's shape, and its figures go into every record's machine section and the run's Hardware."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ..host import env
from ..host.env import version
from ..host.rates import Rates, line
from ..matrix.cells import Cell
from ..matrix.presets import PRESETS
from ..records import cache
from ..records.record import machine_of
from . import launch

__all__ = ["DEFAULT_MODEL", "DEFAULT_TOKENS", "probe_machine", "run_shape", "shape"]

DEFAULT_MODEL = "llama-7b"
DEFAULT_TOKENS = 2048
TIMEOUT_S = 300.0
"""The helper's limit: its measurements stop themselves at 20 s; the rest is importing torch, DeepSpeed and
bitsandbytes on a loaded host."""


def shape(model: str, tokens: int) -> tuple[int, int, int] | None:
    """(tokens, hidden, intermediate) of a preset's MLP; None for a model that is not a preset."""
    p = PRESETS.get(model)
    if p is None:
        return None
    return tokens, int(p["hidden_size"]), int(p["intermediate_size"])


def run_shape(cells: Iterable[Cell]) -> tuple[int, int, int]:
    """The shape a run is probed at: its largest preset's MLP at that preset's most tokens per micro-batch (a
    micro-batch searched for, "auto", counts as 1; the default 7B shape where no cell's model is a preset)."""
    shapes = [s for c in cells if (s := shape(c.model, _micro(c) * c.seq_len)) is not None]
    if not shapes:
        return shape(DEFAULT_MODEL, DEFAULT_TOKENS)  # type: ignore[return-value]
    return max(shapes, key=lambda s: (s[1] * s[2], s[0]))


def _micro(cell: Cell) -> int:
    return cell.micro_batch if isinstance(cell.micro_batch, int) else 1


def _cpu_adam_built(environ: Mapping[str, str], platform: env.Platform) -> bool:
    """DeepSpeed's CPU Adam loads without a compile: DeepSpeed was installed with it, or the op cache vouches for
    it (the probe never compiles)."""
    if cache.deepspeed_prebuilt("cpu_adam"):
        return True
    key = cache.ops_key(environ, cuda=platform.cuda, gpus=[g.name for g in platform.gpus])
    return not cache.ops_missing(key, ["CPUAdamBuilder"], environ)


def _key() -> dict | None:
    """What the cached figures depend on: the machine (boot and GPUs) and the libraries timed. None where the
    machine cannot be told apart from another (no boot id and no GPU UUID): measured every time."""
    m = machine_of(env.provenance())
    if m is None:
        return None
    libs = {d: version(d) for d in ("torch", "deepspeed", "bitsandbytes")}
    return {"machine": m.id, **libs}


def _split(figures: dict) -> tuple[dict, dict]:
    """A probe's figures as the machine's and the matmul shape's (each with its notes): the cache keeps one entry per
    machine, its matmuls per shape."""
    mm = {k: v for k, v in figures.items() if k.startswith("matmul_")}
    rest = {k: v for k, v in figures.items() if not k.startswith("matmul_") and k != "notes"}
    notes = [n for n in str(figures.get("notes") or "").split("; ") if n]
    if matmul_notes := [n for n in notes if n.startswith("matmul")]:
        mm["notes"] = "; ".join(matmul_notes)
    if rest_notes := [n for n in notes if not n.startswith("matmul")]:
        rest["notes"] = "; ".join(rest_notes)
    return rest, mm


def _join(machine: dict, mm: dict) -> Rates | None:
    notes = "; ".join(x for x in (mm.get("notes"), machine.get("notes")) if x)
    return Rates.from_dict({**machine, **mm, **({"notes": notes} if notes else {})})


def probe_machine(
    dims: tuple[int, int, int],
    *,
    refresh: bool = False,
    extra_env: dict | None = None,
    logs: Path | None = None,
    printer: Callable[[str], object] | None = print,
    platform: env.Platform | None = None,
) -> tuple[Rates | None, bool]:
    """The machine's rates at a matmul shape (tokens, hidden, intermediate), and whether they came from the cache
    (a machine probed before times only what the cache lacks: the matmuls at a new shape, CPU Adam once its op is
    built); (None, False) where the helper failed
    (said, with its log). Prints the one line (printer None: silent). platform: the host as the run sees it
    (default: as found now); its first GPU is probed."""
    platform = platform or env.probe()
    gpus = [platform.gpus[0].index] if platform.cuda else None
    environ = launch.child_env({**os.environ, **(extra_env or {})}, port=launch.free_port(), gpus=gpus)
    if not platform.cuda:  # the CPU's rates, as the run takes this host for a CPU one (ZEROBENCH_NO_GPU, say)
        environ["CUDA_VISIBLE_DEVICES"] = ""
    cpu_adam = _cpu_adam_built(environ, platform)
    key = _key()
    entry = (None if refresh or key is None else cache.probe_read(key, environ)) or {}
    machine, shapes = entry.get("machine"), entry.get("matmul") or {}
    machine = machine if isinstance(machine, dict) else None
    shape_key = "x".join(map(str, dims))
    parts = _parts(machine, shapes.get(shape_key), cpu_adam)
    if not parts:
        rates = _join(machine, shapes[shape_key])
        if printer and rates is not None:
            printer(line(rates, cached="cached"))
        return rates, rates is not None
    figures = _measure(dims, cpu_adam, environ, logs, printer, parts if machine is not None else None)
    if figures is None:
        return None, False
    new_machine, new_mm = _split(figures)
    mm = new_mm if "matmul" in parts else shapes[shape_key]
    machine = new_machine if machine is None else _merge(machine, new_machine)
    rates = _join(machine, mm)
    timed = [f"matmul timed at {shape_key}"] * ("matmul" in parts) + ["CPU Adam timed"] * ("cpu_adam" in parts)
    if printer and rates is not None:
        printer(line(rates, cached=None if len(parts) == 3 else ", ".join(["cached", *timed])))
    if key is not None:
        _store(key, {"machine": machine, "matmul": {**shapes, shape_key: mm}}, environ, printer)
    return rates, False


def _parts(machine: dict | None, mm: dict | None, cpu_adam: bool) -> list[str]:
    """What a probe must time (bench.worker.probe.PARTS) where the cache holds these figures: everything for a
    machine never probed, else the matmuls at a new shape and CPU Adam once its op is built."""
    if machine is None:
        return ["matmul", "memory", "cpu_adam"]
    return ["matmul"] * (not isinstance(mm, dict)) + ["cpu_adam"] * (cpu_adam and "cpu_adam" not in machine)


def _notes(figures: dict) -> dict[str, str]:
    """A figures dict's notes by the figure each is about."""
    return {n.split(":", 1)[0]: n for n in str(figures.get("notes") or "").split("; ") if n}


def _merge(machine: dict, new: dict) -> dict:
    """The machine's cached figures with those a later probe timed (CPU Adam, say), and the notes that still hold."""
    out = {**machine, **{k: v for k, v in new.items() if k not in ("notes", "probe_s")}}
    notes = {**_notes(machine), **_notes(new)}
    notes = [n for name, n in notes.items() if name not in new]
    out.pop("notes", None)
    return {**out, **({"notes": "; ".join(notes)} if notes else {})}


def _store(key: dict, entry: dict, environ: Mapping[str, str], printer) -> None:
    try:
        cache.probe_write(key, entry, environ)
    except OSError as e:  # the figures stand; the next run measures again
        if printer:
            printer(f"probe: not cached ({e.strerror or e})")


def _measure(
    dims: tuple[int, int, int], cpu_adam: bool, environ: dict, logs: Path | None, printer, parts: list[str] | None
) -> dict | None:
    """The helper's figures (parts: those to time, None: all), or None where it failed (said)."""
    with tempfile.TemporaryDirectory(prefix="zerobench-probe-") as tmp:
        folder = logs or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        log, report = folder / "probe.log", Path(tmp) / "probe.json"
        log.unlink(missing_ok=True)
        args = ["-m", "bench.worker", "--probe", str(report), "--shape", *map(str, dims)]
        args += ["--cpu-adam"] * cpu_adam + [a for part in parts or () for a in ("--only", part)]
        code = launch.run_tool(args, log_path=log, env=environ, timeout_s=TIMEOUT_S)
        try:
            figures = json.loads(report.read_text())
        except (OSError, ValueError):
            figures = None
        if not isinstance(figures, dict):
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:]) if log.exists() else ""
            where = f"log: {log}" if logs else f"its output: {tail or 'none'}"
            if printer:
                printer(f"probe: failed (exit {code}; {where})")
            return None
    return figures
