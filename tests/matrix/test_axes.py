"""The axis and optimizer tables are the one source: everything that lists axes agrees with them."""

from __future__ import annotations

import dataclasses

from bench.execute import prepare
from bench.judge import results
from bench.matrix import axes, dsconfig, rules, spec
from bench.matrix.cells import AxisValues, Cell
from bench.report import analysis


def test_every_list_of_axes_is_the_table():
    names = [a.name for a in axes.AXES]
    assert [f.name for f in dataclasses.fields(AxisValues)] == names
    assert list(spec.Axes.model_fields) == names and list(spec.Pick.model_fields) == names
    assert results.AXIS_COLUMNS == [a.name for a in axes.SHOWN]
    assert [c for c, _, _ in analysis.AXES][:-1] == [
        "peft_variant" if a.name == "peft" else a.name for a in axes.SHOWN if a.ablate
    ]
    assert len({p.order for p in axes.NAME_PARTS}) == len(axes.NAME_PARTS)


def test_defaults_are_allowed_values():
    for a in axes.AXES:
        if a.values:
            assert a.default in a.values, a.name
        if a.minimum is not None:
            assert a.default >= a.minimum, a.name
        assert getattr(Cell(), a.name) == a.default


def test_optimizer_facts_are_derived():
    specs = axes.OPTIMIZERS
    assert axes.AXIS["optimizer"].values == tuple(specs)
    assert set(dsconfig.OPTIMIZER_SECTIONS) == {n for n, s in specs.items() if not s.client}
    assert set(dsconfig.CLIENT_OPTIMIZERS) == {n for n, s in specs.items() if s.client}
    assert all(specs[n].module and specs[n].hf_optim for n in dsconfig.CLIENT_OPTIMIZERS)
    ops = {"fusedadam": "FusedAdamBuilder", "cpuadam": "CPUAdamBuilder", "fusedlamb": "FusedLambBuilder"}
    assert prepare._OPS == ops
    assert rules.ONEBIT == ("onebitadam", "zerooneadam", "onebitlamb")
    assert rules.BNB == ("paged_adamw", "paged_adamw_8bit", "adamw_8bit")


def test_offload_helpers():
    off = axes.Offload
    assert axes.AXIS["offload"].values == (off.NONE, off.OPTIMIZER, off.OPTIMIZER_PARAMS, off.NVME)
    assert [axes.optimizer_offloaded(o) for o in axes.OFFLOADS] == [False, True, True, True]
    assert [axes.params_offloaded(o) for o in axes.OFFLOADS] == [False, False, True, True]


def test_a_later_axis_at_its_default_leaves_hash_and_name_alone():
    # What `hashed_at_default=False` and `shown=UNLESS_DEFAULT` promise a new axis, shown on kernels.
    c = Cell(zero_stage=2, offload="optimizer", optimizer="cpuadam")
    assert "kernels" not in c.canonical() and "kernels" not in c.name
    assert Cell(kernels="liger").hash != Cell().hash and "kernels=liger" in Cell(kernels="liger").name
