"""Input of the right shape but the wrong content: duplicate matrix keys, records whose values are out of
range, a byte-order mark, one results file given twice, non-finite figures, paths the file system cannot
look up, folders that cannot be written, and Ctrl-C during a report. Each is a message (or a skipped,
named record), never a traceback."""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bench.judge.results import load
from bench.matrix import spec
from bench.matrix.problems import ConfigError
from bench.records.store import Store, read_records
from tests.conftest import TINY, write_matrix, zerobench

SKIPPED = TINY + "axes: {zero_stage: [0, 1], precision: [fp16]}\n"
LONG = "a" * 300


@functools.cache
def _records(tmp: str) -> list[dict]:
    """Real records of a run (its cells skip on a CPU host)."""
    d = Path(tmp)
    write_matrix(d / "m.yaml", SKIPPED)
    r = zerobench("run", "m.yaml", "--results", "r.jsonl", "--no-report", cwd=d)
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in (d / "r.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def recs(tmp_path_factory):
    return _records(str(tmp_path_factory.mktemp("run")))


def _write(p: Path, records: list[dict]) -> Path:
    p.write_text("".join(json.dumps(r) + "\n" for r in records))
    return p


def test_duplicate_matrix_keys_name_both_lines():
    with pytest.raises(ConfigError) as e:
        spec.loads(TINY + "seq_len: 64\n", file="m.yaml")
    assert "m.yaml:7: seq_len: key 'seq_len' is given twice (lines 2 and 7)" in str(e.value)
    with pytest.raises(ConfigError, match=r"axes.zero_stage: key 'zero_stage' is given twice \(lines (\d+) and \1\)"):
        spec.loads(TINY + "axes: {zero_stage: [0], zero_stage: [1]}\n", file="m.yaml")


@pytest.mark.parametrize(
    "bad, says",
    [
        (lambda r: r.update(cell={"zero_stage": -1}), "cell.zero_stage: -1 is not a ZeRO stage"),
        (lambda r: r.update(started_at="yesterday"), "started_at: 'yesterday' is not an ISO 8601 time"),
        (lambda r: r.update(metrics={"tokens_per_s": math.inf}), "metrics.tokens_per_s: inf is not a finite"),
        (lambda r: r.update(schema_version="two"), "schema_version 'two' is not a version"),
    ],
    ids=["zero-stage", "started-at", "infinite-tps", "odd-version"],
)
def test_out_of_range_record_is_skipped_and_named(tmp_path, recs, capfd, bad, says):
    first = json.loads(json.dumps(recs[0]))
    bad(first)
    p = _write(tmp_path / "r.jsonl", [first, *recs[1:]])
    got = list(read_records(p))
    assert len(got) == len(recs) - 1
    err = capfd.readouterr().err
    assert "line 1 (" in err and says in err, err
    r = zerobench("report", str(p), "-o", "rep/r", cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    r = zerobench("compare", str(p), str(p), cwd=tmp_path)  # its cells all skipped: 3, compared nothing
    assert r.returncode in (0, 1, 3) and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_byte_order_mark_keeps_the_first_record(tmp_path, recs):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in recs).encode())
    assert len(list(read_records(p))) == len(recs)


def test_the_same_file_twice_counts_once(tmp_path, recs, capfd):
    p = _write(tmp_path / "r.jsonl", recs)
    (tmp_path / "link.jsonl").symlink_to(p)
    df = load(p, tmp_path / "link.jsonl", str(p))
    assert len(df) == len([r for r in recs if r["status"] != "started"])
    assert "is the same file as" in capfd.readouterr().err


def test_non_finite_figures_are_written_as_null(tmp_path, recs):
    rec = {**recs[-1], "metrics": {"tokens_per_s": math.nan, "mfu": math.inf}, "losses": [1.0, math.nan]}
    p = tmp_path / "r.jsonl"
    Store(p).append(rec)
    text = p.read_text()
    assert "NaN" not in text and "Infinity" not in text
    back = json.loads(text)
    assert back["metrics"] == {"tokens_per_s": None, "mfu": None} and back["losses"] == [1.0, None]
    assert any("metrics.tokens_per_s was nan" in w for w in back["warnings"]), back["warnings"]


def _refused(cwd: Path, *args, env=None, says: str) -> None:
    r = zerobench(*args, cwd=cwd, env=env, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and says in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) <= 3, r.stderr


def test_path_parts_over_255_characters(tmp_path):
    write_matrix(tmp_path / "m.yaml", SKIPPED)
    _refused(tmp_path, "cells", f"{LONG}.yaml", says="File name too long")
    _refused(tmp_path, "run", "m.yaml", "--results", f"{LONG}.jsonl", says="--results")
    _refused(tmp_path, "run", "m.yaml", "--dry-run", "--ds-config", f"{LONG}.json", says="over 255 bytes")
    for key in ("model", "data"):
        body = SKIPPED.replace("model: llama-tiny", f"model: {LONG}") if key == "model" else SKIPPED + f"data: {LONG}\n"
        write_matrix(tmp_path / "l.yaml", body)
        _refused(tmp_path, "cells", "l.yaml", says=f"{key}: a part of this path is over 255 bytes")


def test_cache_naming_a_file(tmp_path):
    write_matrix(tmp_path / "m.yaml", SKIPPED)
    (tmp_path / "cache").write_text("")
    env = {"ZEROBENCH_CACHE": str(tmp_path / "cache")}
    _refused(tmp_path, "run", "m.yaml", "--no-report", env=env, says="ZEROBENCH_CACHE: ")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a read-only tmpfs")
def test_logs_on_a_read_only_mount(tmp_path):
    write_matrix(tmp_path / "m.yaml", SKIPPED)
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], check=True)
    try:
        _refused(tmp_path, "run", "m.yaml", "--logs", str(ro / "logs"), "--no-report", says="a read-only file system")
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=True)


def test_ctrl_c_during_report(tmp_path, recs):
    """Ctrl-C once the report runs (an event, not a guess in seconds: on a loaded machine the imports alone can
    take longer than any wait): exit 130, no traceback."""
    # A report that takes well over the moment of the Ctrl-C: 30,000 records, each a line of its own (a repeated
    # line is the same record and read once).
    p = _write(tmp_path / "r.jsonl", [{**r, "attempt": i + 1} for i in range(15000) for r in recs])
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    # `zerobench report` as `python -m bench` runs it, with a mark once the verb, inside main(), begins its report.
    code = (
        "import pathlib, sys, bench.cli, bench.report as r; write = r.write_reports; "
        "r.write_reports = lambda *a, **k: (pathlib.Path('reporting').touch(), write(*a, **k))[1]; "
        "sys.exit(bench.cli.main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [os.sys.executable, "-c", code, "report", str(p), "-o", "rep/r"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while not (tmp_path / "reporting").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the report ended before the Ctrl-C: give it more records"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and "interrupted (Ctrl-C)" in err, err[-2000:]


def test_ctrl_c_while_the_verb_starts_is_no_traceback(monkeypatch, capsys):
    """A Ctrl-C before the verb runs (its imports and parser take a second on a loaded machine): exit 130 too."""
    import bench.cli

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(bench.cli, "parser", interrupted)
    try:
        code = bench.cli.main(["report", "results"])
    except KeyboardInterrupt:  # escaping, it would stop the whole test session instead of failing this test
        pytest.fail("a Ctrl-C while the verb starts escaped main()")
    assert code == 130
    assert "zerobench: interrupted (Ctrl-C)" in capsys.readouterr().err


# -- records that contradict themselves or are too large to be records -----------------------------------------

CPU = Path(__file__).parent.parent / "data" / "smoke_cpu.jsonl"


def _cpu_records() -> list[dict]:
    """Real records of the smoke matrix on a CPU (13 ok, 5 skipped)."""
    return [json.loads(x) for x in CPU.read_text().splitlines()]


def _first_ok(records: list[dict]) -> int:
    return next(i for i, r in enumerate(records) if r["status"] == "ok")


def _median_step(r: dict) -> float:
    return r["metrics"]["step_time_median_s"]


@pytest.mark.parametrize(
    "forge, says",
    [
        (lambda r: r["metrics"].update(tokens_per_s=1e9), "metrics.tokens_per_s: 1e+09 is not its 128 tokens per step"),
        (
            lambda r: r["metrics"].update(
                step_time_median_s=_median_step(r) / 100, tokens_per_s=r["metrics"]["tokens_per_s"] * 100
            ),
            "metrics.step_time_median_s: ",
        ),
        (lambda r: r.update(status="skipped"), "metrics.tokens_per_s: "),
        (
            lambda r: r["memory"].update(nvml_proc_peak_bytes=-1),
            "memory.nvml_proc_peak_bytes: Value error, -1 is negative",
        ),
        (lambda r: r["memory"].update(nvml_proc_peak_per_gpu=[2**30, -1]), "memory.nvml_proc_peak_per_gpu.1: "),
        (lambda r: r["metrics"].update(mfu=-0.5), "metrics.mfu: Value error, -0.5 is negative"),
        (
            lambda r: r.update(step_times_s=[-1.0, *r["step_times_s"][1:]]),
            "step_times_s.0: Value error, -1 is negative",
        ),
        (lambda r: r["metrics"].update(tokens_per_s=0.0), "metrics.tokens_per_s: 0 on an ok record"),
    ],
    ids=[
        "tokens-per-s",
        "median-not-of-its-steps",
        "measured-yet-skipped",
        "negative-nvml-peak",
        "negative-per-gpu",
        "negative-mfu",
        "negative-step-time",
        "ok-at-zero-tokens-per-s",
    ],  # fmt: skip
)
def test_impossible_metrics_are_refused_with_the_line(tmp_path, capfd, forge, says):
    recs = _cpu_records()
    i = _first_ok(recs)
    forge(recs[i])
    p = _write(tmp_path / "r.jsonl", recs)
    got = list(read_records(p))
    assert len(got) == len(recs) - 1 and recs[i]["cell_hash"] not in {
        r.cell_hash for r in got if r.status.value == "ok"
    }
    err = capfd.readouterr().err
    assert f"line {i + 1} (" in err and says in err, err
    r = zerobench("report", str(p), "-o", "rep/r", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    fastest = max(
        (x for x in recs if x["status"] == "ok" and x is not recs[i]), key=lambda x: x["metrics"]["tokens_per_s"]
    )
    assert f"| fastest | {fastest['cell_name']} |" in (tmp_path / "rep/r.md").read_text()


@pytest.mark.parametrize("where", ["cell_name", "model"])
def test_a_name_of_a_megabyte_is_refused_and_the_report_ends(tmp_path, capfd, where):
    recs = _cpu_records()
    i = _first_ok(recs)
    if where == "cell_name":
        recs[i]["cell_name"] = "z" * 2**20
    else:
        recs[i]["cell"]["model"] = "/models/" + "z" * 2**20
    p = _write(tmp_path / "r.jsonl", recs)
    assert len(list(read_records(p))) == len(recs) - 1
    err = capfd.readouterr().err
    key = "cell_name" if where == "cell_name" else "cell.model"
    assert f"line {i + 1} ({key}: 1,048,5" in err and "a name here is at most 4,096" in err, err[-2000:]
    r = zerobench("report", str(p), "-o", "rep/r", cwd=tmp_path, timeout=120)  # it laid out the name for minutes
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_line_of_many_megabytes_is_refused_unread(tmp_path, capfd):
    recs = _cpu_records()
    recs[0]["losses"] = [1.0] * 1_000_000  # 5 MB: no worker writes one, and each loss would be drawn
    p = _write(tmp_path / "r.jsonl", recs)
    assert len(list(read_records(p))) == len(recs) - 1
    assert "line 1 (4.8 MiB; a record is at most 4 MiB)" in capfd.readouterr().err


def test_a_torn_last_line_is_named(tmp_path, capfd):
    text = CPU.read_text()
    last = text.splitlines()[-1]
    p = tmp_path / "r.jsonl"
    p.write_text(text + last[: len(last) // 2])  # a run killed while writing its next record
    n = len(text.splitlines())
    assert len(list(read_records(p))) == n
    err = capfd.readouterr().err
    assert f"skipping its last line ({n + 1}): it is cut short, not a whole record" in err, err


def test_many_skipped_cells_keep_the_html_small(tmp_path, recs):
    # 5,000 skipped cells (one per record, as a matrix of thousands leaves them): counted, not each a row.
    skipped = [r for r in recs if r["status"] == "skipped"]
    many = []
    for k in range(5000 // len(skipped) + 1):
        for r in skipped:
            name, _, h = r["cell_id"].rpartition("#")  # a compact record: its name and hash are its id's
            h = f"{k:04x}{h[4:]}"
            many.append({**r, "cell_id": f"{name},k={k}#{h}"})
    p = _write(tmp_path / "r.jsonl", many[:5000])
    r = zerobench("report", str(p), "-o", "rep/r", "--format", "html", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    html = (tmp_path / "rep/r.html").read_text()
    assert len(html) < 200_000, len(html)  # listing them made 6 MB (62 MB at 50,000)
    assert "5,000 cells that did not run (5,000 skipped) are counted here, not listed" in html
    assert "skipped by rule: fp16-needs-cuda 5,000" in html


def test_machine_fields_of_60000_characters_are_cut_in_reports_and_compare(tmp_path):
    """A record may hold text of 64 KiB (a CPU model, an OS, a driver): the reports' environment and compare's
    table of environments show each cut to its first 200 characters and how long it was."""
    recs, other = _cpu_records(), _cpu_records()
    for r, driver in [*((r, "D" * 60_000) for r in recs), *((r, "580.1") for r in other)]:
        if r.get("provenance"):
            r["provenance"].update(cpu="C" * 60_000, os="O" * 60_000, driver=driver)
    p, q = _write(tmp_path / "long.jsonl", recs), _write(tmp_path / "short.jsonl", other)
    r = zerobench("report", str(p), "-o", "rep/r", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("r.md", "r.html"):
        text = (tmp_path / "rep" / name).read_text()
        assert "C" * 201 not in text and "O" * 201 not in text and "D" * 201 not in text, name
        assert "C" * 200 + "… (60,000 characters)" in text, name
    r = zerobench("compare", str(q), str(p), "--md", "c.md", cwd=tmp_path)
    md = (tmp_path / "c.md").read_text()
    assert "D" * 201 not in md and "| driver | 580.1 | " + "D" * 200 + "… (60,000 characters) |" in md, md[-3000:]
