"""One entry point for every planner: ``solve(problem, solver=...)``."""

from __future__ import annotations

import math
from collections.abc import Callable

from dione.plan.plan import Plan
from dione.plan.problem import PlanningProblem

__all__ = ["SOLVERS", "solve"]


def _cpsat(problem: PlanningProblem, time_limit: float, threads: int | None,
           deterministic_time: float | None = None) -> Plan:
    from dione.plan.cpsat import cpsat

    return cpsat(problem, time_limit, threads, deterministic_time)


def _greedy(problem: PlanningProblem, time_limit: float, threads: int | None) -> Plan:
    from dione.plan.greedy import greedy

    return greedy(problem, time_limit)


def _sequential(problem: PlanningProblem, time_limit: float, threads: int | None) -> Plan:
    from dione.plan.greedy import sequential

    return sequential(problem)


def _spread(problem: PlanningProblem, time_limit: float, threads: int | None) -> Plan:
    from dione.plan.greedy import spread

    return spread(problem)


def _saturn_milp(problem: PlanningProblem, time_limit: float, threads: int | None) -> Plan:
    from dione.plan.saturn_milp import saturn_milp

    return saturn_milp(problem, time_limit, threads)


SOLVERS: dict[str, Callable[[PlanningProblem, float, int | None], Plan]] = {
    "cpsat": _cpsat,
    "greedy": _greedy,
    "sequential": _sequential,
    "saturn-milp": _saturn_milp,
    "spread": _spread,  # a baseline: HyperSched's even spreading, no solver
}


def solve(problem: PlanningProblem, solver: str = "cpsat", time_limit: float = 10.0,
          threads: int | None = None, deterministic_time: float | None = None) -> Plan:
    """Plan ``problem`` with ``solver`` within ``time_limit`` seconds on ``threads``;
    ``deterministic_time`` (cpsat only) bounds the search by CP-SAT's deterministic time
    instead, for the same plan on a busy machine as on a quiet one."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    if not time_limit > 0 or not math.isfinite(time_limit):
        raise ValueError(f"the time limit must be a positive number of seconds, not "
                         f"{time_limit}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be at least 1, not {threads} (leave it out for "
                         "every core)")
    if deterministic_time is not None:
        if solver != "cpsat":
            raise ValueError(f"a deterministic time applies to the cpsat solver only, not "
                             f"{solver!r}; drop it or choose cpsat")
        if not deterministic_time > 0 or not math.isfinite(deterministic_time):
            raise ValueError(f"the deterministic time must be positive, not "
                             f"{deterministic_time}")
        return _cpsat(problem, time_limit, threads, deterministic_time)
    return SOLVERS[solver](problem, time_limit, threads)
