"""Packing cells on one host (bench.execute.executors.local): disjoint GPU sets, first come first served, stops that
reach every running cell; and what it relies on (ports held per running cell, serialized appends)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.execute.executors import local as pool
from bench.execute.executors.executor import WAIT, Attempt, Job, Shape, dispatch
from bench.execute.launch import Launch, ports
from bench.matrix.cells import Cell
from bench.records.record import AttemptContext, Record
from bench.records.store import Store


def test_slots_hand_out_disjoint_lowest_free_sets():
    s = pool.Slots([0, 1, 2, 3])
    a, b = s.take(1), s.take(2)
    assert a == (0,) and b == (1, 2)
    assert s.take(2) is None  # one left
    c = s.take(1)
    assert c == (3,) and s.take(1) is None
    s.give(b)
    assert s.take(2) == (1, 2)
    with pytest.raises(ValueError, match="needs 5 GPUs"):
        s.take(5)


def test_slots_max_cells_bounds_how_many_run_at_once():
    s = pool.Slots([0, 1], max_cells=1)  # --no-pack: one cell at a time, on the first free GPUs
    assert s.take(1) == (0,)
    assert s.take(1) is None
    s.give((0,))
    assert s.take(2) == (0, 1)


class _Job:
    """The payload the executor under test runs (it is real; what it runs only sleeps and notes where):
    called as a Job is, with the GPUs it holds and its stop request."""

    def __init__(self, name, work):
        self.name, self.work, self.cell = name, work, Cell(matrix="m", model="llama-tiny")

    def __call__(self, gpus, stop):
        self.work(self.name, gpus, stop)
        return SimpleNamespace(name=self.name, window=None, beside=None)


def _dispatch(units, slots, work, *, admit=None, done=None):
    """Run (name, width) units through a real LocalExecutor and dispatch; done gets each Finished."""
    attempts = (
        WAIT if u is WAIT else Attempt(key=u[0], cell=None, shape=Shape(u[1]), job=_Job(u[0], work)) for u in units
    )
    dispatch(
        pool.LocalExecutor(slots),
        attempts,
        admit=(lambda h: admit(h.attempt.key)) if admit else (lambda h: True),
        done=done or (lambda f: None),
    )


def _run(units, slots, hold_s=0.3):
    """Run units (name, width) through the pool; return per name its slots and [start, end)."""
    seen: dict[str, dict] = {}
    order: list[str] = []

    def work(name, gpus, stop):
        t0 = time.time()
        time.sleep(hold_s)
        seen[name] = {"slots": tuple(gpus), "t0": t0, "t1": time.time()}

    _dispatch(units, slots, work, done=lambda f: order.append(f.value.name))
    return seen, order


def _overlap(a, b) -> bool:
    return a["t0"] < b["t1"] and b["t0"] < a["t1"]


def test_cells_run_side_by_side_on_disjoint_gpus():
    seen, order = _run([("a", 1), ("b", 1), ("c", 1), ("d", 1)], pool.Slots([0, 1]))
    assert sorted(order) == ["a", "b", "c", "d"]
    assert _overlap(seen["a"], seen["b"]) and seen["a"]["slots"] != seen["b"]["slots"]
    for x in seen:
        for y in seen:
            if x < y and _overlap(seen[x], seen[y]):
                assert not set(seen[x]["slots"]) & set(seen[y]["slots"]), (x, y, seen)
    # At every start, at most two cells run (one per GPU).
    assert max(sum(s["t0"] <= x["t0"] < s["t1"] for s in seen.values()) for x in seen.values()) <= 2


def test_a_wide_cell_waits_for_enough_gpus_and_is_not_overtaken():
    # 1-GPU a and b fill both GPUs; the 2-GPU cell w waits for both; c, behind w, does not jump ahead
    # onto the GPU that frees first (it would, again and again, with a stream of 1-GPU cells behind).
    seen, _ = _run([("a", 1), ("b", 1), ("w", 2), ("c", 1)], pool.Slots([0, 1]))
    assert seen["w"]["slots"] == (0, 1)
    assert seen["w"]["t0"] >= max(seen["a"]["t1"], seen["b"]["t1"])
    assert seen["c"]["t0"] >= seen["w"]["t1"]


def test_units_are_drawn_only_when_they_can_be_placed():
    drawn: list[float] = []

    def units():
        for name in "abc":
            drawn.append(time.time())
            yield (name, 1)

    seen, _ = _run(units(), pool.Slots([0]), hold_s=0.2)
    # One slot: b is drawn from the iterator only after a ended (and a's outcome was handed to done), so
    # it can depend on a's outcome: a cell implied out of memory by a leaves the queue before it is drawn.
    assert drawn[1] >= seen["a"]["t1"] and drawn[2] >= seen["b"]["t1"]


def test_a_source_that_waits_is_asked_again_once_an_attempt_ends():
    # A micro-batch search: its next probe exists only once the last one has ended.
    ended: list[str] = []

    def units():
        yield ("probe1", 1)
        yield WAIT  # two slots free, but nothing to run until probe1 ends
        assert ended == ["probe1"]
        yield ("probe2", 1)

    _dispatch(units(), pool.Slots([0, 1]), lambda *a: time.sleep(0.1), done=lambda f: ended.append(f.value.name))
    assert ended == ["probe1", "probe2"]
    with pytest.raises(RuntimeError, match="none is in flight"):
        _dispatch(iter([WAIT]), pool.Slots([0]), lambda *a: None)


def test_a_stop_in_the_main_thread_stops_every_running_cell_and_hands_back_each_end():
    stopped: dict[str, BaseException] = {}
    ends: dict[str, BaseException] = {}
    started = threading.Barrier(3)

    def work(name, gpus, stop):
        started.wait(5)
        assert stop.wait(10), "never asked to stop"
        stopped[name] = stop.exc
        time.sleep(0.2)  # its worker being stopped: the pool waits for it
        raise stop.exc

    class Stop(KeyboardInterrupt):
        pass

    def units():
        yield ("a", 1)
        yield ("b", 1)
        started.wait(5)  # both run: now the "signal"
        raise Stop()

    # Three GPUs, so the pool draws again (and meets the "signal") while a and b run.
    with pytest.raises(Stop):
        _dispatch(units(), pool.Slots([0, 1, 2]), work, done=lambda f: ends.update({f.handle.attempt.key: f.error}))
    assert set(stopped) == {"a", "b"} == set(ends)
    assert all(isinstance(e, Stop) for e in stopped.values())
    assert stopped["a"] is not stopped["b"]  # each thread raises its own copy
    assert all(isinstance(e, Stop) for e in ends.values())  # handed back: the session records them interrupted


def _raise_errors(f):
    if f.error is not None and not isinstance(f.error, KeyboardInterrupt):
        raise f.error  # as the session does with zerobench's own failure (HarnessError)


def test_an_error_raised_by_done_stops_the_others_and_is_raised():
    others_stopped, waiting = threading.Event(), threading.Event()

    def work(name, gpus, stop):
        if name == "bad":
            waiting.wait(10)  # the other unit runs: the failure has something to stop
            raise OSError("disk full")
        waiting.set()
        if stop.wait(10):
            others_stopped.set()
            raise stop.exc

    with pytest.raises(OSError, match="disk full"):
        _dispatch([("slow", 1), ("bad", 1)], pool.Slots([0, 1]), work, done=_raise_errors)
    assert others_stopped.is_set()


def test_a_cell_stopped_because_another_failed_says_so_not_the_user():
    stops: list[BaseException] = []
    waiting = threading.Event()

    def work(name, gpus, stop):
        if name == "bad":
            waiting.wait(10)  # the other unit runs: the failure has something to stop
            raise OSError(28, "No space left on device")
        waiting.set()
        stop.wait(10)
        stops.append(stop.exc)
        raise stop.exc

    with pytest.raises(OSError):
        _dispatch([("a", 1), ("bad", 1)], pool.Slots([0, 1]), work, done=_raise_errors)
    (exc,) = stops
    assert isinstance(exc, pool.Halted) and isinstance(exc, KeyboardInterrupt)  # unwinds as a stop does
    assert exc.reason.startswith("stopped: the run failed beside it (OSError") and "No space left" in exc.reason


def test_a_unit_turned_away_at_placement_does_not_run_and_frees_its_slots():
    # With packing, a cell drawn while it waits for GPUs may be implied out of memory by a cell that ends
    # meanwhile; at placement it is turned away, not run.
    ran: list[str] = []
    admitted: list[str] = []

    def work(name, gpus, stop):
        time.sleep(0.1)
        ran.append(name)

    def admit(name):
        admitted.append(name)
        return name != "implied"

    _dispatch([("a", 1), ("implied", 2), ("c", 2)], pool.Slots([0, 1]), work, admit=admit)
    assert sorted(ran) == ["a", "c"] and admitted == ["a", "implied", "c"]


def test_neighbours_are_the_cells_running_during_a_window():
    n = pool.Neighbours()
    a = n.enter("a", 0.0)
    b = n.enter("b", 5.0)
    n.leave(b, 8.0)
    c = n.enter("c", 20.0)  # still running
    assert n.during(a, 1.0, 4.0) == []
    assert n.during(a, 1.0, 6.0) == ["b"]
    assert n.during(a, 9.0, 30.0) == ["c"]
    assert n.during(c, 25.0, 26.0) == ["a"]  # a never left


def test_a_held_port_is_not_handed_to_a_second_cell(monkeypatch):
    env = {"ZEROBENCH_PORT": "29611"}
    p1 = ports._hold_port(env, first=True)
    p2 = ports._hold_port(env, first=True)
    try:
        assert (p1, p2) == (29611, 29612)  # a pinned port taken by a neighbour: the next one up
    finally:
        ports._release_port(p1)
        ports._release_port(p2)
    assert ports._hold_port(env, first=True) == 29611  # released: free again
    ports._release_port(29611)
    # The OS may call one port free twice: a held one is never handed out again.
    monkeypatch.setattr(ports, "free_port", iter([40001, 40001, 40002]).__next__)
    q1 = ports._hold_port({}, first=True)
    q2 = ports._hold_port({}, first=True)
    ports._release_port(q1)
    ports._release_port(q2)
    assert (q1, q2) == (40001, 40002)


def test_appends_from_threads_are_whole_lines(tmp_path):
    store = Store(tmp_path / "r.jsonl")
    big = "x" * 200_000  # larger than a pipe's atomic write: interleaving would tear it

    def put(k):
        for j in range(5):
            store.append({"k": k, "j": j, "pad": big})

    threads = [threading.Thread(target=put, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert sorted((d["k"], d["j"]) for d in map(json.loads, lines)) == [(k, j) for k in range(6) for j in range(5)]


def test_placement_is_kept_from_start_to_end():
    cell = Cell(matrix="m", model="llama-tiny")
    start = Record.started(
        cell, run_id="r", attempt=1, matrix_file="", started_at="2026-01-01T00:00:00+00:00",
        context=AttemptContext(placement={"gpus": [3]}),
    )  # fmt: skip
    assert start.to_dict()["placement"] == {"gpus": [3]}
    stopped = Record.interrupted(start, "stopped by SIGTERM", ended_at="2026-01-01T00:00:01+00:00")
    assert stopped.to_dict()["placement"] == {"gpus": [3]}
    plain = Record.started(cell, run_id="r", attempt=1, matrix_file="", started_at="2026-01-01T00:00:00+00:00")
    assert "placement" not in plain.to_dict()


def test_cells_sharing_a_cpu_host_each_get_their_share_of_the_cores(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    job = Job(Cell(matrix="m", model="llama-tiny"), None, Launch(Path("x.log"), extra_env={"A": "1"}))
    cores = len(os.sched_getaffinity(0))
    two = pool._sharing_cores(job, 1, 2)
    assert two.launch.extra_env == {"A": "1", "OMP_NUM_THREADS": str(max(1, cores // 2))}
    assert pool._sharing_cores(job, 2, 2).launch.extra_env["OMP_NUM_THREADS"] == str(max(1, cores // 2) * 2)
    assert pool._sharing_cores(job, 1, 1) is job  # alone: the whole host, as torch sizes it
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert pool._sharing_cores(job, 1, 2) is job  # the user's setting wins
