"""A task's best evaluated checkpoint (``keep_best``): kept beside the newest ones while
the run prunes the rest, and what ``dione export --best`` / ``--step`` and
``dione.load(best=..., step=...)`` give."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import dione
from dione.launch import local_placement, run_slice
from dione.profile.results import TrialEvaluation, evaluation_mistake, remembered_mistake
from dione.spec.stopping import Asha
from dione.spec.validate import keep_best_doubts, training_loss_doubt, validate_workload
from dione.spec.workload import load_workload
from dione.state.export import ExportError, best_kept
from dione.state.store import RunStore
from dione.zoo.digits import digits_accuracy
from helpers import TEST_NODE, digits_task, final_parameters, in_process

# How far the weights moved from where they started: lower is better, and it grows as
# the task trains, so its best evaluation is its first, whose checkpoint the run would
# otherwise prune (it keeps the newest two).
DRIFTING = """
import functools
import torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

model = functools.partial(digits_mlp, hidden=16, depth=1)


def drift(trained):
    torch.manual_seed(3)  # the task's seed: the weights it started from
    start = model().state_dict()
    return {"drift": sum(float((v - start[k]).norm()) for k, v in trained.state_dict().items())}


def task(name, **extra):
    return Task(name=name, model=model, data=digits_train,
                loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=16,
                steps=12, seed=3, evaluate=drift, eval_every=2, techniques=("single",),
                **extra)


workload = Workload([task("kept", keep_best="drift", keep_best_mode="min"), task("plain")])
"""


def _equal(one: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> bool:
    return one.keys() == other.keys() and all(torch.equal(one[k], other[k]) for k in one)


def test_the_best_evaluation_keeps_its_checkpoint_and_is_what_export_gives(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "drifting.py"
    file.write_text(DRIFTING)
    run = tmp_path / "run"
    status, out, err = in_process(capsys, "run", str(file), "--out", str(run),
                                  "--catalog", str(tmp_path / "catalog.sqlite"))
    assert status == 0, out + err
    said = " ".join(out.split())
    assert "best checkpoints kept (keep_best): kept at step 2; `dione export" in said
    assert "TASK --best -o DIR` writes one" in said
    status, out, err = in_process(capsys, "status", str(run))  # by the store alone
    assert status == 0, out + err
    assert "best checkpoints kept (keep_best): kept at step 2; `dione export" in " ".join(
        out.split())
    with RunStore(run) as store:
        assert [t.status for t in store.tasks()] == ["done", "done"]
        drift = dict(store.evaluations("kept")["drift"])
        kept = {t: [c.step for c in store.checkpoints(t)] for t in ("kept", "plain")}
        paths = {c.step: c.path for c in store.checkpoints("kept")}
    assert sorted(drift) == [2, 4, 6, 8, 10, 12]
    best = min(drift, key=lambda s: drift[s])
    assert best == 2 and drift[2] < min(drift[s] for s in drift if s != 2)
    assert kept == {"kept": [2, 10, 12], "plain": [10, 12]}  # the newest two, and the best
    assert sorted(p.name for p in (run / "checkpoints" / "kept").iterdir()) == [
        "step-00000002", "step-00000010", "step-00000012"]
    summary = (run / "report" / "summary.md").read_text()
    kept_section = summary.split("## Best checkpoints kept (keep_best)")[1].split("##")[0]
    assert [line.split(" ")[1] for line in kept_section.splitlines()
            if line.startswith("- ")] == ["kept:"]  # plain keeps none for being best
    assert "at step 2 (lowest)" in kept_section

    workload = load_workload(file)
    task = workload.task("kept")
    result = dione.run(workload, run_dir=str(run), quiet=True,  # finished: nothing trains
                       catalog=str(tmp_path / "catalog.sqlite"))
    assert [(t.best_step, t.best_checkpoint) for t in result.tasks] == [(2, paths[2]),
                                                                        (None, None)]
    assert _equal(dione.load(run, "kept", best=True).state_dict(), final_parameters(task, paths[2]))
    assert _equal(dione.load(run, "kept", step=10).state_dict(), final_parameters(task, paths[10]))
    assert _equal(dione.load(run, "kept").state_dict(), final_parameters(task, paths[12]))

    status, out, err = in_process(capsys, "export", str(run), "kept", "-o",
                                  str(tmp_path / "best"), "--best")
    assert status == 0, out + err
    said = json.loads((tmp_path / "best" / "dione.json").read_text())
    assert said["step"] == 2 and said["evaluation"] == {"drift": drift[2]}
    assert said["chosen"] == {"by": "best", "metric": "drift", "mode": "min", "value": drift[2]}
    assert said["run"]["status"] == "done"

    # What cannot be given says why, and what can.
    status, out, err = in_process(capsys, "export", str(run), "kept", "-o",
                                  str(tmp_path / "four"), "--step", "4")
    assert status != 0
    assert "keeps no checkpoint at step 4; it keeps steps: 2, 10, 12" in out + err
    status, out, err = in_process(capsys, "export", str(run), "plain", "-o",
                                  str(tmp_path / "plain"), "--best")
    assert status != 0
    assert "names no keep_best metric" in out + err and "it keeps steps: 10, 12 (--step; " \
        "dione.load(..., step=))" in out + err
    with pytest.raises(ValueError, match="one of latest, best and step"):
        dione.load(run, "kept", best=True, step=2)
    with pytest.raises(ValueError, match="step must be 1 or more"):
        dione.load(run, "kept", step=0)
    assert not (tmp_path / "four").exists() and not (tmp_path / "plain").exists()


def test_keep_best_is_checked_before_anything_trains() -> None:
    said = " ".join(str(p) for p in validate_workload([
        digits_task("no-evaluate", keep_best="accuracy"),
        digits_task("no-direction", evaluate=digits_accuracy, keep_best="score"),
        digits_task("bad-mode", evaluate=digits_accuracy, keep_best="accuracy",
                    keep_best_mode="up"),
        digits_task("mode-alone", evaluate=digits_accuracy, keep_best_mode="max"),
    ]))
    assert "no-evaluate" in said and "which the task does not define: give evaluate" in said
    assert "'score' does not say whether lower or higher is better: is it spelt as " \
           "evaluate returns it (`dione validate` runs evaluate to see)? If so, give " \
           "keep_best_mode='min' or 'max'" in said
    assert "must be 'min' (lower is better), 'max' or None, not 'up'" in said
    assert "keep_best is not given" in said
    # A typo of the rule's metric: the name is the fix (a mode moved the failure on).
    typo = validate_workload([digits_task("typo", evaluate=digits_accuracy,
                                          keep_best="acuracy", stopping=Asha(
                                              metric="accuracy", mode="max", min_steps=4))])
    assert "'acuracy' does not say whether lower or higher is better: did you mean " \
        "'accuracy', the stopping rule's metric? Else give keep_best_mode" in \
        " ".join(str(p) for p in typo)
    fine = [digits_task("by-name", evaluate=digits_accuracy, keep_best="accuracy"),
            digits_task("by-rule", evaluate=digits_accuracy, keep_best="score",
                        stopping=Asha(metric="score", mode="max", min_steps=4))]
    assert validate_workload(fine) == []
    assert [t.best_mode() for t in fine] == ["max", "max"]
    assert digits_task("min", keep_best="score", keep_best_mode="min").best_mode() == "min"


def test_validate_says_a_misspelt_keep_best_is_misspelt_not_that_it_needs_a_mode() -> None:
    # Told to give keep_best_mode, a user did, and only then heard the name was wrong
    # (a review): validation runs evaluate, so it says so at once.
    found = dione.validate([digits_task("typo", evaluate=digits_accuracy, keep_best="acuracy"),
                            digits_task("unknown", evaluate=digits_accuracy,
                                        keep_best="score")], devices="cpu:1")
    said = {p.task: p.message for p in found.problems}
    assert said["typo"].startswith(
        "keep_best names 'acuracy', which its evaluate does not return (it returned "
        "'accuracy', 'test_loss' on its untrained model): did you mean 'accuracy'?"), said
    assert "score" in said["unknown"] and "not return" in said["unknown"], said
    # A name evaluate does return, whose direction nothing says: the mode is the fix.
    named = dione.validate([digits_task("named", evaluate=_scored, keep_best="score")],
                           devices="cpu:1")
    assert [p.message for p in named.problems] == [
        "its name 'score' does not say whether lower or higher is better, and evaluate "
        "returns it: give keep_best_mode='min' or 'max'"]


def _scored(model: object) -> dict[str, float]:
    return {"score": 1.0}


def test_a_keep_best_metric_evaluate_does_not_return_is_named_from_its_trial() -> None:
    task = digits_task("t", evaluate=digits_accuracy, keep_best="acuracy")
    mistake = evaluation_mistake(task, TrialEvaluation(0.1, ("accuracy",), None))
    assert mistake is not None and mistake.startswith(
        "keep_best names 'acuracy', which its evaluate does not return (it returned "
        "'accuracy' in its profiling trial)")
    assert evaluation_mistake(task, TrialEvaluation(0.1, ("acuracy",), None)) is None


# A score the test sets before each slice: the best moves, ties, and falls back.
SCORED = """
import functools
from pathlib import Path
import torch
from dione import Asha, Task, Workload
from dione.zoo import digits_mlp, digits_train

SCORE = Path(%r)


def scored(model):
    return {"score": float(SCORE.read_text())}


def task(name, **extra):
    return Task(name=name, model=functools.partial(digits_mlp, hidden=16, depth=1),
                data=digits_train, loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=16,
                steps=16, seed=1, evaluate=scored, **extra)


# Its direction from its rule (the name says neither way).
workload = Workload([task("moving", keep_best="score",
                          stopping=Asha(metric="score", mode="max", min_steps=2)),
                     task("misnamed", keep_best="acc", keep_best_mode="max")])
"""


def test_the_best_moves_as_it_is_overtaken_and_the_direction_is_the_one_pruned_by(
        tmp_path: Path) -> None:
    score = tmp_path / "score"
    file = tmp_path / "scored.py"
    file.write_text(SCORED % str(score))
    moving, misnamed = load_workload(file)
    run = tmp_path / "run"
    placement = local_placement(TEST_NODE, [0])
    kept_after: list[list[int]] = []
    # Steps 2..16; 0.95 twice: the later is best. A best outside the newest two is kept,
    # and goes once overtaken.
    for value in (0.5, 0.9, 0.7, 0.6, 0.95, 0.95, 0.2, 0.1):
        score.write_text(str(value))
        result = run_slice(moving, "single", run, placement, steps=2, evaluate_at_end=True)
        assert result.evaluation == {"score": value}
        with RunStore(run) as store:
            kept_after.append([c.step for c in store.checkpoints("moving")])
    assert kept_after == [[2], [2, 4], [4, 6], [4, 6, 8], [8, 10], [10, 12], [12, 14],
                          [12, 14, 16]]
    with RunStore(run) as store:
        assert store.keep_best("moving") == ("score", "max")
        paths = {c.step: c.path for c in store.checkpoints("moving")}
    # Exported by what the run pruned by, whatever the workload says now.
    turned = dataclasses.replace(moving, stopping=None, keep_best_mode="min")
    assert _equal(dione.load(run, "moving", workload=[turned], best=True).state_dict(),
                  final_parameters(moving, paths[12]))
    # The best's checkpoint set aside (as a corrupt one is): said, not another given.
    with RunStore(run) as store:
        store.forget_checkpoints("moving", [paths[12]])
        why = best_kept(store, "moving", (None, None))
    assert why == ("has its best score (0.95 at step 12) in no checkpoint it keeps (pruned "
                   "before keep_best named 'score', or set aside as corrupt); the best it "
                   "keeps is 0.2, at step 14")
    with pytest.raises(ExportError, match="it keeps steps: 14, 16"):
        dione.load(run, "moving", workload=[moving], best=True)

    # A keep_best its evaluate does not return: said at the slice's end, nothing spared.
    score.write_text("0.5")
    result = run_slice(misnamed, "single", run, placement, steps=2, evaluate_at_end=True)
    assert result.doubts == ["misnamed: keep_best names 'acc', which its evaluate did not "
                             "return at step 2 (it returned 'score'): no checkpoint is kept "
                             "for being best; name one of those"]
    with RunStore(run) as store:
        assert best_kept(store, "misnamed", (None, None)) == (
            "has no value of 'acc' (keep_best) recorded: its evaluate did not return it, or "
            "returned NaN or inf each time (recorded: 'score')")
    # keep_best removed on resume: pruned by none since, whatever an older workload says.
    run_slice(dataclasses.replace(misnamed, keep_best=None, keep_best_mode=None), "single",
              run, placement, steps=2, evaluate_at_end=True)
    with RunStore(run) as store:
        assert store.keep_best("misnamed") == (None, None)
        assert best_kept(store, "misnamed", ("acc", "max")).startswith(
            "had its keep_best removed")


def test_what_keep_best_may_not_do_is_said() -> None:
    only_at_end = digits_task("end", evaluate=digits_accuracy, keep_best="accuracy")
    assert keep_best_doubts(only_at_end) == [
        "keep_best='accuracy' keeps nothing but its last checkpoint: the task evaluates "
        "only at its end; give eval_every (or a stopping rule on that metric)"]
    turned = digits_task("turned", evaluate=digits_accuracy, eval_every=4,
                         keep_best="test_loss", keep_best_mode="max")
    assert keep_best_doubts(turned) == [
        "keep_best_mode='max' keeps the checkpoint where 'test_loss' was highest, but a "
        "lower test_loss is usually better: set keep_best_mode='min' if so"]
    # Ray Tune's and Lightning's habit (monitor="loss"): said before anything runs.
    training = dataclasses.replace(turned, keep_best="loss", keep_best_mode=None)
    assert keep_best_doubts(training) == []  # a run checks what evaluate returns
    assert [training_loss_doubt(training)] == [
        "keep_best='loss' ranks what evaluate returns as 'loss', not the training loss (a "
        "stopping rule's metric='loss'): unless evaluate returns 'loss', name the held-out "
        "metric it returns (keep_best='test_loss')"]
    one = digits_task("one", evaluate=digits_accuracy, keep_best="acc",
                      stopping=Asha(metric="acc", mode="max", min_steps=4))
    two = dataclasses.replace(one, keep_best="f1")
    returned = TrialEvaluation(0.1, ("accuracy",), None)
    assert str(evaluation_mistake(one, returned)).startswith(
        "its stopping rule judges 'acc' and keep_best names it, which its evaluate does not "
        "return (it returned 'accuracy' in its profiling trial)")
    assert str(evaluation_mistake(two, returned)).startswith(
        "its stopping rule judges 'acc' and keep_best names 'f1', neither of which its "
        "evaluate returns")
    # The fix names both places (it said "as the rule's metric" alone: review).
    assert "name one of those as the rule's metric and keep_best, or return it" in str(
        evaluation_mistake(two, returned))
    assert str(remembered_mistake(two, ("accuracy",))).endswith(
        "if it still does, the rule fails the task at its first rung and keep_best keeps "
        "nothing; stop, fix it and resume (`--reprofile` runs it again)")
