"""bench.execute.schedule: outcomes implied without running, the order for early answers, the ETA; and one real
CPU run where a cell is forced out of GPU memory and the heavier cells come out implied, naming it."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from bench.estimate import check
from bench.execute import schedule
from bench.execute.progress import Progress as _Progress
from bench.judge import compare
from bench.judge.results import records_to_frame
from bench.matrix.axes import AXES, LARGER, heavier_or_equal
from bench.matrix.cells import Cell
from bench.records.record import SCHEMA_VERSION, Record, parse
from bench.records.status import Status
from bench.report import analysis, markdown
from tests.conftest import ROOT, TINY, write_matrix, zerobench
from tests.judge.test_compare import rec

BASE = Cell(zero_stage=2, offload="none", precision="bf16", grad_ckpt=True, micro_batch=2, matrix="m")


def cell(**kw) -> Cell:
    return dataclasses.replace(BASE, **kw)


# -- dominance -----------------------------------------------------------------------------------


def test_heavier_along_the_certain_directions():
    assert schedule.heavier(cell(micro_batch=8), BASE) == ["mb=8 vs 2"]
    assert schedule.heavier(cell(grad_ckpt=False), BASE) == ["gc=off vs on"]
    assert schedule.heavier(cell(offload="optimizer"), cell(offload="optimizer+params", zero_stage=3)) is None
    assert schedule.heavier(BASE, cell(offload="optimizer")) == ["offload=none vs optimizer"]
    both = schedule.heavier(cell(micro_batch=4, grad_ckpt=False), BASE)
    assert both == ["gc=off vs on", "mb=4 vs 2"]
    assert schedule.heavier(BASE, BASE) == []
    # Less offload at the same stage, in both offload chains.
    z3 = cell(zero_stage=3)
    for lighter in ("optimizer+params", "nvme"):
        assert schedule.heavier(z3, cell(zero_stage=3, offload=lighter)) == [f"offload=none vs {lighter}"]
        assert schedule.heavier(cell(zero_stage=3, offload="optimizer"), cell(zero_stage=3, offload=lighter))


def test_not_implied_where_no_direction_is_certain():
    """ZeRO stage is not monotone in memory on one GPU (1.1B on the H200: ZeRO-0 24.7 GiB, ZeRO-2 36.9 GiB),
    nor is precision; a cell lighter in one respect and heavier in another is not comparable either."""
    assert schedule.heavier(cell(zero_stage=0), BASE) is None
    assert schedule.heavier(cell(zero_stage=3), BASE) is None
    assert schedule.heavier(cell(precision="fp32"), BASE) is None
    assert schedule.heavier(cell(micro_batch=1), BASE) is None  # lighter
    assert schedule.heavier(cell(micro_batch=8, offload="optimizer"), BASE) is None  # heavier and lighter
    assert schedule.heavier(cell(micro_batch=8, seq_len=64), BASE) is None  # a fixed setting differs
    assert schedule.heavier(cell(micro_batch=8, peft="lora"), BASE) is None
    z3 = cell(zero_stage=3)
    assert schedule.heavier(cell(zero_stage=3, offload="nvme"), cell(zero_stage=3, offload="optimizer+params")) is None
    assert schedule.heavier(cell(zero_stage=3, offload="optimizer+params"), cell(zero_stage=3, offload="nvme")) is None
    assert schedule.heavier(cell(micro_batch="auto"), z3) is None


def test_host_directions_are_only_more_offload():
    z3 = cell(zero_stage=3)
    more = cell(zero_stage=3, offload="optimizer+params")
    assert schedule.heavier(more, z3, schedule.HOST) == ["offload=optimizer+params vs none"]
    assert schedule.heavier(z3, more, schedule.HOST) is None
    # Not certain on the host: a larger micro-batch, no checkpointing, NVMe's buffers against the others.
    assert schedule.heavier(cell(micro_batch=8), BASE, schedule.HOST) is None
    assert schedule.heavier(cell(grad_ckpt=False), BASE, schedule.HOST) is None
    assert schedule.heavier(cell(zero_stage=3, offload="nvme"), z3, schedule.HOST) is None


def test_the_directions_are_written_once_in_the_axis_table():
    gpu = {a.name for a in AXES if a.gpu_heavier}
    assert gpu == {"micro_batch", "grad_ckpt", "offload"}
    assert {a.name for a in AXES if a.host_heavier} == {"offload"}
    assert heavier_or_equal(LARGER, 4, 2) and not heavier_or_equal(LARGER, 2, 4) and heavier_or_equal(None, 1, 1)
    assert not heavier_or_equal(None, 2, 1)


def test_implied_lists_the_heavier_cells_only_for_an_oom():
    others = [cell(micro_batch=4), cell(micro_batch=1), cell(zero_stage=3, micro_batch=4), BASE, cell(grad_ckpt=False)]
    hit = schedule.implied(BASE, "cuda_oom", others)
    assert [(c.micro_batch, c.grad_ckpt, how) for c, how in hit] == [(4, True, "mb=4 vs 2"), (2, False, "gc=off vs on")]
    assert schedule.implied(BASE, "error", others) == [] and schedule.implied(BASE, "ok", others) == []
    assert schedule.implied(BASE, "host_oom", others) == []  # none is heavier on the host


# -- order -----------------------------------------------------------------------------------------


def _order(cells, free=None, risky=None, mem=None):
    n = len(cells)
    idx = schedule.order(
        cells, free=free or [False] * n, risky=risky if risky is not None else [True] * n, mem=mem or [None] * n
    )
    return [cells[i] for i in idx]


def test_risky_chains_run_lightest_first():
    cells = [cell(micro_batch=8, grad_ckpt=False), cell(micro_batch=8), cell(micro_batch=2), cell(micro_batch=4)]
    got = _order(cells)
    pos = {(c.micro_batch, c.grad_ckpt): i for i, c in enumerate(got)}
    assert pos[(2, True)] < pos[(4, True)] < pos[(8, True)] < pos[(8, False)]
    assert _order(cells) == got  # deterministic


def test_free_cells_first_then_the_frontier_prior():
    cells = [
        cell(offload="optimizer"),
        cell(grad_ckpt=True, micro_batch=1),
        cell(grad_ckpt=False, micro_batch=1),
        cell(precision="fp32"),
        cell(zero_stage=3, offload="nvme"),
    ]
    free = [False, False, False, False, True]
    mem = [1e9, 2e9, 3e9, 9e9, None]
    got = _order(cells, free=free, risky=[False] * 5, mem=mem)
    assert got == [cells[4], cells[2], cells[1], cells[3], cells[0]]  # free; no ckpt; ckpt by memory; offload


def test_a_lighter_risky_cell_runs_just_before_the_heavier_one_waiting_on_it():
    """The heavier cell comes first by the prior (no checkpointing), the lighter one (checkpointing, last by
    the prior) moves up to run just before it, not after every other cell."""
    heavy, light = cell(grad_ckpt=False, micro_batch=4), cell(grad_ckpt=True, micro_batch=4)
    safe = [cell(precision="fp32", grad_ckpt=True, micro_batch=m) for m in (1, 2)]
    got = _order([safe[0], light, heavy, safe[1]], risky=[False, True, True, False], mem=[1, 5, 6, 2])
    assert got == [light, heavy, safe[0], safe[1]]


def test_not_risky_cells_are_not_held_back():
    big, small = cell(micro_batch=8), cell(micro_batch=2)
    assert _order([big, small], risky=[False, False], mem=[1, 2]) == [big, small]
    assert _order([big, small], risky=[True, True], mem=[1, 2]) == [small, big]


# -- ETA -------------------------------------------------------------------------------------------


def test_eta_by_class_falling_back_to_the_runs_mean():
    eta = schedule.Eta()
    full, lora, off = cell(), cell(peft="lora"), cell(offload="optimizer")
    assert eta.remaining([full]) is None and eta.remaining([]) == 0.0
    eta.observe(full, 10.0)
    eta.observe(full, 20.0)
    eta.observe(off, 90.0)
    assert eta.remaining([full, full]) == 30.0
    assert eta.remaining([off]) == 90.0
    assert eta.remaining([lora]) == pytest.approx(40.0)  # unseen class: the mean of all three
    assert [schedule.duration(s) for s in (35, 250, 3720, None)] == ["35s", "4m10s", "1h02m", "?"]


def _said(status: str, name: str, **fields) -> Record:
    """A record as the console is handed it: the fields a line shows, the rest the least a record has."""
    at = "2026-01-01T00:00:00+00:00"
    base = {"schema_version": SCHEMA_VERSION, "run_id": "r", "attempt": 1, "matrix": "m", "reason": ""}
    return parse(base | {"cell_id": f"{name}#0", "status": status, "started_at": at, **fields})


def test_progress_lines_carry_elapsed_and_eta_and_the_summary_counts_implied():
    lines: list[str] = []
    prog = _Progress(3, enabled=False, printer=lines.append)
    prog.done(1, _said("ok", "a", wall_s=12.0, metrics={"tokens_per_s": 100}), elapsed=12.0, eta=250.0)
    prog.done(2, _said("implied_oom", "b", reason="implied ..."), elapsed=12.1, eta=0.0)
    prog.done(3, _said("cuda_oom", "c", reason="CUDA out of memory"), elapsed=20.0, eta=0.0)
    prog.close(20.0, 3, True)
    assert lines[0].startswith("[1/3]") and lines[0].endswith("[12s elapsed, ETA 4m10s]")
    assert lines[1].startswith("[2/3]  implied_oom")
    assert lines[-1] == "matrix done: 3 cells in 20 s (2 ran, 1 implied_oom)"


# -- the record and its readers ----------------------------------------------------------------------


def _implied_record(prover: Cell, c: Cell) -> dict:
    by = {"cell_name": prover.name, "cell_hash": prover.hash, "status": "cuda_oom", "how": "mb=4 vs 2"}
    return Record.implied_oom(c, by, run_id="r", attempt=1, matrix_file="", at="2027-02-01T00:00:00+00:00").to_dict()


def test_the_implied_record_names_its_prover_and_validates():
    d = _implied_record(BASE, cell(micro_batch=4))
    assert d["status"] == "implied_oom" and d["implied_by"]["cell_hash"] == BASE.hash
    assert d["reason"].startswith(f"implied out of GPU memory, not run: {BASE.name} (#{BASE.hash}) ran out (cuda_oom)")
    schema = json.loads((ROOT / "schema" / f"record-v{SCHEMA_VERSION}.schema.json").read_text())
    jsonschema.validate(d, schema)
    assert parse(d).implied_by.how == "mb=4 vs 2"
    assert Status.IMPLIED_OOM.is_outcome and not Status.IMPLIED_OOM.ran


def test_reports_compare_and_the_model_check_keep_implied_apart(tmp_path):
    """Counted and shown as implied, never as a measured OOM; compare does not judge it; the memory model's
    check leaves it out."""
    recs = [rec(0, 1, tps=30_000), rec(1, 1, tps=0, status="cuda_oom"), rec(2, 1, tps=0, status="implied_oom")]
    a = analysis.analyse(records_to_frame(map(parse, recs)))
    (s,) = a.sections
    assert len(s.did_not_fit) == 1 and len(s.implied) == 1 and a.counts["implied_oom"] == 1
    md = markdown.render_analysis(a)
    assert "**1** ran out of memory. 1 more did not run: implied out of memory" in md
    assert "Of the 2 cells that ran, **1** fit" in md
    base = [rec(2, 1, tps=30_000)]
    c = next(
        x
        for x in compare.compare(records_to_frame(map(parse, base)), records_to_frame(map(parse, recs))).cells
        if x.key == f"{2:010x}"
    )
    assert c.verdict == compare.NOT_RUN
    path = tmp_path / "r.jsonl"
    implied = _implied_record(BASE, cell(micro_batch=4))
    implied["provenance"] = {"host": "h", "gpu_name": "NVIDIA H200", "gpus": []}  # as if a GPU run wrote it
    path.write_text(json.dumps(implied) + "\n")
    assert check.cases([path]) == []


# -- a real run ------------------------------------------------------------------------------------


def _with_cells(path) -> list[dict]:
    """A results file's records, each with its cell (a compact record's from its matrix file, beside results/, the
    default results/local/'s parent)."""
    from bench.judge.results import with_cells
    from bench.records.store import read_records

    return [r.to_dict() for r in with_cells(read_records(path), near=[path.parent.parent.parent, path.parent.parent])]


@pytest.mark.slow
def test_an_oom_implies_the_heavier_cells_and_resume_keeps_them(tmp_path):
    """A real tiny CPU matrix, ZeRO 0/1 x micro-batch 2/1 (listed heaviest first). The ZeRO-0 mb=1 cell is
    forced out of GPU memory (ZEROBENCH_FAULT cudaoom: the allocator's error, raised on a CPU cell). The early
    order runs it before mb=2, which comes out implied_oom naming it; the ZeRO-1 cells, a different stage, run.
    --resume runs nothing again."""
    write_matrix(
        tmp_path / "m.yaml",
        "name: implied\n" + TINY + "axes:\n  zero_stage: [0, 1]\n  precision: [fp32]\n  micro_batch: [2, 1]\n",
    )
    fault = {"ZEROBENCH_FAULT": "cudaoom@1~zero=0.*mb=1#"}
    r = zerobench("run", "m.yaml", "--no-report", "--no-progress", cwd=tmp_path, env=fault)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = tmp_path / "results" / "local" / "implied.jsonl"
    lines = res.read_text().splitlines()
    ends = {(x["cell"]["zero_stage"], x["cell"]["micro_batch"]): x for x in _with_cells(res)}
    assert {k: v["status"] for k, v in ends.items()} == {
        (0, 1): "cuda_oom",
        (0, 2): "implied_oom",
        (1, 1): "ok",
        (1, 2): "ok",
    }
    oom, implied = ends[(0, 1)], ends[(0, 2)]
    by = implied["implied_by"]
    assert by["cell_hash"] == oom["cell_hash"] and by["cell_name"] == oom["cell_name"]
    assert implied["implied_by"]["how"] == "mb=2 vs 1" and oom["cell_name"] in implied["reason"]
    assert not any(x["status"] == "started" and x["cell_hash"] == implied["cell_hash"] for x in map(json.loads, lines))
    assert "ETA" in r.stdout and "1 implied_oom" in r.stdout

    r = zerobench("run", "m.yaml", "--resume", "--no-report", "--no-progress", cwd=tmp_path, env=fault)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert res.read_text().splitlines() == lines
    assert "4 of 4 cells already have a result" in r.stdout

    # A second repeat: the cells that ran run again; the implied cell's record stands for every repeat
    # (written once), and the cell that ran out of memory runs again (a measurement, not an implication).
    again = ("run", "m.yaml", "--resume", "--repeats", "2", "--no-report", "--no-progress")
    r = zerobench(*again, cwd=tmp_path, env=fault)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    new = _with_cells(res)[len(lines) :]
    ran = sorted((x["cell"]["zero_stage"], x["cell"]["micro_batch"]) for x in new if x["status"] != "started")
    assert ran == [(0, 1), (1, 1), (1, 2)], ran
    assert not any(x["cell_hash"] == implied["cell_hash"] for x in new)


def test_a_dry_run_shows_the_run_order_and_what_the_memory_model_prunes(tmp_path):
    from tests.conftest import TINY, write_matrix, zerobench

    m = write_matrix(
        tmp_path / "m.yaml",
        TINY.replace("seq_len: 32", "seq_len: 2048")
        + "axes: {zero_stage: [0], precision: [fp32], micro_batch: [4096, 1], grad_ckpt: [false, true]}\n",
    )
    r = zerobench("run", str(m), "--dry-run", "--verbose", "--gpu-mem", "16GiB", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout[r.stdout.index("run order (early)") :].splitlines()
    end = next(i for i, ln in enumerate(lines) if ln.startswith("memory model:"))
    assert "judged against 16.0 GiB of GPU memory" in lines[end]
    rows = [ln.split() for ln in lines[1:end]]
    # Cells recorded without running come first (the two micro-batch 4096 cells cannot fit in 16 GiB), then
    # no checkpointing before checkpointing; nothing ran.
    assert [(w[1], "mb=4096" in w[-1], "gc=on" in w[-1]) for w in rows] == [
        ("pruned", True, False), ("pruned", True, True), ("run", False, False), ("run", False, True),
    ]  # fmt: skip
    # The summary last: the counts, the predicted GPU time and frontier.
    assert lines[end + 1] == "2 to run, 2 pruned" and lines[end + 2].startswith("predicted GPU time (2 cells")
    assert lines[end + 3].startswith("predicted memory/speed frontier") and "GiB" in lines[-1]
    assert not (tmp_path / "results").exists()
