"""Rules shown by committed H200 records, checked against those records: every attempt there of the optimizers a
rule is about ended as the rule says where the rule stops the cell, and did not end so where it lets the cell
through. (The GPU side, each combination run again with its loss checked: tests/matrix/test_gpu_rules.py.)"""

from __future__ import annotations

import dataclasses

import pytest

from bench.execute.executors.replay import Recording
from bench.host import env
from bench.matrix import rules
from bench.matrix.axes import OPTIMIZERS
from bench.matrix.cells import Cell, Lora
from bench.records.status import Status
from tests.conftest import as_written

SEVEN_B = "results/7b-answer-h200.jsonl"  # the 7B answer on H200s, bitsandbytes 0.50.2, deepspeed 0.19.6

CASES = {
    # rule: (results files, the optimizers it is about, what a stopped cell's record says)
    "fusedlamb-needs-zero0": ((SEVEN_B, "results/1b-axes-2.jsonl"), ("fusedlamb",), "untested ZeRO Optimizer"),
    "bnb-over-int32": (
        (SEVEN_B, "results/7b.jsonl"),
        rules.BNB,
        "Error invalid argument at line 177 in file /src/csrc/ops.cu",
    ),
    "onebit-needs-fp16": ((SEVEN_B, "results/1b-axes.jsonl"), rules.ONEBIT, ""),
}


def _ends(files: tuple[str, ...], optimizers: tuple[str, ...]):
    """Each attempt's end in the files (no starts or stops) of a cell with one of these optimizers, with the
    rule that stops that cell on the machine the files were recorded on."""
    for f in files:
        platform = Recording([f]).platform()
        for r in as_written(f):
            st = Status(r["status"])
            if st.ran and st.is_outcome and r["cell"]["optimizer"] in optimizers:
                yield r, rules.check(Cell.from_dict(r["cell"]), platform)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_a_rule_stops_the_cells_that_failed_on_the_h200_and_lets_through_those_that_ran(rule):
    files, optimizers, says = CASES[rule]
    stopped, through = [], []
    for r, skip in _ends(files, optimizers):
        if skip is not None and skip.rule == rule:
            stopped.append(r)
            assert r["status"] in ("error", "diverged") and says in r["reason"], (r["cell_name"], r["reason"])
        else:
            through.append(r)
            assert not (says and says in r["reason"]), f"{rule} lets {r['cell_name']} through: {r['reason']}"
    assert len(stopped) >= 3 and any(r["status"] == "ok" for r in through), (len(stopped), len(through))


def test_one_bit_optimizers_in_bf16_diverged_or_failed_and_trained_in_fp16():
    ends = list(_ends(CASES["onebit-needs-fp16"][0], rules.ONEBIT))
    bf16 = [r for r, _ in ends if r["cell"]["precision"] == "bf16"]
    assert {r["cell"]["optimizer"] for r in bf16} == set(rules.ONEBIT)
    assert all(r["status"] in ("diverged", "error") for r in bf16)
    fp16 = [r for r, _ in ends if r["cell"]["precision"] == "fp16"]
    assert {r["cell"]["optimizer"] for r in fp16} == set(rules.ONEBIT)
    assert all(r["status"] == "ok" and r["losses"][-1] < r["losses"][0] for r in fp16)


def test_the_flat_partition_is_the_trainable_parameters_over_the_ranks_at_zero_1_and_2_only():
    gpu = Recording([SEVEN_B]).platform()
    full = Cell(model="llama-7b", zero_stage=1, optimizer="adamw_8bit", precision="bf16", seq_len=128)
    assert rules.flat_partition(full) == 6_738_415_616  # a 7B Llama's parameters, every one trained
    skip = rules.check(full, gpu)
    assert skip.rule == "bnb-over-int32" and "6,738,415,616 elements" in skip.reason and "at least 4 GPUs" in skip.fix
    four = dataclasses.replace(gpu, gpus=tuple(env.Gpu(i, "NVIDIA H200", 0, f"gpu-{i}") for i in range(4)))
    for ok in (
        Cell(model="llama-7b", zero_stage=0, optimizer="adamw_8bit", precision="bf16"),  # each weight on its own
        Cell(model="llama-7b", zero_stage=3, optimizer="adamw_8bit", precision="bf16"),  # sub-groups of 1e9
        Cell(model="llama-7b", zero_stage=1, optimizer="adamw_8bit", precision="bf16", gpus=4),  # 1.68e9 a rank
        Cell(model="llama-7b", zero_stage=2, optimizer="fusedadam", precision="bf16"),  # not bitsandbytes
        Cell(model="llama-7b", zero_stage=1, optimizer="adamw_8bit", peft="lora", lora=Lora()),  # 40M trained
    ):
        assert rules.check(ok, four) is None, ok
    # The 32-bit kernels take the count as an int32 too: paged_adamw is stopped as well.
    assert rules.check(Cell(model="llama-7b", zero_stage=2, optimizer="paged_adamw"), gpu).rule == "bnb-over-int32"
    assert OPTIMIZERS["paged_adamw"].state_bits == 32 and rules.BNB_MAX_ELEMENTS == 2**31 - 1
