"""Large-neighbourhood search around a plan: free a window of tasks, keep the rest, re-solve.

A round frees a few tasks and keeps every other one on its option and node, and in its
order on that node (a kept task that ended before another kept one started still does)::

    node 0  |== a ==|     |=== b ===|         a, b kept: b still starts after a ends
    node 1  |= c =|[ freed: any option, any node, any start ]|= d =|

CP-SAT places the freed tasks and re-times the others (those that end before the
window opens stay fixed); the round's plan replaces the incumbent when it ends earlier
or, ending at the same time, when its tasks end earlier in sum once re-timed exactly.
Three kinds of window take turns: the tasks nearest a moment of the plan, the tasks of
two or more nodes (always the node that ends last, often the one that ends first), and
a random set with the last-ending task. A window grows after a round proven optimal
without gain (there was nothing better inside it) and shrinks after a round cut by its
time limit.

On a cluster of more than ``MANY_NODES`` nodes a round looks at ``SCOPE_NODES`` of them
(the one that ends last, the one that ends first, the rest at random): its window is
chosen among their tasks, its freed tasks may go on those nodes only, and every other
node's tasks stay exactly where they are. Over every node, a round of 30 freed tasks on
64 nodes was some 19,000 optional intervals beside 1,000 kept tasks: 18-40 s of wall
time for 0.2 units of deterministic time, and not one feasible plan found.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from dione.plan.budget import Budget, cp_solver
from dione.plan.options import (
    TICKS_PER_HORIZON,
    Placement,
    tick_starts,
    ticks,
    useful_for,
    useful_options,
)
from dione.plan.plan import assign_device_ids, left_shift
from dione.plan.problem import Option, PlanningProblem

__all__ = ["KINDS", "LnsStats", "improve", "retimed"]

KINDS = ("moment", "nodes", "random")
ROUND_SECONDS = 1.0  # each round's limit: many small re-solves beat a few long ones here
# The same on a deterministic budget: a unit of CP-SAT's deterministic time took 5-9 s of
# wall time on these models, so a round of one unit was a long one (hard-5, 8 units on 2
# workers: 1.023 x the bound with rounds of 0.2, 1.033 with rounds of 1; hard-3 equal).
ROUND_UNITS = 0.2
ROUND_OVERHEAD = 0.01  # deterministic time charged at least per round
MANY_NODES = 16  # above this many nodes, a round looks at SCOPE_NODES of them
SCOPE_NODES = 4


@dataclass
class LnsStats:
    """What the search did: rounds per kind of window, and how many improved the plan."""

    rounds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    improvements: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    window: int = 0
    # A lower bound in seconds, proven when a window grew to every task (then the round
    # is the whole model) and CP-SAT solved it to optimality; 0 otherwise.
    bound: float = 0.0

    def notes(self) -> dict[str, object]:
        notes: dict[str, object] = {"lns_rounds": dict(self.rounds),
                                    "lns_improvements": dict(self.improvements),
                                    "lns_last_window": self.window}
        if self.bound:
            notes["lns_bound"] = self.bound
        return notes


def retimed(problem: PlanningProblem, placed: Sequence[Placement]
            ) -> tuple[list[Placement], tuple[float, float]]:
    """``placed`` re-timed exactly in seconds (as the plan will be), with its score: the
    makespan, then the sum of the tasks' ends."""
    options = {name: option for name, option, _, _ in placed}
    shifted = left_shift(assign_device_ids(placed, problem), problem)
    result = [(a.task, options[a.task], a.node, a.start) for a in shifted]
    ends = [a.end for a in shifted]
    makespan = max([*ends, *(b.until for b in problem.busy), 0.0])
    return result, (makespan, sum(ends))


def _window(kind: str, placed: Sequence[Placement], nodes: Sequence[str], size: int,
            rng: random.Random) -> set[str]:
    ends = {name: start + option.seconds for name, option, _, start in placed}
    last = max(ends, key=lambda n: ends[n])
    if kind == "moment":
        moment = rng.uniform(0.0, ends[last])

        def distance(p: Placement) -> float:
            return max(0.0, p[3] - moment, moment - ends[p[0]])

        ranked = sorted(placed, key=lambda p: (distance(p), rng.random()))
        return {p[0] for p in ranked[:size]}
    if kind == "nodes":
        by_node: dict[str, list[str]] = defaultdict(list)
        for name, _, node, _ in placed:
            by_node[node].append(name)
        node_of = {p[0]: p[2] for p in placed}
        finish = {n: max((ends[t] for t in by_node[n]), default=0.0) for n in nodes}
        others = sorted(set(nodes) - {node_of[last]})
        rng.shuffle(others)
        if others and rng.random() < 0.5:
            # The node that ends first is where the last one's work can go.
            first = min(others, key=lambda n: (finish[n], n))
            others = [first] + [n for n in others if n != first]
        # At least two nodes: within one node a window can only re-pack it.
        free: set[str] = set()
        for taken, node in enumerate([node_of[last], *others]):
            free.update(by_node[node])
            if taken >= 1 and len(free) >= size:
                break
        return free
    names = sorted(ends)
    names.remove(last)
    return {last, *rng.sample(names, min(len(names), size - 1))}


def _scope(placed: Sequence[Placement], nodes: Sequence[str], rng: random.Random
           ) -> set[str]:
    """The nodes a round on a large cluster looks at: the one whose tasks end last, the
    one whose end first, and others at random up to ``SCOPE_NODES``."""
    finish = dict.fromkeys(nodes, 0.0)
    for _, option, node, start in placed:
        finish[node] = max(finish[node], start + option.seconds)
    ranked = sorted(nodes, key=lambda n: (finish[n], n))
    scope = {ranked[-1], ranked[0]}
    rest = sorted(set(nodes) - scope)
    return scope | set(rng.sample(rest, min(len(rest), SCOPE_NODES - len(scope))))


def _round(problem: PlanningProblem, placed: Sequence[Placement], free: set[str],
           budget: Budget, seconds: float, threads: int, scope: set[str] | None = None
           ) -> tuple[list[Placement] | None, bool, float]:
    """Re-solve with ``free`` tasks freed; the placements found (None: none), whether
    CP-SAT proved them the best of this window, and its bound in seconds (a bound on
    every plan only when every task is free). ``scope``: the only nodes the freed
    tasks may go on (None: every node); the tasks of the others stay where they are."""
    makespan = max(start + option.seconds for _, option, _, start in placed)
    tick = makespan / TICKS_PER_HORIZON
    starts = tick_starts(problem, placed, tick)
    limit = max([starts[n] + ticks(o.seconds, tick) for n, o, _, _ in placed]
                + [ticks(b.until, tick) for b in problem.busy])
    model = cp_model.CpModel()
    span = model.new_int_var(0, limit, "makespan")
    intervals: dict[str, list[tuple[cp_model.IntervalVar, int]]] = defaultdict(list)
    for b in problem.busy:
        until = ticks(b.until, tick)
        if until > 0 and (scope is None or b.node in scope):
            intervals[b.node].append(
                (model.new_fixed_size_interval_var(0, until, f"busy {b.task}"),
                 len(b.device_ids)))
        model.add(span >= until)
    release = {name: ticks(seconds, tick) for name, seconds in problem.releases().items()}
    start_vars: dict[str, cp_model.IntVar] = {}
    choices: dict[tuple[str, int, str], cp_model.IntVar] = {}
    usable: dict[str, list[Option]] = {}
    ends: list[cp_model.LinearExprT] = []
    # Kept tasks that end before the window's first task starts stay where they are:
    # nothing freed can use their time, and fixed they cost the search nothing.
    opening = min(starts[name] for name in free)
    for name, option, node, _ in placed:
        if scope is not None and node not in scope:  # out of the round's sight: fixed
            ends.append(starts[name] + ticks(option.seconds, tick))
            continue
        settled = name not in free and starts[name] + ticks(option.seconds, tick) <= opening
        if settled:
            # Constants of one value are one variable: hinted twice, the model is invalid.
            start = model.new_constant(starts[name])
        else:
            start = model.new_int_var(min(release[name], limit), limit, f"start {name}")
            model.add_hint(start, starts[name])
        start_vars[name] = start
        if name not in free:
            length = ticks(option.seconds, tick)
            intervals[node].append((model.new_fixed_size_interval_var(start, length, name),
                                    option.devices))
            ends.append(start + length)
            continue
        usable[name] = useful_options(task := problem.task(name))
        present, lengths = [], []
        for i, candidate in enumerate(usable[name]):
            length = ticks(candidate.seconds, tick)
            for target in problem.nodes:
                if not task.may_run(candidate, target) or (scope is not None
                                                          and target.name not in scope):
                    continue
                chosen = model.new_bool_var(f"{name} {i} {target.name}")
                model.add_hint(chosen, target.name == node and candidate == option)
                intervals[target.name].append((model.new_optional_fixed_size_interval_var(
                    start, length, chosen, f"{name} {i} on {target.name}"), candidate.devices))
                choices[(name, i, target.name)] = chosen
                present.append(chosen)
                lengths.append(length * chosen)
        model.add_exactly_one(present)
        ends.append(start + sum(lengths))
    for end in ends:
        model.add(span >= end)
    # Kept tasks keep their order on their node: the window's tasks move around them.
    kept: dict[str, list[Placement]] = defaultdict(list)
    for p in placed:
        if p[0] not in free and p[0] in start_vars:
            kept[p[2]].append(p)
    for group in kept.values():
        for first in group:
            first_end = starts[first[0]] + ticks(first[1].seconds, tick)
            for second in group:
                if second is not first and starts[second[0]] >= first_end:
                    model.add(start_vars[second[0]]
                              >= start_vars[first[0]] + ticks(first[1].seconds, tick))
    for target in problem.nodes:
        here = intervals[target.name]
        if here:
            model.add_cumulative([i for i, _ in here], [d for _, d in here], target.devices)
            wide = [i for i, d in here if 2 * d > target.devices]
            if len(wide) > 1:
                model.add_no_overlap(wide)
    model.add_hint(span, limit)
    # The makespan alone: a round then proves its window quickly (0.2 s on hard-5, where
    # adding the sum of ends as a tie-break left every 1 s round unproven and gained
    # less in the same time). Tried too: the sum of the nodes' finishing times as the
    # tie-break (hard-3, 60 s: 1.044 and 1.041 x the bound against 1.036 and 1.037).
    model.minimize(span)
    solver = cp_solver(budget, seconds, threads)
    status = solver.solve(model)
    # A round's model building is work CP-SAT's deterministic time does not count: charge
    # some, or tiny problems would spin through rounds for ever on a deterministic budget.
    budget.charge(solver, at_least=ROUND_OVERHEAD)
    # Rounded-up lengths lengthen a chain of tasks by at most one tick each.
    bound = max(0.0, solver.best_objective_bound - len(placed)) * tick
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, False, bound
    found: list[Placement] = []
    for name, option, node, _ in placed:
        if name not in start_vars:  # out of the round's sight
            found.append((name, option, node, starts[name] * tick))
            continue
        at = solver.value(start_vars[name]) * tick
        if name not in free:
            found.append((name, option, node, at))
            continue
        found.extend((name, usable[name][i], target, at)
                     for (task, i, target), var in choices.items()
                     if task == name and solver.boolean_value(var))
    return found, status == cp_model.OPTIMAL, bound


def improve(problem: PlanningProblem, placed: Sequence[Placement], budget: Budget,
            threads: int, bound: float = 0.0, seed: int = 1
            ) -> tuple[list[Placement], LnsStats]:
    """Search around ``placed`` until ``budget`` is spent or the plan meets ``bound``; the
    best placements found (``placed`` itself, re-timed, if nothing better)."""
    stats = LnsStats()
    rng = random.Random(seed)
    best, score = retimed(problem, [(n, useful_for(useful_options(problem.task(n)), o), node, s)
                                    for n, o, node, s in placed])
    count = len(best)
    size = min(count, max(5, min(30, count // 5)))
    turn = 0
    nodes = [n.name for n in problem.nodes]
    while budget.left() > 0.05 and score[0] > bound * (1 + 1e-9) and count > 1:
        kind = KINDS[turn % len(KINDS)]
        turn += 1
        scope = _scope(best, nodes, rng) if len(nodes) > MANY_NODES else None
        seen = best if scope is None else [p for p in best if p[2] in scope]
        free = _window(kind, seen, nodes if scope is None else sorted(scope), size, rng)
        stats.rounds[kind] += 1
        limit = ROUND_UNITS if budget.deterministic else ROUND_SECONDS
        found, proven, found_bound = _round(problem, best, free, budget,
                                            min(limit, budget.left()), threads, scope)
        if len(free) == count and proven:
            # The whole problem solved: nothing better exists, and its bound holds.
            stats.bound = max(stats.bound, found_bound)
            if found is not None:
                candidate, candidate_score = retimed(problem, found)
                if candidate_score < score:
                    best, score = candidate, candidate_score
                    stats.improvements[kind] += 1
            break
        if found is not None:
            candidate, candidate_score = retimed(problem, found)
            if candidate_score[0] < score[0] - 1e-6 or (
                    candidate_score[0] <= score[0] + 1e-9
                    and candidate_score[1] < score[1] - 1e-6):
                best, score = candidate, candidate_score
                stats.improvements[kind] += 1
                continue
        grown, shrunk = min(count, size + max(1, size // 4)), max(3, size - max(1, size // 5))
        size = grown if proven else shrunk
    stats.window = size
    return best, stats
