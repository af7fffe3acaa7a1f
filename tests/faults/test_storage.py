"""Storage faults: read-only and full disks, concurrent runs on one results file, stale locks, and results
files with lines zerobench did not write whole. A record is either whole on disk or reported lost; a
line that is not a record is skipped and named, never read as a cell; one run holds a results file.

Disks are real: a small tmpfs mounted for the test (full: its pages run out, so the kernel's write is
short and then ENOSPC; read-only: mounted ro, which even root cannot write). That needs root; without
it those tests skip, and the file size limit (RLIMIT_FSIZE: EFBIG) stands in for a full disk where a
process can set it itself. Most tests run a matrix whose cells all skip on a CPU host (fp16 needs CUDA),
which exercises the orchestrator's whole write path in seconds; the few that need a running cell use a
real one (slow)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.matrix import spec
from bench.records.store import Store, StoreWriteError, read
from tests.conftest import ROOT, TINY, write_matrix, zerobench

# 8 cells, all skipped on a CPU host (CUDA is hidden from tests): ~2 KB of record each.
SKIPPED = TINY + "axes: {zero_stage: [0, 1, 2, 3], precision: [fp16], grad_ckpt: [false, true]}\n"


def names(m: Path) -> list[str]:
    return [c.name for c in spec.expand(spec.load(m))]


def all_skipped(m: Path) -> dict[str, set[str]]:
    return {n: {"skipped"} for n in names(m)}


def whole_lines(p: Path) -> list[dict]:
    """Every line of the file parses on its own: nothing torn was left behind."""
    out = [json.loads(line) for line in p.read_bytes().split(b"\n")[:-1]]  # raises on a torn line
    assert p.read_bytes().endswith(b"\n") or not p.read_bytes(), "the file ends in a torn line"
    return out


# -- real small and read-only disks ---------------------------------------------------------------------


@functools.cache
def can_mount() -> bool:
    if os.geteuid() != 0:
        return False
    probe = Path(f"/tmp/zerobench-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)], capture_output=True)
    if ok.returncode == 0:
        subprocess.run(["umount", str(probe)], check=True)
    probe.rmdir()
    return ok.returncode == 0


needs_mount = pytest.mark.skipif(not can_mount(), reason="needs root to mount a small tmpfs (a real full disk)")


@contextlib.contextmanager
def tmpfs(path: Path, size: str, ro: bool = False):
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        if ro:
            remount(path, "ro")
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def remount(path: Path, opts: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{opts}", str(path)], check=True)


def fill(path: Path) -> None:
    """Write until the disk is full."""
    with open(path, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"x" * 4096)


def run(cwd: Path, *args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    r = zerobench(*args, cwd=cwd, env=env, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r


# -- read-only -------------------------------------------------------------------------------------


@needs_mount
def test_results_folder_read_only(tmp_path, ledger):
    ledger.fault("results-folder-read-only", "the results folder is on a read-only mount")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    with tmpfs(tmp_path / "ro", "64k", ro=True):
        r = run(tmp_path, "run", m.name, "--results", "ro/r.jsonl")
        assert r.returncode == 2, r.stderr
        assert "cannot write the results file ro/r.jsonl: Read-only file system" in r.stderr
        assert "give --results a path in a writable folder" in r.stderr
    assert not (tmp_path / "reports").exists()


@needs_mount
def test_resume_on_read_only_results(tmp_path, ledger):
    ledger.fault("results-read-only-resume", "--resume of a complete results file that is now on a read-only mount")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    with tmpfs(tmp_path / "disk", "1m") as disk:
        assert run(tmp_path, "run", m.name, "--results", "disk/r.jsonl", "--no-report").returncode == 0
        remount(disk, "ro")
        r = run(tmp_path, "run", m.name, "--results", "disk/r.jsonl", "--resume", "--no-report")
        assert r.returncode == 2 and "Read-only file system" in r.stderr, r.stderr
        ledger.account(disk / "r.jsonl", all_skipped(m), runs=1)


@needs_mount
def test_reports_folder_read_only(tmp_path, ledger):
    ledger.fault("reports-folder-read-only", "the reports folder is read-only: the results are written, the report not")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    with tmpfs(tmp_path / "reports", "64k", ro=True):
        r = run(tmp_path, "run", m.name, "--results", "r.jsonl")
        assert r.returncode == 1, r.stderr
        assert "the report was not written" in r.stderr and "the results are saved" in r.stderr
    ledger.account(tmp_path / "r.jsonl", all_skipped(m), runs=1)


# -- full disks -------------------------------------------------------------------------------------


@needs_mount
def test_store_append_on_a_full_disk(tmp_path, ledger):
    ledger.fault("disk-full-store-append", "Store.append of a record longer than the page left (ENOSPC)")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    with tmpfs(tmp_path / "disk", "64k") as disk:
        p = disk / "r.jsonl"
        assert run(tmp_path, "run", m.name, "--results", str(p), "--no-report").returncode == 0
        fill(disk / "filler")  # what is left is the rest of the results file's last page: a short write
        before = p.read_bytes()
        # Longer than a page, whatever the slack the file's size leaves in its last page: always a short write.
        rec = read(p)[0].to_dict()
        big = {**rec, "reason": rec["reason"] + " " + "." * 4096}
        with pytest.raises(StoreWriteError, match=r"No space left on device; the file is back to its \d+ bytes"):
            Store(p).append(big)
        assert p.read_bytes() == before, "nothing torn was left behind"
        ledger.account(p, all_skipped(m), runs=1)


def test_store_append_past_the_file_size_limit(tmp_path, ledger):
    ledger.fault("file-size-limit-store-append", "Store.append past RLIMIT_FSIZE (a short write, then EFBIG)")
    p = tmp_path / "r.jsonl"
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    assert run(tmp_path, "run", m.name, "--results", str(p), "--no-report").returncode == 0
    size = p.stat().st_size
    # In a process of its own: the limit applies to every file it writes.
    code = (
        "import resource, signal, sys\n"
        "from bench.records.store import Store, read, StoreWriteError\n"
        "p = sys.argv[1]; rec = read(p)[0].to_dict()\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({size + 100}, resource.RLIM_INFINITY))\n"
        "try:\n    Store(p).append(rec)\nexcept StoreWriteError as e:\n    print(e.strerror)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code, str(p)], env=env, capture_output=True, text=True)
    assert "File too large; the file is back to its" in r.stdout, (r.stdout, r.stderr)
    assert p.stat().st_size == size
    ledger.account(p, all_skipped(m), runs=1)


# 32 cells a CPU host skips: their compact records (some 350 bytes each) overflow one 4 KB page.
MANY_SKIPPED = TINY + (
    "axes: {zero_stage: [0, 1, 2, 3], precision: [fp16], grad_ckpt: [false, true], micro_batch: [1, 2, 4, 8]}\n"
)


@needs_mount
def test_disk_full_mid_run_then_resume(tmp_path, ledger):
    ledger.fault("disk-full-mid-run", "the results disk fills partway through the records; --resume after making room")
    m = write_matrix(tmp_path / "m.yaml", MANY_SKIPPED)
    n = len(names(m))
    with tmpfs(tmp_path / "disk", "8k") as disk:
        p = disk / "r.jsonl"
        r = run(tmp_path, "run", m.name, "--results", str(p), "--no-report")
        assert r.returncode == 1
        out = r.stdout + r.stderr
        k = len(whole_lines(p))  # the records that fitted on this 4 KB page (the lock file holds the other)
        assert 0 < k < n
        assert "stopped: could not write a record" in out and "No space left on device" in out
        assert f"lost: [{k + 1}/{n}]  skipped" in out and f"by this run: {k} outcome(s), each whole" in out
        assert f"\n[{k + 1}/{n}]" not in r.stdout, "a lost record is not reported written"
        remount(disk, "size=1m")
        r = run(tmp_path, "run", m.name, "--results", str(p), "--resume", "--no-report")
        assert r.returncode == 0, r.stderr
        assert f"resume: {k} of {n} cells already have a result" in r.stdout
        whole_lines(p)
        ledger.account(p, all_skipped(m), runs=2)


@needs_mount
def test_report_on_a_full_disk_leaves_no_half_report(tmp_path, ledger):
    ledger.fault("disk-full-report", "the reports disk is full: no empty or half-written report replaces a good one")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    assert run(tmp_path, "run", m.name, "--results", "r.jsonl", "--no-report").returncode == 0
    with tmpfs(tmp_path / "rep", "64k") as rep:
        assert run(tmp_path, "report", "r.jsonl", "-o", "rep/r", "--format", "md").returncode == 0
        good = (rep / "r.md").read_bytes()
        fill(rep / "filler")
        r = run(tmp_path, "report", "r.jsonl", "-o", "rep/r")
        assert r.returncode != 0 and "No space left on device" in r.stderr, r.stderr[-2000:]
        assert (rep / "r.md").read_bytes() == good
        assert not (rep / "r.html").exists() and not list(rep.glob("*.tmp"))
    ledger.account(tmp_path / "r.jsonl", all_skipped(m), runs=1)


@pytest.mark.slow
@needs_mount
def test_disk_full_after_a_cell_ran(tmp_path, ledger):
    ledger.fault(
        "disk-full-after-cell", "a real cell runs, and its outcome record does not fit on the disk; --resume after"
    )
    m = write_matrix(tmp_path / "m.yaml", TINY)
    [cell] = names(m)
    with tmpfs(tmp_path / "disk", "8k") as disk:  # one page: the started record fits, the outcome does not
        p = disk / "r.jsonl"
        r = run(tmp_path, "run", m.name, "--results", str(p), "--logs", "logs", "--no-report")
        assert r.returncode == 1, r.stderr[-2000:]
        out = r.stdout + r.stderr
        assert "stopped: could not write a record" in out and "lost: [1/1]  ok" in out and cell in out, out
        assert [x["status"] for x in whole_lines(p)] == ["started"]
        remount(disk, "size=1m")
        r = run(tmp_path, "run", m.name, "--results", str(p), "--logs", "logs", "--resume", "--no-report")
        assert r.returncode == 0, r.stderr[-2000:]
        recs = ledger.account(p, {cell: {"ok"}}, runs=2)
    assert [x["status"] for x in recs] == ["started", "interrupted", "started", "ok"]


# -- one run per results file -------------------------------------------------------------------------

HOLD = (
    "import sys, time\n"
    "from bench.records.store import Store\n"
    "held = Store(sys.argv[1]).hold('zerobench run')\n"
    "held.__enter__()\n"
    "print('held', flush=True)\n"
    "time.sleep(600)\n"
)


@contextlib.contextmanager
def holder(results: Path):
    """A process that holds the results file's lock as a run does."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(results)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("resume", [False, True], ids=["run", "resume"])
def test_results_file_in_use(tmp_path, ledger, resume):
    ledger.fault(
        "resume-while-running" if resume else "concurrent-run",
        f"`zerobench run{' --resume' if resume else ''}` on a results file another run holds",
    )
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    p = tmp_path / "r.jsonl"
    assert run(tmp_path, "run", m.name, "--results", str(p), "--no-report").returncode == 0
    before = p.read_bytes()
    with holder(p) as proc:
        args = ["run", m.name, "--results", str(p), "--no-report"] + (["--resume"] if resume else [])
        r = run(tmp_path, *args)
        assert r.returncode == 2, r.stderr
        assert f"results file {p} is in use by pid {proc.pid} (zerobench run, started at " in r.stderr, r.stderr
        assert p.read_bytes() == before
    ledger.account(p, all_skipped(m), runs=1)


@pytest.mark.parametrize("content", [None, b"\x00\xff garbage"], ids=["dead-holder", "garbage"])
def test_stale_lock(tmp_path, ledger, content):
    ledger.fault(
        f"stale-lock-{'dead-holder' if content is None else 'garbage'}",
        "the lock file of a results file left by a SIGKILLed run"
        if content is None
        else "a lock file with garbage in it, held by no one",
    )
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    p = tmp_path / "r.jsonl"
    lock = tmp_path / "r.jsonl.lock"
    if content is None:
        with holder(p) as proc:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert json.loads(lock.read_text())["pid"] == proc.pid, "the dead holder's lock file is left"
    else:
        lock.write_bytes(content)
    t0 = time.monotonic()
    r = run(tmp_path, "run", m.name, "--results", str(p), "--no-report")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 60
    assert not lock.exists()
    ledger.account(p, all_skipped(m), runs=1)


def test_lock_path_is_a_folder(tmp_path, ledger):
    ledger.fault("lock-path-is-folder", "<results>.lock exists as a folder")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    (tmp_path / "r.jsonl.lock").mkdir()
    r = run(tmp_path, "run", m.name, "--results", "r.jsonl", "--no-report")
    assert r.returncode == 2
    assert "cannot write beside the results file r.jsonl (r.jsonl.lock: Is a directory" in r.stderr


@pytest.mark.slow
def test_two_real_runs_on_one_results_file(tmp_path, ledger):
    ledger.fault(
        "concurrent-real-runs",
        "a second `zerobench run` and a `--resume` while a real run is in a cell; then Ctrl-C and --resume",
    )
    m = write_matrix(tmp_path / "m.yaml", TINY)
    [cell] = names(m)
    p = tmp_path / "r.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ZEROBENCH_FAULT": "hang@1"}
    first = subprocess.Popen(
        [sys.executable, "-m", "bench", "run", m.name, "--results", str(p), "--no-report"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (p.exists() and b'"started"' in p.read_bytes()):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.5)
        for extra in ([], ["--resume"]):
            r = run(tmp_path, "run", m.name, "--results", str(p), "--no-report", *extra)
            assert r.returncode == 2 and f"is in use by pid {first.pid} (zerobench run, started at" in r.stderr
        assert [x["status"] for x in whole_lines(p)] == ["started"], "the running cell is left alone"
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=120)
        assert first.returncode == 130, err[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    r = run(tmp_path, "run", m.name, "--results", str(p), "--resume", "--no-report")
    assert r.returncode == 0, r.stderr[-2000:]
    recs = ledger.account(p, {cell: {"ok"}}, runs=2)
    statuses = [(x["status"], x["attempt"]) for x in recs]
    assert statuses == [("started", 1), ("interrupted", 1), ("started", 2), ("ok", 2)]


# -- lines zerobench did not write whole ---------------------------------------------------------------


def _complete(tmp_path: Path) -> tuple[Path, Path]:
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    p = tmp_path / "r.jsonl"
    assert run(tmp_path, "run", m.name, "--results", str(p), "--no-report").returncode == 0
    return m, p


def _rows(tmp_path: Path, p: Path) -> tuple[subprocess.CompletedProcess, str]:
    """`zerobench report` of the file: it must succeed and write both formats; returns the Markdown."""
    r = run(tmp_path, "report", str(p), "-o", "rep/r")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "rep" / "r.html").is_file()
    return r, (tmp_path / "rep" / "r.md").read_text()


def _cells_in(md: str, m: Path) -> int:
    return sum(md.count(n) for n in names(m))


@pytest.mark.parametrize(
    "fault,line,why",
    [
        ("foreign-line-object", '{"hello": "world"}', "run_id: Field required"),
        ("foreign-line-status", None, "status: Input should be"),  # another tool's vocabulary
        ("foreign-line-json-scalars", '[1, 2]\n42\nnull\n"text"', "a JSON list, not an object"),
    ],
)
def test_foreign_lines(tmp_path, ledger, fault, line, why):
    ledger.fault(fault, f"a results file with lines zerobench did not write ({fault.split('-', 2)[-1]})")
    m, p = _complete(tmp_path)
    _, md_before = _rows(tmp_path, p)
    if line is None:  # a record, but "passed" and a cell of its own: a phantom row if it were read
        rec = json.loads(p.read_text().splitlines()[0])
        line = json.dumps({**rec, "status": "passed", "cell_name": "phantom", "cell_hash": "ffffffffff"})
    with open(p, "a") as f:
        f.write(line + "\n")
    for args in (["--resume"], []):  # once stopped `run` with KeyError / ValueError
        r = run(tmp_path, "run", m.name, "--results", str(p), "--no-report", "--filter", "zero=0", *args)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "line 9 (" in r.stderr and why in r.stderr and "not zerobench records, skipped" in r.stderr, r.stderr
    r, md = _rows(tmp_path, p)
    assert "not zerobench records" in r.stderr
    assert "phantom" not in md and "hello" not in md
    assert len(read(p)) == len(names(m)) + 2  # the rerun of the two zero=0 cells
    ledger.account(p, all_skipped(m))


def test_oddly_typed_fields(tmp_path, ledger):
    ledger.fault("odd-types-in-records", "records whose fields have the wrong types (wall_s 'fast', cell.lora 5, ...)")
    m, p = _complete(tmp_path)
    _, md_before = _rows(tmp_path, p)
    lines = p.read_text().splitlines()
    odd = []
    for i, change in enumerate(
        [
            {"wall_s": "fast"},
            {"cell": {"lora": 5}},
            {"cell": {"zero_stage": "three"}},
            {"metrics": {"tokens_per_s": "many"}},
            {"losses": "low"},
            {"attempt": [1]},
        ]
    ):
        rec = json.loads(lines[i])
        for k, v in change.items():
            rec[k] = {**rec[k], **v} if isinstance(v, dict) and isinstance(rec.get(k), dict) else v
        rec["run_id"] = "odd"
        odd.append(json.dumps(rec))
    p.write_text("\n".join(lines + odd) + "\n")
    r, md = _rows(tmp_path, p)
    assert "6 lines not zerobench records" in r.stderr, r.stderr
    assert md == md_before, "the report is that of the good records alone"
    assert len(read(p)) == len(names(m))
    ledger.account(p, all_skipped(m), runs=2)


@pytest.mark.parametrize(
    "fault,tail",
    [
        ("torn-last-line", None),
        ("garbage-middle-line", b"\x00\xde\xad\xbe\xef not json at all\n"),
        ("zero-filled-tail", b"\x00" * 3000),
    ],
)
def test_damaged_lines_then_resume(tmp_path, ledger, fault, tail):
    ledger.fault(fault, f"a results file with {fault.replace('-', ' ')}, then --resume and a report")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    p = tmp_path / "r.jsonl"
    assert run(tmp_path, "run", m.name, "--results", str(p), "--no-report", "--filter", "gc=off").returncode == 0
    if tail is None:  # half of a record, as a run killed mid-write leaves it
        line = p.read_bytes().splitlines()[0]
        tail = line[: len(line) // 2]
    with open(p, "ab") as f:
        f.write(tail)
    r = run(tmp_path, "run", m.name, "--results", str(p), "--resume", "--no-report")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resume: 4 of 8 cells already have a result" in r.stdout
    assert len(read(p)) == 8
    _rows(tmp_path, p)
    ledger.account(p, all_skipped(m), runs=2)


def test_record_from_a_newer_zerobench(tmp_path, ledger):
    ledger.fault("newer-schema-line", "a record written by a newer zerobench (schema_version 99)")
    m, p = _complete(tmp_path)
    rec = json.loads(p.read_text().splitlines()[0])
    with open(p, "a") as f:
        f.write(json.dumps({**rec, "schema_version": 99, "run_id": "future"}) + "\n")
    for args in (["report", str(p), "-o", "rep/r"], ["run", m.name, "--results", str(p), "--resume", "--no-report"]):
        r = run(tmp_path, *args)
        assert r.returncode == 2, r.stderr
        assert "r.jsonl:9: schema_version 99 is newer than this zerobench reads" in r.stderr and "upgrade" in r.stderr
    assert not (tmp_path / "rep").exists()
    ledger.account(p, all_skipped(m), runs=2)


# -- settings from the environment -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, value, what",
    [
        ("ZEROBENCH_STALL_S", "abc", "not seconds"),
        ("ZEROBENCH_STALL_S", "-1", "out of range 1-604800"),
        ("ZEROBENCH_PORT", "99999", "out of range 1024-65000"),
        ("ZEROBENCH_PORT", "abc", "not a whole number"),
        ("ZEROBENCH_FORKSERVER", "yes", "not 0 or 1"),
    ],
)
def test_a_bad_setting_stops_the_run_before_the_first_cell(tmp_path, ledger, name, value, what):
    ledger.fault(f"setting-{name.lower()}-{value}", f"{name}={value} in the environment")
    m = write_matrix(tmp_path / "m.yaml", SKIPPED)
    r = run(tmp_path, "run", m.name, "--results", "r.jsonl", env={name: value})
    assert r.returncode == 2, r.stderr[-2000:]
    assert name in r.stderr and what in r.stderr, r.stderr
    assert not (tmp_path / "r.jsonl").exists()


# -- the harness's own failures --------------------------------------------------------------------


def _exhaust_inodes(folder: Path) -> list[Path]:
    """Create empty files until the file system has no inode left: the next new file is ENOSPC."""
    made = []
    with contextlib.suppress(OSError):
        while True:
            p = folder / f"filler{len(made)}"
            p.touch()
            made.append(p)
    return made


@pytest.mark.slow
@needs_mount
def test_a_logs_folder_that_is_full_stops_the_run_and_leaves_the_cell_to_resume(tmp_path, ledger):
    ledger.fault("logs-folder-full", "the logs folder has no room for a cell's log (ENOSPC): zerobench's own file")
    m = write_matrix(tmp_path / "m.yaml", TINY)
    [cell] = names(m)
    p = tmp_path / "r.jsonl"
    with tmpfs(tmp_path / "disk", "1m,nr_inodes=64") as disk:
        logs = disk / "logs"
        logs.mkdir()
        for name in ("forkserver.log", "prebuild.log", "prebuild.json"):  # what comes before the cell fits
            (logs / name).touch()
        fillers = _exhaust_inodes(disk)
        r = run(tmp_path, "run", m.name, "--results", str(p), "--logs", str(logs), "--no-report")
        assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
        out = r.stdout + r.stderr
        assert "could not write its own files" in out and "No space left on device" in out, out[-3000:]
        assert "--resume" in out
        assert [x["status"] for x in whole_lines(p)] == ["started"], "the harness's failure became the cell's outcome"
        for f in fillers:
            f.unlink()
        r = run(tmp_path, "run", m.name, "--results", str(p), "--logs", str(logs), "--resume", "--no-report")
        assert r.returncode == 0, r.stderr[-2000:]
        recs = ledger.account(p, {cell: {"ok"}}, runs=2)
    assert [x["status"] for x in recs] == ["started", "interrupted", "started", "ok"]


# -- the attempt-folder sweep ----------------------------------------------------------------------


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare for a second PID namespace"
)
def test_the_sweep_spares_a_live_run_in_another_pid_namespace(tmp_path, ledger):
    ledger.fault(
        "sweep-other-pid-namespace",
        "a live run's attempt folder written from another PID namespace (a container sharing /tmp), and a "
        "folder with an owner file that is not zerobench's, in the temp folder a real run sweeps",
    )
    tmp = tmp_path / "tmp"
    theirs, plain = tmp / "zerobench-theirs", tmp / "zerobench-plain"
    for d in (theirs, plain):
        d.mkdir(parents=True)
    (plain / "owner").write_text("1 1.00\n")  # someone else's file: not zerobench's marker
    # The owner tag is written by a live process inside a new PID namespace, as that run would write it.
    code = (
        "import os, sys, time; from bench.execute.launch import folders; "
        "open(sys.argv[1], 'w').write(folders._owner_tag(os.getpid())); time.sleep(300)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    other = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", code, str(theirs / "owner")], env=env)
    try:
        deadline = time.time() + 60
        while not (theirs / "owner").exists() or not (theirs / "owner").read_text():
            assert time.time() < deadline and other.poll() is None, "the namespaced owner never wrote its tag"
            time.sleep(0.2)
        m = write_matrix(tmp_path / "m.yaml", SKIPPED)
        r = run(tmp_path, "run", m.name, "--results", "r.jsonl", "--no-report", env={"TMPDIR": str(tmp)})
        assert r.returncode == 0, r.stderr[-2000:]
        assert theirs.exists(), "a live run in another PID namespace lost its attempt folder"
        assert plain.exists(), "a folder without zerobench's owner marker was deleted"
    finally:
        other.kill()
        other.wait()
    ledger.account(tmp_path / "r.jsonl", all_skipped(m), runs=1)
