"""The result record: every committed results file loads (upgraded) and validates against the model and
the published JSON Schema; each status has one constructor and every record carries provenance; the
results DataFrame read through the model is the one the untyped reader built."""

from __future__ import annotations

import gzip
import json
import math
import sys
import warnings
from pathlib import Path

import jsonschema
import pytest

from bench.cli import main as cli
from bench.execute.launch import Outcome
from bench.host import env
from bench.judge import results
from bench.matrix import cells
from bench.records import record
from bench.records.measured import worker_documents
from bench.records.record import SCHEMA_VERSION, AttemptContext, Record, WorkerDoc, parse
from bench.records.status import Status
from bench.records.store import Store
from tests.conftest import as_written

ROOT = Path(__file__).resolve().parents[2]
RESULTS = sorted((ROOT / "results").glob("*.jsonl"))
SCHEMA_FILE = ROOT / "schema" / f"record-v{SCHEMA_VERSION}.schema.json"
FRAME_FILE = ROOT / "tests" / "data" / "results_frame.json.gz"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- the published schema ------------------------------------------------------------------------


def test_committed_schema_is_the_models(tmp_path):
    out = tmp_path / "s.json"
    assert cli(["schema", "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == record.json_schema()
    assert SCHEMA_FILE.read_text() == out.read_text(), (
        f"regenerate the committed copy: python -m bench schema -o {SCHEMA_FILE.relative_to(ROOT)}"
    )


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_every_committed_record_validates(path):
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    recs = as_written(path)
    assert recs and len(recs) == len(_lines(path)), "every line is read"
    for i, rec in enumerate(recs, 1):
        assert rec["schema_version"] == SCHEMA_VERSION
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(rec)]
        assert not errors, f"{path.name}:{i}: {errors[:3]}"
        parsed = Record.model_validate(rec)
        # Read back as written: nothing the model does not know is dropped or renamed.
        assert parsed.to_dict() == rec, f"{path.name}:{i}"


def test_fixture_records_validate():
    for path in (ROOT / "tests" / "data").glob("*.jsonl"):
        for rec in as_written(path):
            Record.model_validate(rec)


# -- versions -------------------------------------------------------------------------------------


def test_v1_upgrade():
    v1 = _lines(ROOT / "results" / "1b.jsonl")
    started = next(r for r in v1 if r["status"] == "started")
    assert started["schema_version"] == 1 and "provenance" not in started and "reason" not in started
    up = record.upgrade(started)
    assert up["schema_version"] == SCHEMA_VERSION and up["provenance"] is None and up["reason"] == ""
    assert up["machine"] is None and parse(started).block == f"{started['run_id']}@unknown"
    assert "provenance" not in started, "the argument is left as it is"
    ok = next(r for r in v1 if r["status"] == "ok")
    assert record.upgrade(ok)["provenance"] == ok["provenance"]
    assert record.upgrade(record.upgrade(ok)) == record.upgrade(ok), "upgrading a current record is a no-op"


def test_v2_records_read_with_the_machine_their_provenance_names():
    # The 7b answer's records (schema v2) ran on two H200 machines that both call themselves "vm": the GPUs'
    # UUIDs tell them apart; the boot id is unknown. A CPU record of v2 names no GPU: its machine is unknown.
    v2 = [r for r in _lines(ROOT / "results" / "7b-answer-h200.jsonl") if r["status"] == "ok"]
    assert {r["schema_version"] for r in v2} == {2} and "machine" not in v2[0]
    parsed = [parse(r) for r in v2]
    by_gpu = {p.provenance.gpus[0].uuid: p.machine for p in parsed}
    assert len(by_gpu) == 2 and len({m.id for m in by_gpu.values()}) == 2
    for uuid, m in by_gpu.items():
        assert m.gpus == [uuid] and m.boot_id is None and m.host == "vm" and m.cpu_count == 16
    runs = {p.run_id for p in parsed}
    assert len({p.block for p in parsed}) == len(runs) == 3  # two runs on one GPU: still two blocks
    cpu = [r for r in _lines(ROOT / "tests" / "data" / "smoke_cpu.jsonl") if r.get("status") == "ok"][0]
    assert parse(cpu).machine is None and parse(cpu).block.endswith("@unknown")  # a v1 record, read as v3
    skipped = next(r for r in _lines(ROOT / "tests" / "data" / "smoke_cpu.jsonl") if r.get("status") == "skipped")
    assert "machine" not in record.upgrade(skipped)  # a cell that did not run ran nowhere


def test_an_attempt_names_its_machine_by_boot_id_host_cpu_and_gpus():
    started = _started()
    m = started.machine
    assert m is not None and m.boot_id == env.boot_id() and m.host == env.provenance()["host"]
    assert m.id == record.machine_of(env.provenance()).id
    assert started.block == f"{started.run_id}@{m.id}"
    # Another boot of the same host is another machine; so is the same boot id on another GPU.
    other = {**env.provenance(), "boot_id": "another-boot"}
    assert record.machine_of(other).id != m.id
    gpu = {**env.provenance(), "boot_id": "b", "gpus": [{"index": 0, "name": "G", "uuid": "GPU-1"}]}
    gpu2 = {**gpu, "gpus": [{"index": 0, "name": "G", "uuid": "GPU-2"}]}
    assert record.machine_of(gpu).id != record.machine_of(gpu2).id and record.machine_of(gpu).gpus == ["GPU-1"]
    ended = Record.from_outcome(started, _outcome(), ds_config=None, log="l", ended_at="t")
    assert ended.machine == m


def test_newer_version_is_refused(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "cell_hash": "a", "status": "ok"}) + "\n")
    with pytest.raises(record.RecordVersionError, match=r"r.jsonl:1: .*newer"):
        as_written(p)


# -- one constructor per status ---------------------------------------------------------------------

CELL = cells.Cell(
    model="llama-tiny", seq_len=32, micro_batch=2, grad_accum=1, warmup_steps=1, measured_steps=2, matrix="t"
)
IDENT = {"run_id": "r1", "attempt": 1, "matrix_file": "t.yaml"}


def _started() -> Record:
    return Record.started(CELL, started_at="2026-01-01T00:00:00.000+00:00", **IDENT)


def _outcome(**kw) -> Outcome:
    alloc = {
        "torch_max_allocated_bytes": 100,
        "torch_max_reserved_bytes": 200,
        "torch_max_allocated_forward_bytes": 90,
        "torch_allocated_between_steps_bytes": 50,
    }
    docs = [
        {
            "rank": r,
            "world_size": 2,
            "status": "ok",
            "reason": "",
            "losses": [3.0, 2.5, 2.0],
            "step_times_s": [0.5, 0.1, 0.1],
            "params_total": 1000,
            "params_trainable": 1000,
            "params_embedding": 100,
            "model_build_s": 0.2,
            "optimizer_class": "torch.optim.adamw.AdamW",
            "memory_measured": {**alloc, "torch_max_allocated_bytes": 100 + r},
            "memory_setup": {"torch_max_allocated_bytes": 10, "torch_max_reserved_bytes": 20},
            "metrics": {"step_time_median_s": 0.1, "tokens_per_s": 640.0},
            "a_new_fact": r,
        }
        for r in (1, 0)
    ]
    tel = {"all": {"host_rss_peak_bytes": 5}, "phases": {"measured": {"host_rss_peak_bytes": 4}}}
    return Outcome(
        **{
            "status": Status.OK,
            "reason": "",
            "ranks": [WorkerDoc.model_validate(d) for d in docs],
            "telemetry": tel,
            "exit_code": 0,
            "wall_s": 2.0,
            "log_tail": "x" * 7000,
            "phase_at_end": "exit",
            "started_by": {"mode": "spawn", "why": "several ranks"},
            **kw,
        }
    )


def _check(rec: Record) -> dict:
    """Every record: this process's provenance, current version, valid against the published schema."""
    d = rec.to_dict()
    assert d["schema_version"] == SCHEMA_VERSION and d["provenance"]["host"] == env.provenance()["host"]
    jsonschema.validate(d, json.loads(SCHEMA_FILE.read_text()))
    assert record.parse(json.loads(json.dumps(d))) == rec
    return d


def test_every_status_has_provenance():
    started = _started()
    d = _check(started)
    assert d["status"] == "started" and d["reason"] == "" and "metrics" not in d
    assert d["cell_id"] == CELL.id and d["cell_hash"] == CELL.hash and d["cell"] == CELL.to_dict()

    d = _check(Record.interrupted(started, "stopped by the user", ended_at="t", log="l"))
    assert (d["status"], d["reason"], d["log"], d["started_at"]) == (
        "interrupted",
        "stopped by the user",
        "l",
        started.started_at,
    )
    d = _check(Record.error(started, "zerobench failed", ended_at="t", traceback="tb", log="l"))
    assert (d["status"], d["traceback"]) == ("error", "tb")
    with pytest.raises(ValueError, match="ends a started record"):
        Record.error(Record.model_validate(d), "again", ended_at="t", traceback="", log="")


def test_interrupted_keeps_the_provenance_of_the_attempt():
    theirs = {**env.provenance(), "host": "the-host-that-ran-it"}
    started = _started().model_copy(update={"provenance": record.Provenance.model_validate(theirs)})
    assert Record.interrupted(started, "found by --resume", ended_at="t").provenance.host == "the-host-that-ran-it"
    v1 = record.parse(
        {k: v for k, v in _started().to_dict().items() if k not in ("provenance", "reason")} | {"schema_version": 1}
    )
    assert v1.provenance is None
    assert Record.interrupted(v1, "found by --resume", ended_at="t").provenance.host == env.provenance()["host"]


def test_from_outcome():
    d = _check(
        Record.from_outcome(
            _started(), _outcome(), ds_config={"train_batch_size": 4}, log="l", ended_at="t", variant="zerobench"
        )
    )
    assert d["status"] == "ok" and d["variant"] == "zerobench" and d["world_size"] == 2
    assert d["ranks"] == [{"rank": 0, "status": "ok", "reason": ""}, {"rank": 1, "status": "ok", "reason": ""}]
    assert d["losses"] == [3.0, 2.5, 2.0] and d["metrics"] == {"step_time_median_s": 0.1, "tokens_per_s": 640.0}
    mem = d["memory"]
    assert (mem["torch_max_allocated_bytes"], mem["torch_max_allocated_per_gpu"]) == (101, [100, 101])
    assert (mem["torch_max_allocated_forward_bytes"], mem["torch_allocated_between_steps_per_gpu"]) == (90, [50, 50])
    assert (mem["torch_max_allocated_setup_bytes"], mem["host_rss_peak_measured_bytes"]) == (10, 4)
    assert "nvml_proc_peak_bytes" not in mem, "no NVML, no NVML keys"
    assert set(d["worker"]) == set(record.WorkerFacts.model_fields), "every worker fact, None where unknown"
    assert d["worker"]["params_total"] == 1000 and d["worker"]["gpu_name"] is None
    assert len(d["log_tail"]) == 6000 and d["started_by"]["mode"] == "spawn"
    assert results.fixed_cost_s(parse(d)) == pytest.approx(2.0 - 0.7 - 0.2)


def test_from_outcome_with_nvml():
    nvml = {"nvml_used_peak_bytes": 9, "nvml_proc_peak_bytes": 8, "nvml_proc_peak_per_gpu": [8, 7]}
    tel = {
        "nvml": True,
        "all": {"host_rss_peak_bytes": 5, **nvml},
        "phases": {
            "setup": {"nvml_proc_peak_bytes": 6},
            "measured": {"energy_j": 64.0, "duration_s": 2.0, "gpu_util_mean_pct": 90.0, "power_mean_w": 300.0},
        },
    }
    # GPU-indexed figures come from NVML keyed by int (the H200 found a model that refused them).
    before = {0: {"used_bytes": 1, "procs": [[123, 5]]}, 1: {"used_bytes": 1, "procs": []}}
    after = {0: {"used_bytes": 2, "procs": []}, 1: {"used_bytes": 1, "procs": []}}
    d = _check(
        Record.from_outcome(
            _started(),
            _outcome(telemetry=tel, gpu_before=before, gpu_after=after),
            ds_config=None,
            log="l",
            ended_at="t",
        )
    )
    assert d["gpu_after"] == {"0": after[0], "1": after[1]} and d["foreign_gpu_processes"] == {"0": [[123, 5]]}
    assert d["metrics"]["energy_j_per_token"] == 64.0 / (640.0 * 2.0)
    assert (d["metrics"]["gpu_util_mean_pct"], d["metrics"]["power_mean_w"]) == (90.0, 300.0)
    mem = d["memory"]
    assert {k: mem[k] for k in nvml} == nvml and mem["nvml_proc_peak_setup_bytes"] == 6
    assert mem["nvml_used_peak_measured_bytes"] is None


def test_from_outcome_without_a_result():
    out = _outcome(status=Status.HOST_OOM, reason="killed", ranks=[], exit_code=-9)
    d = _check(Record.from_outcome(_started(), out, ds_config=None, log="l", ended_at="t"))
    assert (d["status"], d["metrics"], d["losses"], d["world_size"], d["ranks"]) == ("host_oom", None, None, None, None)
    assert set(d["worker"]) == set(record.WorkerFacts.model_fields)


def test_a_document_that_does_not_match_is_an_error():
    # Parsed once, where the orchestrator reads the ranks' files: the record says which rank and why.
    docs, unreadable = worker_documents([{"rank": 1, "status": "ok", "losses": "not a list"}, {"rank": 0}])
    assert [d.rank for d in docs] == [0] and len(unreadable) == 1 and unreadable[0].startswith("rank 1: losses")
    out = _outcome(ranks=docs, unreadable=unreadable)
    d = _check(Record.from_outcome(_started(), out, ds_config=None, log="l", ended_at="t"))
    assert d["status"] == "error" and "rank 1: losses" in d["reason"]


# -- the worker's document -------------------------------------------------------------------------


def test_worker_document():
    doc = {
        "rank": 0,
        "world_size": 1,
        "status": "diverged",
        "reason": "loss became nan",
        "t_start": 1.0,
        "losses": [2.0, float("nan")],
        "phase": "measured",
        "something_new": {"x": 1},
    }
    out = record.worker_document(doc)
    assert out.keys() == doc.keys() and out["status"] == "diverged" and math.isnan(out["losses"][1])
    assert "NaN" in json.dumps(out), "NaN stays NaN, as json.dump writes it"
    bad = record.worker_document({**doc, "status": "bogus", "traceback": "tb"})
    assert bad["status"] == "error" and "status" in bad["reason"] and bad["traceback"] == "tb"
    WorkerDoc.model_validate(bad)


def test_step_parts_have_fields():
    for part in record.STEP_PARTS:
        assert f"torch_max_allocated_{part}_bytes" in record.Memory.model_fields
        assert f"torch_max_allocated_{part}_bytes" in record.AllocatorPeaks.model_fields


def test_store_writes_the_current_version(tmp_path):
    s = Store(tmp_path / "r.jsonl")
    written = s.append(_started())
    assert written == _lines(tmp_path / "r.jsonl")[0] and written["schema_version"] == SCHEMA_VERSION


# -- the DataFrame ----------------------------------------------------------------------------------


def frame_json(df) -> dict:
    """A frame as JSON values: every column but the per-step lists, NaN as null, times as ISO strings."""
    cols = [c for c in df.columns if c not in ("losses", "step_times_s")]
    rows = []
    for _, r in df[cols].iterrows():
        out = []
        for c in cols:
            v = r[c]
            if hasattr(v, "isoformat"):
                v = v.isoformat()
            elif isinstance(v, float) and math.isnan(v):
                v = None
            elif v is not None and not isinstance(v, (str, bool, int, float)):
                v = v.item() if hasattr(v, "item") else str(v)
            if isinstance(v, float) and math.isnan(v):
                v = None
            out.append(v)
        rows.append(out)
    return {"columns": cols, "rows": rows}


def _frames() -> dict:
    return {p.name: frame_json(results.load(p)) for p in RESULTS}


def test_frame_is_unchanged():
    """Every committed file gives the frame the untyped reader gave: same columns, same values. (The
    column order follows bench.matrix.axes since the axes table; micro_batch and grad_accum moved before ds_config.)"""
    expected = json.loads(gzip.decompress(FRAME_FILE.read_bytes()))
    got = _frames()
    for name, exp in expected.items():
        assert name in got, f"results/{name} is gone"
        assert sorted(got[name]["columns"]) == sorted(exp["columns"]), name
        assert len(got[name]["rows"]) == len(exp["rows"]), name
        for i, (g, e) in enumerate(zip(got[name]["rows"], exp["rows"])):
            g, e = dict(zip(got[name]["columns"], g)), dict(zip(exp["columns"], e))
            diff = {c: (g[c], e[c]) for c in e if g[c] != e[c]}
            assert not diff, f"{name} row {i}: {diff}"


if __name__ == "__main__":  # python -m tests.records.test_record --write-frame: a deliberate change of the frame
    if sys.argv[1:] == ["--write-frame"]:
        FRAME_FILE.write_bytes(gzip.compress(json.dumps(_frames(), separators=(",", ":")).encode(), mtime=0))


def test_an_outcome_a_cluster_node_ran_carries_that_nodes_provenance_and_the_orchestrators():
    started = Record.started(
        CELL,
        started_at="2026-01-01T00:00:00.000+00:00",
        context=AttemptContext(placement={"node": "n1", "node_id": "abc"}),
        **IDENT,
    )
    node_prov = {**env.provenance(), "host": "n1", "gpu_name": "node GPU", "gpu_count": 8}
    out = _outcome(node={"host": "n1", "node_id": "abc", "gpus": [2, 3], "provenance": node_prov}, port=29600)
    d = Record.from_outcome(started, out, ds_config=None, log="l", ended_at="t").to_dict()
    jsonschema.validate(d, json.loads(SCHEMA_FILE.read_text()))
    # The machine that ran the cell is the record's provenance (what reports and checks read); the host that
    # planned and wrote it is beside it.
    assert d["provenance"]["host"] == "n1" and d["provenance"]["gpu_name"] == "node GPU"
    assert d["orchestrator"] == started.to_dict()["provenance"]
    assert d["placement"] == {"node": "n1", "node_id": "abc", "gpus": [2, 3], "port": 29600}
    # One host: no orchestrator of its own, no node.
    d = Record.from_outcome(_started(), _outcome(), ds_config=None, log="l", ended_at="t").to_dict()
    assert "orchestrator" not in d and d["provenance"]["host"] == env.provenance()["host"]


def test_the_probed_rates_stay_with_the_machine_that_was_probed():
    """The run's probe figures go into the started record's machine section and on to its end on that machine; an
    outcome a cluster node ran (another machine) has no figures of the orchestrator's."""
    rates = {"matmul_fp32": 1e9, "host_mem": 5e9, "source": "cpu", "matmul_shape": "64x128x352", "threads": 2}
    started = Record.started(
        CELL, started_at="2026-01-01T00:00:00.000+00:00", context=AttemptContext(rates=rates), **IDENT
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pydantic's serializer warns of a value its field does not validate
        assert started.to_dict()["machine"]["rates"] == rates
    here = Record.from_outcome(started, _outcome(), ds_config=None, log="l", ended_at="t").to_dict()
    jsonschema.validate(here, json.loads(SCHEMA_FILE.read_text()))
    assert here["machine"]["rates"] == rates
    node_prov = {**env.provenance(), "host": "n1", "boot_id": "another-boot"}
    out = _outcome(node={"host": "n1", "node_id": "abc", "gpus": [], "provenance": node_prov}, port=29600)
    there = Record.from_outcome(started, out, ds_config=None, log="l", ended_at="t").to_dict()
    assert there["machine"]["id"] != here["machine"]["id"] and "rates" not in there["machine"]
