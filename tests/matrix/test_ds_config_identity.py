"""A user DeepSpeed config's cell is the file's content and name, not how its path was typed; a dry run
with --resume lists only the cells the run would still measure."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from bench.matrix import spec

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "matrices" / "ds_configs" / "zero1-buckets-5e7.json"


def _ids(typed: str) -> list[str]:
    return [c.id for c in spec.expand(spec.loads("name: t\n", ds_configs=[typed]))]


def test_one_file_typed_four_ways_is_one_cell(tmp_path, monkeypatch):
    (tmp_path / "matrices").mkdir()
    shutil.copy(CONFIG, tmp_path / "matrices" / "z.json")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    ids = {
        typed: _ids(typed) for typed in ("matrices/z.json", "./matrices/z.json", str(tmp_path / "matrices" / "z.json"))
    }
    monkeypatch.chdir(deep)
    ids["../../matrices/z.json"] = [
        c.id for c in spec.expand(spec.loads("name: t\n", ds_configs=["../../matrices/z.json"]))
    ]
    assert len({tuple(v) for v in ids.values()}) == 1, ids
    assert "ds_config=z.json" in ids["matrices/z.json"][0]


def test_an_edited_file_is_another_cell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = json.loads(CONFIG.read_text())
    Path("z.json").write_text(json.dumps(cfg))
    before = _ids("z.json")
    cfg["gradient_clipping"] = 0.5
    Path("z.json").write_text(json.dumps(cfg))
    after = _ids("z.json")
    assert before != after


def test_dry_run_resume_does_not_list_recorded_cells(tmp_path):
    mx = tmp_path / "two.yaml"
    # The committed record's shape (seq 64, micro-batch 2, 2+6 steps): its tokens/s stays its step times' figure.
    mx.write_text(
        "name: two\nseq_len: 64\nbatch: {micro: 2}\nsteps: {warmup: 2, measured: 6}\naxes: {zero_stage: [0, 1]}\n"
    )
    cells = spec.expand(spec.load(mx))
    # A recorded ok outcome for the first cell: a committed record, re-keyed to this cell.
    lines = (ROOT / "tests" / "data" / "smoke_cpu.jsonl").read_text().splitlines()
    rec = next(r for r in map(json.loads, lines) if r["status"] == "ok")
    assert rec["status"] == "ok"
    rec.update(cell_hash=cells[0].hash, cell_name=cells[0].name, cell_id=cells[0].id, cell=cells[0].to_dict())
    results = tmp_path / "two.jsonl"
    results.write_text(json.dumps(rec) + "\n")

    def dry(*extra):
        args = ["run", str(mx), "--dry-run", "--verbose", "--results", str(results), *extra]
        p = subprocess.run(
            [sys.executable, "-m", "bench", *args], capture_output=True, text=True, cwd=ROOT, timeout=120
        )
        assert p.returncode == 0, p.stderr
        return p.stdout.split("run order")[1]

    assert cells[0].id in dry() and cells[1].id in dry()
    resumed = dry("--resume")
    assert cells[0].id not in resumed and cells[1].id in resumed
