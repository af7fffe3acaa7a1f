"""kernels: liger, the parts that run without a GPU: which of Liger's kernels a cell uses, and the
refusal to report a cell as kernels=liger when the built model runs none of Liger's modules.
(That Liger's kernels run and learn like transformers' own is tests/execute/test_gpu.py, on the GPU.)"""

from __future__ import annotations

import pytest
import torch

from bench.matrix.cells import Cell
from bench.worker import setup
from bench.worker.parts import models


def test_zero3_trades_the_fused_head_for_plain_cross_entropy():
    # The fused linear cross-entropy reads lm_head.weight directly; ZeRO-3 shards it (trl#5891).
    assert models.liger_settings(0)["fused_linear_cross_entropy"] is True
    assert models.liger_settings(2)["cross_entropy"] is False
    z3 = models.liger_settings(3)
    assert z3["fused_linear_cross_entropy"] is False and z3["cross_entropy"] is True
    assert z3["rms_norm"] and z3["swiglu"] and z3["rope"]


def test_a_liger_cell_without_liger_modules_is_refused():
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    doc: dict = {}
    setup.record_kernels(Cell(kernels="hf"), plain, doc)
    assert doc["kernels"] == {"asked": "hf", "liger_modules": 0, "liger_settings": None}
    with pytest.raises(RuntimeError, match="refusing to report this cell"):
        setup.record_kernels(Cell(kernels="liger"), plain, {})
