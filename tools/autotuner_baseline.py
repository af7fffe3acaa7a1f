"""DeepSpeed's autotuner on a zerobench matrix, and its answer measured by zerobench (not part of zerobench).

    python -m tools.autotuner_baseline MATRIX --results DIR [--autotuning KEY=VALUE ...] [--answer BUDGET]

MATRIX is the matrix the autotuner is compared with. Its cells may differ in the ZeRO stage and the micro-batch
alone (the autotuner's fast mode searches those two); every other axis has one value, which the autotuner's
experiments share: the model (a preset built with random weights by zerobench's worker code), sequence length,
data source, precision, optimizer, checkpointing, PEFT. The steps, in order, each timed:

1. the DeepSpeed ops the cells need are built once through zerobench's cache (a one-off cost neither side pays);
2. with --answer BUDGET: `zerobench run MATRIX --answer --budget BUDGET` (zerobench's own answer);
3. `deepspeed --autotuning tune tools/autotuner_train.py ...` with the autotuner's defaults (the stages the
   matrix lists; --autotuning KEY=VALUE overrides a setting of its "autotuning" block, and the summary
   names every default changed), stopped after --autotuner-timeout;
4. the configuration the autotuner chose (its ds_config_optimal.json, as written) as a one-cell matrix
   through `zerobench run`, so both answers are measured the same way.

--optimal JSON skips step 3 and measures an earlier run's choice instead: the autotuner's run in one call of a
GPU host, its choice beside zerobench's answer on one machine in another.

DIR gets summary.json (what each step took and found), experiments.jsonl (one line per experiment the
autotuner launched: config, metric, status), the autotuner's own folders (autotuner/) and each step's log.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench.host import env
from bench.matrix import spec
from bench.matrix.axes import AXES
from bench.matrix.cells import Cell
from bench.matrix.problems import InputError

ROOT = Path(__file__).resolve().parents[1]
TRAIN_SCRIPT = ROOT / "tools" / "autotuner_train.py"
SEARCHED = ("zero_stage", "micro_batch")
"""What the autotuner's fast mode searches (it sets the gradient accumulation to keep the batch it tunes for:
autotuner.py get_tuning_micro_batch_size_list)."""
FROM_FILE = ("zero_stage", "offload", "precision", "micro_batch", "grad_accum")
"""The axes a DeepSpeed config file sets for its cell (bench.matrix.dsconfig.describe; the optimizer too, where the file
has an optimizer section)."""
DEFAULTS = {"fast": True, "max_train_micro_batch_size_per_gpu": 1024, "start_profile_step": 3, "end_profile_step": 5}
"""The autotuner's defaults the summary reports against (deepspeed/autotuning/constants.py, 0.19.6)."""


class Refused(Exception):
    """The matrix cannot be put to the autotuner as it is: the message says which key and what to do."""


@dataclasses.dataclass(frozen=True)
class Baseline:
    """What a matrix puts to the autotuner: its fixed settings (one base cell) and the stages to search."""

    path: Path
    raw: dict
    base: Cell
    stages: tuple[int, ...]
    micro_batches: tuple[int, ...]


def plan(path: str | Path) -> Baseline:
    """The matrix as the autotuner's problem; Refused when a cell differs in more than the autotuner searches,
    or asks for what its fast mode cannot express (offload: it writes each experiment's zero_optimization
    afresh; a user's DeepSpeed config; another engine; torch.compile)."""
    path = Path(path)
    cells = spec.expand(spec.load(path))
    for a in AXES:
        values = {getattr(c, a.name) for c in cells}
        if a.name not in SEARCHED and len(values) > 1:
            raise Refused(
                f"{path}: axis {a.name!r} has {len(values)} values; the autotuner searches ZeRO stage "
                "and micro-batch only: give it one value"
            )
    base = cells[0]
    fixed = {"offload": "none", "engine": "deepspeed", "compile": False, "ds_config": None}
    for key, want in fixed.items():
        if getattr(base, key) != want:
            raise Refused(f"{path}: {key} is {getattr(base, key)!r}; the autotuner's script runs {key}: {want!r}")
    if any(c.micro_batch == "auto" for c in cells):
        raise Refused(f"{path}: micro_batch: auto; list the micro-batches (the autotuner searches its own)")
    return Baseline(
        path=path,
        raw=yaml.safe_load(path.read_text()),
        base=base,
        stages=tuple(sorted({c.zero_stage for c in cells})),
        micro_batches=tuple(sorted({c.micro_batch for c in cells})),
    )


def user_config(b: Baseline, overrides: dict, folder: Path) -> dict:
    """The DeepSpeed config a user hands the autotuner: zerobench's config of the base cell (precision,
    optimizer, clipping), the stages to search, no micro-batch (the autotuner starts from 1), and the
    autotuning block. The stages are written out: DeepSpeed 0.19.6 tunes stage 0 alone for a config that
    names none (autotuner.py tune(): .get("stage", 0)), though its README says all four."""
    from bench.matrix import dsconfig

    cfg = dsconfig.build(b.base)
    cfg.pop("train_micro_batch_size_per_gpu", None)
    cfg["zero_optimization"] = {"stage": list(b.stages)}
    cfg["autotuning"] = {
        "enabled": True,
        "results_dir": str(folder / "autotuning_results"),
        "exps_dir": str(folder / "autotuning_exps"),
        **overrides,
    }
    return cfg


def parse_overrides(items: list[str]) -> dict:
    """KEY=VALUE pairs of the autotuning block; a VALUE is read as JSON where it is JSON (16, true, [0, 3])."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Refused(f"--autotuning {item!r}: write KEY=VALUE, e.g. max_train_micro_batch_size_per_gpu=16")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def changed_defaults(overrides: dict) -> dict:
    """Each autotuning setting set here, beside the autotuner's own default."""
    return {k: {"default": DEFAULTS.get(k), "used": v} for k, v in overrides.items()}


def run_logged(cmd: list[str], log: Path, *, env_: dict, cwd: Path, timeout: float, echo=None) -> tuple[int, float]:
    """Run cmd in its own process group, its output to log (and the lines echo matches to the console).
    Past timeout the group gets SIGINT, then SIGKILL 30 s later; returns (exit code, wall seconds)."""
    t0 = time.monotonic()
    with open(log, "w") as out:
        p = subprocess.Popen(
            cmd, cwd=cwd, env=env_, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        timer = _Deadline(p, timeout)
        try:
            for line in p.stdout:
                out.write(line)
                if echo is None or echo.search(line):
                    print(f"  {line.rstrip()[:200]}", flush=True)
            code = p.wait()
        except BaseException:  # stopped (Ctrl-C, SIGTERM): the group goes too, not left to run on
            timer.fire()
            raise
        finally:
            timer.cancel()
    return (124 if timer.fired else code), time.monotonic() - t0


class _Deadline:
    """SIGINT to a process group at its deadline, SIGKILL 30 s later if it is still there."""

    def __init__(self, p: subprocess.Popen, timeout: float):
        import threading

        self.p, self.fired = p, False
        self._timer = threading.Timer(timeout, self.fire)
        self._timer.daemon = True
        self._timer.start()

    def fire(self) -> None:
        self.fired = True
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGKILL, 0)):
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.p.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def cancel(self) -> None:
        self._timer.cancel()


def child_env() -> dict:
    """What zerobench's workers get (offline hubs, a Hopper arch list DeepSpeed's op builder can read), with
    the repository importable."""
    from bench.execute import launch

    e = launch.child_env(dict(os.environ), port=launch.free_port(), gpus=None)
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), e.get("PYTHONPATH")) if p)
    return e


def prebuild(b: Baseline, folder: Path) -> dict:
    """The ops the base cell needs, built (or found) through zerobench's cache, before either side is timed."""
    from bench.execute import prepare
    from bench.execute.plan import Planned

    t0 = time.monotonic()
    costs = prepare._prebuild([Planned(b.base, None, None)], folder / "prebuild", None, env.probe(), print)
    return {"costs": costs, "wall_s": round(time.monotonic() - t0, 1)}


_ECHO = re.compile(r"Launching exp_id|Tuning completed|optimal setup|not runable|No optimal|Traceback")


def run_autotuner(b: Baseline, cfg: dict, folder: Path, timeout: float) -> dict:
    """`deepspeed --autotuning tune` on the training script; what it ran, how long, how it ended."""
    from bench.execute import launch

    folder.mkdir(parents=True, exist_ok=True)
    config, cell = folder / "ds_config.json", folder / "cell.json"
    config.write_text(json.dumps(cfg, indent=1))
    cell.write_text(json.dumps(b.base.to_dict(), indent=1))
    cmd = ["deepspeed", "--autotuning", "tune", "--num_gpus", str(b.base.gpus)]
    cmd += ["--master_port", str(launch.free_port()), str(TRAIN_SCRIPT), "--deepspeed_config", str(config)]
    cmd += ["--cell", str(cell)]
    print(f"autotuner: {' '.join(cmd)} (log: {folder / 'console.log'})", flush=True)
    code, wall = run_logged(cmd, folder / "console.log", env_=child_env(), cwd=folder, timeout=timeout, echo=_ECHO)
    results = Path(cfg["autotuning"]["results_dir"])
    return {
        "command": cmd,
        "exit_code": code,
        "timed_out": code == 124,
        "wall_s": round(wall, 1),
        "tuning_s": _tuning_s(results / "summary.txt"),
        "counted_experiments": _counted(results / "summary.txt"),
        "results_dir": str(results),
    }


def _tuning_s(summary: Path) -> float | None:
    """The autotuner's own "Tuning completed in H:MM:SS.ffffff" (from tune()'s start: its launcher excluded)."""
    m = re.search(r"Tuning completed in (\d+):(\d+):(\d+(?:\.\d+)?)", _read(summary))
    return round(int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3]), 1) if m else None


def _counted(summary: Path) -> int | None:
    """The autotuner's count of experiments (a re-scored earlier experiment counts again)."""
    m = re.search(r"Total number of experiments: (\d+)", _read(summary))
    return int(m[1]) if m else None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# How an experiment without a metrics file ended, from its output: first match wins.
_ENDS = (
    ("cuda_oom", re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED")),
    ("host_oom", re.compile(r"DefaultCPUAllocator: can't allocate memory|Killed|exits with return code = -9")),
)
# DeepSpeed's search_error (autotuning/utils.py): an experiment whose stderr has one of these words failed.
_ERROR_WORDS = ("Error", "error", "ERROR")


def autotuner_error(stderr: str) -> str | None:
    """What the autotuner itself reads as the experiment's error: the rest of the first stderr line with an
    error word (any line: a warning that says "error" fails an experiment for it too)."""
    for line in stderr.splitlines():
        for word in _ERROR_WORDS:
            i = line.find(word)
            if i != -1:
                return line[i + len(word) :].lstrip(": ").strip()
    return None


def classify(result: dict | None, output: str) -> tuple[str, str]:
    """An experiment's status and reason: ok with its result file (metrics, or the model-info run's
    model_info), else cuda_oom / host_oom / error from its output (the autotuner scores all of them 0)."""
    if result is not None:
        return "ok", ""
    for status, pattern in _ENDS:
        m = pattern.search(output)
        if m:
            return status, _line_of(output, m.start())
    return "error", autotuner_error(output) or "no metrics file and no error in its output"


def _line_of(text: str, pos: int) -> str:
    start, end = text.rfind("\n", 0, pos) + 1, text.find("\n", pos)
    return text[start : end if end != -1 else None].strip()[:300]


def experiments(results: Path, seq_len: int) -> list[dict]:
    """One entry per experiment the autotuner launched (its folders under results_dir, in launch order)."""
    out = []
    for d in sorted((p for p in results.iterdir() if (p / "exp.json").is_file()), key=_launch_order):
        exp = json.loads((d / "exp.json").read_text())
        cfg = exp.get("ds_config") or {}
        # The model-info run (the first) writes model_info.json instead: parameters and activation memory.
        info = _json(d / "model_info.json")
        metrics = _json(d / "metrics.json")
        stderr = _read(d / "stderr.log")
        status, reason = classify(metrics or info, stderr + _read(d / "stdout.log"))
        throughput = (metrics or {}).get("throughput")
        losses = [float(x) for x in _LOSS.findall(_read(d / "stdout.log"))]
        out.append(
            {
                "name": exp["name"],
                "exp_id": exp.get("exp_id"),
                "kind": "model_info" if info is not None or exp["name"] == "profile_model_info" else "experiment",
                "model_info": info,
                "zero_stage": (cfg.get("zero_optimization") or {}).get("stage"),
                "micro_batch": cfg.get("train_micro_batch_size_per_gpu"),
                "grad_accum": cfg.get("gradient_accumulation_steps"),
                "status": status,
                "reason": reason,
                "autotuner_error": autotuner_error(stderr),
                "metrics": metrics,
                "tokens_per_s": throughput * seq_len if throughput else None,
                "losses": losses,
                "duration_s": _duration(d),
                "ds_config": cfg,
            }
        )
    return out


_LOSS = re.compile(r"^step \d+: loss (\S+)$", re.M)  # what tools/autotuner_train.py prints per step


def _launch_order(d: Path) -> tuple:
    exp = _json(d / "exp.json") or {}
    return (exp.get("exp_id", 1 << 30), d.name)


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _duration(d: Path) -> float | None:
    """From the experiment's config file (written at its launch) to its logs' last write: file times, not a
    clock the autotuner keeps."""
    try:
        end = max((d / f).stat().st_mtime for f in ("stderr.log", "stdout.log"))
        return round(end - (d / "exp.json").stat().st_mtime, 1)
    except OSError:
        return None


def chosen(optimal: Path, exps: list[dict]) -> dict | None:
    """The configuration the autotuner wrote as optimal (its ds_config_optimal.json), and which of its
    experiments it came from."""
    cfg = _json(optimal)
    if cfg is None:
        return None
    same = [e for e in exps if e["status"] == "ok" and _key(e["ds_config"]) == _key(cfg)]
    best = max(same, key=lambda e: e["metrics"]["throughput"], default=None)
    return {
        "ds_config_path": str(optimal),
        "ds_config": cfg,
        "zero_stage": (cfg.get("zero_optimization") or {}).get("stage"),
        "micro_batch": cfg.get("train_micro_batch_size_per_gpu"),
        "grad_accum": cfg.get("gradient_accumulation_steps"),
        "experiment": best["name"] if best else None,
        "tokens_per_s_autotuner": best["tokens_per_s"] if best else None,
    }


def _key(cfg: dict) -> str:
    return json.dumps({k: v for k, v in cfg.items() if k != "autotuning"}, sort_keys=True)


def choice_matrix(b: Baseline, choice: dict, folder: Path) -> Path:
    """A one-cell matrix: the compared matrix's settings, with the autotuner's configuration as its ds_config
    (the stage, micro-batch, accumulation, precision and optimizer are then the file's)."""
    raw = {k: v for k, v in b.raw.items() if k not in ("include", "exclude", "name", "axes")}
    keep = {k: v for k, v in (b.raw.get("axes") or {}).items() if k not in FROM_FILE}
    raw["name"] = f"{b.raw.get('name') or b.path.stem}-autotuner-choice"
    raw["axes"] = {**keep, "ds_config": [choice["ds_config_path"]]}
    path = folder / "choice.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def zerobench(args: list[str], log: Path, timeout: float) -> dict:
    """`python -m bench ARGS` with its console to log (and here); its exit code and wall time."""
    cmd = [sys.executable, "-m", "bench", *args]
    print(f"zerobench: {' '.join(cmd)}", flush=True)
    code, wall = run_logged(cmd, log, env_=child_env(), cwd=ROOT, timeout=timeout)
    return {"command": cmd, "exit_code": code, "timed_out": code == 124, "wall_s": round(wall, 1)}


def measured(results: Path) -> dict:
    """What zerobench measured in a results file: its ok cells (mean tokens/s over their attempts, peak
    memory, cell time) and the fastest of them; the answer mode's answer where the file has one."""
    from bench.judge import results as res

    if not results.exists():
        return {"cells": [], "fastest": None, "cell_time_s": 0.0}
    df = res.load(results)
    attempts = df[df["status"].isin(["ok", "cuda_oom", "host_oom", "error", "timeout", "killed", "diverged"])]
    ok = df[df["status"] == "ok"]
    cells = [
        {
            "cell": name,
            "tokens_per_s": float(g["tokens_per_s"].mean()),
            "runs": len(g),
            "peak_memory_bytes": _int(g["peak_memory_bytes"].max()),
            "peak_memory_source": g["peak_memory_source"].iloc[0],
        }
        for name, g in ok.groupby("cell_name", sort=False)
    ]
    ends = {str(k): int(v) for k, v in attempts["status"].value_counts().items()}
    return {
        "cells": cells,
        "fastest": max(cells, key=lambda c: c["tokens_per_s"], default=None),
        "attempts": ends,
        "cell_time_s": round(float(attempts["wall_s"].fillna(0).sum()), 1),
        "answer": _answer(df),
    }


def _answer(df) -> dict | None:
    from bench.report import analysis

    sections = analysis.analyse(df).sections
    return sections[0].answer if sections else None


def _int(v) -> int | None:
    return None if v != v else int(v)  # NaN where no peak was recorded


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.autotuner_baseline", description=__doc__.split("\n\n")[0])
    ap.add_argument("matrix", help="the matrix the autotuner is compared with")
    ap.add_argument("--results", required=True, help="folder for the summary, the experiments and every log")
    ap.add_argument("--autotuning", nargs="*", default=[], metavar="KEY=VALUE", help="override an autotuning setting")
    ap.add_argument("--autotuner-timeout", type=float, default=3600, help="seconds before the autotuner is stopped")
    ap.add_argument("--answer", metavar="BUDGET", help="also run zerobench's answer mode on MATRIX with this budget")
    ap.add_argument("--repeats", type=int, default=1, help="measure the autotuner's choice this many times")
    ap.add_argument(
        "--optimal",
        metavar="JSON",
        help="run no autotuner: measure this ds_config_optimal.json (an earlier run's choice) beside zerobench's",
    )
    ap.add_argument("--timeout", type=float, default=3600, help="seconds for each zerobench run")
    args = ap.parse_args(argv)
    try:
        b = plan(args.matrix)
        overrides = parse_overrides(args.autotuning)
    except (Refused, InputError) as e:
        print(f"autotuner_baseline: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stop unwinds: the autotuner's group goes too
    # This interpreter's bin first on PATH for every step: the autotuner starts each experiment as `deepspeed`,
    # and the ops must be built by the ninja the cells and experiments find (another ninja's log hashes the
    # same command differently, so each would rebuild the other's: seen here with 1.11 and 1.13).
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    summary = baseline(b, overrides, Path(args.results).resolve(), args)
    return 0 if summary["autotuner"].get("exit_code", 0) == 0 else 1


def baseline(b: Baseline, overrides: dict, out: Path, args) -> dict:
    """The four steps (module docstring), each written into the summary as soon as it ends."""
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {
        "matrix": str(b.path),
        "base_cell": b.base.name,
        "space": {"zero_stage": list(b.stages), "micro_batch": list(b.micro_batches)},
        "provenance": env.provenance(),
        "prebuild": prebuild(b, out),
    }
    _write(out, summary)
    if args.answer:
        answer = out / "answer.jsonl"
        zb = ["run", str(b.path), "--answer", "--budget", args.answer, "--results", str(answer)]
        run = zerobench(zb + ["--logs", str(out / "logs"), "--no-report"], out / "answer.log", args.timeout)
        summary["zerobench_answer"] = run | {"budget": args.answer, "results": str(answer), **measured(answer)}
        _write(out, summary)
    if args.optimal:  # an earlier run's answer, measured here beside zerobench's
        summary["autotuner"] = {"optimal_from": args.optimal, "chosen": chosen(Path(args.optimal).resolve(), [])}
    else:
        summary["autotuner"] = tune(b, overrides, out, args.autotuner_timeout)
    _write(out, summary)
    choice = summary["autotuner"]["chosen"]
    if choice is not None:
        results = out / "choice.jsonl"
        zb = ["run", str(choice_matrix(b, choice, out)), "--results", str(results), "--repeats", str(args.repeats)]
        run = zerobench(zb + ["--logs", str(out / "logs"), "--no-report"], out / "choice.log", args.timeout)
        summary["choice_measured"] = run | {"results": str(results), **measured(results)}
        _write(out, summary)
    return summary


def tune(b: Baseline, overrides: dict, out: Path, timeout: float) -> dict:
    """The autotuner's run, its experiments (also as experiments.jsonl) and its choice; where it was stopped
    before it chose, the best of its experiments so far, as its own metric ranks them (not its answer)."""
    cfg = user_config(b, overrides, out / "autotuner")
    tuned = run_autotuner(b, cfg, out / "autotuner", timeout)
    results = Path(tuned["results_dir"])
    exps = experiments(results, b.base.seq_len) if results.is_dir() else []
    with open(out / "experiments.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in exps)
    ran = [e for e in exps if e["status"] == "ok" and e["metrics"]]
    best = max(ran, key=lambda e: e["metrics"]["throughput"], default=None)
    return tuned | {
        "settings": cfg["autotuning"],
        "changed_defaults": changed_defaults(overrides),
        "launched_experiments": len(exps),
        "statuses": {s: sum(e["status"] == s for e in exps) for s in dict.fromkeys(e["status"] for e in exps)},
        "chosen": chosen(results / "ds_config_optimal.json", exps),
        "best_so_far": best
        and {k: best[k] for k in ("name", "zero_stage", "micro_batch", "grad_accum", "tokens_per_s")},
    }


def _write(out: Path, summary: dict) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
