"""Hostile paths: a device or a FIFO where a results file or a matrix should be, links planted at the
names a run writes (lock, report temp files, charts, worker logs), a second run through a link to a
results file another run holds, and a results file of garbage lines. Each is refused with a message or
written around, never followed, never read without end and never waited on.

Real files, real devices (/dev/zero), real FIFOs and real `zerobench` processes."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest

from bench.records.store import read_records
from tests.conftest import write_matrix
from tests.faults.test_storage import SKIPPED, all_skipped, holder, run


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


# -- a device or a FIFO given as a file ----------------------------------------------------------------


@pytest.mark.parametrize("what", ["device", "fifo"])
def test_results_is_not_a_regular_file(tmp_path, ledger, what):
    ledger.fault(
        f"results-is-{what}", f"a {'character device (/dev/zero)' if what == 'device' else 'FIFO'} as --results"
    )
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    target = Path("/dev/zero") if what == "device" else _fifo(tmp_path / "r.jsonl")
    said = "a character device" if what == "device" else "a FIFO (named pipe)"
    r = run(tmp_path, "run", m.name, "--results", str(target), "--no-report", timeout=60)
    assert r.returncode == 2 and f"results file {target} is {said}, not a regular file" in r.stderr, r.stderr
    assert not Path(f"{target}.lock").exists(), "no lock is created beside a device or a FIFO"
    p = tmp_path / "ok.jsonl"
    assert run(tmp_path, "run", m.name, "--results", str(p), "--no-report").returncode == 0
    ledger.account(p, all_skipped(m), runs=1)


@pytest.mark.parametrize("what", ["device", "fifo"])
def test_report_and_compare_of_a_device_or_fifo(tmp_path, ledger, what):
    ledger.fault(f"report-of-{what}", f"a {'/dev/zero' if what == 'device' else 'FIFO'} given to report and compare")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    p = tmp_path / "r.jsonl"
    assert run(tmp_path, "run", m.name, "--results", str(p), "--no-report").returncode == 0
    bad = "/dev/zero" if what == "device" else str(_fifo(tmp_path / "f.jsonl"))
    for args in (["report", bad, "-o", "rep/r"], ["compare", str(p), bad], ["compare", bad, str(p)]):
        t0 = time.monotonic()
        r = run(tmp_path, *args, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert f"{bad} is a" in r.stderr and "not a regular file" in r.stderr, r.stderr
        assert time.monotonic() - t0 < 30
    assert not (tmp_path / "rep").exists()
    ledger.account(p, all_skipped(m), runs=1)


@pytest.mark.parametrize("what", ["device", "fifo"])
def test_matrix_is_not_a_regular_file(tmp_path, ledger, what):
    ledger.fault(f"matrix-is-{what}", f"a {'/dev/zero' if what == 'device' else 'FIFO'} given as the matrix")
    bad = "/dev/zero" if what == "device" else str(_fifo(tmp_path / "m.yaml"))
    r = run(tmp_path, "cells", bad, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "no such" not in r.stderr and "not a matrix file" in r.stderr, r.stderr
    ledger.account(tmp_path / "none.jsonl", {})


# -- links planted at the names a run writes -----------------------------------------------------------


def test_planted_links_are_not_followed(tmp_path, ledger):
    ledger.fault("planted-links", "symlinks to decoys at the lock, report, chart and log names of a run")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    p = tmp_path / "results" / "r.jsonl"
    p.parent.mkdir()
    (tmp_path / "reports").mkdir()
    decoys = tmp_path / "decoys"
    decoys.mkdir()
    planted = [p.with_name("r.jsonl.lock"), tmp_path / "reports" / "r.md.tmp", tmp_path / "reports" / "r.html.tmp"]
    for i, link in enumerate(planted):
        (decoys / str(i)).write_text("decoy\n")
        link.symlink_to(decoys / str(i))
    (decoys / "md").write_text("decoy\n")
    (tmp_path / "reports" / "r.md").symlink_to(decoys / "md")
    r = run(tmp_path, "run", m.name, "--results", str(p))
    assert r.returncode == 0, r.stderr
    assert all((decoys / str(i)).read_text() == "decoy\n" for i in range(len(planted))), "a decoy was written"
    assert (decoys / "md").read_text() == "decoy\n", "the report was written through a link"
    md = tmp_path / "reports" / "r.md"
    assert not md.is_symlink() and "zerobench" in md.read_text().lower()
    ledger.account(p, all_skipped(m), runs=1)


def test_planted_chart_and_log_links(tmp_path, ledger):
    ledger.fault("planted-chart-log-links", "symlinks at a chart's temp names and at a worker log's name")
    from bench.host.safefile import safe_open_new  # the worker log is opened through this helper
    from bench.report.charts import Axis, Chart, Series
    from bench.report.figures import write_png

    decoy = tmp_path / "decoy"
    decoy.write_text("decoy\n")
    log = tmp_path / "logs" / "abc.1.log"
    log.parent.mkdir()
    log.symlink_to(decoy)
    with os.fdopen(safe_open_new(log), "wb") as f:
        f.write(b"log\n")
    assert decoy.read_text() == "decoy\n" and not log.is_symlink() and log.read_bytes() == b"log\n"
    png = tmp_path / "r.tps.png"
    for name in ("r.tps.png.tmp", ".r.tps.png.tmp"):
        (tmp_path / name).symlink_to(decoy)
    line = Series(kind="line", x=(1.0, 2.0), y=(1.0, 2.0), color="#000000")
    chart = Chart(name="tps", title="t", aria="a", x=Axis(label="x", lo=0, hi=3), y=Axis(label="y", lo=0, hi=3),
                  series=(line,), legend="above", height=3.0)  # fmt: skip
    write_png(chart, png)
    assert decoy.read_text() == "decoy\n" and png.read_bytes().startswith(b"\x89PNG")
    ledger.account(tmp_path / "none.jsonl", {})


# -- one run per results file, whatever its name -------------------------------------------------------


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_second_run_through_a_link(tmp_path, ledger, how):
    ledger.fault(f"results-via-{how}", f"a second run on the held results file through a {how}")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    p = tmp_path / "r.jsonl"
    assert run(tmp_path, "run", m.name, "--results", str(p), "--no-report").returncode == 0
    other = tmp_path / "elsewhere"
    other.mkdir()
    alias = other / "alias.jsonl"
    alias.symlink_to(p) if how == "symlink" else os.link(p, alias)
    before = p.read_bytes()
    with holder(p):
        r = run(tmp_path, "run", m.name, "--results", str(alias), "--no-report")
        assert r.returncode == 2 and f"results file {alias} is in use by" in r.stderr, r.stderr
        assert p.read_bytes() == before
    ledger.account(p, all_skipped(m), runs=1)


# -- a results file of garbage lines -------------------------------------------------------------------


def test_many_garbage_lines_read_in_linear_time(tmp_path, ledger, capfd):
    ledger.fault("garbage-lines-200k", "200,000 lines that are not JSON between records")
    n = 200_000
    good = json.dumps({"schema_version": 1, "cell_hash": "x"})  # JSON, not a record: skipped after parsing
    calib, bad = tmp_path / "calib.jsonl", tmp_path / "bad.jsonl"
    calib.write_text((good + "\n") * n)
    bad.write_text("not json at all\n" * n + good + "\n")

    def took(p: Path) -> float:
        t0 = time.perf_counter()
        list(read_records(p))
        return time.perf_counter() - t0

    base = took(calib)
    t = took(bad)
    err = capfd.readouterr().err
    assert t < 3 * base + 1, f"{n} garbage lines took {t:.1f} s, {n} JSON lines {base:.1f} s"
    assert err.count("not JSON") == 1 and f"skipping {n} lines that are not JSON (lines 1, 2, 3, 4, 5, ...)" in err
    assert hashlib.sha256(bad.read_bytes()).hexdigest()  # the file is only read
    ledger.account(tmp_path / "none.jsonl", {})
