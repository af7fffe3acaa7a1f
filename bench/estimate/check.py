"""The memory model against measurement: each recorded cell predicted from its cell and its hardware
alone (the GPU's memory from the record's provenance, never the record's measurements), beside what
was measured; errors per category; the fitted constants refitted leaving each results file out.

`zerobench estimate --check RESULTS...` prints this; reports/memory-model.md is its Markdown. Records of any GPU
count: the constants carry to a GPU model they were never fitted on as well as the model's terms do, and
bench.estimate.checks.heldout says how well, by machine and by GPU model. `refit` writes the constants
(fit.json's "memory" section).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..matrix import dsconfig
from ..matrix.axes import OPTIMIZERS
from ..matrix.cells import Cell
from ..matrix.problems import InputError
from ..records.store import read_records
from .fitdata import write_section
from .fitted import FITTED, FITTED_RUNS, NEUTRAL, SECTION, Constants
from .model import Estimate, Hardware, allocated_by_scale, predict
from .verdict import DEFAULT_MARGIN, Verdict, verdict

__all__ = [
    "Case",
    "cases",
    "fit",
    "evaluate",
    "cross_validate",
    "leave_out",
    "summarize",
    "markdown",
    "CATEGORIES",
    "HeldOut",
    "held_out",
    "held_out_table",
    "machine_of",
    "refit",
    "unshown",
    "unfitted_line",
]

GiB = 2**30
OOM = ("cuda_oom", "host_oom")


@dataclass(frozen=True)
class Case:
    """One recorded attempt the model is checked against."""

    file: str
    cell: Cell
    status: str
    ds_config: dict | None
    hw: Hardware
    measured_gpu: float | None
    """NVML's per-process peak (the largest GPU's), ok records only."""
    measured_host: float | None
    measured_allocated: float | None
    measured_reserved: float | None = None
    """The allocator's peak reservation: NVML's figure minus it is the CUDA context (and NCCL)."""
    run: str = ""
    """The run that made it (its run id)."""
    machine: str = ""
    """The machine it ran on (machine_of)."""

    @property
    def gpu(self) -> str:
        """Its GPU model (the GPU's name as the driver gives it)."""
        return self.hw.gpu_name or "unknown GPU"


def machine_of(prov, run: str) -> str:
    """A machine as the checks tell machines apart: its first GPU's UUID (lent machines share one host name),
    else the run's id."""
    return (prov.gpus[0].uuid if prov and prov.gpus else None) or run or "unknown"


def _onebit(cell: Cell) -> bool:
    spec = OPTIMIZERS.get(cell.optimizer)
    return bool(spec and spec.onebit)


def _cell(d: dict) -> Cell:
    """The record's cell (a field this version no longer has left out)."""
    return Cell.from_dict({k: v for k, v in d.items() if k in {f.name for f in dataclasses.fields(Cell)}})


def _ds_config(cell: Cell, recorded: dict | None) -> dict | None:
    """The cell's DeepSpeed config as zerobench builds it (a user config read from its file); the record's
    copy of its input where the file is gone."""
    try:
        return dsconfig.build(cell)
    except Exception:  # noqa: BLE001 - a user config that moved: the record holds the config the cell ran
        return recorded


def fitted_on(run: str) -> bool:
    """Whether the constants were fitted on this run's records (FITTED_RUNS)."""
    return run in FITTED_RUNS


def cases(paths: Iterable[str | os.PathLike], gpu: str | None = None, *, unfitted: bool = False) -> list[Case]:
    """Every ok, cuda_oom and host_oom record (run on a GPU whose name contains `gpu`, where given), with
    NVML's figures (ok) or an out-of-memory end (the rest); of runs the constants were not fitted on
    (FITTED_RUNS) only with `unfitted` (held out: to score them, and the predictions made before they ran)."""
    out = []
    for path in paths:
        for rec in read_records(path, warn=False):
            if rec.status.value not in ("ok", *OOM):
                continue
            if not unfitted and not fitted_on(rec.run_id or ""):
                continue
            prov = rec.provenance
            name = (rec.worker.gpu_name if rec.worker else None) or (prov.gpu_name if prov else None) or ""
            if gpu and gpu not in name:
                continue
            mem = rec.memory
            nvml = mem.nvml_proc_peak_bytes if mem else None
            if rec.status.value == "ok" and not nvml:
                continue  # a selfcheck variant without telemetry: nothing to compare
            cell = _cell(rec.cell)
            hw = Hardware(
                gpu_memory_bytes=prov.gpus[0].memory_bytes if prov and prov.gpus else None,
                host_memory_bytes=prov.host_memory_bytes if prov else None,
                gpu_name=name,
            )
            out.append(
                Case(
                    file=os.path.basename(os.fspath(path)),
                    cell=cell,
                    status=rec.status.value,
                    ds_config=_ds_config(cell, rec.ds_config),
                    hw=hw,
                    measured_gpu=float(nvml) if nvml and rec.status.value == "ok" else None,
                    measured_host=float(mem.host_rss_peak_bytes) if mem and mem.host_rss_peak_bytes else None,
                    measured_allocated=float(mem.torch_max_allocated_bytes)
                    if mem and mem.torch_max_allocated_bytes
                    else None,
                    measured_reserved=float(mem.torch_max_reserved_bytes)
                    if mem and mem.torch_max_reserved_bytes and rec.status.value == "ok"
                    else None,
                    run=rec.run_id or "",
                    machine=machine_of(prov, rec.run_id or ""),
                )
            )
    return out


# -- fitting ------------------------------------------------------------------------------------------
_ZERO_GPU = dict(frag_shared=0.0, frag_activations=0.0, frag_buckets=0.0, frag_loss=0.0)
_ZERO_HOST = dict(host_process=0.0, host_launcher=0.0, host_compile_workers=0.0)
_SCALES = tuple(round(0.80 + 0.025 * i, 3) for i in range(17))  # activation_scale's grid, 0.80-1.20


def _l1(rows: list[list[float]], y: list[float], base: list[float]) -> tuple[list[float], float]:
    """Non-negative coefficients minimizing the sum of |relative errors| (iteratively reweighted least
    squares), and that sum."""
    import numpy as np

    X, Y, B = np.array(rows, dtype=float), np.array(y, dtype=float), np.array(base, dtype=float)
    active = list(range(X.shape[1]))
    w = 1 / Y
    beta = np.zeros(X.shape[1])
    for _ in range(60):
        A = X[:, active] * w[:, None]
        sol, *_ = np.linalg.lstsq(A, (Y - B) * w, rcond=None)
        if (sol < 0).any():  # a coefficient that would go negative is held at zero
            active = [c for c, v in zip(active, sol) if v >= 0] or active[:0]
            if not active:
                break
            continue
        beta = np.zeros(X.shape[1])
        beta[active] = sol
        r = np.abs(B + X @ beta - Y) / Y
        w = 1 / (Y * np.maximum(r, 1e-3))  # 1/|r| weights turn least squares into least absolute error
    err = float(np.sum(np.abs(B + X @ beta - Y) / Y))
    return [float(b) for b in beta], err


def fit(cs: Sequence[Case], base: Constants = FITTED) -> Constants:
    """The fitted constants for these cases, each on the measurement that shows it: the CUDA context and
    NCCL on NVML's figure above the allocator's reservation (medians, 1-bit cells aside: cupy adds its own
    pool); the activation scale and the fragmentation constants on NVML's peak, by least absolute
    relative error; the host constants on host RSS, likewise."""
    gpu = [c for c in cs if c.measured_gpu]
    above = [
        (c.cell.ranks > 1, c.measured_gpu - c.measured_reserved)
        for c in gpu
        if c.measured_reserved and not _onebit(c.cell)
    ]
    one = [x for multi, x in above if not multi]
    ctx = _pct(one, 0.5) if one else base.cuda_context
    multi = [x - ctx for m, x in above if m]
    nccl = max(_pct(multi, 0.5), 0.0) if multi else base.nccl
    # The activation scale on the allocator's peak (what it scales), the fragmentation constants on the
    # reservation above that peak (what they predict), each by least absolute relative error.
    alloc = [c for c in gpu if c.measured_allocated and c.measured_reserved]
    ks = [dataclasses.replace(base, activation_scale=scale) for scale in _SCALES]
    by_case = [allocated_by_scale(c.cell, c.ds_config, ks) for c in alloc]
    scale_err = [
        (sum(abs(got[i] / c.measured_allocated - 1) for c, got in zip(alloc, by_case)), scale)
        for i, scale in enumerate(_SCALES)
    ]
    scale = min(scale_err)[1] if alloc else base.activation_scale
    k0 = dataclasses.replace(base, **_ZERO_GPU, cuda_context=ctx, nccl=nccl, activation_scale=scale)
    rows, y, b = [], [], []
    for c in alloc:
        e = predict(c.cell, c.ds_config, c.hw, k0)
        rows.append([e.basis["shared"], e.basis["activations"], e.basis["buckets"], e.basis["loss"]])
        # Fitted in units of the NVML peak, so each cell weighs by how much the term moves its prediction.
        y.append(c.measured_gpu)
        b.append(c.measured_gpu - (c.measured_reserved - c.measured_allocated))
    (fs, fa, fb, fl), _ = _l1(rows, y, b) if rows else ((0.0, 0.0, 0.0, 0.0), 0.0)
    k = dataclasses.replace(k0, frag_shared=fs, frag_activations=fa, frag_buckets=fb, frag_loss=fl)
    host = [c for c in cs if c.measured_host and c.status == "ok"]
    if host:
        k0 = dataclasses.replace(k, **_ZERO_HOST)
        rows, y, b = [], [], []
        for c in host:
            e = predict(c.cell, c.ds_config, c.hw, k0)
            # Host RSS is one node's: its own ranks' processes, and a launcher wherever there are several ranks.
            rows.append([float(c.cell.gpus), 1.0 if c.cell.ranks > 1 else 0.0, 1.0 if c.cell.compile else 0.0])
            y.append(c.measured_host)
            b.append(e.host_bytes)
        (hp, hl, hc), _ = _l1(rows, y, b)
        k = dataclasses.replace(k, host_process=hp, host_launcher=hl, host_compile_workers=hc)
    return k


def unshown(cs: Sequence[Case]) -> list[str]:
    """The constants none of these cases shows (no multi-GPU record for NCCL, no host RSS for the host's
    terms, ...): fit() keeps its base's value for them."""
    a, b = fit(cs, NEUTRAL), fit(cs, FITTED)
    return [f.name for f in dataclasses.fields(Constants) if getattr(a, f.name) != getattr(b, f.name)]


def refit(paths: Sequence[str | os.PathLike], command: str, gpu: str | None = None) -> dict:
    """fit.json's "memory" section, written: the constants fitted from NEUTRAL (nothing of the last fit carried
    over) on every ok and out-of-memory record of these results files, with the runs, the files, and the
    records per GPU model and per machine they came from. Returns the section."""
    cs = cases(paths, gpu, unfitted=True)
    if not cs:
        raise InputError("no ok or out-of-memory records to fit on in " + ", ".join(map(os.fspath, paths)))
    k = fit(cs, NEUTRAL)
    data = {
        "command": command,
        "constants": {f.name: float(f"{getattr(k, f.name):.6g}") for f in dataclasses.fields(Constants)},
        "files": sorted({c.file for c in cs}),
        "gpus": dict(sorted(Counter(c.gpu for c in cs).items())),
        "machines": dict(sorted(Counter(c.machine for c in cs).items())),
        "runs": sorted({c.run for c in cs}),
    }
    write_section(SECTION, data)
    return data


# -- evaluation ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    case: Case
    estimate: Estimate
    gpu_verdict: str
    host_verdict: str

    @property
    def error(self) -> float | None:
        """Predicted over measured NVML peak, minus one."""
        m = self.case.measured_gpu
        return None if not m else self.estimate.gpu_bytes / m - 1

    @property
    def false_fit(self) -> bool:
        """Predicted to fit, and it ran out of memory (GPU or host)."""
        c = self.case
        return (c.status == "cuda_oom" and self.gpu_verdict == Verdict.FITS) or (
            c.status == "host_oom" and self.host_verdict == Verdict.FITS
        )

    @property
    def false_prune(self) -> bool:
        """Predicted not to fit, and it ran."""
        return self.case.status == "ok" and Verdict.PRUNE in (self.gpu_verdict, self.host_verdict)


def evaluate(cs: Sequence[Case], k: Constants = FITTED, margin: float = DEFAULT_MARGIN) -> list[Row]:
    out = []
    for c in cs:
        e = predict(c.cell, c.ds_config, c.hw, k)
        out.append(
            Row(
                c,
                e,
                verdict(e.gpu_bytes, c.hw.gpu_memory_bytes, margin),
                verdict(e.host_bytes, c.hw.host_memory_bytes, margin),
            )
        )
    return out


def cross_validate(cs: Sequence[Case], margin: float = DEFAULT_MARGIN) -> list[Row]:
    """Each results file's cases predicted with constants fitted on the other files only."""
    out: list[Row] = []
    files = sorted({c.file for c in cs})
    by_case = {}
    for f in files:
        k = fit([c for c in cs if c.file != f])
        for r in evaluate([c for c in cs if c.file == f], k, margin):
            by_case[id(r.case)] = r
    out = [by_case[id(c)] for c in cs]
    return out


def leave_out(cs: Sequence[Case], by: str, margin: float = DEFAULT_MARGIN) -> list[Row]:
    """Each group's cases (`by`: "file", "machine" or "gpu", the GPU model) predicted with constants fitted
    on the other groups' only; none for a group that has no others (nothing to fit on)."""
    out: list[Row] = []
    for key in sorted({getattr(c, by) for c in cs}):
        train = [c for c in cs if getattr(c, by) != key]
        if train:
            out += evaluate([c for c in cs if getattr(c, by) == key], fit(train), margin)
    return out


def _pct(xs: list[float], q: float) -> float:
    """The q-quantile (linear interpolation, as numpy's default)."""
    if not xs:
        return math.nan
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(rows: Sequence[Row]) -> dict:
    errs = [abs(r.error) for r in rows if r.error is not None]
    return {
        "n": len(errs),
        "median_abs_error": _pct(errs, 0.5),
        "p95_abs_error": _pct(errs, 0.95),
        "max_abs_error": max(errs) if errs else math.nan,
        "oom_records": sum(r.case.status in OOM for r in rows),
        "false_fits": sum(r.false_fit for r in rows),
        "false_prunes": sum(r.false_prune for r in rows),
    }


def _categories(c: Case) -> dict[str, str]:
    cell = c.cell
    spec = OPTIMIZERS.get(cell.optimizer)
    return {
        "ZeRO stage": str(cell.zero_stage),
        "offload": cell.offload,
        "LoRA": "yes" if cell.peft == "lora" else "no",
        "QLoRA": "yes" if cell.peft == "qlora" else "no",
        "paged optimizer": "yes" if spec and spec.paged else "no",
        "1-bit optimizer": "yes" if spec and spec.onebit else "no",
        "GPU count": str(cell.gpus) if cell.nodes == 1 else f"{cell.gpus} x {cell.nodes} nodes",
        "model": cell.model,
        "grad checkpointing": "on" if cell.grad_ckpt else "off",
    }


CATEGORIES = tuple(_categories(Case("", Cell(), "ok", None, Hardware(), None, None, None)))


def summary_line(s: dict, label: str) -> str:
    return (
        f"{label}: {s['n']} ok records, NVML process peak median |error| {s['median_abs_error']:.1%}, "
        f"p95 {s['p95_abs_error']:.1%}, max {s['max_abs_error']:.1%}; "
        f"{s['false_fits']} false fits of {s['oom_records']} out-of-memory records, {s['false_prunes']} false prunes"
    )


def unfitted_line(rows: Sequence[Row]) -> str:
    """The summary of the rows of runs no constant was fitted on (FITTED_RUNS), labelled so."""
    names = ", ".join(sorted({r.case.file for r in rows}))
    return summary_line(summarize(rows), f"held out (runs no constant was fitted on: {names})")


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f}"


def table(rows: Sequence[Row], cv: Sequence[Row] | None = None) -> list[list[str]]:
    head = ["file", "cell", "status", "measured GiB", "predicted GiB", "error", "held-out error", "phase", "verdict"]
    out = [head]
    for i, r in enumerate(rows):
        c = r.case
        cv_err = cv[i].error if cv else None
        out.append(
            [
                c.file,
                c.cell.name,
                c.status,
                _gib(c.measured_gpu),
                _gib(r.estimate.gpu_bytes),
                "-" if r.error is None else f"{r.error:+.1%}",
                "-" if cv_err is None else f"{cv_err:+.1%}",
                r.estimate.phase,
                r.gpu_verdict if r.host_verdict != Verdict.PRUNE else f"{r.gpu_verdict}, host: {r.host_verdict}",
            ]
        )
    return out


def _largest(rows: Sequence[Row], n: int = 6) -> list[list[str]]:
    out = [["file", "cell", "measured GiB", "predicted GiB", "error", "largest terms (GiB)"]]
    ranked = sorted((r for r in rows if r.error is not None), key=lambda r: -abs(r.error))[:n]
    for r in ranked:
        top = sorted(r.estimate.gpu_terms.items(), key=lambda kv: -kv[1])[:4]
        out.append(
            [
                r.case.file,
                r.case.cell.name,
                _gib(r.case.measured_gpu),
                _gib(r.estimate.gpu_bytes),
                f"{r.error:+.1%}",
                ", ".join(f"{k} {v / GiB:.1f}" for k, v in top),
            ]
        )
    return out


def category_table(rows: Sequence[Row], cv: Sequence[Row]) -> list[list[str]]:
    out = [["category", "value", "records", "median |error|", "p95 |error|", "held-out median", "held-out p95"]]
    for cat in CATEGORIES:
        values: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            if r.error is not None:
                values.setdefault(_categories(r.case)[cat], []).append(i)
        for v, idx in sorted(values.items()):
            e = [abs(rows[i].error) for i in idx]
            ecv = [abs(cv[i].error) for i in idx]
            out.append(
                [
                    cat,
                    v,
                    str(len(idx)),
                    f"{_pct(e, 0.5):.1%}",
                    f"{_pct(e, 0.95):.1%}",
                    f"{_pct(ecv, 0.5):.1%}",
                    f"{_pct(ecv, 0.95):.1%}",
                ]
            )
    return out


def constants_table(k: Constants) -> list[list[str]]:
    out = [["constant", "value", "what it is"]]
    for f in dataclasses.fields(Constants):
        v = getattr(k, f.name)
        shown = f"{v:.3f}" if f.name.startswith(("frag_", "activation")) else f"{v / GiB:.3f} GiB"
        doc = (Constants.__dataclass_fields__[f.name].metadata or {}).get("doc") or _DOCS.get(f.name, "")
        out.append([f.name, shown, doc])
    return out


def _docs() -> dict[str, str]:
    import ast
    import inspect

    from . import fitted

    src = inspect.getsource(fitted.Constants)
    tree = ast.parse(src)
    docs, last = {}, None
    for node in tree.body[0].body:
        if isinstance(node, ast.AnnAssign):
            last = node.target.id
        elif isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) and last:
            docs[last] = " ".join(str(node.value.value).split())
            last = None
    return docs


_DOCS = _docs()


def md_table(rows: list[list[str]]) -> str:
    esc = [[c.replace("|", "\\|") for c in r] for r in rows]
    lines = ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(esc[0])]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return "\n".join(lines)


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# -- held out: predictions committed before their cells ran --------------------------------------------
_VERDICT = "(?:fits|uncertain|won't fit|no capacity)"
# A cell's line of `zerobench estimate MATRIX`: six term groups, GPU GiB, host GiB, phase, the two
# verdicts, the cell id (name#hash).
_PREDICTED = re.compile(
    rf"^\s*(?P<terms>(?:-?[\d.]+\s+){{8}}).+?\s+(?P<gpu>{_VERDICT})\s+{_VERDICT}\s+\S+#(?P<hash>[0-9a-f]{{10}})\s*$"
)
_MADE_AT = re.compile(r"made at commit ([0-9a-f]{7,40})")
# Files made since the table has the step-time model's column: its seconds per step follow the 8 figures.
_STEP = re.compile(r"^\s*(?:-?[\d.]+\s+){8}(?P<step>[\d.e+-]+)\s")


@dataclass(frozen=True)
class HeldOut:
    """A file of `zerobench estimate` predictions committed before its cells ran, scored against their records."""

    file: str
    commit: str | None
    """The commit the file says it was made at (its model and constants)."""
    cells: int
    errors: tuple[float, ...]
    """Predicted over measured NVML peak, minus one, per ok record of a predicted cell."""
    results: tuple[str, ...]
    oom_records: int
    false_fits: int
    step_errors: tuple[float, ...] = ()
    """Predicted over measured median step time, minus one, per ok record (files with the s/step column)."""


def held_out(path: str | os.PathLike, cs: Sequence[Case], steps: dict[str, list[float]] | None = None) -> HeldOut:
    """Score a predictions file against the cases whose cell it predicted (matched by cell hash), and its
    seconds per step against `steps` (cell hash -> measured median step times). Its GPU figures are as
    printed, to 0.1 GiB; its step times to 4 significant digits."""
    text = open(path, encoding="utf-8").read()
    made = _MADE_AT.search(text)
    by_hash: dict[str, list[Case]] = {}
    for c in cs:
        by_hash.setdefault(c.cell.hash, []).append(c)
    cells, errors, files, oom, false_fits, step_errors = 0, [], set(), 0, 0, []
    for line in text.splitlines():
        m = _PREDICTED.match(line)
        if m is None:
            continue
        cells += 1
        step = _STEP.match(line)
        for measured in (steps or {}).get(m["hash"], []) if step else []:
            step_errors.append(float(step["step"]) / measured - 1)
        predicted = float(m["terms"].split()[6]) * GiB
        for c in by_hash.get(m["hash"], []):
            files.add(c.file)
            if c.measured_gpu:
                errors.append(predicted / c.measured_gpu - 1)
            if c.status == "cuda_oom":
                oom += 1
                false_fits += m["gpu"] == Verdict.FITS
    return HeldOut(
        os.path.basename(os.fspath(path)),
        made[1] if made else None,
        cells,
        tuple(errors),
        tuple(sorted(files)),
        oom,
        false_fits,
        tuple(step_errors),
    )


def held_out_table(held: Sequence[HeldOut]) -> list[list[str]]:
    head = ["predictions", "made at", "cells", "results", "records", "median |error|", "p95 |error|", "max |error|"]
    steps = any(h.step_errors for h in held)
    out = [[*head, "false fits"] + (["step records", "step median |error|", "step p95 |error|"] if steps else [])]
    for h in held:
        e, t = [abs(x) for x in h.errors], [abs(x) for x in h.step_errors]
        step_cols = [str(len(t)), f"{_pct(t, 0.5):.1%}" if t else "-", f"{_pct(t, 0.95):.1%}" if t else "-"]
        out.append(
            [
                h.file,
                h.commit or "-",
                str(h.cells),
                ", ".join(h.results) or "-",
                str(len(e)),
                f"{_pct(e, 0.5):.1%}" if e else "-",
                f"{_pct(e, 0.95):.1%}" if e else "-",
                f"{max(e):.1%}" if e else "-",
                f"{h.false_fits} of {h.oom_records} OOM",
            ]
            + (step_cols if steps else [])
        )
    return out


_HELD_OUT_TEXT = (
    "Each predictions file is `zerobench estimate MATRIX` output committed before its matrix ran on the GPU, "
    "made by the model and constants of the commit it names (before these records were fitting data), and "
    "scored here against the records of the cells it predicted. Its GPU figures are as printed, to 0.1 GiB, "
    "so each error is exact to about 0.05 GiB over the measured peak."
)


def _markdown_intro(paths: Sequence[str], held_arg: str, margin: float) -> list[str]:
    """What the check is, the command that made it, and what its margin means."""
    return [
        "# The memory model against the committed measurements",
        "",
        "Made by `zerobench estimate --check` (the command below); every figure is a pure function of the "
        "results files and the model (`bench/estimate/`). Each cell is predicted from the cell and the GPU's "
        "memory alone: never from the record's own measurements. *measured* is NVML's per-process peak on the "
        "cell's GPU (the largest rank's), *predicted* the model's; *held-out error* is the prediction with the "
        "fitted constants refitted without the cell's results file (leave one file out).",
        "",
        f"    python -m bench estimate --check {' '.join(paths)}{held_arg} --markdown reports/memory-model.md",
        "",
        "What the model is: `bench/estimate/model.py` (each term read off DeepSpeed 0.19.6, PyTorch, "
        "transformers, PEFT and bitsandbytes, the place named beside it); the constants below are the only "
        "fitted numbers.",
        "",
        f"Margin {margin:.0%}: a cell *fits* when predicted at most {1 - margin:.0%} of the GPU's memory, is "
        f"*pruned* (skipped by `zerobench run`) when predicted above {1 + margin:.0%} of it (or of the host's, "
        "for host RSS), and is *uncertain* between. A false fit is a cell the model says fits that ran out of "
        "memory; a false prune, one it would have skipped that ran.",
        "",
    ]


def markdown(
    paths: Sequence[str],
    files: Sequence[str],
    rows: Sequence[Row],
    cv: Sequence[Row],
    margin: float,
    held: Sequence[tuple[str, HeldOut]] = (),
    unfitted: Sequence[Row] = (),
    groups: Sequence[tuple[str, list[list[str]]]] = (),
) -> str:
    """The check of the shipped constants as Markdown: `paths` as given on the command line, `files` the results
    files read, `held` the predictions files (as given, scored), `unfitted` the rows of the runs no constant was
    fitted on, `groups` the held-out tables by GPU model and machine (title, table:
    bench.estimate.checks.heldout.memory_table)."""
    s_in, s_cv = summarize(rows), summarize(cv)
    only = sorted({r.case.file for r in unfitted} - {r.case.file for r in rows})  # held-out files
    fitted_files = [os.path.basename(p) for p in files if os.path.basename(p) not in only]
    listed = ", ".join(f"`{f}`" for f in fitted_files)
    held_only = ", ".join(f"`{f}`" for f in only)
    held_arg = f" --held-out {' '.join(p for p, _ in held)}" if held else ""
    held_part = ["## Held-out checks", "", _HELD_OUT_TEXT, "", md_table(held_out_table([h for _, h in held])), ""]
    gpus = ", ".join(sorted({r.case.gpu for r in (*rows, *unfitted)})) or "none"
    return "\n".join(
        [
            *_markdown_intro(paths, held_arg, margin),
            "## Summary",
            "",
            f"- {summary_line(s_in, 'in-sample (the constants of bench/estimate/fit.json)')}",
            f"- {summary_line(s_cv, 'held out (leave one results file out)')}",
            *([f"- {unfitted_line(unfitted)}"] if unfitted else []),
            "",
            *(held_part if held else []),
            *(part for title, t in groups for part in (f"## Held out by {title}", "", md_table(t), "")),
            "## Errors per category",
            "",
            md_table(category_table(rows, cv)),
            "",
            "## Largest errors",
            "",
            "The cells the model misses most (in-sample), with the terms of their prediction; "
            "`results/README.md` says what each results file's code did (its caveats are not in the model, "
            "which predicts the cell as zerobench runs it now).",
            "",
            md_table(_largest(rows)),
            "",
            "## The fitted constants",
            "",
            md_table(constants_table(FITTED)),
            "",
            "## Every cell",
            "",
            md_table(table(rows, cv)),
            "",
            f"Results files ({len(fitted_files)}): {listed}. Records counted: status ok with NVML's "
            f"figures, and cuda_oom/host_oom, run on any GPU (here: {gpus}); the others (skipped, interrupted, "
            "errors, selfcheck "
            "variants without telemetry) predict nothing to compare."
            + (
                f" Read only for the held-out checks (no constant was fitted on them): {held_only}."
                if held_only
                else ""
            ),
            "",
        ]
    )
