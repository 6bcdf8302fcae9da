"""An Optuna study driving dione (``dione.optuna``): its pruner stops the losers, the study
is told each result."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import optuna
import pytest
import torch

import dione.optuna
from dione.profile import TrialOptions
from dione.state.store import RunStore
from helpers import digits_task

LEARNING_RATES = [0.01, 1e-5, 0.02, 2e-5, 0.005, 1e-5, 0.03, 3e-5]


def test_a_study_of_eight_trials_with_a_median_pruner_runs_through_dione(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
                # The mean of its last 5 losses, as each report (one batch's was told).
                window = [loss for _, loss in store.losses(name)][-5:]
                assert trial.value == pytest.approx(sum(window) / 5, rel=1e-12)
                assert trial.value != result.task(name).final_loss
            # Every report step it reached was reported to its trial, with dione's value.
            mine = {d[1]: d[2] for d in decisions if d[0] == name}
            assert mine == trial.intermediate_values
    pruned = [n for n, t in trials.items() if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned  # the median of completed trials stopped some: each was told on its end
    # A pruned trial's weights: its newest checkpoint, asked for in this function's
    # words (the refusal named the command line's --latest: a review).
    from dione.state.export import ExportError

    number = trials[pruned[0]].number
    with pytest.raises(ExportError, match=r"dione\.optuna\.load\(\.\.\., latest=True\)"):
        dione.optuna.load(study, build, number)
    assert dione.optuna.load(study, build, number, latest=True) is not None
    assert study.best_trial.params["lr"] >= 0.01  # the pick: a learning rate that learns

    # Again with the same study and run: nothing trains, nothing is asked or told twice,
    # and that is said (a makespan alone was printed: a review).
    capsys.readouterr()
    again = dione.optuna.optimize(
        optuna.load_study(study_name="lr", storage=storage), build, n_trials=8,
        report_every=4, run_dir=str(run_dir), devices="cpu:2",
        catalog=str(tmp_path / "catalog.sqlite"), time_limit=2.0)
    assert {t.task: t.status for t in again.tasks} == statuses
    assert "nothing trained this call: each trial's task of this run had ended " \
        "(n_trials=8, and the run holds 8 trials" in " ".join(capsys.readouterr().out.split())
    assert len(optuna.load_study(study_name="lr", storage=storage).trials) == 8


class _Watching(optuna.samplers.RandomSampler):
    """Random proposals; notes, as each trial is asked, how many trials had been told."""

    def __init__(self) -> None:
        super().__init__(seed=0)
        self.told_at_ask: dict[int, int] = {}

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        super().before_trial(study, trial)
        self.told_at_ask[trial.number] = sum(t.state.is_finished()
                                             for t in study.get_trials(deepcopy=False))


def test_a_sequential_study_asks_each_trial_once_an_earlier_one_was_told(
        tmp_path: Path) -> None:
    """With ``in_flight=2`` the sampler proposes two trials, then one each time a trial is
    told; each joins the live run and is trained. So a trial was proposed knowing every
    result but those of at most one other still training. A trial the user's function
    cannot build, or whose task the run refuses, fails alone, and the next is asked in
    its place."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    sampler = _Watching()
    study = optuna.create_study(storage=storage, study_name="seq", direction="minimize",
                                sampler=sampler, pruner=optuna.pruners.NopPruner())

    def build(trial: optuna.trial.Trial) -> dione.Task:
        lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        if trial.number == 3:
            raise ValueError("no model for this trial")
        return digits_task("digits", steps=8, techniques=("single",),
                           batch_size=0 if trial.number == 4 else 16,  # 4: refused
                           optimizer=functools.partial(torch.optim.Adam, lr=lr))

    options = dict(report_every=4, run_dir=str(tmp_path / "run"), devices="cpu:2",
                   quiet=True, catalog=str(tmp_path / "catalog.sqlite"), time_limit=2.0,
                   trial=TrialOptions(warmup_steps=1, measure_steps=2))
    result = dione.optuna.optimize(study, build, n_trials=6, in_flight=2, **options)

    trials = study.get_trials()
    assert [t.number for t in trials] == list(range(6))
    assert sampler.told_at_ask == {0: 0, 1: 0, 2: 1, 3: 2, 4: 3, 5: 4}
    assert trials[3].state == trials[4].state == optuna.trial.TrialState.FAIL
    assert "no model for this trial" in trials[3].user_attrs["dione_error"]
    assert "batch_size" in trials[4].user_attrs["dione_error"]
    statuses = {t.task: t.status for t in result.tasks}
    assert statuses == {f"trial-{k}": "done" for k in (0, 1, 2, 5)}
    for k in (0, 1, 2, 5):
        assert trials[k].state == optuna.trial.TrialState.COMPLETE
        with RunStore(tmp_path / "run") as store:
            window = [loss for _, loss in store.losses(f"trial-{k}")][-5:]
        assert trials[k].value == pytest.approx(sum(window) / 5, rel=1e-12)

    # Again with the same study and run: nothing trains, nothing is asked or told twice.
    again = dione.optuna.optimize(optuna.load_study(study_name="seq", storage=storage),
                                  build, n_trials=6, in_flight=2, **options)
    assert {t.task: t.status for t in again.tasks} == statuses
    assert len(optuna.load_study(study_name="seq", storage=storage).trials) == 6


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
    assert dione.optuna.OptunaPruning(study, {}, report_every=5,
                                      metric="accuracy").mistakes() == []
    # A study maximizing a metric whose name says lower is better: the warning's fix is
    # the study's direction (it said "Set mode='min' on the rule": no rule of the user's).
    from dione.spec.metrics import doubtful_direction

    doubting = dione.optuna.OptunaPruning(study, {}, report_every=5, metric="test_loss")
    doubt = doubtful_direction(doubting.metric, doubting.mode, doubting.mode_fix)
    assert doubt is not None and doubt.endswith(
        "Create the study with direction='minimize' if lower is better")
    # A study maximizing the training loss stops the best trials: named, with its fix.
    (said,) = dione.optuna.OptunaPruning(study, {}, report_every=5).mistakes()
    assert "create the study with direction='minimize'" in said
    # ... and optimize says so before asking any trial (each was asked and told FAIL).
    with pytest.raises(ValueError, match="optimize cannot prune this study: mode='max'"):
        dione.optuna.optimize(study, lambda trial: None, 4, report_every=5)
    assert study.trials == []
    with pytest.raises(TypeError, match=r"study must be an optuna\.Study"):
        dione.optuna.optimize(None, lambda trial: None, 4, report_every=5)
    # stop_asking_after stops the asking, which in_flight=None does all at once: said.
    with pytest.raises(ValueError, match="give in_flight=k"):
        dione.optuna.optimize(study, lambda trial: None, 4, report_every=5,
                              metric="accuracy", stop_asking_after=60)
    with pytest.raises(ValueError, match="stop_asking_after must be a number of seconds > 0"):
        dione.optuna.optimize(study, lambda trial: None, 4, report_every=5,
                              metric="accuracy", in_flight=2, stop_asking_after=0)
    assert study.trials == []


def _score(model: torch.nn.Module) -> dict[str, float]:
    """The held-out loss as a metric named "score", whose name says no direction."""
    from dione.zoo.digits import digits_accuracy

    return {"score": digits_accuracy(model)["test_loss"]}


def test_asking_stops_after_its_time_and_load_gives_the_best_by_the_studys_direction(
        tmp_path: Path) -> None:
    """Past the ``in_flight`` trials a call starts with, ``stop_asking_after`` passed, no
    more is asked (Optuna's own ``timeout``); those asked train to their end.
    ``load(best=True)`` gives a trial's ``keep_best`` checkpoint ranked by the study's
    direction (the metric's name says none): here a study maximizing a held-out loss,
    whose best is its first evaluation, a checkpoint only keep_best keeps."""
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.NopPruner(),
                                sampler=optuna.samplers.RandomSampler(seed=0))

    def build(trial: optuna.trial.Trial) -> dione.Task:
        lr = trial.suggest_float("lr", 1e-2, 2e-2)
        return digits_task("digits", steps=12, techniques=("single",), evaluate=_score,
                           keep_best="score",
                           optimizer=functools.partial(torch.optim.Adam, lr=lr))

    run_dir = str(tmp_path / "run")
    result = dione.optuna.optimize(
        study, build, n_trials=4, report_every=4, metric="score", in_flight=2,
        stop_asking_after=1e-9, run_dir=run_dir, devices="cpu:2", quiet=True,
        catalog=str(tmp_path / "catalog.sqlite"), time_limit=2.0,
        trial=TrialOptions(warmup_steps=1, measure_steps=2))
    assert [t.number for t in study.trials] == [0, 1]  # the two it started with, no more
    assert {t.task: t.status for t in result.tasks} == {"trial-0": "done", "trial-1": "done"}
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    with RunStore(tmp_path / "run") as store:
        scores = dict(store.evaluations("trial-0")["score"])
        assert store.keep_best("trial-0") == ("score", "max")
        kept = [c.step for c in store.checkpoints("trial-0")]
    assert sorted(scores) == [4, 8, 12] and kept == [4, 8, 12]
    assert max(scores, key=lambda s: scores[s]) == 4 and scores[4] > scores[12]
    best = dione.optuna.load(study, build, 0, run_dir=run_dir, best=True)
    last = dione.optuna.load(study, build, 0, run_dir=run_dir)
    # Evaluated here with this process's threads, there with the worker's: the sums'
    # order differs (1.04e-6 apart once in a fresh clone's CI); the steps' scores are
    # far further apart than that.
    assert abs(scores[4] - scores[12]) > 1e-3 * abs(scores[4])
    assert _score(best)["score"] == pytest.approx(scores[4], rel=1e-5)
    assert _score(last)["score"] == pytest.approx(scores[12], rel=1e-5)
    # The trial itself (study.best_trial), from the run directory it recorded; another
    # run directory's trial of that number refused (its weights were loaded, unsaid).
    own = dione.optuna.load(study, build, study.trials[0])
    assert _score(own)["score"] == pytest.approx(scores[12], rel=1e-6)
    with pytest.raises(ValueError, match=r"was trained in .*, not elsewhere"):
        dione.optuna.load(study, build, 0, run_dir="elsewhere")
    # Another study (a new one, or one deleted and made again: trial 0 again) into this
    # run directory was told this one's results, nothing trained: refused, nothing asked.
    fresh = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.TPESampler(n_startup_trials=1))
    # Its sampler (TPE, Optuna's default) learns from results none of which it would see
    # with every trial asked at once: said (a review).
    with pytest.warns(UserWarning, match=r"TPESampler proposes from the results it was "
                      r"told.*give in_flight=k"), \
            pytest.raises(ValueError, match="trains the trials of another study"):
        dione.optuna.optimize(fresh, build, n_trials=2, report_every=4, metric="score",
                              run_dir=run_dir, devices="cpu:2", quiet=True)
    # Optuna's own optimize arguments (and typos) refused before a trial is asked: they
    # were refused by dione.run, every trial left RUNNING in the study.
    with pytest.raises(TypeError, match=r"optimize takes no callbacks \(Optuna's "):
        dione.optuna.optimize(fresh, build, n_trials=2, report_every=4, metric="score",
                              run_dir=str(tmp_path / "other"), callbacks=[print])
    with pytest.raises(TypeError, match="did you mean 'time_limit'"):
        dione.optuna.optimize(fresh, build, n_trials=2, report_every=4, metric="score",
                              run_dir=str(tmp_path / "other"), time_limt=3)
    from dione.spec import ClusterError

    # Optuna's search budget was taken as each slice's limit, unsaid (a review); devices
    # this machine lacks were found once every trial was asked, each left RUNNING.
    with pytest.raises(TypeError, match=r"optimize takes no timeout \(.*stop_asking_after="
                       r"SECONDS .*slice_timeout=SECONDS is each slice's limit"):
        dione.optuna.optimize(fresh, build, n_trials=2, report_every=4, metric="score",
                              run_dir=str(tmp_path / "other"), timeout=3600)
    with pytest.raises(ClusterError, match=r"^devices=cpu:4096"):
        dione.optuna.optimize(fresh, build, n_trials=2, report_every=4, metric="score",
                              run_dir=str(tmp_path / "other"), devices="cpu:4096")
    with pytest.raises(ValueError, match=r"devices must be text as --devices takes it"):
        dione.optuna.optimize(fresh, build, n_trials=2, report_every=4, metric="score",
                              run_dir=str(tmp_path / "other"), devices=2)  # it crashed
    assert fresh.trials == []
    assert dione.optuna._run_arguments({"slice_timeout": 60.0}) == {"timeout": 60.0}


def test_an_interrupted_study_says_which_trials_wait_to_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Optuna's optimize fails an interrupted trial; dione's keeps it RUNNING, to resume
    with its training, and now says so (a bare KeyboardInterrupt said nothing)."""
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    study = optuna.create_study(direction="maximize")

    def build(trial: optuna.trial.Trial) -> dione.Task:
        lr = trial.suggest_float("lr", 1e-2, 2e-2)
        return digits_task("digits", steps=12, techniques=("single",), evaluate=_score,
                           optimizer=functools.partial(torch.optim.Adam, lr=lr))

    def stop(event: Any) -> None:
        if event.kind == "slice_started":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dione.optuna.optimize(study, build, n_trials=2, report_every=4, metric="score",
                              run_dir=str(tmp_path / "run"), devices="cpu:2", quiet=True,
                              on_event=stop, catalog=str(tmp_path / "catalog.sqlite"),
                              trial=TrialOptions(warmup_steps=1, measure_steps=2))
    assert "interrupted: trial(s) 0, 1 stay RUNNING in the study, their training kept" in \
        capsys.readouterr().out
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING] * 2


class _FirstTwoItems(torch.utils.data.Dataset[Any]):
    """The digits, of which only the items validation tries load (the first four, and
    four spread over the data for its loss check, a single-only task's too): a task of
    it fails in its run, not before."""

    def __init__(self) -> None:
        from dione.zoo.digits import digits_train

        self.items = digits_train()
        last = len(self.items) - 1
        self.readable = {0, 1, 2, 3} | {round(i * last / 3) for i in range(4)}

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        if index not in self.readable:
            raise OSError(f"item {index} cannot be read")
        return self.items[index]


def test_failed_trials_are_final_and_proposed_again_only_when_asked(tmp_path: Path) -> None:
    """Data that cannot be read fails every trial (FAIL). Calling optimize again trained
    them again and crashed reporting to finished trials; now they are not trained again,
    and with ``retry_failed=True`` (the data fixed) each configuration is a new trial,
    trained and told; a second retry proposes none twice. A report_every past the task's
    end is named as such, not as the user's function's fault."""
    import sys

    import cloudpickle

    from dione.zoo.digits import digits_accuracy

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _FirstTwoItems
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="typo", direction="maximize",
                                pruner=optuna.pruners.NopPruner())
    for lr in (0.01, 0.02):
        study.enqueue_trial({"lr": lr})
    broken = [True]

    def build(trial: optuna.trial.Trial) -> dione.Task:
        lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        return digits_task("digits", steps=8, techniques=("single",), evaluate=digits_accuracy,
                           optimizer=functools.partial(torch.optim.Adam, lr=lr),
                           **({"data": _FirstTwoItems} if broken[0] else {}))

    options = dict(report_every=4, run_dir=str(tmp_path / "run"), devices="cpu:2",
                   quiet=True, catalog=str(tmp_path / "catalog.sqlite"), time_limit=2.0,
                   trial=TrialOptions(warmup_steps=1, measure_steps=2))
    dione.optuna.optimize(study, build, n_trials=2, metric="accuracy", **options)
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.FAIL] * 2
    for failed in study.get_trials():  # why, in the study (it was only in `dione status`)
        assert "OSError: item" in failed.user_attrs["dione_error"], failed.user_attrs
        # The driver's own fix first (the run's said `dione resume`, which an Optuna
        # run's directory does not take: a review).
        assert failed.user_attrs["dione_error"].startswith(
            "under dione.optuna: fix the cause, then call optimize again with "
            "retry_failed=True")
    broken[0] = False
    with pytest.raises(ValueError, match="no trial of this run is left to train"):
        dione.optuna.optimize(study, build, n_trials=2, metric="accuracy", **options)
    result = dione.optuna.optimize(study, build, n_trials=2, metric="accuracy",
                                   retry_failed=True, **options)
    trials = study.get_trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]
    for retry in trials[2:]:
        assert retry.state == optuna.trial.TrialState.COMPLETE
        original = trials[retry.user_attrs["dione_retry_of"]]
        assert retry.params == original.params
        assert retry.value == result.task(f"trial-{retry.number}").evaluation["accuracy"]
    dione.optuna.optimize(study, build, n_trials=2, metric="accuracy", retry_failed=True,
                          **options)
    assert len(study.get_trials()) == 4
    # A trial's trained model, its task built again from the trial's parameters (the run
    # has no workload file; export says so and names this).
    model = dione.optuna.load(study, build, 3, run_dir=str(tmp_path / "run"))
    assert digits_accuracy(model)["accuracy"] == trials[3].value
    from dione.cli import main

    assert main(["export", str(tmp_path / "run"), "trial-3", "-o", str(tmp_path / "x")]) == 2

    # A mistake every trial shares is said once the first two failed alike (it used up
    # all n_trials); one trial's own (Optuna's TrialPruned from make_task: a
    # configuration it skips) is that trial's, PRUNED, and the others train.
    for in_flight in (None, 2):
        late = optuna.create_study(direction="minimize")
        with pytest.raises(ValueError, match=r"report_every=40 leaves no report before the "
                           r"task's last step \(8\).*taken for a mistake every trial would "
                           r"share.*raise optuna.TrialPruned"):
            dione.optuna.optimize(late, build, n_trials=4, in_flight=in_flight, **{
                **options, "report_every": 40, "run_dir": str(tmp_path / f"late{in_flight}")})
        assert [t.state for t in late.get_trials()] == [optuna.trial.TrialState.FAIL] * 2

    def skipping(trial: optuna.trial.Trial) -> dione.Task:
        if trial.suggest_float("lr", 1e-3, 3e-2, log=True) > 0.025:
            raise optuna.TrialPruned("too fast for this model")
        return build(trial)

    skips = optuna.create_study(direction="maximize")
    for lr in (0.03, 0.02):
        skips.enqueue_trial({"lr": lr})
    dione.optuna.optimize(skips, skipping, n_trials=2, metric="accuracy",
                          **{**options, "run_dir": str(tmp_path / "skips")})
    assert [t.state for t in skips.get_trials()] == [optuna.trial.TrialState.PRUNED,
                                                      optuna.trial.TrialState.COMPLETE]
    # Every configuration skipped: said as such (it read "each failed before", and
    # pointed at retry_failed, which proposes no pruned trial again).
    every = optuna.create_study(direction="maximize")
    for _ in range(2):
        every.enqueue_trial({"lr": 0.03})
    with pytest.raises(ValueError, match=r"make_task pruned every trial of this run"):
        dione.optuna.optimize(every, skipping, n_trials=2, metric="accuracy",
                              **{**options, "run_dir": str(tmp_path / "every")})
    # A trial whose task never built has no weights: load says so (it raised the
    # build's error again, naming no trial: a review).

    def unbuildable(trial: optuna.trial.Trial) -> dione.Task:
        trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        raise ValueError("optimizer 'bad' is not supported")

    unbuilt = optuna.create_study(direction="maximize")
    with pytest.raises(ValueError, match="optimizer 'bad' is not supported"):
        dione.optuna.optimize(unbuilt, unbuildable, n_trials=2, metric="accuracy",
                              **{**options, "run_dir": str(tmp_path / "unbuilt")})
    with pytest.raises(ValueError, match=r"trial 0 of study .* failed and has no weights: "
                       r"its task does not build \(ValueError: optimizer 'bad'"):
        dione.optuna.load(unbuilt, unbuildable, 0, run_dir=str(tmp_path / "unbuilt"))


def test_a_metric_the_evaluation_does_not_return_stops_optimize_at_the_first_trial(
        tmp_path: Path) -> None:
    """optimize(metric=...) that evaluate does not return failed every trial, each after
    its profiling (n_trials FAIL); now the first task's evaluate is run once as it is
    built, and optimize stops there: one trial FAIL, the name it likely meant said, and
    retry_failed=True with the metric fixed trains that configuration."""
    from dione.zoo.digits import digits_accuracy

    study = optuna.create_study(direction="maximize")
    for lr in (0.01, 0.02):
        study.enqueue_trial({"lr": lr})

    def build(trial: optuna.trial.Trial) -> dione.Task:
        lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        return digits_task("digits", steps=8, techniques=("single",), evaluate=digits_accuracy,
                           optimizer=functools.partial(torch.optim.Adam, lr=lr))

    options = dict(report_every=4, run_dir=str(tmp_path / "run"), devices="cpu:2",
                   quiet=True, catalog=str(tmp_path / "catalog.sqlite"), time_limit=2.0,
                   trial=TrialOptions(warmup_steps=1, measure_steps=2))
    with pytest.raises(ValueError) as said:
        dione.optuna.optimize(study, build, n_trials=4, metric="acuracy", in_flight=2,
                              **options)
    message = " ".join(str(said.value).split())
    assert "optimize(metric=...) judges 'acuracy', which its evaluate does not return (it " \
        "returned 'accuracy', 'test_loss' on its untrained model): did you mean " \
        "'accuracy'? Else name one of those as optimize's metric" in message, message
    assert "trial 0 is told FAIL, no more trials were asked and nothing was trained" \
        in message, message
    (failed, waiting) = study.get_trials()  # the second enqueued, not asked
    assert failed.state == optuna.trial.TrialState.FAIL
    assert waiting.state == optuna.trial.TrialState.WAITING
    assert failed.user_attrs["dione_error"].startswith("optimize(metric=...) judges 'acuracy'")
    with RunStore(tmp_path / "run") as store:  # nothing trained
        assert store.slices() == []
    dione.optuna.optimize(study, build, n_trials=2, metric="accuracy", retry_failed=True,
                          **options)
    states = [t.state for t in study.get_trials()]
    assert states == [optuna.trial.TrialState.FAIL] + [optuna.trial.TrialState.COMPLETE] * 2
    assert [t.params for t in study.get_trials()[1:]
            if t.user_attrs.get("dione_retry_of") == 0] == [failed.params]
    # Into a simulation's folder: refused before a trial is asked (the run refused it
    # after all were, each left RUNNING: a review).
    from dione.orchestrate.options import RunOptions
    from dione.simulate import simulate
    from helpers import small_problem

    simulate(small_problem(2), tmp_path / "sim", steps=10, report=False,
             options=RunOptions(time_limit=1.0))
    fresh = optuna.create_study(direction="maximize")
    with pytest.raises(ValueError, match="holds a simulation"):
        dione.optuna.optimize(fresh, build, n_trials=2, metric="accuracy",
                              **{**options, "run_dir": str(tmp_path / "sim")})
    assert fresh.get_trials() == []


def test_a_trial_whose_name_another_task_took_fails_saying_so(tmp_path: Path) -> None:
    """A `dione add` that took a trial's task name before the trial's task came: resumed,
    the trial was told that other task's result as its own (another learning rate's
    final loss, COMPLETE). It now fails naming why; the next trial trains."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name="taken", direction="minimize")
    for lr in (0.01, 0.02):
        study.enqueue_trial({"lr": lr})
    run_dir = tmp_path / "run"
    asked = dione.optuna._ask(study, str(run_dir.resolve()))  # then the call was killed
    with RunStore(run_dir) as store:  # the add's task, of the trial's name
        request = store.add_tasks(str(tmp_path / "more.py"), [f"trial-{asked.number}"])
        store.settle_addition(request, "taken", f"added trial-{asked.number}")
        store.register_task(f"trial-{asked.number}", 8, 16,
                            settings={"optimizer": "Adam(lr=0.5)"})
        store.set_task_status(f"trial-{asked.number}", "done")

    def build(trial: optuna.trial.Trial) -> dione.Task:
        lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        return digits_task("digits", steps=8, techniques=("single",),
                           optimizer=functools.partial(torch.optim.Adam, lr=lr))

    dione.optuna.optimize(study, build, n_trials=2, report_every=4, run_dir=str(run_dir),
                          devices="cpu:1", quiet=True, time_limit=2.0,
                          catalog=str(tmp_path / "catalog.sqlite"),
                          trial=TrialOptions(warmup_steps=1, measure_steps=2))
    first, second = study.get_trials()
    assert first.state == optuna.trial.TrialState.FAIL
    assert "the run's task 'trial-0' came from `dione add` of " in \
        first.user_attrs["dione_error"]
    assert second.state == optuna.trial.TrialState.COMPLETE
    # A request that named a trial's task but was refused it (the trial had the name):
    # the task holding the trial's parameters is its own, and the trial is not failed.
    third = dione.optuna._ask(study, str(run_dir.resolve()))
    third.suggest_float("lr", 1e-3, 3e-2, log=True)  # built, as make_task builds it
    with RunStore(run_dir) as store:
        store.register_task(f"trial-{third.number}", 8, 16, dict(third.params))
        late = store.add_tasks(str(tmp_path / "more.py"), [f"trial-{third.number}", "x"])
        store.settle_addition(late, "taken", "added x; refused ...")
    assert dione.optuna._taken_by_another(study, [third], str(run_dir)) == []
    # No add: the trial's own task, trained otherwise (make_task edited between the two
    # calls). The run refuses, naming the change; the trial stays open (it was failed
    # for good, blamed on an add that never was), so putting make_task back resumes it.
    other = optuna.create_study(storage=storage, study_name="edited", direction="minimize")
    other.enqueue_trial({"lr": 0.01})
    edited = tmp_path / "edited"
    asked = dione.optuna._ask(other, str(edited.resolve()))
    with RunStore(edited) as store:
        store.register_task(f"trial-{asked.number}", 8, 16,
                            settings={"optimizer": "Adam(lr=0.5)"})
        store.begin_slice(f"trial-{asked.number}", "single", {}, "vm", [0], 0, 4)  # trained
    with pytest.raises(ValueError, match=r"other training \(optimizer: Adam\(lr=0.5\) -> "
                                         r"Adam\(lr=0.01\)\)"):
        dione.optuna.optimize(other, build, n_trials=1, report_every=4,
                              run_dir=str(edited), devices="cpu:1", quiet=True,
                              catalog=str(tmp_path / "catalog.sqlite"),
                              trial=TrialOptions(warmup_steps=1, measure_steps=2))
    assert [t.state for t in other.get_trials()] == [optuna.trial.TrialState.RUNNING]


def test_retrying_failed_trials_keeps_a_diverged_ones_place(tmp_path: Path) -> None:
    """A diverged trial is not proposed again by ``retry_failed=True``, and it keeps its
    place among the n_trials: a new configuration took it, unsaid (a review); its
    dione_error gives the driver's fix, not the run's (`dione add`)."""
    from dione.zoo.digits import digits_accuracy

    study = optuna.create_study(direction="maximize")
    for lr in (0.01, 1e12):  # the second diverges
        study.enqueue_trial({"lr": lr})

    def build(trial: optuna.trial.Trial) -> dione.Task:
        lr = trial.suggest_float("lr", 1e-3, 1e13, log=True)
        return digits_task("digits", steps=8, techniques=("single",), evaluate=digits_accuracy,
                           optimizer=functools.partial(torch.optim.SGD, lr=lr, momentum=0.9))

    options = dict(report_every=4, run_dir=str(tmp_path / "run"), devices="cpu:2",
                   quiet=True, catalog=str(tmp_path / "catalog.sqlite"), time_limit=2.0,
                   trial=TrialOptions(warmup_steps=1, measure_steps=2), metric="accuracy")
    dione.optuna.optimize(study, build, n_trials=2, **options)
    ok, diverged = study.get_trials()
    assert ok.state == optuna.trial.TrialState.COMPLETE
    assert diverged.state == optuna.trial.TrialState.FAIL
    assert diverged.user_attrs["dione_error"].startswith(
        "under dione.optuna: a diverged trial is not trained again")
    dione.optuna.optimize(study, build, n_trials=2, retry_failed=True, **options)
    assert len(study.get_trials()) == 2


def test_a_trial_whose_task_changed_before_a_resume_stays_running(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """make_task edited for one trial between a stop and a resume: the run leaves that
    task as it was (its training kept), and the trial was failed for good, no reason
    kept (a regression review). It stays RUNNING, said, to resume once put back."""
    from dione.zoo import digits_accuracy

    study = optuna.create_study(direction="maximize")
    edited = False

    def build(trial: optuna.trial.Trial) -> dione.Task:
        lr = trial.suggest_float("lr", 1e-2, 2e-2)
        decay = 0.1 if edited and trial.number == 0 else 0.0
        adam = functools.partial(torch.optim.Adam, lr=lr, weight_decay=decay)
        return digits_task("digits", steps=12, techniques=("single",),
                           evaluate=digits_accuracy, optimizer=adam)

    def stop(event: Any) -> None:
        if event.kind == "slice_finished":
            raise KeyboardInterrupt

    run = {"report_every": 4, "metric": "accuracy", "run_dir": str(tmp_path / "run"),
           "devices": "cpu:2", "quiet": True, "catalog": str(tmp_path / "catalog.sqlite"),
           "trial": TrialOptions(warmup_steps=1, measure_steps=2)}
    with pytest.raises(KeyboardInterrupt):
        dione.optuna.optimize(study, build, n_trials=2, on_event=stop, **run)
    edited = True
    capsys.readouterr()
    with pytest.warns(UserWarning, match="trial-0: not trained this session"):
        dione.optuna.optimize(study, build, n_trials=2, **run)
    said = " ".join(capsys.readouterr().out.split())
    assert [t.state.name for t in study.trials] == ["RUNNING", "COMPLETE"]
    assert "trial 0 stays RUNNING, its training kept: task 'trial-0' was recorded" in said
    edited = False  # put back: it resumes and completes
    dione.optuna.optimize(study, build, n_trials=2, **run)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    # Changed again once told: a trial that ended is not said to stay RUNNING (review).
    edited = True
    capsys.readouterr()
    with pytest.warns(UserWarning):
        dione.optuna.optimize(study, build, n_trials=2, **run)
    assert "stays RUNNING" not in capsys.readouterr().out
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    # Another metric or cadence for the same study and run: refused before a trial is
    # asked (a resume by test_loss told losses beside accuracies, one objective: review).
    edited = False
    for changed in ({"metric": "test_loss"}, {"report_every": 3}):
        with pytest.raises(ValueError, match=r"were reported and told by metric='accuracy' "
                           r"report_every=4; this call gives"):
            dione.optuna.optimize(study, build, n_trials=3, **{**run, **changed})
    assert len(study.trials) == 2


class _Counted(torch.nn.Module):
    """The digits MLP counting its training steps in a buffer (checkpointed with it)."""

    def __init__(self) -> None:
        super().__init__()
        from dione.zoo import digits_mlp

        self.net = digits_mlp(hidden=32, depth=2)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.steps += 1
        return self.net(x)


def _fails_at_the_end(model: torch.nn.Module) -> dict[str, float]:
    from dione.zoo import digits_accuracy

    if int(model.steps) >= 8:
        raise RuntimeError("held-out data unavailable at the end")
    return digits_accuracy(model)


def test_a_trial_whose_last_evaluation_failed_says_why_in_the_study(tmp_path: Path) -> None:
    """Trained to its end, its last evaluation raising: the trial is told FAIL (Optuna's
    values are final) with why in dione_error and its weights kept; it was FAIL with no
    reason, "done" in dione (a review)."""
    import sys

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # _Counted
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.NopPruner())
    study.enqueue_trial({"lr": 0.01})

    def build(trial: optuna.trial.Trial) -> dione.Task:
        lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
        return digits_task("digits", steps=8, techniques=("single",), model=_Counted,
                           evaluate=_fails_at_the_end,
                           optimizer=functools.partial(torch.optim.Adam, lr=lr))

    with pytest.warns(UserWarning, match="evaluation at step 8 failed"):
        dione.optuna.optimize(study, build, n_trials=1, report_every=4, metric="accuracy",
                              run_dir=str(tmp_path / "run"), devices="cpu:2", quiet=True,
                              catalog=str(tmp_path / "catalog.sqlite"),
                              trial=TrialOptions(warmup_steps=1, measure_steps=2))
    (trial,) = study.get_trials()
    assert trial.state == optuna.trial.TrialState.FAIL and 4 in trial.intermediate_values
    why = trial.user_attrs["dione_error"]
    assert "its training ended and its weights are kept" in why, why
    assert "held-out data unavailable at the end" in why, why


def test_optuna_loads_errors_name_its_own_arguments() -> None:
    """dione.optuna.load says an export error's fixes as its own arguments; the export's
    texts changed (they name dione.load's beside the flags) and the rewrite missed them
    (a last read of the change)."""
    from dione.optuna import _in_own_words

    assert _in_own_words("task 't' names no keep_best metric; it keeps steps: 10, 12 "
                         "(--step; dione.load(..., step=))").endswith("12 (step=)")
    assert _in_own_words("its newest is at step 4: train it again to its end, or export "
                         "that one as it is (--step 4; --latest; dione.load(..., "
                         "latest=True))").endswith("as it is (step=4; latest=True)")
    assert _in_own_words("take its newest checkpoint as it is (--latest; dione.load(..., "
                         "latest=True))").endswith("(dione.optuna.load(..., latest=True))")


def test_a_rung_judged_again_is_not_reported_twice_to_the_study() -> None:
    """A resume judges again a rung whose report reached the study before a kill (its
    decision not recorded): Optuna warned the user of a step reported twice (a review).
    The first report stands and nothing is said."""
    import warnings

    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=0))
    trial = study.ask()
    rule = dione.optuna.OptunaPruning(study, {"t": trial}, report_every=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = rule.decide(3, 1.5, [], "t")
        again = rule.decide(3, 1.5, [], "t")
    assert first.stop == again.stop and study.trials[0].intermediate_values == {3: 1.5}
