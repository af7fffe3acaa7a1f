"""Running a matrix: plan, prepare, the loop (a session on an executor), one attempt per cell, the console.

run: the public run(); settings: what a run was asked (RunSettings) and the environment's settings; plan:
what runs, in which order, and what is implied or pruned; session: the loop's state; attempt: one attempt
of one cell; prepare: one-off costs; probe: the machine's rates; progress: the console; signals: a clean stop;
executors: where and when attempts run (the protocol, local, ray, slurm, replay and their names); launch: the one
child protocol."""

from .attempt import HarnessError
from .plan import LOCAL, Plan, Planned, default_report_path, default_results_path, plan, preview
from .run import new_run_id, run
from .settings import AnswerSettings, RunSettings, Shard
from .signals import Stopped, stop_on_signals

__all__ = [
    "AnswerSettings",
    "HarnessError",
    "Plan",
    "Planned",
    "RunSettings",
    "Shard",
    "Stopped",
    "default_results_path",
    "default_report_path",
    "LOCAL",
    "new_run_id",
    "plan",
    "preview",
    "run",
    "stop_on_signals",
]
