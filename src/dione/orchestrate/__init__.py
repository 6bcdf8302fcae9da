"""The run loop: profile, plan, execute in slices, re-plan; and the current-practice baseline."""

from typing import TYPE_CHECKING

from dione._lazy import lazy_exports

if TYPE_CHECKING:
    from dione.orchestrate.options import RunEvent, RunOptions
    from dione.orchestrate.run import RunResult, TaskResult, run_workload
    from dione.orchestrate.sequential import TaskOutcome, choose_technique, run_sequential

# Imported on first use: the CLI reads RunOptions' defaults to build its parser, and
# must not pay for torch to do so.
__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("RunEvent", "RunOptions"), "dione.orchestrate.options"),
    **dict.fromkeys(("RunResult", "TaskResult", "run_workload"), "dione.orchestrate.run"),
    **dict.fromkeys(("TaskOutcome", "choose_technique", "run_sequential"),
                    "dione.orchestrate.sequential"),
})

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
