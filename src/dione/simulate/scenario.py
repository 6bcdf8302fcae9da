"""What a simulated cluster does beyond its profile's predictions: slow tasks and nodes,
random spread, injected failures, nodes lost, and the learning curve losses follow."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from numbers import Integral
from os import PathLike
from pathlib import Path
from typing import Any

__all__ = ["CURVES", "Scenario", "ScenarioError", "load_scenario"]

CURVES = ("exponential", "flat")


class ScenarioError(ValueError):
    """A scenario file or value with mistakes; the message names each and the fix
    (``reasons``: each alone)."""

    def __init__(self, message: str, reasons: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.reasons = list(reasons) or [message]


@dataclass(frozen=True)
class Scenario:
    """Each slice takes its option's profiled seconds times its task's and its node's
    slowdown (4.0: four times slower than profiled) and, with ``spread`` > 0, a
    log-normal factor of that sigma drawn from ``seed``. ``failures``: how many slices
    of a task fail (each at its end, then retried as a real failure is). ``node_losses``:
    seconds into the run at which a node leaves (its running slices fail with it).
    ``node_joins``: seconds into the run at which a node of the cluster joins it (absent
    before; planned from the next re-plan on, as a Ray node that joins).
    ``faulty_nodes``: nodes whose every slice raises the same error as it starts (a
    broken accelerator: unlike a node lost, the node stays and takes slices).
    ``curve``: the per-step losses reported (``exponential``: from 2 + U(0, 2) down
    towards U(0.2, 1) with a time constant of a third of the task's steps, per task
    from ``seed``: early and final losses barely agree in rank, a hard case for early
    stopping; ``flat``: 1.0). ``curves``: instead, the curves of a real sweep, a run
    directory (its store's per-step losses) or a JSON file of ``{task: [loss, ...]}``;
    a simulated task takes the curve of the recorded task of its name, else the
    recorded curves in turn (the simulated tasks by name, the curves by name),
    stretched to its length."""

    task_slowdown: Mapping[str, float] = field(default_factory=dict)
    node_slowdown: Mapping[str, float] = field(default_factory=dict)
    spread: float = 0.0
    seed: int = 0
    failures: Mapping[str, int] = field(default_factory=dict)
    node_losses: Mapping[str, float] = field(default_factory=dict)
    node_joins: Mapping[str, float] = field(default_factory=dict)
    faulty_nodes: Sequence[str] = ()
    curve: str = "exponential"
    curves: str | None = None

    def __post_init__(self) -> None:
        maps = ("task_slowdown", "node_slowdown", "failures", "node_losses", "node_joins")
        _refuse([f"{name}: must be an object of names to numbers ({{\"n0\": 2.0}}), not "
                 f"{getattr(self, name)!r}" for name in maps
                 if not isinstance(getattr(self, name), Mapping)])
        reasons = []
        if isinstance(self.faulty_nodes, str) or not isinstance(self.faulty_nodes, Sequence) \
                or not all(isinstance(n, str) for n in self.faulty_nodes):
            reasons.append(f'faulty_nodes: must be a list of node names (["n1"]), not '
                           f"{self.faulty_nodes!r}")
        for name in ("task_slowdown", "node_slowdown"):
            reasons += [f"{name}[{key!r}]: must be a positive number, not {value!r}"
                        for key, value in getattr(self, name).items() if not _positive(value)]
        if not (_number(self.spread) and self.spread >= 0):
            reasons.append(f"spread: must be a number >= 0 (a log-normal sigma), not "
                           f"{self.spread!r}")
        reasons += [f"failures[{key!r}]: must be a whole number >= 0, not {value!r}"
                    for key, value in self.failures.items()
                    if not (isinstance(value, int) and not isinstance(value, bool)
                            and value >= 0)]
        for name in ("node_losses", "node_joins"):
            reasons += [f"{name}[{key!r}]: must be seconds >= 0, not {value!r}"
                        for key, value in getattr(self, name).items()
                        if not (_number(value) and value >= 0)]
        reasons += [f"node_joins[{key!r}]: it joins at {value} s, after it is lost at "
                    f"{self.node_losses[key]} s, and a lost node never comes back: a node "
                    "may join and then be lost; a machine that returns is another node"
                    for key, value in self.node_joins.items()
                    if key in self.node_losses and _number(value)
                    and _number(self.node_losses[key]) and self.node_losses[key] <= value]
        if isinstance(self.seed, bool) or not (
                isinstance(self.seed, (Integral, str)) or _number(self.seed)):
            reasons.append(f"seed: must be a number or text (the spread's draws), not "
                           f"{self.seed!r}")
        if self.curves is not None and not isinstance(self.curves, (str, PathLike)):
            reasons.append(f"curves: must be the path of a JSON file of task: [loss per "
                           f"step] or of a run directory, not {self.curves!r}")
        if self.curve not in CURVES:
            reasons.append(f"curve: must be one of {', '.join(CURVES)}, not {self.curve!r}")
        if isinstance(self.curves, (str, PathLike)):
            try:
                recorded_curves(self.curves)
            except ScenarioError as err:
                reasons.append(f"curves: {err}")
        _refuse(reasons)

    def check(self, nodes: Sequence[str], tasks: Sequence[str],
              left_out: Sequence[str] = ()) -> None:
        """ScenarioError naming at once each node and task the scenario names that the
        cluster or the workload lacks (``left_out``: tasks it has that are not run, which
        the scenario may name), and each way its nodes' times cannot be played."""
        _refuse(self.node_mistakes(nodes) + self.task_mistakes([*tasks, *left_out]))

    def node_mistakes(self, names: Sequence[str]) -> list[str]:
        """Where the scenario names a node the cluster lacks, or every node joins after
        the start."""
        reasons = [f"{field_name}[{key!r}]: the cluster has no such node (its nodes: "
                   f"{', '.join(names)})"
                   for field_name in ("node_slowdown", "node_losses", "node_joins",
                                      "faulty_nodes")
                   for key in getattr(self, field_name) if key not in names]
        if names and all(n in self.faulty_nodes for n in names):
            reasons.append("faulty_nodes: every node is faulty, so every task would fail; "
                           "leave at least one node out")
        elif names and all(n in self.faulty_nodes for n in names
                           if self.node_joins.get(n, 0.0) <= 0.0):
            reasons.append("faulty_nodes: every node there at the start is faulty, so every "
                           "task would fail before a node joins (a real run fails so too: "
                           "it cannot wait for nodes it does not know of); leave one out")
        if names and all(self.node_joins.get(n, 0.0) > 0 for n in names):
            reasons.append("node_joins: every node joins after the start; leave at least "
                           "one out")
        for at in sorted(v for k, v in self.node_losses.items() if k in names):
            there = [n for n in names if self.node_joins.get(n, 0.0) <= at
                     and self.node_losses.get(n, math.inf) > at]
            if not there and any(self.node_losses.get(n, math.inf) > at for n in names):
                reasons.append(f"node_losses: no node is left at {at} s, before a node "
                               "joins; a run would end there (a real one ends so too)")
                break
        if names and all(n in self.node_losses for n in names):
            reasons.append(f"node_losses: every node is lost (the last at "
                           f"{max(self.node_losses[n] for n in names):g} s), so no run could "
                           "finish; leave at least one node out")
        return reasons

    def task_mistakes(self, names: Sequence[str]) -> list[str]:
        """Where the scenario slows or fails a task the workload lacks (a misspelt name
        would leave the scenario silently unplayed)."""
        known = set(names)
        shown = ", ".join(sorted(known)[:10]) + (", ..." if len(known) > 10 else "")
        return [f"{field_name}[{key!r}]: no task has this name (the tasks: {shown})"
                for field_name in ("task_slowdown", "failures")
                for key in getattr(self, field_name) if key not in known]

    def unplayed(self, end: float) -> list[str]:
        """The node losses and joins the scenario sets at or after ``end`` (the run's),
        which never happened: each as ``node_losses['n1'] at 1e+09 s`` (a slip of a digit
        read as a loss that cost nothing: review)."""
        return [f"{name}[{node!r}] at {at:g} s" for name in ("node_losses", "node_joins")
                for node, at in sorted(getattr(self, name).items()) if at >= end]

    def factor(self, task: str, node: str, rng: random.Random) -> float:
        """How much longer than profiled one slice of ``task`` on ``node`` takes."""
        spread = math.exp(rng.gauss(0.0, self.spread)) if self.spread > 0 else 1.0
        return self.task_slowdown.get(task, 1.0) * self.node_slowdown.get(node, 1.0) * spread

    def losses(self, task: str, total: int, start: int, end: int,
               recorded: Sequence[float] | None = None) -> list[float]:
        """The losses of steps ``start+1 .. end`` of ``task`` (``total`` steps long):
        ``recorded`` stretched to its length where given (``assigned_curves``)."""
        if recorded is not None:
            return [_at(recorded, step, total) for step in range(start + 1, end + 1)]
        if self.curve == "flat":
            return [1.0] * (end - start)
        draw = random.Random(f"{self.seed}:{task}")
        first, floor = 2.0 + 2.0 * draw.random(), 0.2 + 0.8 * draw.random()
        scale = max(total / 3.0, 1.0)
        return [floor + (first - floor) * math.exp(-step / scale)
                for step in range(start + 1, end + 1)]

    def assigned_curves(self, tasks: Sequence[str]) -> dict[str, list[float]]:
        """Each of the simulated ``tasks``' recorded curve (``curves``; empty without):
        the recorded task's of its name, else the other recorded curves in turn."""
        if self.curves is None:
            return {}
        recorded = recorded_curves(self.curves)
        spare = sorted(name for name in recorded if name not in tasks) or sorted(recorded)
        others = sorted(name for name in tasks if name not in recorded)
        given = {name: recorded[name] for name in tasks if name in recorded}
        return given | {name: recorded[spare[i % len(spare)]]
                        for i, name in enumerate(others)}

    def to_json(self) -> dict[str, Any]:
        return {f.name: (dict(v) if isinstance(v := getattr(self, f.name), Mapping)
                         else str(v) if isinstance(v, PathLike)  # curves as a Path
                         else int(v) if isinstance(v, Integral) else v)  # numpy's seed
                for f in fields(self)}


def _refuse(reasons: Sequence[str]) -> None:
    """ScenarioError listing ``reasons``, if there are any."""
    if reasons:
        raise ScenarioError("the scenario has mistakes:\n" + "\n".join(
            f"  - {r}" for r in reasons), reasons)


def recorded_curves(source: str | Path) -> dict[str, list[float]]:
    """Per task, its loss at each step, from a run directory's store or a JSON file of
    ``{task: [loss, ...]}`` (ScenarioError naming what is wrong)."""
    path = Path(source)
    if path.is_dir():
        from dione.state.store import STORE_FILE, RunStore, not_a_run

        if not (path / STORE_FILE).is_file():
            raise ScenarioError(not_a_run(path))
        with RunStore(path) as store:
            found = {t.name: [loss for _, loss, _ in store.metrics(t.name)]
                     for t in store.tasks()}
    else:
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ScenarioError(f"cannot read the curves {path}: {err}") from None
        if not isinstance(found, dict):
            raise ScenarioError(f"the curves {path} must be a JSON object of task: "
                                "[loss per step]")
    curves = {str(name): list(losses) for name, losses in found.items()
              if isinstance(losses, list) and losses
              and all(_number(v) for v in losses)}
    bad = sorted(str(name) for name in found if str(name) not in curves)
    if bad and not path.is_dir():  # a run's diverged tasks are left out; a file's, said
        raise ScenarioError(f"{path}: the curve of {', '.join(bad[:5])}"
                            f"{', ...' if len(bad) > 5 else ''} is not a list of finite "
                            "losses (a task's loss per step, at least one): fix or remove it")
    if not curves:
        raise ScenarioError(f"{path} holds no curve of finite losses (a task's loss per "
                            "step, at least one)")
    return curves


def _at(curve: Sequence[float], step: int, total: int) -> float:
    """The curve's value at step ``step`` of ``total`` (linear between its own steps;
    its own values exactly where it is ``total`` long)."""
    where = min(max(step * len(curve) / total, 1.0), float(len(curve))) - 1.0
    low = int(where)
    high = min(low + 1, len(curve) - 1)
    return curve[low] + (curve[high] - curve[low]) * (where - low)


def _number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _positive(value: object) -> bool:
    return _number(value) and value > 0  # type: ignore[operator]


def load_scenario(path: str | Path) -> Scenario:
    """A scenario from a JSON file of ``Scenario``'s fields (each optional; ``curves``
    relative to the file)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ScenarioError(f"cannot read the scenario {path}: {err}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"the scenario {path} must be a JSON object of "
                            f"{', '.join(f.name for f in fields(Scenario))}")
    known = {f.name for f in fields(Scenario)}
    # Every mistake at once: unknown fields were said alone, the values' next.
    reasons = [f"{name}: no such field (allowed: {', '.join(sorted(known))})"
               for name in sorted(set(data) - known)]
    if isinstance(data.get("curves"), str):  # a relative path: beside the scenario file
        data["curves"] = str(Path(path).parent / data["curves"])
    try:
        scenario = Scenario(**{k: v for k, v in data.items() if k in known})
    except ScenarioError as err:
        reasons += err.reasons
    except (TypeError, AttributeError) as err:
        reasons.append(str(err))
    if reasons:
        raise ScenarioError(f"the scenario {path} has mistakes:\n" + "\n".join(
            f"  - {r}" for r in reasons), reasons)
    return scenario
