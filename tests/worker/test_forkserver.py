"""The fork server: single-rank workers forked from a pre-imported parent must measure the same thing
as workers started from scratch, only without paying the imports each time."""

from __future__ import annotations

import os
import threading

import pytest

from bench.execute import launch
from bench.execute.launch import forkserver as server_side
from bench.matrix import dsconfig
from bench.matrix.cells import Cell
from bench.worker import forkserver

CELL = Cell(
    model="llama-tiny",
    seq_len=64,
    micro_batch=2,
    warmup_steps=1,
    measured_steps=3,
    zero_stage=1,
    lr=3e-3,
    timeout_s=300,
)


def _run(tmp_path, name: str, **kw) -> launch.Outcome:
    return launch.run_cell(
        CELL, dsconfig.build(CELL), launch.Launch(tmp_path / f"{name}.log", sample_interval_s=0.05, **kw)
    )


@pytest.fixture(scope="module", autouse=True)
def _ops_built(tmp_path_factory):
    """The ops a CPU cell compiles on first use (DeepSpeed's shared-memory comm), built first as
    `zerobench run` does: in a fresh extensions folder the first cell would otherwise time a compile
    (268 s against 24 s in a fresh checkout's suite), not the fork."""
    from bench.execute.prepare import Planned, _prebuild
    from bench.host import env

    _prebuild([Planned(CELL, None, None)], tmp_path_factory.mktemp("prebuild"), None, env.probe(), print)


@pytest.fixture(autouse=True)
def _fresh_server():
    launch.stop_forkserver()
    yield
    launch.stop_forkserver()


def _import_s(o: launch.Outcome) -> float:
    """Seconds the worker spent in its import phase (torch, DeepSpeed, transformers), from the telemetry."""
    return (o.telemetry["phases"].get("import") or {}).get("duration_s") or 0.0


def test_forked_worker_matches_spawned_and_skips_the_imports(tmp_path, monkeypatch):
    forked = _run(tmp_path, "forked")
    monkeypatch.setenv("ZEROBENCH_FORKSERVER", "0")
    spawned = _run(tmp_path, "spawned")
    assert forked.status.value == spawned.status.value == "ok", (forked.reason, spawned.reason)
    assert forked.started_by["mode"] == "fork" and forked.started_by["server_import_s"] > 0
    assert spawned.started_by == {"mode": "spawn", "why": "ZEROBENCH_FORKSERVER=0"}
    # Same seed, same code, same process-per-cell: the same loss curve to the last bit.
    assert forked.ranks[0].losses == spawned.ranks[0].losses
    assert forked.ranks[0].optimizer_class == spawned.ranks[0].optimizer_class
    # The point of it: the forked cell does not import torch, DeepSpeed and transformers again. Timed as the
    # worker's import phase, not the whole cell: a busy machine stretches setup and steps of either, the forked
    # import stays empty.
    imp_forked, imp_spawned = _import_s(forked), _import_s(spawned)
    assert imp_spawned > 1.0 and imp_forked < imp_spawned / 4, (imp_forked, imp_spawned)
    assert "Traceback" not in (tmp_path / "forked.log").read_text()


def test_a_dead_server_is_replaced(tmp_path):
    first = _run(tmp_path, "a")
    assert first.started_by["mode"] == "fork"
    old = server_side._servers[None]  # a CPU host's one server (no GPU set)
    old.proc.kill()
    old.proc.wait()
    second = _run(tmp_path, "b")
    assert second.status.value == "ok" and second.started_by["mode"] == "fork"
    assert server_side._servers[None] is not old and server_side._servers[None].proc.pid != old.proc.pid


def test_an_environment_read_at_import_gets_a_fresh_interpreter(tmp_path):
    _run(tmp_path, "warm")
    out = _run(tmp_path, "other-env", extra_env={"DS_ACCELERATOR": "cpu"})
    assert out.status.value == "ok"
    assert out.started_by["mode"] == "spawn" and "DS_ACCELERATOR" in out.started_by["why"]


def test_runtime_variables_are_served_by_fork(tmp_path):
    # The fault variable is read when the worker runs, not at import: still a fork, and it still acts.
    out = _run(tmp_path, "fault", extra_env={"ZEROBENCH_FAULT": "raise@1"})
    assert out.started_by["mode"] == "fork"
    assert out.status.value == "error" and "injected fault" in out.reason


def test_server_refuses_to_fork_with_a_foreign_thread_running():
    import torch  # noqa: F401

    forkserver._start_known_threads()  # as the server does, before it counts

    allowed = len(os.listdir("/proc/self/task"))
    assert forkserver._why_unsafe(allowed) is None
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        why = forkserver._why_unsafe(allowed)
        assert why is not None and "1 thread(s)" in why and "the imports" in why
    finally:
        stop.set()
        t.join()


@pytest.mark.slow
def test_a_forked_workers_exit_message_reaches_its_log(tmp_path):
    # A worker that cannot read its spec stops with SystemExit(message) before it has anywhere to write
    # a result; a fresh interpreter prints that message, and a forked worker must too (it once left an
    # empty log and exit code 1).
    env = launch.child_env(dict(os.environ), port=launch.free_port(), gpus=None)
    server = launch.ForkServer(env, tmp_path / "server.log")
    try:
        assert server.wait_ready(), server.why_not
        log = tmp_path / "worker.log"
        proc = server.start(["--spec", str(tmp_path / "missing.json")], env, log)
        assert proc.wait(timeout=60) == 1
        assert "cannot read the spec" in log.read_text() and "missing.json" in log.read_text()
    finally:
        server.close()
