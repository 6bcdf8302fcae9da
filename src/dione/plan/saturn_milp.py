"""Saturn's published MILP, on HiGHS: the baseline the CP-SAT planner must beat.

Saturn (Nagrecha & Kumar, VLDB 2024) chooses, per task, an option and a node with
binaries, marks the devices it occupies with per-device binaries, and keeps two tasks
on one device apart with big-M disjunctions over every pair of tasks:

    sum_{o,n} x[t,o,n] = 1                                    one option, one node
    sum_g a[t,n,g] = sum_o devices(o) x[t,o,n]                 that many devices there
    S_t + D_t <= S_u + M (1 - y[t,u]) + M (2 - a[t,n,g] - a[u,n,g])   t before u, or
    S_u + D_u <= S_t + M y[t,u]       + M (2 - a[t,n,g] - a[u,n,g])   u before t
    C >= S_t + D_t,  D_t = sum_{o,n} seconds(o) x[t,o,n]       minimise C

The pair constraints grow as tasks^2 x devices, which is why it does not scale.
"""

from __future__ import annotations

import time

import highspy
import numpy as np

from dione.plan.bounds import lower_bound
from dione.plan.greedy import sequential
from dione.plan.highs import quiet_highs
from dione.plan.plan import Assignment, Plan, left_shift, matching_option
from dione.plan.problem import Option, PlanningProblem

__all__ = ["MAX_ROWS", "saturn_milp"]

MAX_ROWS = 3_000_000


class _Columns:
    """Variable indices and bounds, added in one go to HiGHS."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.cost: list[float] = []
        self.integer: list[int] = []

    def add(self, lower: float, upper: float, integer: bool = False, cost: float = 0.0) -> int:
        self.lower.append(lower)
        self.upper.append(upper)
        self.cost.append(cost)
        if integer:
            self.integer.append(len(self.lower) - 1)
        return len(self.lower) - 1


class _Rows:
    """Constraint rows lower <= sum(coef * var) <= upper, in CSR form."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.starts: list[int] = []
        self.indices: list[int] = []
        self.values: list[float] = []

    def add(self, terms: dict[int, float], lower: float, upper: float) -> None:
        self.starts.append(len(self.indices))
        for var, coef in terms.items():
            self.indices.append(var)
            self.values.append(coef)
        self.lower.append(lower)
        self.upper.append(upper)


def saturn_milp(problem: PlanningProblem, time_limit: float = 10.0,
                threads: int | None = None) -> Plan:
    """Solve Saturn's formulation with HiGHS for ``time_limit`` s, not counting the time
    to build the model (reported apart), from current practice's plan; status unknown
    and no assignments when it finds no plan, or the model is too large to build.
    ``threads``: taken for the solvers' common signature, not used (below)."""
    began = time.perf_counter()
    bound = lower_bound(problem)
    tasks = problem.tasks
    devices = problem.total_devices
    pairs = len(tasks) * (len(tasks) - 1) // 2
    rows_needed = 2 * pairs * devices
    if rows_needed > MAX_ROWS:
        return Plan("saturn-milp", "unknown", float("inf"), bound, (),
                    time.perf_counter() - began,
                    {"reason": f"not built: {rows_needed:,} pair constraints "
                               f"(tasks^2 x devices) exceed {MAX_ROWS:,}"})
    current = sequential(problem)
    big_m = current.makespan  # no optimal plan ends later than this one
    cols, rows = _Columns(), _Rows()
    makespan = cols.add(0.0, big_m, cost=1.0)
    choice: dict[tuple[int, int, str], int] = {}
    occupy: dict[tuple[int, str, int], int] = {}
    start = [cols.add(min(task.release, big_m), big_m) for task in tasks]
    length: list[dict[int, float]] = []
    for t, task in enumerate(tasks):
        terms: dict[int, float] = {}
        lengths: dict[int, float] = {}
        for node in problem.nodes:
            per_node: dict[int, float] = {}
            for o, option in enumerate(task.options):
                if task.may_run(option, node):
                    var = cols.add(0.0, 1.0, integer=True)
                    choice[(t, o, node.name)] = var
                    terms[var] = 1.0
                    lengths[var] = option.seconds
                    per_node[var] = -float(option.devices)
            for g in range(node.devices):
                var = cols.add(0.0, 1.0, integer=True)
                occupy[(t, node.name, g)] = var
                per_node[var] = 1.0
            rows.add(per_node, 0.0, 0.0)
        rows.add(terms, 1.0, 1.0)
        length.append(lengths)
        rows.add({makespan: 1.0, start[t]: -1.0, **{v: -s for v, s in lengths.items()}},
                 0.0, highspy.kHighsInf)
    for b in problem.busy:  # a task on a device still held waits for it
        for t in range(len(tasks)):
            for g in b.device_ids:
                rows.add({start[t]: 1.0, occupy[(t, b.node, g)]: -b.until}, 0.0,
                         highspy.kHighsInf)
    # The pair constraints, built a pair at a time over all devices at once (numpy): the
    # model has tasks^2 x devices rows, so building it row by row takes minutes.
    device_keys = [(n.name, g) for n in problem.nodes for g in range(n.devices)]
    occupy_columns = np.array([[occupy[(t, n, g)] for n, g in device_keys]
                               for t in range(len(tasks))], dtype=np.int64)
    length_terms = [(np.array(list(d), dtype=np.int64), np.array(list(d.values())))
                    for d in length]
    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    count = len(device_keys)
    order: dict[tuple[int, int], int] = {}
    for t in range(len(tasks)):
        for u in range(t + 1, len(tasks)):
            before = order[(t, u)] = cols.add(0.0, 1.0, integer=True)
            for first, second, sign in ((t, u, 1.0), (u, t, -1.0)):
                # S_first + D_first - S_second + sign M y + M a_first + M a_second
                #   <= 3M (t before u: sign +) or 2M (u before t: sign -)
                fixed = np.array([start[first], start[second], before], dtype=np.int64)
                fixed_values = np.array([1.0, -1.0, sign * big_m])
                per_row = len(fixed) + 2 + len(length_terms[first][0])
                indices = np.empty((count, per_row), dtype=np.int64)
                values = np.empty((count, per_row))
                indices[:, :3] = fixed
                values[:, :3] = fixed_values
                indices[:, 3] = occupy_columns[first]
                indices[:, 4] = occupy_columns[second]
                values[:, 3:5] = big_m
                indices[:, 5:] = length_terms[first][0]
                values[:, 5:] = length_terms[first][1]
                upper = np.full(count, 3 * big_m if sign > 0 else 2 * big_m)
                blocks.append((indices, values, upper))
    pair_indices = [b[0].ravel() for b in blocks]
    pair_values = [b[1].ravel() for b in blocks]
    pair_upper = [b[2] for b in blocks]
    pair_starts = []
    offset = len(rows.indices)
    for indices_block, _, _ in blocks:
        width = indices_block.shape[1]
        pair_starts.append(offset + width * np.arange(indices_block.shape[0]))
        offset += indices_block.size
    highs = quiet_highs()
    # ``threads`` is not passed on: HiGHS runs one scheduler per process, and a count
    # other than the one it started with (a bound's LP had started it) failed every
    # solve at once, "Not Set", so each virtual run (one thread) fell back to greedy.
    highs.setOptionValue("random_seed", 1)
    n = len(cols.lower)
    highs.addVars(n, np.array(cols.lower), np.array(cols.upper))
    highs.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(cols.cost))
    integer = np.array(cols.integer, dtype=np.int32)
    highs.changeColsIntegrality(len(integer), integer,
                                np.full(len(integer), highspy.HighsVarType.kInteger))
    lower = np.concatenate([np.array(rows.lower)]
                           + [np.full(len(u), -highspy.kHighsInf) for u in pair_upper])
    upper = np.concatenate([np.array(rows.upper), *pair_upper])
    starts = np.concatenate([np.array(rows.starts, dtype=np.int64), *pair_starts])
    indices = np.concatenate([np.array(rows.indices, dtype=np.int64), *pair_indices])
    values = np.concatenate([np.array(rows.values), *pair_values])
    built = time.perf_counter()
    highs.setOptionValue("time_limit", float(max(0.1, time_limit)))
    highs.addRows(len(lower), lower, upper, len(indices), starts.astype(np.int32),
                  indices.astype(np.int32), values)
    _start_from(highs, n, problem, current, makespan, start, choice, occupy, order)
    highs.run()
    info = highs.getInfo()
    status = highs.getModelStatus()
    notes = {"rows": len(lower), "columns": n, "build_seconds": built - began,
             "highs_status": highs.modelStatusToString(status)}
    milp_bound = max(bound, float(info.mip_dual_bound)) if info.mip_dual_bound < 1e300 \
        else bound
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible
        return Plan("saturn-milp", "unknown", float("inf"), milp_bound, (),
                    time.perf_counter() - began, notes)
    solution = highs.getSolution().col_value
    placed = []
    for t, task in enumerate(tasks):
        (o, node_name), = [(o, n) for (tt, o, n), v in choice.items()
                           if tt == t and solution[v] > 0.5]
        chosen: Option = task.options[o]
        ids = [g for g in range(problem.node(node_name).devices)
               if solution[occupy[(t, node_name, g)]] > 0.5]
        begin = solution[start[t]]
        placed.append(Assignment(task.name, chosen.technique, dict(chosen.knobs), node_name,
                                 tuple(ids), begin, begin + chosen.seconds))
    # The solver's times carry its tolerances: re-time exactly, in its order per device.
    assignments = left_shift(placed, problem)
    ends = max([a.end for a in assignments] + [b.until for b in problem.busy])
    # HiGHS says optimal within its relative gap (1e-4 by default: 100 s at 1e6 s): the
    # plan is called so only where it meets the bound.
    optimal = status == highspy.HighsModelStatus.kOptimal and \
        ends <= milp_bound * (1 + 1e-6) + 1e-6
    return Plan("saturn-milp", "optimal" if optimal else "feasible", ends,
                milp_bound, tuple(assignments),
                time.perf_counter() - began, notes)


def _start_from(highs: highspy.Highs, columns: int, problem: PlanningProblem, plan: Plan,
                makespan: int, start: list[int], choice: dict[tuple[int, int, str], int],
                occupy: dict[tuple[int, str, int], int], order: dict[tuple[int, int], int]
                ) -> None:
    """Give HiGHS ``plan`` (current practice's) as a feasible start, as a Gurobi user
    gives a MIP start: with none, HiGHS found no plan of 26 tasks on 3 nodes of two
    kinds in 30 s, and the baseline was greedy's plan unsaid (review)."""
    value = np.zeros(columns)
    value[makespan] = plan.makespan
    at = {}
    for t, task in enumerate(problem.tasks):
        a = plan.assignment(task.name)
        chosen = matching_option(a, task.options, problem.node(a.node))
        if chosen is None:
            return  # (not one of its options: no start given)
        value[choice[(t, task.options.index(chosen), a.node)]] = 1.0
        for g in a.device_ids:
            value[occupy[(t, a.node, g)]] = 1.0
        value[start[t]] = at[t] = a.start
    for (t, u), var in order.items():
        value[var] = 1.0 if at[t] <= at[u] else 0.0
    solution = highspy.HighsSolution()
    solution.col_value = list(value)
    solution.value_valid = True
    highs.setSolution(solution)
