"""Planning (pure: JSON in, JSON out): problems, plans, solvers, bounds, the checker."""

from dione.plan.bounds import lower_bound
from dione.plan.plan import Assignment, Plan, assign_device_ids, check_plan, load_plan
from dione.plan.problem import (
    Busy,
    NodeSpec,
    Option,
    PlanningProblem,
    ProblemError,
    TaskOptions,
    load_problem,
)
from dione.plan.solve import SOLVERS, solve

__all__ = [
    "SOLVERS",
    "Assignment",
    "Busy",
    "NodeSpec",
    "Option",
    "Plan",
    "PlanningProblem",
    "ProblemError",
    "TaskOptions",
    "assign_device_ids",
    "check_plan",
    "load_plan",
    "load_problem",
    "lower_bound",
    "solve",
]
