"""The run loop: a session runs one plan into one results file on an executor, the only writer of that file.

loop: the Session (the queue of cell repeats left, the attempts in flight, what each end implies, one source of
attempts per mode, the machine's probe and the one-off costs); earlier: what the results file held when the run
began (--resume reads it); ledger: every record the run writes, stored, counted and said; answering: answer mode's
part (its search, the attempts it asks for, the cells it leaves unmeasured, the answer); units: the run as the
session runs it and a unit of work."""

from .loop import Session
from .units import Run, Unit

__all__ = ["Run", "Session", "Unit"]
