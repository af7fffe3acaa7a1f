"""bitsandbytes.optim's AdamW family as the real classes build it (bitsandbytes 0.50.1, optim/adamw.py: each is
Optimizer2State("adam", ..., optim_bits, is_paged)), stepping as torch's AdamW. FAKE_BNB_BUILDS=32bit makes
every class build 32-bit state and FAKE_BNB_BUILDS=unpaged unpaged state, whatever it was asked: a builder
that builds another optimizer than the one asked for."""

from __future__ import annotations

import os
import types

import torch


class AdamW(torch.optim.AdamW):
    def __init__(
        self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
        args=None, min_8bit_size=4096, percentile_clipping=100, block_wise=True, is_paged=False,
    ):  # fmt: skip
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)
        builds = os.environ.get("FAKE_BNB_BUILDS", "")
        self.optimizer_name = "adam"
        self.args = types.SimpleNamespace(optim_bits=32 if builds == "32bit" else optim_bits)
        self.is_paged = False if builds == "unpaged" else is_paged


class AdamW8bit(AdamW):
    def __init__(self, params, **kw):
        super().__init__(params, **{**kw, "optim_bits": 8})


class PagedAdamW(AdamW):
    def __init__(self, params, **kw):
        super().__init__(params, **{**kw, "is_paged": True})


class PagedAdamW8bit(AdamW):
    def __init__(self, params, **kw):
        super().__init__(params, **{**kw, "optim_bits": 8, "is_paged": True})


# transformers imports these beside AdamW (trainer_optimizer.py _get_bitsandbytes_optimizer); not built here.
Lion = RMSprop = AdamW


class GlobalOptimManager:
    """What the HF Trainer calls for 8-bit optimizers: embeddings kept in 32 bits (a no-op here)."""

    _instance = None

    @classmethod
    def get_instance(cls) -> GlobalOptimManager:
        cls._instance = cls._instance or cls()
        return cls._instance

    def register_module_override(self, module, param_name: str, config: dict) -> None:
        pass
