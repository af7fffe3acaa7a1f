"""Packing cells on one host (bench.execute.local): disjoint GPU sets, first come first served, stops that reach
every running cell; and what it relies on (ports held per running cell, serialized appends)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from bench.cells import Cell
from bench.execute import local as pool
from bench.execute.launch import ports
from bench.record import Record
from bench.store import Store


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


def _run(units, slots, hold_s=0.3):
    """Run units (name, width) through the pool; return per name its slots and [start, end)."""
    seen: dict[str, dict] = {}
    order: list[str] = []

    def work(u):
        name, _ = u
        ln = pool.lane()
        t0 = time.time()
        time.sleep(hold_s)
        seen[name] = {"slots": ln.slots if ln else (), "t0": t0, "t1": time.time()}
        return name

    pool.run_units(units, slots, need=lambda u: u[1], work=work, done=lambda u, r: order.append(r))
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


def test_a_unit_that_needs_nothing_runs_in_the_main_thread_in_its_turn():
    where: dict[str, str] = {}

    def work(u):
        where[u[0]] = threading.current_thread().name
        return u[0]

    pool.run_units([("skip", 0), ("run", 1)], pool.Slots([0]), need=lambda u: u[1], work=work, done=lambda u, r: None)
    assert where["skip"] == threading.main_thread().name and where["run"] != where["skip"]


def test_a_stop_in_the_main_thread_stops_every_running_cell_and_waits_for_them():
    stopped: dict[str, BaseException] = {}
    started = threading.Barrier(3)

    def work(u):
        ln = pool.lane()
        started.wait(5)
        assert ln.stop.wait(10), "never asked to stop"
        stopped[u[0]] = ln.stop.exc
        time.sleep(0.2)  # its record being written: the pool waits for it
        raise ln.stop.exc

    class Stop(KeyboardInterrupt):
        pass

    def units():
        yield ("a", 1)
        yield ("b", 1)
        started.wait(5)  # both run: now the "signal"
        raise Stop()

    # Three GPUs, so the pool draws again (and meets the "signal") while a and b run.
    with pytest.raises(Stop):
        pool.run_units(units(), pool.Slots([0, 1, 2]), need=lambda u: u[1], work=work, done=lambda u, r: None)
    assert set(stopped) == {"a", "b"}
    assert all(isinstance(e, Stop) for e in stopped.values())
    assert stopped["a"] is not stopped["b"]  # each thread raises its own copy


def test_a_units_error_stops_the_others_and_is_raised():
    others_stopped = threading.Event()

    def work(u):
        ln = pool.lane()
        if u[0] == "bad":
            time.sleep(0.2)
            raise OSError("disk full")
        if ln.stop.wait(10):
            others_stopped.set()
            raise ln.stop.exc
        return u[0]

    with pytest.raises(OSError, match="disk full"):
        pool.run_units(
            [("slow", 1), ("bad", 1)], pool.Slots([0, 1]), need=lambda u: u[1], work=work, done=lambda u, r: None
        )
    assert others_stopped.is_set()


def test_a_cell_stopped_because_another_failed_says_so_not_the_user():
    stops: list[BaseException] = []

    def work(u):
        ln = pool.lane()
        if u[0] == "bad":
            time.sleep(0.2)
            raise OSError(28, "No space left on device")
        ln.stop.wait(10)
        stops.append(ln.stop.exc)
        raise ln.stop.exc

    with pytest.raises(OSError):
        pool.run_units([("a", 1), ("bad", 1)], pool.Slots([0, 1]), need=lambda u: u[1], work=work, done=lambda *_: None)
    (exc,) = stops
    assert isinstance(exc, pool.Halted) and isinstance(exc, KeyboardInterrupt)  # unwinds as a stop does
    assert exc.reason.startswith("stopped: the run failed beside it (OSError") and "No space left" in exc.reason


def test_a_unit_turned_away_at_placement_does_not_run_and_frees_its_slots():
    # Issue 16 with packing: a cell drawn while it waits for GPUs may be implied out of memory by a cell that
    # ends meanwhile; at placement it is turned away, not run.
    ran: list[str] = []
    admitted: list[str] = []

    def work(u):
        time.sleep(0.1)
        ran.append(u[0])
        return u[0]

    def admit(u):
        admitted.append(u[0])
        return u[0] != "implied"

    pool.run_units(
        [("a", 1), ("implied", 2), ("c", 2)], pool.Slots([0, 1]), need=lambda u: u[1], work=work,
        done=lambda u, r: None, admit=admit,
    )  # fmt: skip
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
        cell, run_id="r", attempt=1, matrix_file="", started_at="2026-01-01T00:00:00+00:00", placement={"gpus": [3]}
    )
    assert start.to_dict()["placement"] == {"gpus": [3]}
    stopped = Record.interrupted(start, "stopped by SIGTERM", ended_at="2026-01-01T00:00:01+00:00")
    assert stopped.to_dict()["placement"] == {"gpus": [3]}
    plain = Record.started(cell, run_id="r", attempt=1, matrix_file="", started_at="2026-01-01T00:00:00+00:00")
    assert "placement" not in plain.to_dict()
