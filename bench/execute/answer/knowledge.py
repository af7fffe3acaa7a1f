"""What the search knows of a cell: its speed and memory, measured (through the anchors from another block) or
predicted by the models the run corrects, and the predicted wall of an attempt."""

from __future__ import annotations

import math

import numpy as np

from ...judge import blocks
from .candidate import MEMORY_NOISE, Candidate, Z


class Knowledge:
    """The figures of the search's cells as its measurements stand (a part of bench.execute.answer.Search)."""

    @property
    def offsets(self) -> blocks.Offsets:
        """Each block's offset from the reference block, from the anchors (bench.judge.blocks.offsets)."""
        if "offsets" not in self._memo:
            measured = {c.cell.hash: c.obs for c in self.candidates if c.obs}
            offs = blocks.offsets(measured, self.cross, self.order)
            self.tps.anchor({b: (offs.mean[b], offs.var(b) if b != offs.ref else 0.0) for b in offs.blocks})
            self._memo["offsets"] = offs
        return self._memo["offsets"]

    def speed(self, c: Candidate) -> tuple[float, float]:
        """log tokens/s of the cell on the reference block's scale: (mean, sd), measured where it was (through
        the anchors from another block), else predicted."""
        key = ("speed", id(c))
        if key not in self._memo:
            self._memo[key] = self._speed(c)
        return self._memo[key]

    def _speed(self, c: Candidate) -> tuple[float, float]:
        if c.obs:
            mean, var = blocks.level(c.obs, self.offsets, self.cross)
            return mean, math.sqrt(var)
        if c.base_tps is None:
            return math.inf, math.inf  # unknown: it could lead
        return self._predicted("tps")[id(c)]

    def _predicted(self, which: str) -> dict[int, tuple[float, float]]:
        """Every unmeasured cell's corrected prediction (log tokens/s or log peak), by id: one pass over all."""
        key = ("predicted", which)
        if key not in self._memo:
            self.offsets  # noqa: B018 - the model's block offsets are the anchors'
            model, base = (self.tps, "base_tps") if which == "tps" else (self.memory, "base_mem")
            cells = [c for c in self.candidates if getattr(c, base) is not None]
            means, sds = model.marginals([(c.model, getattr(c, base)) for c in cells])
            self._memo[key] = {id(c): (float(m), float(sd)) for c, m, sd in zip(cells, means, sds)}
        return self._memo[key]

    def posterior(self, cells: list[Candidate]) -> tuple[np.ndarray, np.ndarray]:
        """The joint mean and covariance of these cells' log tokens/s on the reference block's scale: measured
        cells from their measurements and the blocks' offsets (bench.judge.blocks.joint), the others from the corrected
        step-time model (Online.posterior); a measured and a predicted cell are taken as independent."""
        mean, cov = np.zeros(len(cells)), np.zeros((len(cells), len(cells)))
        measured = [i for i, c in enumerate(cells) if c.obs]
        predicted = [i for i, c in enumerate(cells) if not c.obs and c.base_tps is not None]
        if measured:
            m, v = blocks.joint([cells[i].obs for i in measured], self.offsets, self.cross)
            mean[measured], cov[np.ix_(measured, measured)] = m, v
        if predicted:
            self.offsets  # noqa: B018 - the model's block offsets are the anchors'
            m, v = self.tps.posterior([(cells[i].model, cells[i].base_tps) for i in predicted])
            mean[predicted], cov[np.ix_(predicted, predicted)] = m, v
        unknown = [i for i, c in enumerate(cells) if not c.obs and c.base_tps is None]
        mean[unknown], cov[unknown, unknown] = math.inf, math.inf
        return mean, cov

    def gap(self, c: Candidate, m: Candidate) -> tuple[float, float]:
        """log(c / m) and its sd: two measured cells within the blocks both ran in, else through the anchors
        (bench.judge.blocks.gap); a predicted cell's own width beside a measured one's."""
        if c.obs and m.obs:
            g = blocks.gap(c.obs, m.obs, self.offsets, self.cross)
            return g.d, math.sqrt(g.var)
        (mc, sc), (mm, sm) = self.speed(c), self.speed(m)
        return mc - mm, math.hypot(sc, sm)

    def comparable(self, c: Candidate, m: Candidate) -> bool:
        """Whether two measured cells compare at all: one block, or blocks the anchors tie together."""
        part = self.parts()
        return bool({part[b] for b in c.obs} & {part[b] for b in m.obs})

    def parts(self) -> dict[str, int]:
        """Each block's set of blocks tied by anchors, numbered (bench.judge.blocks.parts)."""
        if "parts" not in self._memo:
            measured = {c.cell.hash: c.obs for c in self.candidates if c.obs}
            self._memo["parts"] = blocks.parts(measured, self.offsets.ref)
        return self._memo["parts"]

    def untied(self) -> list[Candidate]:
        """The measured cells of blocks no anchor ties to the reference block: compared with no cell of it, and left
        out of the chances (bench.execute.answer.settle)."""
        tied = self.offsets.tied
        return [c for c in self.candidates if c.obs and not set(c.obs) & tied]

    def interval(self, c: Candidate) -> tuple[float, float]:
        m, sd = self.speed(c)
        return m - Z * sd, m + Z * sd

    def memory_interval(self, c: Candidate) -> tuple[float, float]:
        key = ("memory", id(c))
        if key not in self._memo:
            self._memo[key] = self._memory_interval(c)
        return self._memo[key]

    def _memory_interval(self, c: Candidate) -> tuple[float, float]:
        if c.mem is not None:
            return c.mem - Z * MEMORY_NOISE, c.mem + Z * MEMORY_NOISE
        if c.base_mem is None:
            return -math.inf, math.inf
        m, sd = self._predicted("memory")[id(c)]
        return m - Z * sd, m + Z * sd

    def cost_s(self, c: Candidate, rung: int) -> float:
        """Predicted wall seconds of one attempt at this rung, corrected by the walls measured so far."""
        if c.base_cost is None:
            return 0.0
        if "cost" not in self._memo:
            self._memo["cost"] = self.cost.predict({}, 0.0)[0]
        log = c.base_cost + self._memo["cost"]
        return math.exp(log + c.short if rung == 0 and self.s.halving else log)
