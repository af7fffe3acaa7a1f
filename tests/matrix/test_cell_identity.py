"""Every committed record's cell rebuilds to the hash, name and id it was stored under.

Cell hashes key history, baselines and --resume, and names are what reports and filters show: a
refactor of how cells are named or hashed must leave every published one as it was. Read from the
committed files, not restated here. Two histories are allowed for, each checked for exactly itself:
- names recorded before the micro-batch joined the name lack its `,mb=N` part;
- tests/data/smoke_cpu.jsonl was recorded before `ds_config_sha` existed, whose addition (without a
  _LATER_FIELDS entry) changed those hashes; they must equal the hash without that one field;
- a cell with a user ds_config once hashed the path as typed (now the file's stem, its content being
  ds_config_sha): such a record's hash must equal the hash with its typed path, and no other cell's may.
tests/data/synthetic_gpu.jsonl is hand-written with made-up hashes (f1x...): its names are checked,
its hashes are not.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from bench.matrix.cells import Cell

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "results").glob("*.jsonl")) + sorted((ROOT / "tests" / "data").glob("*.jsonl"))
SYNTHETIC = {"synthetic_gpu.jsonl"}


def _records(path: Path):
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            rec = json.loads(line)
            if rec.get("cell"):
                yield n, rec


def _hash_without(cell: Cell, key: str) -> str:
    d = {k: v for k, v in cell.canonical().items() if k != key}
    return _sha(d)


def _sha(d: dict) -> str:
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:10]


def _hash_with_typed_path(cell: Cell) -> str:
    return _sha({**cell.canonical(), "ds_config": cell.ds_config})


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_committed_cells_keep_their_identity(path):
    recs = list(_records(path))
    assert recs, f"{path.name} has no record with a cell"
    for n, rec in recs:
        cell = Cell.from_dict(rec["cell"])
        where = f"{path.name}:{n}"
        if path.name not in SYNTHETIC:
            if rec["cell"].get("ds_config"):
                assert _hash_with_typed_path(cell) == rec["cell_hash"], where
            elif "ds_config_sha" in rec["cell"]:
                assert cell.hash == rec["cell_hash"], where
            else:
                assert _hash_without(cell, "ds_config_sha") == rec["cell_hash"], where
        assert rec["cell_name"] in (cell.name, cell.name.replace(f",mb={cell.micro_batch}", "")), where
        assert rec["cell_id"] == f"{rec['cell_name']}#{rec['cell_hash']}", where
