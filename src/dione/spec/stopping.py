"""Stopping rules of a sweep: which tasks stop early, at which steps, and why.

Five rules, each judged at rungs (a slice ends at each): ``Asha`` compares a task with
the tasks that reached its rung before it, ``Median`` with the median of theirs,
``Patience`` with the task's own earlier rungs (no improvement for so many, or worse
than a threshold), ``SuccessiveHalving`` (synchronous) waits at each rung for every
task to reach it, then keeps the best ``1/eta`` of them, and ``PausingAsha`` pauses a
task at a rung until it ranks among the best ``1/eta`` there (promoted) or never can.

``Asha`` is asynchronous successive halving (Li et al., "A System for Massively Parallel
Hyperparameter Tuning", MLSys 2020) as Ray Tune's ``AsyncHyperBandScheduler`` applies
it to stop trials: rungs at ``min_steps``, ``min_steps * eta``, ``min_steps * eta**2``
... steps; a task that reaches a rung continues only if its metric there is at least as
good as the best ``1/eta`` of the values the tasks before it recorded at that rung (the
``1/eta`` quantile for ``mode="min"``; the first to arrive continues). Tasks that share
one rule (equal rules: a grid's tasks) are compared with each other; a stopped task
never trains again.

The metric: ``"loss"``, the mean training loss of the rung's last ``loss_window`` steps
(no evaluation needed), or a name the task's ``evaluate(model)`` returns (it then runs at
every rung, in the worker of the slice that ends there, on the model loaded from the
checkpoint that slice wrote).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from dione.spec.keywords import named_keywords

if TYPE_CHECKING:
    from dione.spec.task import Task

__all__ = ["Asha", "Decision", "Median", "Patience", "PausingAsha", "StoppingRule",
           "SuccessiveHalving", "attribute_key", "common_mistakes", "legacy_rule_key",
           "rule_key", "too_few_sharing", "too_few_to_compare"]


@dataclass(frozen=True)
class Decision:
    """What a rule decided for a task at a rung: continue or stop, and why."""

    rung: int  # the step
    value: float
    stop: bool
    reason: str


class StoppingRule(ABC):
    """What the orchestrator asks of a stopping rule: the steps a task is judged at (a
    slice ends at each), and a decision there. ``rule_key`` names the rule (``key()``:
    its class's name and attributes, or its repr where its class, not a dataclass,
    writes one): tasks whose rules have one key are judged together, and the store
    keys decisions by it."""

    metric: str  # "loss" (the mean of the rung's last ``loss_window`` steps) or evaluate()'s
    mode: str  # "min" or "max"
    loss_window: int
    # Judged together: a task that reaches a rung waits (holding no device) until every
    # task under the rule has reached it or ended, then ``decide_together`` judges all.
    synchronous: ClassVar[bool] = False
    # Paused: a task that reaches a rung waits (holding no device) until
    # ``decide_paused`` promotes or stops it, asked again as others reach the rung.
    pausing: ClassVar[bool] = False
    # Its tasks begun come first in each plan, the furthest first (``plan.favour``): a
    # rule that compares with the tasks that ended (Optuna's pruners count completed
    # trials) judged a resume's new tasks, planned beside the half-trained ones, against
    # none, and let the worst run to its end (review).
    begun_first: ClassVar[bool] = False
    # What names the rule's metric, in messages that ask to fix it (dione.optuna's rule
    # is made by optimize's metric argument, not written by the user).
    judged_by: ClassVar[str] = "its stopping rule"
    metric_fix: ClassVar[str] = "the rule's metric"
    # How the user makes it judge with another mode (formatted with ``mode``).
    mode_fix: ClassVar[str] = "set mode={mode!r} on the rule"
    retry: ClassVar[str] = "resume"  # what trains a task refused for it again

    @property
    def waits_at_rungs(self) -> bool:
        """Whether a task under the rule waits at each rung for a decision (synchronous
        or pausing), rather than being judged the moment it arrives."""
        return self.synchronous or self.pausing

    @abstractmethod
    def mistakes(self) -> list[str]:
        """Each way the rule is malformed (empty: none), with the fix."""

    @abstractmethod
    def rungs(self, total: int) -> list[int]:
        """The steps, before ``total``, at which a task is judged."""

    def never_stops(self, total: int) -> str | None:
        """Why the rule can stop no task of ``total`` steps for its metric's values (only
        for one that is not finite), with the fix (None: it can): a warning, since a run
        may have started with it. Here: no rung before its end (refused, it split a
        Hyperband-like grid of lengths under one rule; it trains unjudged: review)."""
        if total > 1 and not self.rungs(total):
            return (f"it has no rung before the task's last step ({total}): it trains to "
                    "its end unjudged (lower min_steps to judge it)")
        return None

    def least_tasks(self) -> int:
        """The fewest tasks sharing the rule for it to stop one for its metric's values
        (a rule that compares a task with those before it at a rung stops none alone)."""
        return 1

    def next_rung(self, done: int, total: int) -> int | None:
        """The first rung after step ``done`` (None: none is left)."""
        return next((r for r in self.rungs(total) if r > done), None)

    def promoted_share(self) -> float:
        """The share of the tasks reaching a rung expected to go on past it (1.0: the
        rule does not say; a halving rule's 1/eta)."""
        return 1.0

    def expected_steps(self, done: int, total: int) -> float:
        """The steps a task at step ``done`` is expected to train on: each stretch after
        a rung counted at the chance of passing every rung before it."""
        share, chance, expected, at = self.promoted_share(), 1.0, 0.0, done
        for rung in self.rungs(total):
            if rung > done:
                expected += chance * (rung - at)
                chance, at = chance * share, rung
        return expected + chance * (total - at)

    @abstractmethod
    def decide(self, rung: int, value: float, recorded: Sequence[float],
               task: str = "", history: Sequence[float] = ()) -> Decision:
        """Whether ``task`` with ``value`` at ``rung`` goes on, given the values the
        tasks before it recorded there under this rule (``value`` not among them) and
        the task's own values at its earlier rungs, in order (``history``)."""

    def decide_together(self, rung: int, values: Mapping[str, float]) -> dict[str, Decision]:
        """The decision for each task of a cohort that reached ``rung`` (its value): by
        default each in turn, by name, the ones before it taken as recorded."""
        decisions: dict[str, Decision] = {}
        recorded: list[float] = []
        for task in sorted(values):
            decisions[task] = self.decide(rung, values[task], recorded, task)
            recorded.append(values[task])
        return decisions

    def decide_paused(self, rung: int, values: Mapping[str, float],
                      waiting: Collection[str], to_come: int) -> dict[str, Decision]:
        """For a pausing rule: the tasks of ``waiting`` decided now (promoted or
        stopped), given every value recorded at ``rung`` (``values``: those decided
        there before and the waiting ones) and how many more tasks may still reach it."""
        raise NotImplementedError(f"{type(self).__name__} does not pause at rungs")

    def ended(self, task: str, status: str, loss: float | None,  # noqa: B027 (a hook)
              evaluation: Mapping[str, float]) -> None:
        """Told, in the launcher, as a task under this rule ends (``done``, ``stopped``,
        ``failed``, ``diverged``) with its last loss and evaluation: a rule that learns
        from finished tasks (a median over completed ones) records it here."""

    def key(self) -> str:
        """What tells this rule from another (``rule_key``): its class's name and every
        attribute, or its repr where its class writes one of its own. A rule that keeps
        what it learns in attributes (``ended``) leaves them out here, so that a run of
        it resumed in the same process is not taken for an edited rule."""
        return attribute_key(self)


@dataclass(frozen=True)
class _Halving(StoppingRule):
    """What the halving rules share: rungs at ``min_steps * eta**k`` steps, ``1/eta`` of
    the tasks expected past each. A subclass adds no field: its ``repr``, which keys its
    decisions in the store, is its own name with these fields."""

    metric: str = "loss"
    mode: str = "min"  # min: lower is better; max: higher
    min_steps: int = 1
    eta: float = 3.0
    loss_window: int = 5  # steps averaged for the "loss" metric

    def mistakes(self) -> list[str]:
        """Each way the rule is malformed (empty: none), with the fix."""
        return _halving_mistakes(self, self.eta)

    def promoted_share(self) -> float:
        return 1 / self.eta

    def least_tasks(self) -> int:
        return 2  # the first at a rung goes on, and a lone task is kept

    def rungs(self, total: int) -> list[int]:
        """The steps, before ``total``, at which a task is judged."""
        return _geometric(self.min_steps, self.eta, total)


@named_keywords
@dataclass(frozen=True)
class Asha(_Halving):
    """Asynchronous successive halving; see the module's docstring."""

    def decide(self, rung: int, value: float, recorded: Sequence[float],
               task: str = "", history: Sequence[float] = ()) -> Decision:
        if not math.isfinite(value):
            return Decision(rung, value, True, f"{self.metric} is {value} at step {rung}")
        # A value that is not finite (a loser judged before) has no place in a cutoff,
        # as Ray's nanpercentile leaves it out.
        ordered = sorted(v for v in recorded if math.isfinite(v))
        if not ordered:
            return Decision(rung, value, False, f"first at step {rung}")
        # The best 1/eta: below the 1/eta quantile (min), above the 1 - 1/eta one (max).
        cutoff = _quantile(ordered, 1 / self.eta if self.mode == "min" else 1 - 1 / self.eta)
        worse = value > cutoff if self.mode == "min" else value < cutoff
        keep = f"top {1 / self.eta:.0%}"
        return Decision(rung, value, worse,
                        f"{self.metric} {value:.4g} at step {rung} "
                        + (f"is outside the {keep} of the {len(ordered)} before it "
                           f"(cutoff {cutoff:.4g}): stopped by ASHA (eta {self.eta:g})"
                           if worse else f"is within the {keep} of the {len(ordered)} "
                           f"before it (cutoff {cutoff:.4g})"))


@named_keywords
@dataclass(frozen=True)
class PausingAsha(_Halving):
    """ASHA as Li et al. define it (MLSys 2020, Algorithm 2: promotions, not stops): a
    task that reaches a rung pauses there, holding no device, and is promoted as soon as
    it ranks among the best ``floor(n / eta)`` of the ``n`` tasks that have reached the
    rung; it stops once it can no longer get there, counting every task still able to
    reach the rung. When none is left to come, the best ``max(1, floor(n / eta))`` go
    on and the rest stop (a finite sweep keeps at least one). Unlike ``Asha`` (Ray
    Tune's stopping form), the first task at a rung is not promoted for being first."""

    pausing: ClassVar[bool] = True

    def decide(self, rung: int, value: float, recorded: Sequence[float],
               task: str = "", history: Sequence[float] = ()) -> Decision:
        """One task judged as if no other could still reach the rung."""
        return self.decide_paused(rung, _with_recorded(recorded, task, value), [task],
                                  0)[task]

    def decide_paused(self, rung: int, values: Mapping[str, float],
                      waiting: Collection[str], to_come: int) -> dict[str, Decision]:
        ranked = _ranked(values, self.mode)
        n = len(values)
        now = math.floor(n / self.eta) if to_come else max(1, math.floor(n / self.eta))
        ever = max(1, math.floor((n + to_come) / self.eta))  # at most, once all came
        decisions = {}
        for task in waiting:
            value = values[task]
            if task not in ranked:
                decisions[task] = Decision(rung, value, True,
                                           f"{self.metric} is {value} at step {rung}")
                continue
            place = ranked.index(task) + 1
            said = (f"{self.metric} {value:.4g} at step {rung} ranks {place} of the {n} "
                    f"that reached it")
            if place <= now:
                decisions[task] = Decision(rung, value, False,
                                           f"{said}; the best {now} go on: promoted")
            elif place > ever or not to_come:
                decisions[task] = Decision(
                    rung, value, True, f"{said}"
                    + (f" and {to_come} more may" if to_come else "")
                    # Not how many go on: those promoted earlier, from fewer at the rung,
                    # went on too (Li et al.'s promotions are for good).
                    + f"; it cannot be among the best {ever} of {n + to_come}: stopped by "
                    f"PausingAsha (eta {self.eta:g})")
        return decisions


@named_keywords
@dataclass(frozen=True)
class Median(StoppingRule):
    """The median rule (Golovin et al., "Google Vizier", KDD 2017; Optuna's
    ``MedianPruner``): judged at ``min_steps`` and every ``every`` steps after, a task
    stops when its best value so far is worse than the median of the values the tasks
    before it recorded at that rung, those stopped since included (Optuna's counts
    completed trials only, which tasks trained side by side seldom are by the early
    rungs). Until ``min_tasks`` have recorded there, every task goes on (a median of
    one or two says little)."""

    metric: str = "loss"
    mode: str = "min"
    min_steps: int = 1  # Optuna's n_warmup_steps: no judgement before
    every: int = 1  # steps between rungs (Optuna's interval_steps)
    min_tasks: int = 3  # values at a rung before any is judged (Optuna's n_min_trials)
    loss_window: int = 5

    def mistakes(self) -> list[str]:
        """Each way the rule is malformed (empty: none), with the fix."""
        return common_mistakes(self, "min_steps", "every", "min_tasks")

    def least_tasks(self) -> int:
        return self.min_tasks + 1  # min_tasks recorded before the one judged

    def rungs(self, total: int) -> list[int]:
        """The steps, before ``total``, at which a task is judged."""
        return list(range(self.min_steps, total, self.every))

    def decide(self, rung: int, value: float, recorded: Sequence[float],
               task: str = "", history: Sequence[float] = ()) -> Decision:
        if not math.isfinite(value):
            return Decision(rung, value, True, f"{self.metric} is {value} at step {rung}")
        best = _best([*history, value], self.mode)
        recorded = sorted(v for v in recorded if math.isfinite(v))  # as Asha's
        if len(recorded) < self.min_tasks:
            return Decision(rung, value, False, f"{self.metric} {value:.4g} at step {rung}: "
                            f"{len(recorded)} before it, fewer than {self.min_tasks} to judge by")
        median = _quantile(recorded, 0.5)
        worse = best > median if self.mode == "min" else best < median
        return Decision(rung, value, worse,
                        f"{self.metric} at step {rung}: best so far {best:.4g} is "
                        + (f"worse than the median {median:.4g} of the {len(recorded)} before "
                           "it: stopped by the median rule" if worse else
                           f"no worse than the median {median:.4g} of the {len(recorded)} "
                           "before it"))


@named_keywords
@dataclass(frozen=True)
class Patience(StoppingRule):
    """Early stopping on the task's own curve (as Keras' and Lightning's
    ``EarlyStopping``): judged at ``min_steps`` and every ``every`` steps after, a task
    stops when its last ``patience`` rungs brought no improvement of more than
    ``min_delta`` over its best before them, or (``threshold``) when its value is worse
    than the threshold (Optuna's ``ThresholdPruner``). Other tasks play no part."""

    metric: str = "loss"
    mode: str = "min"
    min_steps: int = 1
    every: int = 1
    patience: int = 3  # rungs without improvement before a stop
    min_delta: float = 0.0  # an improvement must beat the best by more than this
    threshold: float | None = None  # worse than this at any rung: stopped
    loss_window: int = 5

    def mistakes(self) -> list[str]:
        """Each way the rule is malformed (empty: none), with the fix."""
        reasons = common_mistakes(self, "min_steps", "every", "patience")
        if not _number(self.min_delta) or self.min_delta < 0:
            reasons.append(f"min_delta must be a number >= 0, not {self.min_delta!r}")
        if self.threshold is not None and not _number(self.threshold):
            reasons.append(f"threshold must be a finite number or None, not "
                           f"{self.threshold!r}")
        return reasons

    def rungs(self, total: int) -> list[int]:
        """The steps, before ``total``, at which a task is judged."""
        return list(range(self.min_steps, total, self.every))

    def never_stops(self, total: int) -> str | None:
        rungs = len(self.rungs(total))
        if not rungs:
            return super().never_stops(total)
        if self.threshold is not None or rungs > self.patience:
            return None
        return (f"it judges at {rungs} rung(s) before the task's last step ({total}), and "
                f"a want of patience shows only from {self.patience + 1}: it stops the "
                "task only where its value is not finite: lower patience, every or "
                "min_steps, or give a threshold")

    def decide(self, rung: int, value: float, recorded: Sequence[float],
               task: str = "", history: Sequence[float] = ()) -> Decision:
        if not math.isfinite(value):
            return Decision(rung, value, True, f"{self.metric} is {value} at step {rung}")
        said = f"{self.metric} {value:.4g} at step {rung}"
        sign = 1.0 if self.mode == "min" else -1.0  # lower is better after the sign
        if self.threshold is not None and sign * value > sign * self.threshold:
            return Decision(rung, value, True, f"{said} is worse than the threshold "
                            f"{self.threshold:.4g}: stopped")
        curve = [*history, value]
        if len(curve) <= self.patience:
            return Decision(rung, value, False, f"{said}: fewer than {self.patience + 1} "
                            "rungs to judge by")
        before = _best(curve[:-self.patience], self.mode)
        recent = _best(curve[-self.patience:], self.mode)
        improved = sign * (before - recent) > self.min_delta
        return Decision(rung, value, not improved,
                        f"{said}: the best of the last {self.patience} rungs, {recent:.4g}, "
                        + (f"improves on {before:.4g}" if improved else
                           f"does not improve on {before:.4g} by more than "
                           f"{self.min_delta:g}: stopped for want of patience"))


@named_keywords
@dataclass(frozen=True)
class SuccessiveHalving(_Halving):
    """Synchronous successive halving (Jamieson & Talwalkar, AISTATS 2016; the ``SHA``
    of Li et al., MLSys 2020): rungs at ``min_steps * eta**k`` steps as ``Asha``'s, but a
    task that reaches one waits there, holding no device, until every task under the
    rule has reached it or ended; then the best ``max(1, floor(n / eta))`` of the ``n``
    that reached it go on (ties: by name) and the rest stop. Slower than ASHA when tasks
    run at different paces, but its decisions never depend on who arrived first."""

    synchronous: ClassVar[bool] = True

    def decide(self, rung: int, value: float, recorded: Sequence[float],
               task: str = "", history: Sequence[float] = ()) -> Decision:
        """One task judged with ``recorded`` taken for the rest of its cohort."""
        return self.decide_together(rung, _with_recorded(recorded, task, value))[task]

    def decide_together(self, rung: int, values: Mapping[str, float]) -> dict[str, Decision]:
        """The decision for each task of the cohort that reached ``rung`` (its value)."""
        ranked = _ranked(values, self.mode)
        keep = max(1, math.floor(len(values) / self.eta))
        decisions = {}
        for task, value in values.items():
            if task not in ranked:
                decisions[task] = Decision(rung, value, True,
                                           f"{self.metric} is {value} at step {rung}")
                continue
            place = ranked.index(task) + 1
            stop = place > keep
            decisions[task] = Decision(
                rung, value, stop, f"{self.metric} {value:.4g} at step {rung} ranks {place} "
                f"of the {len(values)} that reached it; the best {keep} go on"
                + (": stopped by successive halving" if stop else ""))
        return decisions


def _with_recorded(recorded: Sequence[float], task: str, value: float) -> dict[str, float]:
    """``task``'s value beside the values recorded before it, under placeholder names
    that sort before any task's name (so a tie goes to those recorded first)."""
    return {**{f"\0{k}": v for k, v in enumerate(recorded)}, task: value}


def _ranked(values: Mapping[str, float], mode: str) -> list[str]:
    """The tasks with a finite value, best first (``mode`` "min": lowest); ties by name."""
    sign = 1.0 if mode == "min" else -1.0
    return sorted((t for t in values if math.isfinite(values[t])),
                  key=lambda t: (sign * values[t], t))


def _geometric(first: int, ratio: float, total: int) -> list[int]:
    """The first step at or past each of ``first``, ``first * ratio``, ... (a task is
    judged once it has trained a rung's whole budget, as Ray's ASHA judges at the
    first iteration past a milestone), distinct, below ``total``."""
    found: list[int] = []
    step = float(first)
    while (at := math.ceil(step * (1 - 1e-12))) < total:  # 4.5000000001: 5; 9.0000001: 9
        if not found or at > found[-1]:
            found.append(at)
        step *= ratio
    return found


def _best(values: Sequence[float], mode: str) -> float:
    return min(values) if mode == "min" else max(values)


def _whole(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def rule_key(rule: object) -> str:
    """What identifies a rule in every process: tasks of equal keys are judged together,
    and a run's decisions are kept under it (a resume reads them back by it). The rule's
    own ``key()`` where it has one, else ``attribute_key`` (``StoppingRule.key``'s
    default: its class's name and every attribute); either less what differs from
    process to process for one rule: an object's address, the module a workload file is
    imported as (named after its text). Given a str (a key or repr the store holds), that
    text less the same. A run fixes each rule's key as it first sees it (``Runner``): a
    rule that records what it learns in attributes keeps its key through the run."""
    if isinstance(rule, str):
        return _stripped(rule)
    key = getattr(rule, "key", None)
    return _stripped(key() if callable(key) else attribute_key(rule))


def legacy_rule_key(rule: object) -> str:
    """The key a run recorded before ``rule_key`` (2026-12-07): the rule's repr, less an
    address and a workload module's name; a resume of such a run finds its decisions
    under it."""
    return _stripped(repr(rule))


def attribute_key(rule: object) -> str:
    """``StoppingRule.key``'s default: a repr of the class's own (not a dataclass's, which
    leaves out a knob a subclass adds and writes a set in its process's order), else the
    class's name and every attribute (of ``__slots__`` too), values as ``_stable``."""
    cls = type(rule)
    owner = next(c for c in cls.__mro__ if "__repr__" in vars(c))
    if owner is not object and not dataclasses.is_dataclass(owner) and \
            cls.__repr__ is not object.__repr__:
        return repr(rule)
    # No module: the class of a workload file, run by `dione run` (a module named after
    # the file's text) or imported by name from Python, is one rule.
    return _of_attributes(rule, 0)


def _of_attributes(value: object, depth: int) -> str:
    """``value``'s class's name and its attributes (of ``__slots__`` too), sorted."""
    cls = type(value)
    slots = [n for c in cls.__mro__ for n in vars(c).get("__slots__", ())
             if n not in ("__dict__", "__weakref__") and hasattr(value, n)]
    own = {**{n: getattr(value, n) for n in slots}, **getattr(value, "__dict__", {})}
    return f"{cls.__qualname__}(" + ", ".join(
        f"{k}={_stable(v, depth + 1)}" for k, v in sorted(own.items())) + ")"


def _stable(value: object, depth: int = 0) -> str:
    """``value`` as text the same in every process and different for different values:
    each set's items and each dict's keys sorted, numbers as floats (``eta=3`` is
    ``eta=3.0``), a tensor or an array by its shape, type and a hash of its bytes (its
    repr is cut with "..."), a function by its name, defaults and closure, an object or
    a dataclass by its attributes (its repr may be an address, or write a set in its
    process's order): inside tuples, lists, dicts and such objects, a few levels deep."""
    if depth > _KEY_DEPTH:
        return repr(value)
    inner = functools.partial(_stable, depth=depth + 1)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return repr(value)
    if isinstance(value, numbers.Real):  # NumPy's scalars too: np.int64(3) is 3
        number = float(value)
        return repr(number) if abs(number) < 2 ** 53 else repr(value)
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(map(inner, value))) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(sorted(f"{inner(k)}: {inner(v)}"
                                      for k, v in value.items())) + "}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(map(inner, value))
        return (f"[{items}]" if isinstance(value, list)
                else f"{type(value).__qualname__}({items})")
    if (hasattr(value, "tobytes") and hasattr(value, "shape")) or type(value).__name__ in (
            "Tensor", "Parameter"):
        return _array_key(value)
    if isinstance(value, functools.partial):
        return f"partial({inner(value.func)}, {inner(value.args)}, {inner(value.keywords)})"
    if hasattr(value, "__self__") and hasattr(value, "__func__"):  # a bound method
        return f"{inner(value.__func__)} of {inner(value.__self__)}"
    code = getattr(value, "__code__", None)
    if code is not None:  # a function: its code, closure and defaults tell two apart
        cells = [c.cell_contents for c in getattr(value, "__closure__", None) or ()
                 if _filled(c)]
        return (f"{getattr(value, '__qualname__', '?')}[{_code_digest(code)}]"
                f"({inner(cells)}, {inner(getattr(value, '__defaults__', None))})")
    if dataclasses.is_dataclass(value) or type(value).__repr__ is object.__repr__:
        return _of_attributes(value, depth)
    return repr(value)


# How deep ``_stable`` looks into a rule's values (a rule's knobs are seldom nested).
_KEY_DEPTH = 4


def _array_key(value: Any) -> str:
    """A tensor's or an array's shape, type and a hash of its bytes."""
    import hashlib

    try:
        data = value.detach().cpu().contiguous().numpy() if hasattr(value, "detach") \
            else value
        digest = hashlib.sha1(data.tobytes()).hexdigest()[:16]
    except Exception:  # not readable so: its repr, as before
        return repr(value)
    return f"{type(value).__name__}({tuple(value.shape)}, {value.dtype}, {digest})"


def _code_digest(code: Any) -> str:
    """A hash of a function's instructions, constants and the names they use (``v.mean``
    and ``v.max`` differ in a name only: a regression review), its nested functions'
    alike, not of where it lies (a line added above it in its file changes no rule)."""
    import hashlib

    consts = [_code_digest(c) if hasattr(c, "co_code") else repr(c) for c in code.co_consts]
    names = (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)
    return hashlib.sha1(code.co_code + repr((consts, names)).encode()).hexdigest()[:12]


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


def _stripped(text: str) -> str:
    """``text`` without an object's address or a workload module's name."""
    return re.sub(r" at 0x[0-9a-fA-F]+|dione_workload_[0-9a-f]+\.", "", text)


def too_few_sharing(tasks: Sequence[Task], key: Callable[[object], str] = rule_key
                    ) -> list[tuple[str, list[str]]]:
    """For each well-formed rule of ``tasks`` that compares tasks and that too few of
    them share to stop any (``too_few_to_compare``): why, and those tasks' names; rules
    told apart by ``key`` (a live run's: each rule's key as the run first saw it)."""
    sharing: dict[str, list[Task]] = {}
    for task in tasks:
        if task.stopping is not None and not task.stopping.mistakes():
            sharing.setdefault(key(task.stopping), []).append(task)
    found = []
    for alike in sharing.values():
        rule = alike[0].stopping
        lonely = rule and too_few_to_compare(rule, len(alike))
        if lonely:
            found.append((lonely, [t.name for t in alike]))
    return found


def too_few_to_compare(rule: StoppingRule, sharing: int) -> str | None:
    """Why ``rule``, shared by ``sharing`` tasks, stops none (it compares a task with
    those before it at a rung: ASHA and the median rule alone judge nothing), with the
    fix; None where it can stop one."""
    least = rule.least_tasks()
    if sharing >= least:
        return None
    return (f"its stopping rule compares a task with those before it at a rung and stops "
            f"one only where {least} or more tasks share it (alike in every field; here "
            f"{sharing}), or where a metric is not finite, while each rung still ends a "
            "slice: give more tasks the same rule, or leave it out, unless tasks will be "
            "added to the run")


def common_mistakes(rule: StoppingRule, *whole: str,
                    mode_fix: str = "leave mode out (its default is 'min')") -> list[str]:
    """What every rule checks: its metric, mode and loss window, and that each field
    named in ``whole`` is a whole number >= 1 (``mode_fix``: how to judge the training
    loss lower-is-better, for a rule whose mode is not its own field)."""
    reasons = []
    if not isinstance(rule.metric, str) or not rule.metric:
        reasons.append(f"metric must be 'loss' or a name evaluate() returns, not "
                       f"{rule.metric!r}")
    if rule.mode not in ("min", "max"):
        reasons.append(f"mode must be 'min' or 'max', not {rule.mode!r}")
    elif rule.metric == "loss" and rule.mode == "max":  # training lowers it, always
        reasons.append("mode='max' on metric 'loss' (the training loss, which training "
                       f"lowers) would stop the best tasks: {mode_fix}, or name an "
                       "evaluated metric that is better higher")
    reasons += [f"{name} must be a whole number >= 1, not {getattr(rule, name)!r}"
                for name in ("loss_window", *whole) if not _whole(getattr(rule, name), 1)]
    return reasons


def _halving_mistakes(rule: StoppingRule, eta: object) -> list[str]:
    """What ASHA and successive halving check: rungs from ``min_steps`` by ``eta``."""
    reasons = common_mistakes(rule, "min_steps")
    if not _number(eta) or eta <= 1:  # type: ignore[operator]
        reasons.append(f"eta must be a number above 1 (3: keep a third), not {eta!r}")
    return reasons


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, linearly interpolated as numpy's default
    does it: from the nearer end, so that a midpoint a value ties in exact arithmetic
    (0.3 between 0.1 and 0.5) is that value, not 0.30000000000000004."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    part = position - low
    if part < 0.5:
        return ordered[low] + (ordered[high] - ordered[low]) * part
    return ordered[high] - (ordered[high] - ordered[low]) * (1 - part)
