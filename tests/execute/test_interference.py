"""tools/interference.py: a cell alone against copies of it side by side, from real runs on CPU slots."""

from __future__ import annotations

import pytest

from tests.conftest import TINY, as_written, write_matrix
from tools import interference


@pytest.mark.slow
@pytest.mark.serial  # "alone" must be alone: another test beside it would be the copy
def test_alone_then_beside_a_copy_gives_a_ratio(tmp_path, monkeypatch, capsys):
    # 4 measured steps last ~50 ms: the second copy's start (fork, warm-up) can come after the first copy's
    # measured phase has ended. 60 steps (~1-4 s) make the two phases overlap.
    long = TINY.replace("measured: 4", "measured: 60")
    m = write_matrix(tmp_path / "i.yaml", long + "axes: {zero_stage: [0, 1]}\n")
    monkeypatch.chdir(tmp_path)
    code = interference.main(
        [str(m), "--filter", "zero=0", "--gpus", "2", "--repeats", "1", "--out", "out", "--md", "i.md"]
    )
    assert code == 0
    alone, beside = as_written(tmp_path / "out" / "alone.jsonl"), as_written(tmp_path / "out" / "beside.jsonl")
    ends = [r for r in alone if r["status"] == "ok"]
    assert len(ends) == 1 and ends[0]["placement"]["beside"] == []
    packed = [r for r in beside if r["status"] == "ok"]
    assert len(packed) == 2 and all(r["placement"]["beside"] == [r["cell_hash"]] for r in packed)
    text = (tmp_path / "i.md").read_text()
    assert "ratio beside/alone: tokens/s " in text and "| beside | 2 |" in text, text
    # Each copy gets its share of the two cores (bench.execute.executors.local): without it both sized their thread
    # pools to the whole host and ran 16x slower than alone; with it, about 1.2x.
    ratio = float(text.split("step time ")[-1].split()[0])
    assert ratio < 4, text


def test_a_filter_that_selects_no_single_cell_is_refused(tmp_path, capsys):
    m = write_matrix(tmp_path / "i.yaml", TINY + "axes: {zero_stage: [0, 1]}\n")
    assert interference.main([str(m), "--filter", "zero", "--out", str(tmp_path / "o")]) == 2
    assert "must select one runnable single-GPU cell" in capsys.readouterr().err
