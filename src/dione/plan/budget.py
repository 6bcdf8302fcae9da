"""How long a search may go on (wall or deterministic time), and CP-SAT set up to spend it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ortools.sat.python import cp_model

__all__ = ["PORTFOLIO", "Budget", "cp_solver"]

PORTFOLIO = ("max_lp", "quick_restart", "default_lp", "no_lp", "core", "reduced_costs",
             "pseudo_costs", "fixed")


@dataclass
class Budget:
    """How long the search may go on: wall seconds, or CP-SAT's deterministic time (the
    same work on a busy machine as on a quiet one)."""

    seconds: float
    deterministic: bool
    began: float = 0.0
    spent: float = 0.0

    def __post_init__(self) -> None:
        self.began = time.perf_counter()

    def left(self) -> float:
        if self.deterministic:
            return self.seconds - self.spent
        return self.seconds - (time.perf_counter() - self.began)

    def limit(self, solver: cp_model.CpSolver, seconds: float) -> None:
        if self.deterministic:
            solver.parameters.max_deterministic_time = max(0.05, seconds)
        else:
            solver.parameters.max_time_in_seconds = max(0.05, seconds)

    def charge(self, solver: cp_model.CpSolver, at_least: float = 0.0) -> None:
        self.spent += max(at_least, solver.deterministic_time)


def cp_solver(budget: Budget, seconds: float, threads: int) -> cp_model.CpSolver:
    """A CP-SAT solver limited to ``seconds`` of ``budget``'s kind, on ``threads`` workers,
    with the parameters these scheduling models need."""
    solver = cp_model.CpSolver()
    # CP-SAT would install its own SIGINT handler and leave the default one behind: after
    # the first solve, Ctrl-C killed the launcher (and a notebook's kernel) outright.
    solver.parameters.catch_sigint_signal = False
    budget.limit(solver, seconds)
    solver.parameters.num_workers = threads
    solver.parameters.random_seed = 1
    # Stronger cumulative reasoning: it proves instances the defaults leave open.
    solver.parameters.use_overload_checker_in_cumulative = True
    solver.parameters.use_timetable_edge_finding_in_cumulative = True
    solver.parameters.use_conservative_scale_overload_checker = True
    solver.parameters.use_dynamic_precedence_in_cumulative = True
    if threads == 1:
        solver.parameters.linearization_level = 2
    elif budget.deterministic:
        # Parallel workers race on the clock; interleaved, they do the same work in the
        # same order whatever the load.
        solver.parameters.interleave_search = True
        # One task per worker per batch: CP-SAT's default batch ran far past the limit
        # (hard-3, 1 unit on 2 workers: 4.5 units and 31 s of wall time; with this,
        # 1.6 units and 8 s), since a batch is only stopped once all of it is done.
        solver.parameters.interleave_batch_size = threads
    elif threads < len(PORTFOLIO):
        # CP-SAT's default for few workers leaves out the subsolvers that prove these
        # models optimal (seen: 3 tasks unproven in 10 s on 2 workers, proven in 0.01 s
        # with max_lp); choose them, still on ``threads`` threads.
        solver.parameters.subsolvers.extend(PORTFOLIO[:threads])
    return solver
