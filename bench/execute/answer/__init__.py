"""Answer mode (`zerobench run M --answer`): measure only what settles the answer, then stop.

The answer, per model: (a) the fastest cell that fits in each group (by PEFT mode unless --group-by says
otherwise), (b) the memory/speed frontier, (c) each knob's effect on throughput with a 95% interval. Every
runnable cell starts open. The step-time and memory models give each a prediction; what the run measures
corrects them (bench.estimate.planning.online: an offset for the machine, one per block, and an additive effect per
axis value, fitted to the residuals), so after a few cells the predictions speak for this machine.

Blocks: a measurement belongs to one run part on one machine (bench.records.record.Record.block). Two measured cells
compare directly only within a block; across blocks through anchors, cells measured in both
(bench.judge.blocks). A knob's effect is made of pairs measured in one block. A search that goes on (--resume) in
a new block first measures anchors there: each group's leader and a few other cells measured before (role
"anchor"), so its offset is known; a cell whose comparison no anchor settles is measured again in this
block where the answer needs it. Each measurement carries its noise (bench.records.quality: about three times wider
when it was host-bound or unstable). A cell is measured when it
could still change the answer, in this order: each group's predicted leader; a cell whose throughput
interval reaches the leader's; the leader again on the full schedule, and whichever of two overlapping cells
has fewer measurements (up to MAX_MEASUREMENTS), another short look; a cell not dominated on memory (the
frontier); a pair partner for a knob effect (--pairs per value). A cell is left unmeasured only when its
throughput interval lies below its group leader's AND a measured cell needs no more memory (within the
tolerance) and is surely faster; when it is expected to repeat an error that two attempts of cells sharing its
settings ended in (bench.execute.answer.failures); or when the budget (--budget) is spent. Its record says which.

Successive halving over measured steps: a cell's measurements run the short schedule (rung 0, a short look:
rung_cell, whose median lands within a fraction of one measurement's noise of the full schedule's); only each
group's leader runs again on the matrix's own schedule (rung 1), the answer's own figure. A rung is a repeat
of the same cell: the record keeps the cell's identity and says the schedule it ran (`steps`) and why it was
measured (`answer`).

Pure decisions: no I/O; the session (bench.execute.session) asks `next()` for work and `observe()`s records.

The package: the search's cells (candidate), the search (search: its models and state, made of knowledge, outcomes,
judging, picking and ending), the joint stopping rule (settle), a configuration's micro-batches (families), the
errors that teach it (failures) and the answer as the console prints it (text).
"""

from .candidate import EXTRA_ANCHORS, MAX_MEASUREMENTS, SHORT_LOOK, Candidate, Request, State, Z, rung_cell
from .search import Search, Settings, agreement, distinct
from .text import group_name, kilo, speed_text

__all__ = [
    "EXTRA_ANCHORS",
    "MAX_MEASUREMENTS",
    "SHORT_LOOK",
    "Z",
    "Candidate",
    "Request",
    "State",
    "Search",
    "Settings",
    "distinct",
    "group_name",
    "kilo",
    "speed_text",
    "agreement",
    "rung_cell",
]
