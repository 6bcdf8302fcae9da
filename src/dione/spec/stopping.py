"""Stopping rules of a sweep: which tasks stop early, at which steps, and why.

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

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Asha", "Decision", "StoppingRule"]


@dataclass(frozen=True)
class Decision:
    """What a rule decided for a task at a rung: continue or stop, and why."""

    rung: int  # the step
    value: float
    stop: bool
    reason: str


class StoppingRule(ABC):
    """What the orchestrator asks of a stopping rule: the steps a task is judged at (a
    slice ends at each), and a decision there. ``repr`` names the rule: tasks whose
    rules have one repr are judged together, and the store keys decisions by it."""

    metric: str  # "loss" (the mean of the rung's last ``loss_window`` steps) or evaluate()'s
    mode: str  # "min" or "max"
    loss_window: int

    @abstractmethod
    def mistakes(self) -> list[str]:
        """Each way the rule is malformed (empty: none), with the fix."""

    @abstractmethod
    def rungs(self, total: int) -> list[int]:
        """The steps, before ``total``, at which a task is judged."""

    def next_rung(self, done: int, total: int) -> int | None:
        """The first rung after step ``done`` (None: none is left)."""
        return next((r for r in self.rungs(total) if r > done), None)

    @abstractmethod
    def decide(self, rung: int, value: float, recorded: Sequence[float],
               task: str = "") -> Decision:
        """Whether ``task`` with ``value`` at ``rung`` goes on, given the values the
        tasks before it recorded there under this rule (``value`` not among them)."""

    def ended(self, task: str, status: str, loss: float | None,  # noqa: B027 (a hook)
              evaluation: Mapping[str, float]) -> None:
        """Told, in the launcher, as a task under this rule ends (``done``, ``stopped``,
        ``failed``, ``diverged``) with its last loss and evaluation: a rule that learns
        from finished tasks (a median over completed ones) records it here."""


@dataclass(frozen=True)
class Asha(StoppingRule):
    """Asynchronous successive halving; see the module's docstring."""

    metric: str = "loss"
    mode: str = "min"  # min: lower is better; max: higher
    min_steps: int = 1
    eta: float = 3.0
    loss_window: int = 5  # steps averaged for the "loss" metric

    def mistakes(self) -> list[str]:
        """Each way the rule is malformed (empty: none), with the fix."""
        reasons = []
        if not isinstance(self.metric, str) or not self.metric:
            reasons.append(f"metric must be 'loss' or a name evaluate() returns, not "
                           f"{self.metric!r}")
        if self.mode not in ("min", "max"):
            reasons.append(f"mode must be 'min' or 'max', not {self.mode!r}")
        if not isinstance(self.min_steps, int) or isinstance(self.min_steps, bool) \
                or self.min_steps < 1:
            reasons.append(f"min_steps must be a whole number >= 1, not {self.min_steps!r}")
        if not isinstance(self.eta, (int, float)) or isinstance(self.eta, bool) \
                or not math.isfinite(self.eta) or self.eta <= 1:
            reasons.append(f"eta must be a number above 1 (3: keep a third), not {self.eta!r}")
        if not isinstance(self.loss_window, int) or self.loss_window < 1:
            reasons.append(f"loss_window must be a whole number >= 1, not "
                           f"{self.loss_window!r}")
        return reasons

    def rungs(self, total: int) -> list[int]:
        """The steps, before ``total``, at which a task is judged."""
        found: list[int] = []
        step = float(self.min_steps)
        while round(step) < total:
            if not found or round(step) > found[-1]:
                found.append(round(step))
            step *= self.eta
        return found

    def decide(self, rung: int, value: float, recorded: Sequence[float],
               task: str = "") -> Decision:
        if not math.isfinite(value):
            return Decision(rung, value, True, f"{self.metric} is {value} at step {rung}")
        if not recorded:
            return Decision(rung, value, False, f"first at step {rung}")
        ordered = sorted(recorded)
        # The best 1/eta: below the 1/eta quantile (min), above the 1 - 1/eta one (max).
        cutoff = _quantile(ordered, 1 / self.eta if self.mode == "min" else 1 - 1 / self.eta)
        worse = value > cutoff if self.mode == "min" else value < cutoff
        keep = f"top {1 / self.eta:.0%}"
        return Decision(rung, value, worse,
                        f"{self.metric} {value:.4g} at step {rung} "
                        + (f"is outside the {keep} of the {len(recorded)} before it "
                           f"(cutoff {cutoff:.4g}): stopped by ASHA (eta {self.eta:g})"
                           if worse else f"is within the {keep} of the {len(recorded)} "
                           f"before it (cutoff {cutoff:.4g})"))


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, linearly interpolated (numpy's default)."""
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
