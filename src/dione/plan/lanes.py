"""A lower bound on the makespan from devices as bins: a configuration LP by column generation.

Relax a plan of makespan M to what each device does: a device (a *lane*) runs a set of
task pieces one after another, at most one piece of each task, their lengths adding up
to at most M; a task run on d devices puts one piece of its length on each of d lanes.
Time and nodes are forgotten (pieces of one task need not line up), so any plan gives
such a packing, and M is a lower bound wherever no packing exists.

The packing is bin packing with a choice of option per task, and its configuration LP
(Gilmore-Gomory: one variable per set of pieces that fits a lane) is tight for bin
packing. It sees what the area bound misses: long single-device pieces that cannot
share a lane fill the lanes left beside long wide tasks (small-6: 23,510 s against the
area-based 22,566 s, and a plan of 23,772 s). On nodes of different sizes the lanes
come in classes, one per node size, and a piece goes only on lanes of nodes that could
hold its task (mixed-1, nodes of 8, 4 and 4: 17,472 s against 17,151 s with every lane
alike, and a plan of 17,642 s).

The LP is solved by column generation (GLOP for the master, a multiple-choice knapsack
by dynamic programming for the pricing). Its proofs need no optimal LP: any
non-negative piece prices give a dual bound on the lanes needed (Farley's), checked
here with floor-rounded lengths, which only admit more sets and so keep it valid.
Bounded by counts of LP solves, never by the clock, so it gives the same bound however
loaded the machine is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ortools.linear_solver import pywraplp

from dione.plan.options import fitting_options, useful_options
from dione.plan.problem import PlanningProblem

__all__ = ["lane_bound", "lanes_needed"]

# Length units per makespan in the pricing knapsack: finer proves a little more and
# prices a little slower (floors lose at most one unit per piece).
UNITS = 2_000
# LP solves per makespan tried, and makespans tried (bisection steps). Where pieces
# are many, each solve costs more and the bound rarely beats the area bound (the pieces
# are short beside the plan): at most WORK // pieces solves there (hard-8, 200 tasks:
# 50 solves, 1.1 s, against 4.7 s for 200 that proved nothing more; hard-3, 40 tasks,
# needs about 200 to raise its bound from 5,699 s to 5,771 s).
ROUNDS = 200
WORK = 40_000
MIN_ROUNDS = 25
STEPS = 12
# Above this many pieces the bound is not tried: with that many tasks, pieces are short
# beside the plan and the area bound holds already (large-2, 4,800 pieces: 4.5 s for
# nothing; hard-8, 688 pieces: 1.1 s).
MAX_PIECES = 1_000


@dataclass(frozen=True)
class _Piece:
    task: int
    devices: int
    seconds: float
    # A held device's piece: the size of its node, whose lanes alone may hold it.
    node_devices: int | None = None

    @property
    def key(self) -> tuple[int, int, float]:
        """The piece as a column pool remembers it across makespans."""
        return self.task, self.devices, self.seconds

    def fits(self, lane_class: int) -> bool:
        """Whether a lane of a node of ``lane_class`` devices may hold this piece."""
        if self.node_devices is not None:
            return lane_class == self.node_devices
        return self.devices <= lane_class


def _pieces(problem: PlanningProblem, makespan: float) -> list[_Piece] | None:
    """Every (task, option) that a plan of ``makespan`` could use, and one fixed piece
    per device still held by a running task; None where some task has no such option."""
    widest = max(n.devices for n in problem.nodes)
    pieces = []
    for t, task in enumerate(problem.tasks):
        usable = fitting_options(task, makespan, widest)
        if not usable:
            return None
        pieces += [_Piece(t, o.devices, o.seconds) for o in usable]
    # A running task's device is a lane busy until it ends: as a relaxation, a
    # one-device piece that some lane of its node's size must hold (a lane holds one of
    # these at most).
    held = len(problem.tasks)
    for b in problem.busy:
        if b.until > makespan:
            return None
        for _ in b.device_ids:
            if b.until > 0:
                pieces.append(_Piece(held, 1, b.until, problem.node(b.node).devices))
                held += 1
    return pieces


def lanes_needed(problem: PlanningProblem, makespan: float, rounds: int = ROUNDS,
                 columns: list[frozenset[tuple[int, int, float]]] | None = None,
                 enough: float | None = None) -> float:
    """A lower bound on the lanes (devices) a plan ending by ``makespan`` needs, as the
    cluster's devices times the least factor by which every class of lanes must grow
    (on equal nodes, simply the lanes needed); inf where no option of some task fits,
    or a running task ends later. ``columns``: sets of pieces from earlier calls, to
    start from (and where the sets found are added). Stops early once the LP packs the
    pieces into ``enough`` lanes (then no bound above ``enough`` can come).

    Lanes come in classes, one per node size: a piece of a task on d devices goes only
    on lanes of nodes of at least d devices (on nodes of 8, 4 and 2, an 8-device task's
    pieces never count the small nodes' lanes), a held device's piece only on lanes of
    its own node's size."""
    pieces = _pieces(problem, makespan)
    if pieces is None:
        return math.inf
    if not pieces or makespan <= 0:
        return 0.0  # (zero-second options only: nothing to pack)
    tasks = max(p.task for p in pieces) + 1
    total = problem.total_devices
    lanes = {size: sum(n.devices for n in problem.nodes if n.devices == size)
             for size in sorted({n.devices for n in problem.nodes})}
    unit = makespan / UNITS
    weight = np.array([math.floor(p.seconds / unit + 1e-9) for p in pieces], dtype=np.int64)
    index = {p.key: i for i, p in enumerate(pieces)}
    by_task: list[list[int]] = [[] for _ in range(tasks)]
    for i, p in enumerate(pieces):
        by_task[p.task].append(i)
    # What one lane of each class may hold: a piece of each task, and one held device's
    # piece at most (two held devices are two devices).
    held = [i for i, p in enumerate(pieces) if p.task >= len(problem.tasks)]
    groups = {size: [kept for members in [*by_task[:len(problem.tasks)], held]
                     if (kept := [i for i in members if pieces[i].fits(size)])]
              for size in lanes}
    solver = pywraplp.Solver.CreateSolver("GLOP")
    # needed: the lanes needed, as the cluster's devices times the factor t by which
    # every class must grow; class s has lanes[s] x t lanes (t = needed / total).
    needed = solver.NumVar(0.0, solver.infinity(), "needed")
    objective = solver.Objective()
    objective.SetCoefficient(needed, 1.0)
    objective.SetMinimization()
    capacity = {}
    for size, count in lanes.items():
        row = solver.Constraint(0.0, solver.infinity())
        row.SetCoefficient(needed, count / total)
        capacity[size] = row
    # mu[i]: the share of its task that piece i's option runs; one per task in all.
    mu = [solver.NumVar(0.0, 1.0, f"mu{i}") for i in range(len(pieces))]
    for members in by_task:
        row = solver.Constraint(1.0, 1.0)
        for i in members:
            row.SetCoefficient(mu[i], 1.0)
    # Lanes holding piece i cover its option's devices: sum of sets with i >= d_i mu_i.
    cover = []
    for i, p in enumerate(pieces):
        row = solver.Constraint(0.0, solver.infinity())
        row.SetCoefficient(mu[i], -float(p.devices))
        cover.append(row)
    pool = columns if columns is not None else []
    known = set(pool)

    def add(members: list[int], size: int) -> None:
        var = solver.NumVar(0.0, solver.infinity(), "")
        capacity[size].SetCoefficient(var, -1.0)
        for i in members:
            cover[i].SetCoefficient(var, 1.0)

    for i, p in enumerate(pieces):
        for size in lanes:
            if p.fits(size):
                add([i], size)
    for column in pool:
        members = [index.get(key, -1) for key in column]
        if -1 not in members and sum(weight[m] for m in members) <= UNITS:
            for size in lanes:
                if all(pieces[m].fits(size) for m in members):
                    add(members, size)
    best = 0.0
    for _ in range(min(rounds, max(MIN_ROUNDS, WORK // len(pieces)))):
        if solver.Solve() != pywraplp.Solver.OPTIMAL:
            break
        if enough is not None and objective.Value() <= enough:
            break
        price = np.array([max(0.0, row.dual_value()) for row in cover])
        sets = {size: _best_set(price, weight, groups[size]) for size in lanes}
        # With sigma_s the best set's price on class s, (alpha, price / Z) is dual
        # feasible for Z = sum of lanes[s] / total x sigma_s, alpha_t the least d x price
        # over the task's pieces: sum(alpha) / Z lanes are needed whatever the LP did.
        alpha = sum(min(pieces[i].devices * price[i] for i in members) for members in by_task)
        scale = sum(lanes[size] / total * value for size, (value, _) in sets.items())
        best = max(best, alpha / max(scale, 1e-12))
        # A set prices above its class's dual only where it would enter the LP.
        entering = [(size, chosen) for size, (value, chosen) in sets.items()
                    if value > capacity[size].dual_value() + 1e-9]
        if not entering:
            break
        for size, chosen in entering:
            add(chosen, size)
            key = frozenset(pieces[i].key for i in chosen)
            if key not in known:  # (the same set may enter on several classes)
                known.add(key)
                pool.append(key)
    return best


def _best_set(price: np.ndarray, weight: np.ndarray, groups: list[list[int]]
              ) -> tuple[float, list[int]]:
    """The set of pieces, at most one of each group, of total weight at most ``UNITS``
    with the largest total price (a multiple-choice knapsack), and that price."""
    value = np.zeros(UNITS + 1)
    picks = []
    for members in groups:
        new = value.copy()
        pick = np.full(UNITS + 1, -1)
        for i in members:
            w = int(weight[i])
            if price[i] <= 1e-12 or w > UNITS:
                continue
            # Rooms below w cannot take the piece: compare and update the rest in place
            # (this loop was about half the bound's time on instances of 40+ tasks).
            candidate = value[:UNITS + 1 - w] + price[i]
            better = candidate > new[w:] + 1e-12
            new[w:][better] = candidate[better]
            pick[w:][better] = i
        value = new
        picks.append(pick)
    chosen, room = [], UNITS
    for pick in reversed(picks):
        i = int(pick[room])
        if i >= 0:
            chosen.append(i)
            room -= int(weight[i])
    return float(value[UNITS]), chosen


def lane_bound(problem: PlanningProblem, at_least: float, at_most: float,
               steps: int = STEPS, rounds: int = ROUNDS) -> float:
    """The largest makespan in [``at_least``, ``at_most``] that ``lanes_needed`` shows
    needs more devices than the cluster has, by bisection; ``at_least`` when none, or
    when the tasks have more than ``MAX_PIECES`` useful options in all.

    Each makespan it rejects is a valid bound on its own, so the bisection needs no
    monotonicity to be sound.
    """
    if not problem.tasks or at_most <= at_least or \
            sum(len(useful_options(t)) for t in problem.tasks) > MAX_PIECES:
        return at_least
    total = problem.total_devices
    pool: list[frozenset[tuple[int, int, float]]] = []

    def short(makespan: float) -> bool:
        return lanes_needed(problem, makespan, rounds, pool, total) > total * (1 + 1e-9) + 1e-6

    low, high = at_least, at_most
    if not short(low):
        return at_least
    for _ in range(steps):
        middle = (low + high) / 2
        if short(middle):
            low = middle
        else:
            high = middle
    return low
