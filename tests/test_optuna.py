"""An Optuna study driving dione (``dione.optuna``): its pruner stops the losers, the study
is told each result."""

from __future__ import annotations

import functools
from pathlib import Path

import optuna
import torch

import dione.optuna
from dione.profile import TrialOptions
from dione.state.store import RunStore
from helpers import digits_task

LEARNING_RATES = [0.01, 1e-5, 0.02, 2e-5, 0.005, 1e-5, 0.03, 3e-5]


def test_a_study_of_eight_trials_with_a_median_pruner_runs_through_dione(
        tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(
        storage=storage, study_name="lr", direction="minimize",
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0))
    for lr in LEARNING_RATES:  # the sampler's proposals, fixed for the test
        study.enqueue_trial({"lr": lr})

    def build(trial: optuna.trial.Trial) -> dione.Task:
        lr = trial.suggest_float("lr", 1e-6, 1.0, log=True)
        return digits_task("digits", steps=16, techniques=("single",),
                           optimizer=functools.partial(torch.optim.Adam, lr=lr))

    run_dir = tmp_path / "run"
    result = dione.optuna.optimize(
        study, build, n_trials=8, report_every=4, run_dir=str(run_dir), devices="cpu:2",
        quiet=True, catalog=str(tmp_path / "catalog.sqlite"), time_limit=2.0,
        trial=TrialOptions(warmup_steps=1, measure_steps=2))

    trials = {f"trial-{t.number}": t for t in study.get_trials()}
    statuses = {t.task: t.status for t in result.tasks}
    assert set(statuses) == set(trials)
    with RunStore(run_dir) as store:
        decisions = store.decisions()
        for name, trial in trials.items():
            assert trial.params["lr"] == LEARNING_RATES[trial.number]
            if trial.state == optuna.trial.TrialState.PRUNED:
                # Stopped by the study's pruner at a report step, and never trained after.
                assert statuses[name] == "stopped"
                (stop,) = [d for d in decisions if d[0] == name and d[3]]
                assert "pruned by Optuna's MedianPruner" in stop[4]
                assert max(s.end_step for s in store.slices(name)) == stop[1]
                assert trial.intermediate_values[stop[1]] == stop[2]
            else:
                assert trial.state == optuna.trial.TrialState.COMPLETE
                assert statuses[name] == "done"
                assert trial.value == result.task(name).final_loss
            # Every report step it reached was reported to its trial, with dione's value.
            mine = {d[1]: d[2] for d in decisions if d[0] == name}
            assert mine == trial.intermediate_values
    pruned = [n for n, t in trials.items() if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned  # the median of completed trials stopped some: each was told on its end
    assert study.best_trial.params["lr"] >= 0.01  # the pick: a learning rate that learns

    # Again with the same study and run: nothing trains, nothing is asked or told twice.
    again = dione.optuna.optimize(
        optuna.load_study(study_name="lr", storage=storage), build, n_trials=8,
        report_every=4, run_dir=str(run_dir), devices="cpu:2", quiet=True,
        catalog=str(tmp_path / "catalog.sqlite"), time_limit=2.0)
    assert {t.task: t.status for t in again.tasks} == statuses
    assert len(optuna.load_study(study_name="lr", storage=storage).trials) == 8


def test_a_malformed_pruning_rule_is_named_as_every_rule_is() -> None:
    """The study's rule checks what every dione rule checks (metric, loss window) and its
    own ``report_every``, each with the value it was given."""
    study = optuna.create_study(direction="maximize")
    rule = dione.optuna.OptunaPruning(study, {}, report_every=0, metric="", loss_window=0)
    said = " ".join(rule.mistakes())
    assert "report_every must be a whole number >= 1, not 0" in said
    assert "loss_window must be a whole number >= 1, not 0" in said
    assert "metric must be 'loss' or a name evaluate() returns" in said
    assert rule.mode == "max"
    assert dione.optuna.OptunaPruning(study, {}, report_every=5).mistakes() == []
