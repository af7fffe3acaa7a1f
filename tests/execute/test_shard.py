"""`zerobench run --shard I/N`: a matrix split by cell hash for CI jobs, each part into its own results file;
--resume and reports take the parts together."""

from __future__ import annotations

import csv

import pytest

from bench.cli import DEFAULT_MATRIX
from bench.execute import Shard, plan
from tests.conftest import TINY, as_written, write_matrix, zerobench

# Eight cells that a CPU host records as skipped (fp16 needs CUDA): a run writes them without running any.
SKIPPED_HERE = TINY + "axes: {zero_stage: [0, 1, 2, 3], grad_ckpt: [false, true], precision: [fp16]}\n"


def test_the_shards_of_a_matrix_are_disjoint_and_make_the_whole():
    whole = {it.cell.hash for it in plan(str(DEFAULT_MATRIX)).items}
    for n in (1, 2, 3, 5):
        parts = [{it.cell.hash for it in plan(str(DEFAULT_MATRIX), shard=Shard(i, n)).items} for i in range(1, n + 1)]
        assert set().union(*parts) == whole and sum(map(len, parts)) == len(whole), n
    assert all(plan(str(DEFAULT_MATRIX), shard=Shard(i, 3)).items for i in (1, 2, 3))  # 18 cells: none is empty


def test_a_cell_is_in_the_same_shard_whatever_order_the_matrix_lists_it_in(tmp_path):
    a = write_matrix(tmp_path / "a.yaml", TINY + "axes: {zero_stage: [0, 1, 2, 3], grad_ckpt: [false, true]}\n")
    b = write_matrix(tmp_path / "b.yaml", TINY + "axes: {grad_ckpt: [true, false], zero_stage: [3, 2, 1, 0]}\n")
    for i in (1, 2, 3):
        in_a = [it.cell.hash for it in plan(str(a), shard=Shard(i, 3)).items]
        in_b = [it.cell.hash for it in plan(str(b), shard=Shard(i, 3)).items]
        assert sorted(in_a) == sorted(in_b) and in_a != [], i
    assert [it.cell.hash for it in plan(str(a)).items] != [it.cell.hash for it in plan(str(b)).items]


@pytest.mark.parametrize("text", ["0/2", "3/2", "1/0", "a/b", "1", "1/2/3"])
def test_a_shard_is_i_of_n(text):
    with pytest.raises(ValueError, match="i/N"):
        Shard.parse(text)


def test_a_bad_shard_is_an_argument_error(tmp_path):
    r = zerobench("run", "--shard", "3/2", "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and "--shard" in r.stderr and "1 <= i <= N" in r.stderr, r.stderr[-1000:]


def test_shards_write_their_own_files_and_resume_and_report_take_them_together(tmp_path):
    m = write_matrix(tmp_path / "fp16.yaml", "name: fp16\n" + SKIPPED_HERE)
    for i in (1, 2):
        r = zerobench("run", str(m), "--shard", f"{i}/2", "--no-report", "--no-progress", cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    one, two = (tmp_path / "results" / "local" / f"fp16.shard-{i}-of-2.jsonl" for i in (1, 2))
    h1, h2 = ({r["cell_hash"] for r in as_written(p)} for p in (one, two))
    whole = {it.cell.hash for it in plan(str(m)).items}
    assert h1 and h2 and not h1 & h2 and h1 | h2 == whole and len(whole) == 8
    # --resume over the parts together: every cell has its outcome, nothing runs again.
    union = tmp_path / "union.jsonl"
    union.write_text(one.read_text() + two.read_text())
    r = zerobench("run", str(m), "--resume", "--results", str(union), "--no-report", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0 and "resume: 8 of 8 cells already have a result" in r.stdout, r.stdout[-2000:]
    assert len(as_written(union)) == 8
    # A report of both parts has every cell.
    r = zerobench("report", str(one), str(two), "-o", str(tmp_path / "rep"), "--csv", str(tmp_path / "all.csv"),
                  cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    with open(tmp_path / "all.csv") as f:
        assert {row["cell_hash"] for row in csv.DictReader(f)} == whole
