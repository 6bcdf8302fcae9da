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
from the run's store). By default the sampler proposes all ``n_trials`` before
training starts, and dione plans them together; with ``in_flight=k`` it proposes ``k``
first and one more each time a trial is told (the task joins the live run: a
``dione.TaskInbox``), so a sequential sampler (TPE) learns from this run's results,
as Optuna's own ``study.optimize(n_jobs=k)`` would let it. Needs the ``optuna`` extra.
"""

from __future__ import annotations

import json
import math
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from shlex import quote
from typing import Any

from dione.spec.stopping import Decision, StoppingRule
from dione.spec.task import Task

__all__ = ["OptunaPruning", "load", "optimize"]

_TASK = "dione_task"  # the trial's user attribute naming its task
_RUN = "dione_run"  # ... and the run directory that trains it
_BUILD_ERROR = "dione_error"  # why its task could not be built, was refused, or failed


class OptunaPruning(StoppingRule):
    """A study's pruner as a dione stopping rule: judged every ``report_every`` steps, a
    task reports its metric to its trial and stops where ``should_prune()`` says. The
    study lives in the launcher only: the rule travels to workers without it."""

    begun_first = True  # as Optuna's optimize: a trial begun runs on before new ones
    judged_by = "optimize(metric=...)"
    metric_fix = "optimize's metric"
    # (Optuna's direction, not a mode: "min" is "minimize".)
    mode_fix = "create the study with direction='{mode}imize'"
    retry = "call optimize again with retry_failed=True"

    def __init__(self, study: Any, trials: dict[str, Any], report_every: int,
                 metric: str = "loss", loss_window: int = 5,
                 on_told: Callable[[], None] | None = None) -> None:
        """``on_told``: called after each trial is told (a sequential ``optimize`` asks
        the next one then)."""
        self.study = study
        self.on_told = on_told
        self.run_dir: str | None = None  # where a failed task's reason is read (optimize)
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
        # Workers never decide, nor ask.
        return {**self.__dict__, "study": None, "trials": {}, "on_told": None}

    def mistakes(self) -> list[str]:
        """Each way the rule is malformed (empty: none), with the fix."""
        from dione.spec.stopping import common_mistakes

        return common_mistakes(self, "report_every", mode_fix="the study maximizes it; "
                               "create the study with direction='minimize'")

    def rungs(self, total: int) -> list[int]:
        return list(range(self.report_every, total, self.report_every))

    def decide(self, rung: int, value: float, recorded: Sequence[float],
               task: str = "", history: Sequence[float] = ()) -> Decision:
        trial = self.trials[task]
        if not math.isfinite(value):
            return Decision(rung, value, True, f"{self.metric} is {value} at step {rung}")
        with warnings.catch_warnings():
            # A resume judges again a rung whose report reached the study before a kill
            # and whose decision dione had not recorded: Optuna keeps the first report
            # (the same value, the slice being exact) and warned the user of a step
            # reported twice, something they did not do (a review).
            warnings.filterwarnings("ignore", "The reported value is ignored because")
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
            try:
                if status in ("failed", "diverged") and self.run_dir is not None:
                    _note_error(trial, _store_error(self.run_dir, task), status)
                elif (status == "done" and self.metric != "loss" and self.run_dir is not None
                      and self.metric not in evaluation):  # trained; its evaluation failed
                    _note_error(trial, _store_error(self.run_dir, task) or (
                        f"its last evaluation returned no {self.metric!r}"), "evaluation")
                _tell(self.study, trial, self.metric, status, loss, evaluation)
            finally:  # told or not (the storage failed), its place in flight is free
                if self.on_told is not None:
                    self.on_told()


def _store_error(run_dir: str, task: str) -> str | None:
    """Why the run's store says ``task`` failed or diverged (None: it says nothing)."""
    from dione.state.store import RunStore

    with RunStore(run_dir) as store:
        record = store.task(task)
    return None if record is None else record.error


def _note_error(trial: Any, error: str | None, status: str = "failed") -> None:
    """Keep why a trial's task failed in its ``dione_error`` (an Optuna user reads the
    study, not ``dione status``), unless a reason is kept already; the driver's own fix
    first (the run's said `dione resume`, or `dione add` under a new name, which an
    Optuna run has no workload file for: a review)."""
    if error and _BUILD_ERROR not in trial.user_attrs:
        fix = ("under dione.optuna: a diverged trial is not trained again; narrow the "
               "search space (a lower learning rate) for the trials asked next"
               if status == "diverged" else
               # Told FAIL with no reason where it read "done" in dione (a review).
               "under dione.optuna: its training ended and its weights are kept "
               "(dione.optuna.load(study, make_task, trial, run_dir=...) gives its model), "
               "but its last evaluation gave no value of the metric, so the study was told "
               "FAIL, which is final; once evaluate is fixed, optimize again with "
               "retry_failed=True trains its configuration again from its start"
               if status == "evaluation" else
               "under dione.optuna: fix the cause, then call optimize again with "
               "retry_failed=True (it proposes this trial's parameters again)")
        trial.set_user_attr(_BUILD_ERROR, f"{fix}. What the run says: {error}"[:5000])


def _tell(study: Any, trial: Any, metric: str, status: str, loss: float | None,
          evaluation: Mapping[str, float]) -> None:
    """A finished task's value (its mean loss over its last steps, or ``metric`` of its
    evaluation); a stopped one PRUNED; a failed or diverged one, or a value that is not a
    number, FAIL."""
    from optuna.trial import TrialState

    if status == "done":
        value = loss if metric == "loss" else evaluation.get(metric)
        if value is not None and math.isfinite(value):
            study.tell(trial, value)
            return
    study.tell(trial, state=TrialState.PRUNED if status == "stopped" else TrialState.FAIL)


def _direction(study: Any) -> str:
    import optuna

    if not isinstance(study, optuna.study.Study):
        raise TypeError(f"study must be an optuna.Study (optuna.create_study(...)), not "
                        f"{type(study).__name__}")
    if len(study.directions) != 1:
        raise ValueError(f"study {study.study_name!r} has {len(study.directions)} objectives; "
                         "dione.optuna drives single-objective studies")
    return "minimize" if study.direction == optuna.study.StudyDirection.MINIMIZE \
        else "maximize"


def _of_run(study: Any, run_dir: str) -> list[Any]:
    """The study's trials (frozen) asked for the run in ``run_dir`` (resolved)."""
    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(_RUN) == run_dir]


def _asked_before(study: Any, run_dir: str) -> list[Any]:
    """The trials an earlier call asked for this run (from the study's storage)."""
    import optuna

    # A trial of the study's storage, again as the Trial the ask-and-tell interface
    # gives (Optuna names a stored trial by its private id only).
    return [optuna.trial.Trial(study, t._trial_id) for t in _of_run(study, run_dir)]


def _ask(study: Any, run_dir: str) -> Any:
    trial = study.ask()
    trial.set_user_attr(_RUN, run_dir)
    trial.set_user_attr(_TASK, f"trial-{trial.number}")
    return trial


def optimize(study: Any, make_task: Callable[[Any], Task], n_trials: int, *,
             report_every: int, metric: str = "loss", run_dir: str = "runs/optuna",
             in_flight: int | None = None, retry_failed: bool = False,
             stop_asking_after: float | None = None, **run: Any) -> Any:
    """Train ``n_trials`` of ``study``, each the task ``make_task(trial)`` builds, as one
    dione run in ``run_dir`` (``run``: ``dione.run``'s other arguments: devices, ray,
    options); see the module's docstring. ``n_trials`` is the run directory's total, not
    a number more: a call again with the same study and ``run_dir`` resumes, training
    what is left of it (Optuna's ``study.optimize`` adds ``n_trials`` at each call;
    here raise it, or give another ``run_dir``, for more). ``in_flight``: at most this many trials
    asked and not yet told at once (the sampler proposes the next as each is told, so a
    sequential sampler such as TPE learns from this run's results); None: all
    ``n_trials`` at once, which dione plans together. A trial told FAIL is final, as
    in Optuna; ``retry_failed``: each trial of this run that failed (not one that
    diverged: its configuration would again) is proposed again as a new trial with its
    parameters (after the cause was fixed), in its place among the ``n_trials``.
    ``stop_asking_after``: past the ``in_flight`` trials the call starts with, no trial
    is asked once this many seconds have passed since it began (those asked train to
    their end or their pruning), as Optuna's own ``timeout``; with ``in_flight`` only,
    since otherwise every trial is asked at once. ``timeout`` is refused, being Optuna's
    budget and ``dione.run``'s slice limit at once; ``slice_timeout``: each slice's limit
    (``dione.run``'s ``timeout``). A configuration ``make_task`` cannot build: raise
    ``optuna.TrialPruned`` there (its trial is told PRUNED, as Optuna's optimize tells
    it); another exception fails its trial alone, but where the first two trials fail
    alike before any task was built (a mistake all share), the call stops there.
    Returns ``dione.run``'s result; the study holds each trial's outcome."""
    try:
        import optuna
    except ImportError as err:
        raise RuntimeError(f"dione.optuna needs optuna: pip install 'dione[optuna]' ({err})"
                           ) from None
    import dione
    from dione.orchestrate.additions import TaskInbox

    _direction(study)
    # The rule's own mistakes (a study maximizing the training loss, report_every 0) are
    # every trial's: said before any is asked, not as n_trials failed trials.
    checked = OptunaPruning(study, {}, report_every, metric)
    mistakes = checked.mistakes()
    if mistakes:
        raise ValueError("optimize cannot prune this study: " + "; ".join(mistakes))
    if not isinstance(n_trials, int) or n_trials < 1:
        raise ValueError(f"n_trials must be a whole number >= 1, not {n_trials!r}")
    if in_flight is not None and (not isinstance(in_flight, int) or in_flight < 1):
        raise ValueError(f"in_flight must be a whole number >= 1, or None (every trial at "
                         f"once), not {in_flight!r}")
    if stop_asking_after is not None and (isinstance(stop_asking_after, bool) or not
                                          isinstance(stop_asking_after, (int, float))
                                          or not stop_asking_after > 0):
        raise ValueError(f"stop_asking_after must be a number of seconds > 0, or None, not "
                         f"{stop_asking_after!r}")
    if stop_asking_after is not None and in_flight is None:
        raise ValueError("stop_asking_after stops the asking of new trials, and with "
                         "in_flight=None all n_trials are asked before training starts: "
                         "give in_flight=k (at most k trials training at once) with it")
    run = _run_arguments(run)  # before any trial is asked: a typo left n_trials RUNNING
    if in_flight is None and _learns_from_results(study, n_trials):
        warnings.warn(
            f"{type(study.sampler).__name__} proposes from the results it was told, and "
            f"with in_flight=None all {n_trials} trials are asked before any is trained: "
            "each comes from its random start-up; give in_flight=k (k trials training at "
            "once, the next asked as each is told) for a search that learns", stacklevel=2)
    _claim(study, run_dir, metric, report_every)
    began = time.monotonic()
    where = str(Path(run_dir).resolve())
    trials = _asked_before(study, where)
    held = len(trials)  # the trials this run held before this call
    # A trial whose task name a `dione add` took first is not told that task's outcome:
    # it fails, saying so.
    for trial, why in _taken_by_another(study, trials, run_dir):
        trial.set_user_attr(_BUILD_ERROR, why)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    # An interrupted call's, not yet told.
    _tell_ended(study, trials, run_dir, metric, checked.loss_window)
    failed_before = _failed(study, trials)
    if retry_failed:  # each proposed again (Optuna asks enqueued trials first)
        for params, number in _to_retry(study, run_dir, failed_before):
            study.enqueue_trial(params, user_attrs={"dione_retry_of": number})
        # A retried trial's place is its retry's; a diverged one, not retried, keeps its
        # own (a new configuration took it, unsaid: a review).
        replaced = {t.user_attrs.get("dione_retry_of")
                    for t in study.get_trials(deepcopy=False)}
        trials = [t for t in trials if t.number not in replaced]
    told = _finished(study)
    want = n_trials if in_flight is None else min(n_trials, max(
        len(trials), in_flight + sum(t.number in told for t in trials)))
    # A trial told FAIL is final (Optuna's trials cannot be reported to or told again):
    # its task is not trained again, whether it failed to build or to train.
    failed_now = _failed(study, trials)
    by_task = {str(t.user_attrs[_TASK]): t for t in trials if t.number not in failed_now}
    rule = OptunaPruning(study, by_task, report_every, metric)
    rule.run_dir = run_dir

    def build(name: str, trial: Any) -> Task:
        """The trial's task; ValueError where dione would refuse it (then its trial
        fails here, with the reason, rather than hold a place in flight)."""
        from dione.techniques.validation import valid_tasks

        built = make_task(trial)  # a resumed trial's suggestions return its own values
        task = replace(built, name=name, stopping=rule,
                       hyperparameters={**trial.params, **built.hyperparameters})
        steps = task.steps if isinstance(task.steps, int) else None
        if steps is not None and steps > 0 and not rule.mistakes() and not rule.rungs(steps):
            raise ValueError(f"report_every={report_every} leaves no report before the "
                             f"task's last step ({steps}), so its trial would never be "
                             f"reported to nor pruned: give optimize a report_every below "
                             f"{steps}")
        _, problems = valid_tasks([task])
        if problems:
            raise ValueError("; ".join(str(p) for p in problems))
        if not evaluated:  # the first task built: its evaluate run once, here
            evaluated.append(name)
            mistake = _metric_mistake(task)
            if mistake is not None:
                raise _SharedMistake(mistake)
        return task

    def failed(trial: Any, err: BaseException | str) -> None:
        """The trial whose task could not be built told so: PRUNED where ``make_task``
        raised Optuna's TrialPruned (a configuration it skips, as Optuna's optimize takes
        it), else FAIL with the error (one told already, resumed, is left as it is)."""
        if trial.number in _finished(study):
            return
        if isinstance(err, optuna.TrialPruned):
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        why = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
        trial.set_user_attr(_BUILD_ERROR, why[:5000])
        study.tell(trial, state=optuna.trial.TrialState.FAIL)

    tasks: list[Task] = []
    sent: set[str] = set()  # the tasks given to the live run through the inbox
    evaluated: list[str] = []  # the task whose evaluate was run once at its build
    # The trials whose tasks failed to build before any was built, with their errors.
    unbuilt: list[tuple[int, str]] = []

    def same_mistake(name: str, trial: Any, err: BaseException) -> None:
        """ValueError where two trials' tasks failed alike in a row, none built before: a
        mistake every trial shares (report_every past the task's end, a typo in
        ``make_task``) is said then, not as ``n_trials`` failed trials; one trial's
        configuration failing alone (a parameter that cannot work) is that trial's, and
        a pruned one (optuna.TrialPruned) none's."""
        if tasks or sent or isinstance(err, optuna.TrialPruned):
            return
        unbuilt.append((trial.number, f"{type(err).__name__}: {err}".replace(name, "{task}")))
        if len(unbuilt) >= 2 and unbuilt[-1][1] == unbuilt[-2][1]:
            raise ValueError(
                f"trials {unbuilt[-2][0]} and {unbuilt[-1][0]} could not build their tasks, "
                f"alike ({type(err).__name__}: {err}), and no trial's task was built: "
                "taken for a mistake every trial would share, so no more trials were asked "
                "and nothing was trained; both are told FAIL. If only some configurations "
                "cannot be built (a region of the search space), raise optuna.TrialPruned "
                "for them in make_task: each is then skipped and the study goes on. Else "
                "fix the cause and call optimize again (retry_failed=True proposes these "
                "parameters again)") from err

    def take(name: str, trial: Any) -> None:
        """The trial's task built for the run, or its trial failed (the user's function:
        this trial alone)."""
        try:
            tasks.append(build(name, trial))
        except Exception as err:
            failed(trial, str(err) if isinstance(err, _SharedMistake) else err)
            del by_task[name]
            if isinstance(err, _SharedMistake):
                raise ValueError(
                    f"{err}: taken for a mistake every trial shares, so trial "
                    f"{trial.number} is told FAIL, no more trials were asked and nothing "
                    "was trained; fix it and call optimize again (retry_failed=True "
                    f"proposes trial {trial.number}'s parameters again)") from None
            same_mistake(name, trial, err)

    for name, trial in list(by_task.items()):
        take(name, trial)
    while len(trials) < want:  # asked one by one: a shared mistake stops the asking
        trial = _ask(study, where)
        trials.append(trial)
        by_task[name := str(trial.user_attrs[_TASK])] = trial
        take(name, trial)
    inbox = TaskInbox() if len(trials) < n_trials else None
    timed_out: list[int] = []  # the trials asked when stop_asking_after closed the inbox

    def ask_next(first: bool = False) -> None:
        """One more trial for the live run, once one is told (``first``: one of the
        trials the run starts with); the inbox closed once ``n_trials`` were asked, or
        ``stop_asking_after`` passed. A trial ``make_task`` cannot build fails (its error in the
        trial's user attribute ``dione_error``) and the next is asked."""
        assert inbox is not None
        if inbox.closed:
            return
        if (not first and stop_asking_after is not None
                and time.monotonic() - began >= stop_asking_after):
            inbox.close()  # the run ends once the trials asked have
            timed_out.append(len(trials))
            return
        try:
            while len(trials) < n_trials:
                trial = _ask(study, where)
                trials.append(trial)
                name = str(trial.user_attrs[_TASK])
                try:
                    task = build(name, trial)
                except Exception as err:  # the user's function: this trial alone fails
                    failed(trial, err)
                    same_mistake(name, trial, err)
                    continue
                inbox.add(task)
                by_task[name] = trial
                sent.add(name)
                break
        except BaseException:  # the study cannot ask: no more will come, the run ends
            inbox.close()
            raise
        if len(trials) >= n_trials:
            inbox.close()

    def not_taken(name: str, why: str) -> None:
        """A task this inbox gave that the live run refused: its trial fails, and the
        next is asked (a task of the same name from ``dione add`` is not this one)."""
        assert inbox is not None
        trial = by_task.get(name)
        if (name in sent and name not in inbox.taken
                and trial is not None and trial.number not in _finished(study)):
            failed(trial, why)
            ask_next()

    if inbox is not None:
        rule.on_told = ask_next
        inbox.on_refused = not_taken
        finished = _finished(study)  # with those just failed: others take their place
        for _ in range((in_flight or 0) - sum(t.number not in finished
                                              for t in by_task.values())):
            ask_next(first=True)
        tasks += inbox.take()  # the run starts with them
    if not tasks:
        errors = "; ".join(f"trial {t.number}: {t.user_attrs[_BUILD_ERROR]}" for t in trials
                           if _BUILD_ERROR in t.user_attrs)
        if not errors and trials and _pruned(study) >= {t.number for t in trials}:
            raise ValueError(  # none failed: make_task skipped every configuration asked
                f"make_task pruned every trial of this run (optuna.TrialPruned: "
                f"{len(trials)} of n_trials={n_trials}): nothing to train; widen the "
                "search space, or raise n_trials for the sampler to propose others")
        raise ValueError(
            f"no trial of this run is left to train ({errors or 'each failed before'}): "
            "fix what the errors name, then call optimize again with retry_failed=True "
            "(the failed trials are final in the study; their configurations are "
            "proposed again)")
    try:
        result = dione.run(tasks, run_dir=run_dir, inbox=inbox, **run)
    except KeyboardInterrupt:  # Optuna fails an interrupted trial; these wait to resume
        open_trials = sorted(t.number for t in _asked_before(study, where)
                             if t.number not in _finished(study))
        if open_trials:
            print(f"interrupted: trial(s) {', '.join(map(str, open_trials))} stay RUNNING "
                  f"in the study, their training kept; optimize(..., run_dir="
                  f"{run_dir!r}) with this study resumes them")
        raise
    finally:
        if inbox is not None:
            inbox.close()
    # Each task was told as it ended; one the store has ended untold is told now.
    _tell_ended(study, trials, run_dir, metric, rule.loss_window)
    # A trial whose task the run never took (refused at the start or as it came); one
    # whose task changed since the run recorded it (make_task edited) was left as it
    # was, its training kept: it stays RUNNING, to resume once make_task builds it as
    # before (it was failed for good, no reason kept: a regression review).
    from dione.state.store import RunStore

    told, in_run = _finished(study), {t.task for t in result.tasks}
    with RunStore(run_dir) as store:
        invalid = store.invalid()
        changed = {name: why for name, (why, *_) in invalid.items()
                   if name in by_task and by_task[name].number not in told
                   and store.task(name) is not None}  # a told trial's stands as told
    for name, trial in by_task.items():
        if name not in in_run and name not in changed and trial.number not in told:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    for name, why in changed.items():  # said even when quiet: nothing else keeps it
        print(f"trial {by_task[name].number} stays RUNNING, its training kept: {why}; "
              "under dione.optuna: put make_task back as it was and call optimize again "
              "to resume it, or give a new run_dir")
    if not result.slices and not run.get("quiet") and not changed \
            and len(_asked_before(study, where)) == held:  # (it printed a makespan alone)
        print(f"nothing trained this call: each trial's task of this run had ended "
              f"(n_trials={n_trials}, and the run holds {held} trials: a larger n_trials "
              "asks new ones)")
    if timed_out and not run.get("quiet"):
        print(f"stop_asking_after={stop_asking_after:g} s passed with {timed_out[0]} of "
              f"n_trials={n_trials} trial(s) asked; calling optimize again asks the rest")
    retried = _to_retry(study, run_dir, _failed(study, trials) - failed_before)
    if retried and not run.get("quiet"):
        print(f"{len(retried)} trial(s) of this call failed (why: each trial's "
              f"dione_error, or `dione status {quote(str(run_dir))}`): once the cause is "
              "fixed, optimize(..., retry_failed=True) trains their configurations again")
    return result


class _SharedMistake(ValueError):
    """A mistake of the metric optimize judges (or the task's keep_best names), found by
    running the first task's evaluate once: every trial's, not one configuration's."""


def _metric_mistake(task: Task) -> str | None:
    """Why ``task`` cannot be judged by its rule: a metric it names that its evaluate,
    run once on its untrained model here, does not return (None: it does, or that could
    not be run here: then the run's profiling trial says so)."""
    from dione.spec.evaluated import metric_mistake, missing_metrics
    from dione.techniques.checking import untrained_evaluation

    if not missing_metrics(task, ()):  # it names no evaluated metric: nothing to check
        return None
    try:
        returned = untrained_evaluation(task)
    except Exception:  # it fails here (maybe for want of the run's devices): the run's
        return None  # profiling trial judges it where it trains
    return None if returned is None else metric_mistake(task, returned,
                                                       "on its untrained model")


# What Optuna's study.optimize takes that optimize does not, and what stands for it.
_OPTUNA_ONLY = {
    "callbacks": "look at the study after the call, or follow the run with on_event=f",
    "n_jobs": "in_flight=k trains k trials at once, on the devices the plan gives each",
    "catch": "a trial whose task fails fails alone; the others go on",
    "gc_after_trial": "each trial trains in processes of its own",
    "show_progress_bar": "the run prints its progress (quiet=True: none)",
    # The one Optuna and dione.run both take, meaning each its own (a review: Optuna's
    # search budget was taken as every slice's limit, unsaid).
    "timeout": "give stop_asking_after=SECONDS (with in_flight) to stop asking after that "
               "long; slice_timeout=SECONDS is each slice's limit (dione.run's timeout)",
}
# The study a run directory trains, recorded by optimize in the run's store.
_STUDY_ATTR = "dione_study"


def _run_arguments(run: Mapping[str, Any]) -> dict[str, Any]:
    """``optimize``'s keywords for ``dione.run``, checked before any trial is asked:
    Optuna's own optimize arguments said as such, any other unknown one named, and the
    devices asked for; returned as ``dione.run`` takes them (``slice_timeout`` as its
    ``timeout``)."""
    import inspect

    import dione
    from dione.spec import ClusterError, local_cluster

    optuna_only = [k for k in run if k in _OPTUNA_ONLY]
    if optuna_only:
        raise TypeError("optimize takes no " + "; no ".join(
            f"{k} (Optuna's study.optimize argument: {_OPTUNA_ONLY[k]})" for k in optuna_only))
    run = dict(run)
    if "slice_timeout" in run:
        run["timeout"] = run.pop("slice_timeout")
    own = set(inspect.signature(dione.run).parameters) - {"workload", "options"}
    dione._known_options({k: v for k, v in run.items() if k not in own})
    dione._devices_text(run.get("devices"))
    if run.get("ray") is None:  # a bad --devices was found after every trial was asked,
        # each left RUNNING in the study (a review)
        try:
            local_cluster(run.get("devices"))
        except ClusterError as err:  # in this call's words, as dione.run's
            raise ClusterError(str(err).replace("--devices ", "devices=")) from None
    return run


def _learns_from_results(study: Any, n_trials: int) -> bool:
    """Whether the study's sampler proposes from the trials told to it (TPE, Gaussian
    process, CMA-ES) past its random start-up within ``n_trials``, which asking every
    trial before any is told would waste."""
    sampler = study.sampler
    return type(sampler).__name__ in ("TPESampler", "GPSampler", "CmaEsSampler") and \
        n_trials > getattr(sampler, "_n_startup_trials", 0)  # the first are random anyway


def _claim(study: Any, run_dir: str, metric: str, report_every: int) -> None:
    """Record ``study`` as the one ``run_dir`` trains, by ``metric`` reported every
    ``report_every`` steps, or refuse it where another study has it (a run's task
    ``trial-N`` is its study's trial N, and a new study, or one deleted and made again,
    starts at trial 0 too, so it was told the old study's results for other parameters,
    nothing trained: review), or where this call judges by another metric or cadence (a
    resume by test_loss told the study losses beside the accuracies told before, and
    its maximizing best trial became the worst model: review)."""
    import uuid

    from dione.state.store import SIMULATED_FILE, RunStore

    if (Path(run_dir) / SIMULATED_FILE).is_file():  # before a trial is asked (the run
        # refused it after every trial was asked, each left RUNNING for good)
        raise ValueError(f"{run_dir} holds a simulation (`dione simulate`): trials that "
                         "train would mix with it; give optimize a run_dir of its own")
    ident = study.user_attrs.get(_STUDY_ATTR)
    if ident is None:
        ident = uuid.uuid4().hex
        study.set_user_attr(_STUDY_ATTR, ident)
    with RunStore(run_dir) as store:
        owner = store.optuna_study()
        if owner and owner.get("id") != ident:
            raise ValueError(
                f"{run_dir} trains the trials of another study ({owner.get('name')!r}): its "
                f"tasks trial-0, trial-1, ... are that study's, not study "
                f"{study.study_name!r}'s; give this study a run_dir of its own "
                "(optimize(..., run_dir=...))")
        judged = {"metric": metric, "report_every": report_every}
        before = {k: owner[k] for k in judged if k in owner}  # (an older dione's: none)
        # Once a trial trained or was valued (its rule's rungs, or a value told); the
        # run's own refusal of the rule came later, in the words of a workload file.
        if before and before != {k: judged[k] for k in before} and (
                store.slices() or _valued(study, run_dir)):
            raise ValueError(
                f"{run_dir}'s trials were reported and told by "
                + " ".join(f"{k}={v!r}" for k, v in before.items()) + "; this call gives "
                + " ".join(f"{k}={judged[k]!r}" for k in before) + ": the study would rank "
                "values of both as one objective, and its told values cannot be changed; "
                "give optimize the same, or a new study and run_dir for the other")
        if not owner or before != judged:  # (a metric no trial was valued by: replaced)
            store.set_optuna_study({"id": ident, "name": study.study_name, **judged})


def _valued(study: Any, run_dir: str) -> bool:
    """Whether a trial of this run was reported to or told a value (a misspelt metric
    that failed the first trial before anything trained may be fixed)."""
    from optuna.trial import TrialState

    return any(t.state == TrialState.COMPLETE or t.intermediate_values
               for t in _of_run(study, str(Path(run_dir).resolve())))


def load(study: Any, make_task: Callable[[Any], Task], trial: Any, *,
         run_dir: str | None = None, latest: bool = False, best: bool = False,
         step: int | None = None) -> Any:
    """The trained model of trial number ``trial`` of ``study`` in ``run_dir``: its task
    built again by ``make_task`` from the trial's parameters, its weights loaded as
    ``dione.load`` loads them (``latest``: the newest checkpoint of a trial pruned or
    not finished; ``best``: where the task's ``keep_best`` metric was best, by the
    metric and direction the run pruned by; ``step``: one it keeps at that step).
    ``trial``: its number, or the trial itself (``study.best_trial``); ``run_dir``: the
    run directory that trained it (default: the one the trial recorded). A run
    ``optimize`` trained has no workload file to load from."""
    import optuna

    import dione

    number = getattr(trial, "number", trial)
    found = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    if not found:
        raise KeyError(f"study {study.study_name!r} has no trial {number!r}")
    recorded = found[0].user_attrs.get(_RUN)
    if run_dir is None:
        if recorded is None:
            raise ValueError(f"trial {number} of study {study.study_name!r} records no run "
                             "directory (it was not trained by dione.optuna.optimize): give "
                             "run_dir=")
        run_dir = str(recorded)
    elif recorded is not None and str(Path(run_dir).resolve()) != recorded:
        raise ValueError(f"trial {number} of study {study.study_name!r} was trained in "
                         f"{recorded}, not {run_dir}: another run's trial-{number} holds "
                         "other weights (leave run_dir out to load from its own)")
    from dione.state.export import ExportError

    try:
        built = make_task(optuna.trial.FixedTrial(found[0].params, number=number))
    except Exception as err:
        if found[0].state != optuna.trial.TrialState.FAIL:
            raise
        # Its build's own error again said nothing of the trial having no weights (a
        # review).
        raise ValueError(f"trial {number} of study {study.study_name!r} failed and has no "
                         f"weights: its task does not build ({type(err).__name__}: {err})"
                         ) from err
    name = str(found[0].user_attrs.get(_TASK, f"trial-{number}"))
    try:
        return dione.load(run_dir, name, workload=[replace(built, name=name)],
                          latest=latest, best=best, step=step)
    except ExportError as err:  # in this function's words (it named the CLI's: a review)
        raise ExportError(_in_own_words(str(err))) from None


def _in_own_words(said: str) -> str:
    """An export error's fixes as ``dione.optuna.load``'s arguments, not the CLI's flags
    and ``dione.load``'s (``dione.state.export`` says both)."""
    said = said.replace("(--latest; dione.load(..., latest=True))",
                        "(dione.optuna.load(..., latest=True))")
    said = re.sub(r"\(--step (\d+); --latest; dione\.load\(\.\.\., latest=True\)\)",
                  r"(step=\1; latest=True)", said)
    return said.replace("(--step; dione.load(..., step=))", "(step=)")


def _failed(study: Any, trials: Sequence[Any]) -> set[int]:
    """The numbers of ``trials`` the study holds as FAIL."""
    from optuna.trial import TrialState

    mine = {t.number for t in trials}
    return {t.number for t in study.get_trials(deepcopy=False)
            if t.number in mine and t.state == TrialState.FAIL}


def _to_retry(study: Any, run_dir: str, numbers: set[int]) -> list[tuple[dict[str, Any], int]]:
    """(parameters, number) of each failed trial in ``numbers`` worth proposing again:
    not one proposed again before, nor one whose task diverged (the same configuration
    diverges again)."""
    from dione.state.store import STORE_FILE, RunStore

    diverged: set[str] = set()
    if (Path(run_dir) / STORE_FILE).is_file():
        with RunStore(run_dir) as store:
            diverged = {t.name for t in store.tasks() if t.status == "diverged"}
    every = study.get_trials(deepcopy=False)
    retried = {t.user_attrs.get("dione_retry_of") for t in every}  # once each, not per call
    return [(dict(t.params), t.number) for t in every
            if t.number in numbers and t.number not in retried
            and t.user_attrs.get(_TASK) not in diverged]


def _taken_by_another(study: Any, trials: Sequence[Any], run_dir: str
                      ) -> list[tuple[Any, str]]:
    """Each trial not yet told whose task name a `dione add` request gave the run (an
    interrupted call asked the trial, but the add's task took the name first), and why:
    that task is another configuration, whatever its settings."""
    from dione.state.store import STORE_FILE, RunStore

    if not (Path(run_dir) / STORE_FILE).is_file():
        return []
    told = _finished(study)
    found = []
    with RunStore(run_dir) as store:
        for trial in trials:
            name = str(trial.user_attrs.get(_TASK))
            added = store.addition_of(name)
            record = store.task(name)
            # A request that named it may have been refused it (the trial's task had
            # the name): its own task holds the trial's parameters.
            own = record is not None and bool(trial.params) and all(
                record.hyperparameters.get(k) == json.loads(json.dumps(v, default=str))
                for k, v in trial.params.items())
            if trial.number not in told and added is not None and not own:
                found.append((trial, f"the run's task {name!r} came from `dione add` of "
                              f"{added.workload}: another configuration took this trial's "
                              "name, so the trial cannot be trained under it"))
    return found


def _tell_ended(study: Any, trials: Sequence[Any], run_dir: str, metric: str,
                loss_window: int) -> None:
    """Tell each trial whose task the run's store has ended (an interrupted call ended
    it and stopped before telling): such a trial holds no place in flight. Its "loss":
    the mean of its last ``loss_window`` steps, as the runner tells it."""
    from dione.state.store import STORE_FILE, RunStore
    from dione.state.summaries import summaries

    if not (Path(run_dir) / STORE_FILE).is_file():
        return
    by_task = {str(t.user_attrs.get(_TASK)): t for t in trials}
    told = _finished(study)
    with RunStore(run_dir) as store:
        ended = [s for s in summaries(store)
                 if s.status in ("done", "stopped", "failed", "diverged")]
        means = {s.task: store.mean_loss(s.task, loss_window) for s in ended}
    for summary in ended:
        trial = by_task.get(summary.task)
        if trial is not None and trial.number not in told:
            if summary.status in ("failed", "diverged"):
                _note_error(trial, summary.error, summary.status)
            mean = means[summary.task]
            _tell(study, trial, metric, summary.status,
                  summary.final_loss if mean is None else mean, summary.evaluation)


def _finished(study: Any) -> set[int]:
    return {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}


def _pruned(study: Any) -> set[int]:
    """The numbers of the study's trials told PRUNED."""
    import optuna

    return {t.number for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.PRUNED}
