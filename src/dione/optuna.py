"""Optuna as a driver: a study's sampler proposes the configurations, dione trains them
side by side on the devices it plans, the study's own pruner stops the losers, and the
study is told each result.

    study = optuna.create_study(storage="sqlite:///study.db", study_name="lr",
                                pruner=optuna.pruners.MedianPruner(), load_if_exists=True)
    def task(trial):
        lr = trial.suggest_float("lr", 1e-4, 1e-1, log=True)
        return dione.Task(name="mlp", ..., optimizer=partial(torch.optim.Adam, lr=lr))
    result = dione.optuna.optimize(study, task, n_trials=16, report_every=50,
                                   run_dir="runs/lr")

Each trial is asked (``study.ask()``) and built into a task named ``trial-<number>``;
dione trains them all in one run. At every ``report_every`` steps (a slice ends there,
so no decision is late) the task's metric goes to its trial (``trial.report``) and the
task stops when ``trial.should_prune()`` says so: Optuna's median, successive-halving
or Hyperband pruner decides, and the freed devices are planned again for the others at
once. As each task ends its trial is told (``study.tell``), so a pruner comparing with
completed trials learns of them during the run: a finished task's value (its last
loss, or ``metric`` from its evaluation), PRUNED for a stopped one, FAIL for a failed
or diverged one. Calling ``optimize`` again with the same study and run directory resumes both
(the trials of the interrupted run are rebuilt from the study's storage, the slices
from the run's store). The sampler proposes all ``n_trials`` before training starts,
so a sequential sampler (TPE) sees the results of an earlier ``optimize`` call, not of
this one's trials. Needs the ``optuna`` extra.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dione.spec.stopping import Decision, StoppingRule
from dione.spec.task import Task

__all__ = ["OptunaPruning", "optimize"]

_TASK = "dione_task"  # the trial's user attribute naming its task
_RUN = "dione_run"  # ... and the run directory that trains it


class OptunaPruning(StoppingRule):
    """A study's pruner as a dione stopping rule: judged every ``report_every`` steps, a
    task reports its metric to its trial and stops where ``should_prune()`` says. The
    study lives in the launcher only: the rule travels to workers without it."""

    def __init__(self, study: Any, trials: dict[str, Any], report_every: int,
                 metric: str = "loss", loss_window: int = 5) -> None:
        self.study = study
        self.trials = trials  # task name -> optuna.trial.Trial
        self.report_every = report_every
        self.metric = metric
        self.mode = "min" if _direction(study) == "minimize" else "max"
        self.loss_window = loss_window
        self.name = study.study_name

    def __repr__(self) -> str:
        return (f"OptunaPruning(study={self.name!r}, metric={self.metric!r}, "
                f"report_every={self.report_every})")

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "study": None, "trials": {}}  # workers never decide

    def mistakes(self) -> list[str]:
        """Each way the rule is malformed (empty: none), with the fix."""
        from dione.spec.stopping import common_mistakes

        return common_mistakes(self, "report_every")

    def rungs(self, total: int) -> list[int]:
        return list(range(self.report_every, total, self.report_every))

    def decide(self, rung: int, value: float, recorded: Sequence[float],
               task: str = "", history: Sequence[float] = ()) -> Decision:
        trial = self.trials[task]
        if not math.isfinite(value):
            return Decision(rung, value, True, f"{self.metric} is {value} at step {rung}")
        trial.report(value, rung)
        prune = bool(trial.should_prune())
        pruner = type(self.study.pruner).__name__
        return Decision(rung, value, prune,
                        f"{self.metric} {value:.4g} at step {rung}: trial {trial.number} "
                        + (f"pruned by Optuna's {pruner}" if prune
                           else f"goes on ({pruner})"))


    def ended(self, task: str, status: str, loss: float | None,
              evaluation: Mapping[str, float]) -> None:
        """Tell the study the task's outcome as it ends: a pruner that compares with
        completed trials (median, percentile) learns of each one during the run."""
        trial = self.trials.get(task)
        if trial is not None and trial.number not in _finished(self.study):
            _tell(self.study, trial, self.metric, status, loss, evaluation)


def _tell(study: Any, trial: Any, metric: str, status: str, loss: float | None,
          evaluation: Mapping[str, float]) -> None:
    """A finished task's value (its last loss, or ``metric`` of its evaluation); a
    stopped one PRUNED; a failed or diverged one, or a value that is not a number, FAIL."""
    from optuna.trial import TrialState

    if status == "done":
        value = loss if metric == "loss" else evaluation.get(metric)
        if value is not None and math.isfinite(value):
            study.tell(trial, value)
            return
    study.tell(trial, state=TrialState.PRUNED if status == "stopped" else TrialState.FAIL)


def _direction(study: Any) -> str:
    import optuna

    if len(study.directions) != 1:
        raise ValueError(f"study {study.study_name!r} has {len(study.directions)} objectives; "
                         "dione.optuna drives single-objective studies")
    return "minimize" if study.direction == optuna.study.StudyDirection.MINIMIZE \
        else "maximize"


def _trials_of(study: Any, run_dir: str, n_trials: int) -> list[Any]:
    """This run's trials: those an earlier call asked (from the study's storage), then
    new ones up to ``n_trials``."""
    import optuna

    mine = [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(_RUN) == run_dir]
    # A trial of the study's storage, again as the Trial the ask-and-tell interface
    # gives (Optuna names a stored trial by its private id only).
    trials = [optuna.trial.Trial(study, t._trial_id) for t in mine]
    while len(trials) < n_trials:
        trial = study.ask()
        trial.set_user_attr(_RUN, run_dir)
        trial.set_user_attr(_TASK, f"trial-{trial.number}")
        trials.append(trial)
    return trials


def optimize(study: Any, make_task: Callable[[Any], Task], n_trials: int, *,
             report_every: int, metric: str = "loss", run_dir: str = "runs/optuna",
             **run: Any) -> Any:
    """Train ``n_trials`` of ``study``, each the task ``make_task(trial)`` builds, as one
    dione run in ``run_dir`` (``run``: ``dione.run``'s other arguments: devices, ray,
    options); see the module's docstring. Returns ``dione.run``'s result; the study
    holds each trial's outcome."""
    try:
        import optuna
    except ImportError as err:
        raise RuntimeError(f"dione.optuna needs optuna: pip install 'dione[optuna]' ({err})"
                           ) from None
    import dione

    _direction(study)
    if not isinstance(n_trials, int) or n_trials < 1:
        raise ValueError(f"n_trials must be a whole number >= 1, not {n_trials!r}")
    where = str(Path(run_dir).resolve())
    trials = _trials_of(study, where, n_trials)
    by_task = {str(t.user_attrs[_TASK]): t for t in trials}
    rule = OptunaPruning(study, by_task, report_every, metric)
    tasks = []
    for name, trial in by_task.items():
        built = make_task(trial)  # a resumed trial's suggestions return its own values
        tasks.append(replace(built, name=name, stopping=rule,
                             hyperparameters={**trial.params, **built.hyperparameters}))
    result = dione.run(tasks, run_dir=run_dir, **run)
    # Each task was told as it ended; a task an earlier, interrupted call finished
    # without telling is told now.
    told = _finished(study)
    for outcome in result.tasks:
        trial = by_task[outcome.task]
        if trial.number not in told and outcome.status in (
                "done", "stopped", "failed", "diverged"):
            _tell(study, trial, metric, outcome.status, outcome.final_loss,
                  outcome.evaluation)
    for invalid in result.invalid:  # a task its trial built that dione refused
        for name, trial in by_task.items():
            if invalid.startswith(f"task {name!r}") and trial.number not in told:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                told.add(trial.number)
    return result


def _finished(study: Any) -> set[int]:
    return {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
