"""Cells over several nodes: `nodes: N` in a matrix (gpus per node x nodes), what the rules, the memory
model and the launcher make of it, and real two-node cells on one machine (`local` runs each node as its
own torchrun at 127.0.0.1, CPU ranks over gloo)."""

from __future__ import annotations

import json
import socket
import sys

import pytest

from bench.estimate import Hardware, predict, predict_step
from bench.execute.launch import telemetry
from bench.execute.launch.protocol import Rendezvous, _command
from bench.execute.plan import placed_by
from bench.host import env
from bench.matrix import dsconfig, faults, rules
from bench.matrix.cells import Cell
from bench.matrix.spec import MatrixError, expand, loads
from tests.conftest import (
    TINY,
    ZERO3,
    agree_across_nodes,
    as_written,
    blamed_on_the_second_node,
    write_matrix,
    zerobench,
)

GPU_HOST = env.Platform(
    gpus=tuple(env.Gpu(i, "NVIDIA H200", 141 * 2**30, f"GPU-{i}") for i in range(2)),
    versions={"deepspeed": "0.19.6", "torch": "2.11.0"},
)
CPU_HOST = env.Platform(gpus=(), versions={"deepspeed": "0.19.6", "torch": "2.13.0+cpu"})


def test_nodes_is_a_fixed_setting_named_and_hashed_only_past_one():
    (one,) = expand(loads("model: llama-tiny\ngpus: 2\n"))
    (two,) = expand(loads("model: llama-tiny\ngpus: 2\nnodes: 2\n"))
    assert (one.nodes, one.ranks, two.nodes, two.ranks) == (1, 2, 2, 4)
    assert "nodes" not in one.canonical() and two.canonical()["nodes"] == 2
    assert one.hash != two.hash
    assert one.name.endswith(",gpus=2") and two.name.endswith(",gpus=2,nodes=2")
    assert Cell.from_dict(two.to_dict()) == two and Cell.from_dict(two.to_dict()).hash == two.hash


def test_zero_nodes_are_refused_with_the_key():
    with pytest.raises(MatrixError, match="nodes"):
        loads("model: llama-tiny\nnodes: 0\n")


def test_zero3_over_two_nodes_partitions_like_two_gpus_of_one():
    """Per GPU, a ZeRO-3 cell of 2 nodes x 1 GPU holds what 1 node x 2 GPUs does (both partition over two
    ranks); per host, it holds one rank's processes and offloaded state, not two."""
    hw = Hardware(gpu_memory_bytes=141 * 2**30, host_memory_bytes=2**40)
    kw = dict(model="llama-1b", zero_stage=3, offload="optimizer", optimizer="cpuadam", precision="bf16")
    across, within, alone = (Cell(**kw, gpus=g, nodes=n) for g, n in ((1, 2), (2, 1), (1, 1)))
    a, w, one = (predict(c, dsconfig.build(c), hw) for c in (across, within, alone))
    assert a.gpu_bytes == w.gpu_bytes and a.gpu_terms == w.gpu_terms
    assert a.gpu_terms["weights"] == one.gpu_terms["weights"] / 2  # ZeRO-3's partition of the weights
    assert a.host_terms["processes"] == one.host_terms["processes"] == w.host_terms["processes"] / 2
    assert a.host_terms["offloaded_optimizer"] == pytest.approx(w.host_terms["offloaded_optimizer"] / 2, rel=1e-6)
    assert a.host_bytes < w.host_bytes


def test_the_batch_counts_every_rank_of_every_node():
    c = Cell(gpus=2, nodes=3, micro_batch=2, grad_accum=4)
    # A user config's "auto" batch is filled in as the HF Trainer fills it: over every rank.
    assert dsconfig.resolve({"train_batch_size": "auto"}, c)["train_batch_size"] == 2 * 4 * 6
    assert c.tokens_per_step == 2 * 4 * c.seq_len * 6


def test_no_step_time_is_predicted_past_one_node():
    # The step-time constants were fitted on single-node runs only.
    assert predict_step(Cell(model="llama-1b", gpus=2)) is not None
    assert predict_step(Cell(model="llama-1b", gpus=1, nodes=2)) is None


def test_rules_keep_multi_node_gpu_cells_off_one_host():
    cell = Cell(gpus=2, nodes=2)
    skip = rules.check(cell, GPU_HOST)
    assert skip is not None and skip.rule == "nodes-on-one-host"
    assert "spans 2 nodes" in skip.reason and "gpus: 4" in skip.fix
    # On a CPU host the nodes run side by side at 127.0.0.1: the multi-node path, tested on one machine.
    assert rules.check(cell, CPU_HOST) is None
    cluster = env.Platform(**{**GPU_HOST.__dict__, "hosts": 4})
    assert rules.check(cell, cluster) is None
    # Under --executor ray its nodes are Ray nodes, which the plan does not count: the executor refuses, before any
    # cell, what its cluster cannot place (tests/execute/test_ray.py).
    assert rules.check(cell, placed_by(GPU_HOST, "ray")) is None and placed_by(GPU_HOST, "local") == GPU_HOST
    skip = rules.check(Cell(gpus=2, nodes=8), cluster)
    assert skip is not None and skip.rule == "nodes-available" and "the cluster has 4" in skip.reason
    assert rules.check(Cell(gpus=2, nodes=8), env.Platform(**{**GPU_HOST.__dict__, "hosts": None})) is None


def test_each_node_runs_torchrun_with_its_rank_at_the_first_nodes_rendezvous():
    cmd = _command("spec.json", 2, Rendezvous(29600, "10.0.0.1", nodes=2, node=1))
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    flags = dict(zip(cmd[3:13:2], cmd[4:13:2]))
    assert flags == {
        "--nproc_per_node": "2",
        "--nnodes": "2",
        "--node_rank": "1",
        "--master_addr": "10.0.0.1",
        "--master_port": "29600",
    }
    # One rank on one node needs no torchrun; one rank on each of two nodes does.
    assert _command("spec.json", 1, Rendezvous(29600))[1:3] == ["-m", "bench.worker"]
    assert "torch.distributed.run" in _command("spec.json", 1, Rendezvous(29600, nodes=2))


def test_faults_address_ranks_of_every_node():
    cell = Cell(gpus=1, nodes=2, warmup_steps=1, measured_steps=4)
    assert faults.check("sigkill@2#1", [cell]) == []
    assert faults.check("sigkill@2#2", [cell]) == [("sigkill@2#2", f"{cell.name} has ranks 0-1: it would never fire")]


def test_telemetry_across_nodes_keeps_per_gpu_and_per_host_figures():
    def node(rss, used, energy, reasons):
        w = {
            "host_rss_peak_bytes": rss,
            "duration_s": 10.0,
            "nvml_used_peak_bytes": max(used),
            "nvml_used_peak_per_gpu": used,
            "energy_j": energy,
            "throttle_reasons": reasons,
        }
        return {"samples": 5, "nvml": True, "all": w, "phases": {"measured": w}}

    s = telemetry.across_nodes([node(100, [7, 9], 50.0, ["sw_power_cap"]), node(300, [8, 6], 70.0, [])])
    for w in (s["all"], s["phases"]["measured"]):
        assert w["host_rss_peak_bytes"] == 300  # the largest host's, as a host's figure
        assert w["nvml_used_peak_bytes"] == 9 and w["nvml_used_peak_per_gpu"] == [7, 9, 8, 6]
        assert w["energy_j"] == 120.0 and w["throttle_reasons"] == ["sw_power_cap"]
    assert s["samples"] == 10


# -- real cells over two nodes on this machine ----------------------------------------------------------


def _run(tmp_path, name, body, env=None) -> dict:
    m = write_matrix(tmp_path / f"{name}.yaml", body)
    res = tmp_path / f"{name}.jsonl"
    r = zerobench("run", str(m), "--results", str(res), "--no-report", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    (rec,) = [x for x in as_written(res) if x["status"] != "started"]
    return rec


def test_zero3_on_cpu_ranks_gathers_one_parameter_at_a_time():
    """DeepSpeed 0.19.6's coalesced ZeRO-3 gather reads gloo buffers it has not waited on (a two-rank CPU cell of
    the test below diverged once, loss nan at step 3): on CPU ranks the worker asks for sequential gathers, in the
    place DeepSpeed reads them; GPU ranks and one rank keep the config as built."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from bench.worker.setup import gloo_safe

    (cell,) = expand(loads(ZERO3 + "gpus: 2\n"))
    built = dsconfig.build(cell)
    safe = gloo_safe(built, cuda=False, world=2)
    assert DeepSpeedZeroConfig(**safe["zero_optimization"]).allgather_sequential
    assert not DeepSpeedZeroConfig(**built["zero_optimization"]).allgather_sequential  # built is left as it was
    assert dsconfig.check(safe) == []
    assert gloo_safe(built, cuda=True, world=2) is built and gloo_safe(built, cuda=False, world=1) is built
    for name in ("stage3_allgather_sequential", "allgather_sequential"):  # a config's own choice, either spelling
        own = {**built, "zero_optimization": {**built["zero_optimization"], name: False}}
        assert gloo_safe(own, cuda=False, world=2) is own


@pytest.mark.slow
def test_two_nodes_of_one_rank_agree_with_one_node_of_two(tmp_path):
    """ZeRO-3 over 2 nodes x 1 rank and over 1 node x 2 ranks is the same training: the same losses."""
    across = _run(tmp_path, "across", ZERO3 + "gpus: 1\nnodes: 2\n")
    within = _run(tmp_path, "within", ZERO3 + "gpus: 2\n")
    agree_across_nodes(across, within)
    # Each ran ZeRO-3 on two CPU ranks: its record says the worker gathered one parameter at a time (gloo_safe).
    sequential = {"zero_optimization": {"stage3_allgather_sequential": True}}
    assert across["worker"]["ds_config_added"] == within["worker"]["ds_config_added"] == sequential
    host = socket.gethostname()
    assert [(n["host"], n["addr"]) for n in across["nodes"]] == [(host, "127.0.0.1")] * 2
    for n in across["nodes"]:
        assert n["provenance"]["host"] == host and n["provenance"]["versions"]["deepspeed"]
        assert n["telemetry"]["all"]["host_rss_peak_bytes"] > 0
        assert n["telemetry"]["phases"]["measured"]["host_rss_peak_bytes"] > 0  # each node's own phases
    assert across["nodes"][1]["log"].endswith(".node1.log") and across["log"] == across["nodes"][0]["log"]
    peak = max(n["telemetry"]["all"]["host_rss_peak_bytes"] for n in across["nodes"])
    assert across["memory"]["host_rss_peak_bytes"] == peak


@pytest.mark.slow
def test_a_rank_killed_on_the_second_node_is_blamed_on_that_rank_and_node(tmp_path):
    rec = _run(
        tmp_path,
        "killed",
        ZERO3 + "gpus: 1\nnodes: 2\n",
        env={"ZEROBENCH_FAULT": "sigkill@2#1", "ZEROBENCH_STALL_S": "120"},
    )
    blamed_on_the_second_node(rec)
    assert json.dumps(rec).count("sigkill@2#1") >= 1


@pytest.mark.slow
def test_a_taken_rendezvous_port_relaunches_every_node(tmp_path):
    """The first node cannot bind the rendezvous port (held here): the second waits on it in vain, is
    stopped once the first has failed, and the attempt runs again, every node, on another port."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        rec = _run(
            tmp_path,
            "port",
            TINY + "gpus: 1\nnodes: 2\n",
            env={"ZEROBENCH_PORT": str(port), "ZEROBENCH_STALL_S": "120"},
        )
    assert rec["status"] == "ok", rec["reason"]
    assert rec["placement"]["port"] != port
    assert f"the rendezvous port {port} was in use" in " ".join(rec["warnings"])
    for n in rec["nodes"]:
        assert f"port {port} was in use; relaunching" in open(n["log"]).read()


def test_the_zero_report_counts_the_gpus_of_every_node():
    import pandas as pd

    from bench.report.analysis.zero import _zero_scaling

    rows = [
        {"cell_name": f"zero={z},nodes=2", "cell_hash": f"h{z}", "status": "ok", "zero_stage": z, "gpus": 1,
         "nodes": 2, "peft": "none", "offload": "none", "micro_batch": 2, "ds_config": None, "model": "llama-1b",
         "estimate_model_states_bytes": est, "torch_max_allocated_bytes": alloc}
        for z, est, alloc in ((0, 16e9, 20e9), (3, 8e9, 11e9))
    ]  # fmt: skip
    got = _zero_scaling(pd.DataFrame(rows))
    assert [(r["zero_stage"], r["gpus"], r["nodes"]) for r in got] == [(0, 2, 2), (3, 2, 2)]
    assert got[1]["torch_max_allocated_bytes_ratio"] == pytest.approx(11 / 20)
