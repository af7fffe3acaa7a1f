"""Results DataFrame -> what the reports say. Pure pandas, no formatting, no clock.

Markdown (pull requests) and HTML (reading) both render one `Analysis`, so they tell the same story
from the same numbers. What ranks cells (best cells, the frontier, knob effects) is per `Section`, one
model at one sequence length, never across them; `effects` summarises a knob's pairs of cells.
Everything here is ordered by the input or by explicit keys, never by hash or set order, because a
report must be a pure function of its results.

One module per part of the report: values (Analysis, Section, Ablation), build (analyse), cells (the cells
table), frontier (best cells), ablations (one-knob tables and effects), knobs (the axes they vary), zero (ZeRO
stages against the paper, loss parity), failures, blocks, answer (answer mode's verdict), notes (the
environment, banner, replays, warnings).
"""

from .ablations import COMPARE_RULE
from .answer import ANSWER_NOTE, knobs_aside, random_weights
from .blocks import BLOCKS_NOTE
from .build import analyse
from .cells import MEMORY_PHASES, MEMORY_VIEW
from .failures import causes
from .frontier import FRONTIER_NOTE
from .knobs import AXES
from .notes import replay_note
from .values import NOT_RUN, SECTION_NOTE, STATUS_ORDER, Ablation, Analysis, Section, measured_first, records
from .zero import LOSS_PARITY_NOTE, ZERO_SCALING_NOTE

__all__ = [
    "Analysis",
    "Ablation",
    "Section",
    "analyse",
    "replay_note",
    "AXES",
    "MEMORY_VIEW",
    "MEMORY_PHASES",
    "STATUS_ORDER",
    "NOT_RUN",
    "records",
    "measured_first",
    "causes",
    "BLOCKS_NOTE",
    "ANSWER_NOTE",
    "COMPARE_RULE",
    "FRONTIER_NOTE",
    "LOSS_PARITY_NOTE",
    "SECTION_NOTE",
    "ZERO_SCALING_NOTE",
    "knobs_aside",
    "random_weights",
]
