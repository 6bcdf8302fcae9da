"""The run loop: profile, plan, execute in slices, re-plan; and the current-practice baseline."""

from dione.orchestrate.run import RunEvent, RunOptions, RunResult, TaskResult, run_workload
from dione.orchestrate.sequential import TaskOutcome, choose_technique, run_sequential

__all__ = [
    "RunEvent",
    "RunOptions",
    "RunResult",
    "TaskOutcome",
    "TaskResult",
    "choose_technique",
    "run_sequential",
    "run_workload",
]
