"""What a cell measures, written once for both engines: step times, losses, fp16 skipped steps, the
phases (events), the allocator's peaks per phase and per part of a step, and the result document's
fields made from them. The engines only drive: the DeepSpeed loop calls it around its own steps, the
HF Trainer path from its callback."""

from __future__ import annotations

import math
import time
from typing import Callable

from ..records.adaptive import Schedule
from .events import Events

__all__ = ["Measure"]


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Measure:
    """One cell's measurement. The driver calls, in order: warmup() once setup is done; per step
    step_start(step), [part(name) after each part, own loop only], step_end(), loss(value), and stops
    once `done`; then finish() at the end of training. A cell that fails on the way gets none of
    finish()'s fields. When warmup and measurement end is the cell's Schedule's (bench/records/adaptive.py)."""

    def __init__(self, cell, doc: dict, events: Events, device, t_setup: float, *, own_loop: bool, world: int = 1):
        """own_loop: the driver sees inside each step (DeepSpeed's loop), so the memory held between
        steps and the peak per part of a step are recorded; the Trainer's callbacks see only step
        boundaries. world: ranks that must agree on an adaptive schedule's decisions."""
        import torch

        self.torch, self.cell, self.doc, self.events, self.device = torch, cell, doc, events, device
        self.cuda = device.type == "cuda"
        self.t_setup = t_setup
        self.own_loop = own_loop
        self.schedule = Schedule(cell.warmup_steps, cell.measured_steps, cell.adaptive)
        # Ranks step in lockstep, so an adaptive decision (made from each rank's own clock) must be one.
        self._agree = world > 1 and cell.adaptive is not None
        self.losses: list[float] = []
        self.times: list[float] = []
        self.diverged: str | None = None
        # The engine's count of fp16 steps skipped on overflow; the driver sets it once the engine exists.
        self.skipped: Callable[[], int] = lambda: 0
        # The fp16 loss scale the engine's optimizer holds (None without one); read once, at the end.
        self.loss_scale: Callable[[], float | None] = lambda: None
        self._skipped_at_measure: int | None = None
        self._measuring = False
        self._setup_alloc: dict | None = None
        self._resident = 0  # allocated at the start of a measured step: model states and what persists between steps
        self._parts = _PartPeaks(torch, device) if self.cuda and own_loop else None
        self._t0 = 0.0

    def _phase(self, name: str) -> None:
        self.doc["phase"] = name
        self.events.phase(name)

    def warmup(self) -> None:
        """Setup is over; the warmup steps begin."""
        self.doc["setup_s"] = time.perf_counter() - self.t_setup
        self._phase("warmup")

    def step_start(self, step: int) -> None:
        torch, device = self.torch, self.device
        if self.schedule.measuring and not self._measuring:
            _sync(torch, device)
            if self.cuda:
                self._setup_alloc = {
                    "torch_max_allocated_bytes": torch.cuda.max_memory_allocated(device),
                    "torch_max_reserved_bytes": torch.cuda.max_memory_reserved(device),
                }
                torch.cuda.reset_peak_memory_stats(device)
            self._skipped_at_measure = self.skipped()
            self._measuring = True
            self._phase("measured")
        if self.cuda and self.own_loop and self._measuring:
            # A host-side counter (no sync): what ZeRO's model-state formulas describe, without the
            # activations, communication buckets and gathered parameters that make up the peak.
            self._resident = max(self._resident, torch.cuda.memory_allocated(device))
        # The clock starts on an idle device (the previous step's end already synced it; step 0 follows setup).
        _sync(torch, device)
        self._t0 = time.perf_counter()

    def part(self, name: str) -> None:
        """One part of a measured step (forward, backward, step) has ended: its allocator peak."""
        if self._parts is not None and self._measuring:
            self._parts.end(name)

    def step_end(self) -> None:
        _sync(self.torch, self.device)
        dt = time.perf_counter() - self._t0
        self.times.append(dt)
        self.schedule.observe(dt)  # after the clock stopped: deciding is not part of the step
        if self._agree:
            torch = self.torch
            state = torch.tensor(self.schedule.state(), dtype=torch.int64, device=self.device)
            torch.distributed.broadcast(state, src=0)
            self.schedule.impose(state.tolist())

    @property
    def done(self) -> bool:
        """The schedule has ended: the driver stops after this step."""
        return self.schedule.done

    def loss(self, value: float) -> bool:
        """The step's loss; False once it is not finite (the first such step is the cell's reason)."""
        step = len(self.losses)
        self.losses.append(value)
        self.events.emit("step", step=step, loss=value, dt=self.times[-1] if self.times else None)
        if not math.isfinite(value):
            self.diverged = self.diverged or f"loss became {value} at step {step}"
            return False
        return True

    def finish(self, counts: dict, cfg, world: int) -> None:
        """Training ended: status, losses, times and memory into the document, and the metrics made from them."""
        from . import metrics

        torch, device, cell, doc = self.torch, self.device, self.cell, self.doc
        self._phase("teardown")
        doc["status"] = "diverged" if self.diverged else "ok"
        if self.diverged:
            doc["reason"] = self.diverged
        losses, times = self.losses, self.times
        taken = self.schedule.summary()
        doc["steps"] = taken
        measured_times = times[taken["warmup"] :]
        doc["losses"] = losses
        doc["step_times_s"] = times
        skipped = self.skipped()
        # Skips before the first measured step are the warmup's: the loss scale settling (or a wrong
        # one) shows there first, and a warmup that skipped every step leaves the weights untouched.
        at_measure = skipped if self._skipped_at_measure is None else self._skipped_at_measure
        doc["fp16_skipped_warmup_steps"] = at_measure
        doc["fp16_skipped_steps"] = skipped - at_measure
        try:
            scale = self.loss_scale()
            doc["loss_scale_final"] = float(scale) if scale is not None else None
        except Exception:  # noqa: BLE001 - a private attribute of the engine: absent is fine
            doc["loss_scale_final"] = None
        if self.cuda:
            doc["memory_setup"] = self._setup_alloc
            doc["memory_measured"] = {
                "torch_max_allocated_bytes": torch.cuda.max_memory_allocated(device),
                "torch_max_reserved_bytes": torch.cuda.max_memory_reserved(device),
            }
            doc["gpu_name"] = torch.cuda.get_device_name(device)
        if doc["status"] == "ok" and len(measured_times) >= 1:
            model_ft, hw_ft = metrics.flops_per_token(
                params_total=counts["params_total"],
                params_trainable=counts["params_trainable"],
                params_embedding=counts["params_embedding"],
                layers=cfg.num_hidden_layers,
                hidden=cfg.hidden_size,
                seq_len=cell.seq_len,
                grad_ckpt=cell.grad_ckpt,
            )
            peak = metrics.peak_tflops(doc.get("gpu_name"), cell.precision) if self.cuda else None
            doc["metrics"] = metrics.summarize(
                measured_times,
                tokens_per_step=cell.micro_batch * cell.grad_accum * cell.seq_len * world,
                samples_per_step=cell.micro_batch * cell.grad_accum * world,
                model_flops_tok=model_ft,
                hw_flops_tok=hw_ft,
                gpus=world,
                peak=peak,
            )
            doc["metrics"].update(
                model_flops_per_token=model_ft,
                hw_flops_per_token=hw_ft,
                peak_tflops=peak,
                loss_first=losses[0],
                loss_final=losses[-1],
                loss_measured_first=losses[taken["warmup"]],
            )
        if self.cuda and self._resident:
            doc["memory_measured"]["torch_allocated_between_steps_bytes"] = self._resident
        if self._parts is not None and self._parts.peaks:
            self._parts.merge_into(doc["memory_measured"])


class _PartPeaks:
    """The allocator's peak in each part of a measured step: forward (with the loss), backward (with
    ZeRO's gradient reduction, which DeepSpeed runs inside engine.backward) and the optimizer step.
    Where the peak comes from decides what shrinks it: the ZeRO paper's model states (parameters,
    gradients, optimizer state) all exist at once only at the end of the backward pass, while the
    loss's logits or the step's fp32 gradient copy can set the cell's peak instead.
    The allocator's counters are kept on the host: reading and resetting them needs no sync."""

    def __init__(self, torch, device):
        self.cuda, self.device = torch.cuda, device
        self.peaks: dict[str, int] = {}
        self.reserved = 0

    def end(self, part: str) -> None:
        self.peaks[part] = max(self.peaks.get(part, 0), self.cuda.max_memory_allocated(self.device))
        self.reserved = max(self.reserved, self.cuda.max_memory_reserved(self.device))
        # The next part's peak starts from what is allocated now.
        self.cuda.reset_peak_memory_stats(self.device)

    def merge_into(self, mem: dict) -> None:
        """Per-part peaks into the measured figures; the whole-phase peaks stay the max over all parts
        (each reset above cleared the allocator's own)."""
        for part, v in self.peaks.items():
            mem[f"torch_max_allocated_{part}_bytes"] = v
        mem["torch_max_allocated_bytes"] = max(mem["torch_max_allocated_bytes"], *self.peaks.values())
        mem["torch_max_reserved_bytes"] = max(mem["torch_max_reserved_bytes"], self.reserved)
