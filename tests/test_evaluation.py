"""Evaluation during training (``eval_every``): where it happens, that exact techniques
give single's numbers, and that predictions count its cost."""

from __future__ import annotations

import dataclasses

import pytest

from dione.orchestrate import RunOptions, run_workload
from dione.orchestrate.estimates import profile_problem
from dione.profile import Profile, TaskProfile, TrialOptions
from dione.profile.catalog import TrialRecord
from dione.profile.choice import choose_options
from dione.spec.cluster import Cluster, Node
from dione.spec.stopping import Asha
from dione.spec.validate import validate_workload
from dione.state.store import RunStore
from dione.zoo.digits import digits_accuracy
from helpers import digits_task

TECHNIQUES = ("single", "ddp", "fsdp", "gpipe")


def test_the_steps_a_task_evaluates_after() -> None:
    task = digits_task("t", steps=20, evaluate=digits_accuracy, eval_every=6)
    assert task.evaluation_steps(20) == [6, 12, 18, 20]
    ranked = digits_task("r", steps=20, evaluate=digits_accuracy,
                         stopping=Asha(metric="accuracy", mode="max", min_steps=5, eta=2))
    assert ranked.evaluation_steps(20) == [5, 10, 20]  # its rungs, and the end
    assert digits_task("n", steps=20).evaluation_steps(20) == []  # nothing to evaluate
    said = " ".join(str(p) for p in validate_workload([
        digits_task("a", steps=20, eval_every=5),
        digits_task("b", steps=20, evaluate=digits_accuracy, eval_every=0)]))
    assert "give evaluate, or leave eval_every out" in said
    assert "must be a whole number of steps >= 1" in said


def test_each_evaluation_is_counted_in_the_planners_seconds() -> None:
    trials = [TrialRecord("s", "single", {"accumulation": 1}, 1, "cpu", "ok",
                          step_seconds=0.01, fixed_seconds=1.0)]
    profiles = [TaskProfile(name, "g", 20, options=choose_options(trials, 20),
                            trials=trials, evaluation_seconds=0.5, evaluations=count)
                for name, count in (("once", 1), ("four", 4))]
    problem = profile_problem(Profile(Cluster([Node("n", 1, "cpu")]), profiles))
    once, four = (problem.task(n).options[0].seconds for n in ("once", "four"))
    assert four - once == pytest.approx(3 * 0.5)


def test_each_slice_end_a_task_forces_is_counted_in_the_planners_seconds() -> None:
    """A rule judged every step ended a slice at each (120 slices for two tasks of 60
    steps), and the plan counted one slice's start: it predicted 0.5 s of an 8.7 s run.
    Each slice that must end on the way (its evaluations and rungs before its end) now
    costs a resumed slice's start."""
    from dione.spec.stopping import Median

    every = digits_task("m", steps=20, stopping=Median(min_steps=1))
    assert every.slice_ends(20) == list(range(1, 20))
    evaluated = digits_task("e", steps=20, evaluate=digits_accuracy, eval_every=6,
                            stopping=Asha(min_steps=5, eta=2))
    assert evaluated.slice_ends(20) == [5, 6, 10, 12, 18]  # rungs and evaluations
    assert digits_task("n", steps=20).slice_ends(20) == []
    trials = [TrialRecord("s", "single", {"accumulation": 1}, 1, "cpu", "ok",
                          step_seconds=0.01, fixed_seconds=1.0, load_seconds=0.25)]
    profiles = [TaskProfile(name, "g", 20, options=choose_options(trials, 20),
                            trials=trials, evaluations=0, restarts=count)
                for name, count in (("whole", 0), ("cut", 19))]
    problem = profile_problem(Profile(Cluster([Node("n", 1, "cpu")]), profiles))
    whole, cut = (problem.task(n).options[0].seconds for n in ("whole", "cut"))
    assert cut - whole == pytest.approx(19 * (1.0 + 0.25))


def test_exact_techniques_evaluate_as_single_at_every_point(tmp_path) -> None:
    """One task four times, each trained by one technique on two devices' worth of
    cluster: the evaluations at steps 4, 8 and 12 agree with single's."""
    tasks = [digits_task(f"by-{t}", steps=12, evaluate=digits_accuracy, eval_every=4,
                         techniques=(t,)) for t in TECHNIQUES]
    run_dir = tmp_path / "run"
    result = run_workload(tasks, Cluster([Node("n", 2, "cpu")]), run_dir,
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), time_limit=5.0,
                                     trial=TrialOptions(warmup_steps=1, measure_steps=2)))
    assert [t.status for t in result.tasks] == ["done"] * len(TECHNIQUES)
    with RunStore(run_dir) as store:
        found = {t: store.evaluations(f"by-{t}")["accuracy"] for t in TECHNIQUES}
        for t in TECHNIQUES:
            slices = [s for s in store.slices(f"by-{t}") if s.status == "done"]
            assert {s.technique for s in slices} == {t}
            assert {s.end_step for s in slices} >= {4, 8, 12}  # a slice ends at each
    assert [step for step, _ in found["single"]] == [4, 8, 12]
    # The result carries each task's history, as Optuna's intermediate values (a notebook
    # read the store's SQLite for it).
    for t in TECHNIQUES:
        history = result.task(f"by-{t}")
        assert history.evaluations["accuracy"] == found[t], t
        assert [step for step, _ in history.losses] == list(range(1, 13)), t
        assert history.losses[-1][1] == history.final_loss, t
    # Read from the run directory when asked: one moved away is said, not read as no
    # history (it returned [] silently: review).
    gone = dataclasses.replace(result.task("by-single"), run_dir=tmp_path / "moved")
    with pytest.raises(FileNotFoundError, match="holds no run store now"):
        gone.losses  # noqa: B018 (the property reads)
    for t in TECHNIQUES[1:]:
        assert [step for step, _ in found[t]] == [4, 8, 12], t
        # Accuracy over the 360 held-out digits: reduction order may move at most one
        # prediction across a tie (1/360), and has not moved any here.
        assert [v for _, v in found[t]] == pytest.approx(
            [v for _, v in found["single"]], abs=1 / 360 + 1e-9), t


LIVE = """
import functools
import random
import numpy
import torch
from dione import Task, Workload
from dione.zoo import CharGPT, sequence_cross_entropy, text_train, text_validation_loss


def evaluate(model):
    # The live model still holds the last step's gradients; one loaded from a
    # checkpoint has none: which one was evaluated shows in the result.
    held = any(p.grad is not None for p in model.parameters())
    # A draw: it starts from the task's seed, whatever the training drew before.
    # fsdp's live model holds only its shards: its weights are DTensors.
    sharded = any(type(p).__name__ == "DTensor" for p in model.parameters())
    return {**text_validation_loss(model, context=16, limit=64), "grads": float(held),
            "sharded": float(sharded), "draw": float(torch.rand(())),
            "numpy_draw": float(numpy.random.rand()), "python_draw": random.random()}


workload = Workload([Task(
    name="live", model=functools.partial(CharGPT, context=16, width=16, layers=1, heads=2),
    data=functools.partial(text_train, 16), loss=sequence_cross_entropy,
    optimizer=functools.partial(torch.optim.AdamW, lr=3e-3), batch_size=8, steps=4, seed=2,
    evaluate=evaluate)])
"""


@pytest.mark.parametrize(("technique", "live"), [
    # 1f1b shares gpipe's training loop and its evaluation: gpipe stands for both.
    ("single", True), ("ddp", True), ("fsdp", True), ("gpipe", False), ("xpipe", False)])
def test_every_technique_evaluates_its_live_model_as_its_checkpoint_would(
        tmp_path, technique: str, live: bool) -> None:
    """Each technique evaluates the model it has just trained, with no checkpoint round
    trip (single and ddp the whole model on rank 0, fsdp its sharded model on every
    rank together, each still holding the last step's gradients; a pipeline's stages
    put together on rank 0 in memory, into a fresh model with none), and gets the
    numbers a fresh model loaded from the slice's checkpoint gets, bit for bit; a random
    draw inside the evaluation starts from the task's seed under every technique."""
    import random

    import numpy
    import torch

    from dione.launch import local_placement, run_slice
    from dione.spec.workload import load_workload
    from dione.techniques.evaluate import evaluate_checkpoint
    from helpers import TEST_NODE

    file = tmp_path / "live.py"
    file.write_text(LIVE)
    [task] = list(load_workload(file))
    if technique == "xpipe":  # trained on predicted weights: the task's opt-in
        task = dataclasses.replace(task, allow_inexact=True)
    devices = [0] if technique == "single" else [0, 1]
    result = run_slice(task, technique, tmp_path / "run", local_placement(TEST_NODE, devices),
                       evaluate=True, timeout=300)
    assert result.evaluation_error is None
    assert result.evaluation["grads"] == float(live)
    assert result.evaluation["sharded"] == float(technique == "fsdp")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the worker's slot ran it
    try:
        again = evaluate_checkpoint(task, result.checkpoint, torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert again["grads"] == again["sharded"] == 0.0
    assert result.evaluation["val_loss"] == again["val_loss"]
    torch.manual_seed(task.seed)
    assert result.evaluation["draw"] == again["draw"] == float(torch.rand(()))
    # NumPy's and Python's too (only torch's were seeded: an evaluation sampling with
    # NumPy gave other numbers under fsdp and after a resume under another technique,
    # numbers a stopping rule judges: a review).
    from dione.spec.draws import seeded_draws

    with seeded_draws() as seed_all:
        seed_all(task.seed)
        drawn = {"numpy_draw": float(numpy.random.rand()), "python_draw": random.random()}
    for name, value in drawn.items():
        assert result.evaluation[name] == again[name] == value, name


FROM_WEIGHTS = """
import functools
import torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train


def norm(model):  # read from the weights, as a sweep logs a weight norm
    return {"norm": sum(float(p.detach().pow(2).sum()) for p in model.parameters())}


def used(model):  # a weight used as a plain tensor (under fsdp, a DTensor)
    first = next(model.parameters())
    return {"used": float((torch.ones(1, first.shape[1]) @ first.T).sum())}


def task(name, evaluate):
    return Task(name=name, model=functools.partial(digits_mlp, hidden=16, depth=1),
                data=digits_train, loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=16,
                steps=3, evaluate=evaluate)


workload = Workload([task("norm", norm), task("used", used)])
"""


def test_an_evaluation_read_from_fsdps_weights_gives_single_numbers(tmp_path) -> None:
    """fsdp evaluates its sharded model on every rank: a weight norm read each rank's
    shard (rank 0's half of each weight, recorded as the task's metric with no word),
    and a weight used as a plain tensor raised under fsdp only (review). Where the
    ranks disagree or evaluate raises there, the whole model is put together on rank 0
    and evaluated as single's is: the numbers of the checkpoint's model."""
    import torch

    from dione.launch import local_placement, run_slice
    from dione.spec.workload import load_workload
    from dione.techniques.evaluate import evaluate_checkpoint
    from helpers import TEST_NODE

    file = tmp_path / "weights.py"
    file.write_text(FROM_WEIGHTS)
    for task in load_workload(file):
        result = run_slice(task, "fsdp", tmp_path / task.name,
                           local_placement(TEST_NODE, [0, 1]), evaluate=True, timeout=300)
        assert result.evaluation_error is None, result.evaluation_error
        again = evaluate_checkpoint(task, result.checkpoint, torch.device("cpu"))
        assert result.evaluation == pytest.approx(again, rel=1e-6), task.name


def test_ranks_whose_metrics_differ_by_rounding_decide_alike(tmp_path) -> None:
    """Metrics within rounding of rank 0's on one rank and not on another: each rank
    compared the others with its own, under a tolerance, so rank 1 kept its numbers
    while ranks 0 and 2 gathered the whole model, a collective rank 1 never joined,
    and the gang hung to its timeout (a regression review). Every rank now judges rank
    0's answer against each, alike."""
    from dione.launch import local_placement, run_slice
    from dione.spec.workload import load_workload
    from helpers import THREE

    file = tmp_path / "rounding.py"
    file.write_text(FROM_WEIGHTS.replace(
        'workload = Workload([task("norm", norm), task("used", used)])',
        "def by_rank(model):  # 1.0 on rank 0, as the whole model there gives\n"
        "    import torch.distributed as dist\n"
        "    return {'m': 1.0 + 9e-6 * (dist.get_rank() if dist.is_initialized() else 0)}\n"
        "\n\nworkload = Workload([task('rounding', by_rank)])"))
    [task] = list(load_workload(file))
    task = dataclasses.replace(task, batch_size=18)  # three shares
    result = run_slice(task, "fsdp", tmp_path / "run", local_placement(THREE, [0, 1, 2]),
                       evaluate=True, timeout=120)
    assert result.evaluation_error is None and result.evaluation == {"m": 1.0}


def test_an_evaluation_that_fails_under_fsdp_keeps_the_training(tmp_path) -> None:
    """An evaluation raising on every rank of fsdp's gang (after a forward through the
    sharded model, so after collectives) ends the slice with its checkpoint and the
    error, not a hung gang."""
    from dione.launch import local_placement, run_slice
    from dione.spec.workload import load_workload
    from helpers import TEST_NODE

    file = tmp_path / "broken.py"
    broken = '''def broken(model):
    model(torch.zeros(1, 16, dtype=torch.long))
    raise ValueError("no held-out split")


workload = '''
    file.write_text(LIVE.replace("evaluate=evaluate)", "evaluate=broken)")
                    .replace("workload = ", broken))
    [task] = list(load_workload(file))
    result = run_slice(task, "fsdp", tmp_path / "run", local_placement(TEST_NODE, [0, 1]),
                       evaluate=True, timeout=300)
    assert result.checkpoint is not None and len(result.losses) == task.steps
    assert result.evaluation == {}
    assert "ValueError: no held-out split" in (result.evaluation_error or "")


UNJUDGEABLE = """
import functools
import os
import torch
from dione import Asha, Task, Workload
from dione.zoo import digits_mlp, digits_train
from dione.zoo.digits import digits_accuracy


def broken(model):
    raise RuntimeError("no held-out split")


def broken_later(model):  # fine in its profiling trial, broken once the test says so
    if os.path.exists(os.path.join(os.path.dirname(__file__), "broken-now")):
        raise RuntimeError("the held-out split went away")
    return digits_accuracy(model)


def overflowed(model):  # a perplexity beside the judged metric: inf early in a sweep
    return {**digits_accuracy(model), "ppl": float("inf")}


def diverged(model):  # the judged metric itself: a loser, not a broken evaluate
    return {"accuracy": float("nan")}


def task(name, **extra):
    return Task(name=name, model=functools.partial(digits_mlp, hidden=16, depth=1),
                data=digits_train, loss=torch.nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.Adam, lr=1e-2), batch_size=16,
                steps=12, techniques=("single",), **extra)


workload = Workload([
    # A metric its evaluate does not return ('accuracy' and 'test_loss' are).
    task("typo", evaluate=digits_accuracy, stopping=Asha(metric="acc", mode="max",
                                                         min_steps=6, eta=2)),
    task("raises", evaluate=broken, stopping=Asha(metric="accuracy", mode="max",
                                                  min_steps=6, eta=2)),
    task("later", evaluate=broken_later, stopping=Asha(metric="accuracy", mode="max",
                                                       min_steps=6, eta=2)),
    task("noted", evaluate=broken, eval_every=6),  # no rule judges it
    task("good", evaluate=digits_accuracy, stopping=Asha(metric="accuracy", mode="max",
                                                         min_steps=6, eta=2)),
    task("overflow", evaluate=overflowed, stopping=Asha(metric="accuracy", mode="max",
                                                        min_steps=6, eta=2)),
    task("nan", evaluate=diverged, stopping=Asha(metric="accuracy", mode="max",
                                                 min_steps=6, eta=2)),
])
"""


def test_a_rule_that_cannot_judge_fails_its_task_and_a_failed_evaluation_is_said(
        tmp_path, capsys) -> None:
    """A stopping rule whose metric the evaluation did not return (a name it does not
    return, or an evaluation that raised) fails its task with the reason and the fix,
    instead of stopping it for a NaN; an evaluation that fails with no rule on it is said
    as it happens and in the report, and the task trains on; the others are untouched."""
    from dione.orchestrate.options import RunEvent
    from dione.report import write_report
    from dione.spec.workload import load_workload
    from helpers import TEST_NODE

    file = tmp_path / "unjudgeable.py"
    file.write_text(UNJUDGEABLE)
    events: list[RunEvent] = []

    def heard(event: RunEvent) -> None:  # "later"'s evaluate breaks once it trains
        events.append(event)
        if event.kind == "slice_started" and event.task == "later":
            (tmp_path / "broken-now").touch()

    result = run_workload(list(load_workload(file)), Cluster([TEST_NODE]), tmp_path / "run",
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), time_limit=5.0,
                                     trial=TrialOptions(warmup_steps=1, measure_steps=2)),
                          on_event=heard)
    statuses = {t.task: t.status for t in result.tasks}
    # A metric that is not finite is a loser's, not a broken evaluate's: one beside the
    # judged metric is left out (it failed the task), the judged one stops its task.
    assert statuses == {"typo": "failed", "raises": "failed", "later": "failed",
                        "noted": "done", "good": "done", "overflow": "done", "nan": "stopped"}
    with RunStore(tmp_path / "run") as store:
        typo, raises = store.task("typo").error, store.task("raises").error
        later = store.task("later").error
        judged = {d[0] for d in store.decisions()}
        assert not judged & {"typo", "raises", "later"}  # never judged
        # An evaluate that raised in its profiling trial, under a rule judging what it
        # returns: failed before training (it trained to its first rung to fail there).
        assert store.slices("raises") == []
        assert "ppl" not in store.evaluations("overflow")
        assert [d[4] for d in store.decisions() if d[0] == "nan"] == [
            "accuracy is nan at step 6"]
        assert store.evaluations("nan") == {}
    # A metric its evaluate lacks is named by the profiling trial, before any training
    # (it trained to its first rung, then failed).
    assert ("its stopping rule judges 'acc', which its evaluate does not return (it "
            "returned 'accuracy', 'test_loss' in its profiling trial)") in typo
    with RunStore(tmp_path / "run") as store:
        assert store.slices("typo") == []
    assert raises == (
        "its evaluate raised RuntimeError: no held-out split in its profiling trial, and its "
        "stopping rule judges 'accuracy' from it, so no rung could judge the task: fix "
        "evaluate, then resume (nothing was trained)")
    assert ("judges 'accuracy' at step 6, but its evaluation there failed: RuntimeError: "
            "the held-out split went away") in later
    from dione.cli.views import print_results
    from dione.state.summaries import figure

    capsys.readouterr()
    print_results(result, tmp_path / "run")  # `dione run`'s closing table says it too
    closing = " ".join(capsys.readouterr().out.split())
    assert "evaluation failed: noted: RuntimeError: no held-out split" in closing
    assert "overflow: evaluated at step 6, ppl is inf (not recorded)" in [
        e.message for e in events if e.kind == "evaluation_not_finite"]
    failed = [e.message for e in events if e.kind == "evaluation_failed"]
    assert "noted: its evaluation at step 6 failed (its training stands): RuntimeError: " \
        "no held-out split" in failed
    summary = (write_report(tmp_path / "run") / "summary.md").read_text()
    assert "## Evaluations that failed" in summary
    # An evaluation with no finite metric is a failed one, said where failures are: it
    # read as never evaluated everywhere (a review); one finite metric stands.
    assert "- nan at step 6: evaluate returned accuracy = nan, not finite, so not " \
        "recorded" in summary
    assert "- overflow at step" not in summary
    # The run's result ranks as the report does (a sweep's best without parsing it).
    board = summary.split("## Leaderboard by accuracy")[1].split("\n\n")[1]
    ranked = [row.split(" | ")[1] for row in board.splitlines()[2:] if row.startswith("| ")]
    assert [t.task for t in result.leaderboard("accuracy")] == ranked
    assert len(ranked) >= 2 and result.best("accuracy") == result.task(ranked[0])
    # ... and the closing lines name it (a 48-task grid's table, in grid order, did not).
    best = result.task(ranked[0])
    assert f"best by accuracy (higher is better): {ranked[0]} " \
        f"{figure(best.evaluation['accuracy'])}" in closing, closing
    with pytest.raises(ValueError, match=r"no task of run .* has a value of 'acc'; its "
                       r"metrics: accuracy, test_loss"):
        result.best("acc")
    # From the result itself: a run directory moved since ranks the same, and is not
    # made again where it was (review: a store was created there, and nothing ranked).
    moved = dataclasses.replace(result, run_dir=tmp_path / "moved")
    assert moved.leaderboard("accuracy") == result.leaderboard("accuracy")
    assert not (tmp_path / "moved").exists()
    assert "- noted at step 6: RuntimeError: no held-out split" in summary
    assert "- noted at step 12: RuntimeError: no held-out split" in summary
    # Every evaluation with its step (metrics.csv has the losses only).
    rows = (tmp_path / "run" / "report" / "evaluations.csv").read_text().splitlines()
    assert rows[0] == "task,step,metric,value,simulated"
    with RunStore(tmp_path / "run") as store:
        good = store.evaluations("good")
    assert sorted(good) == ["accuracy", "test_loss"] and [s for s, _ in good["accuracy"]] \
        == [6, 12]
    assert f"good,6,accuracy,{good['accuracy'][0][1]!r},false" in rows
    assert sum(r.startswith("good,") for r in rows) == 4
    timeline = (tmp_path / "run" / "report" / "timeline.csv").read_text()
    assert "evaluation failed: RuntimeError: no held-out split" in timeline

    # Fixed (the metric's name, the evaluation) and resumed: the typo's rung is judged
    # from the accuracy its evaluation did record there; the one whose evaluation raised
    # trains its stretch to the rung again and is judged there, as the others were (it
    # went on unjudged; a waiting rule would have ranked its NaN last).
    file.write_text(UNJUDGEABLE.replace('metric="acc"', 'metric="accuracy"')
                    .replace('task("raises", evaluate=broken', 'task("raises", '
                             'evaluate=digits_accuracy'))
    (tmp_path / "broken-now").unlink()
    events.clear()
    again = run_workload(list(load_workload(file)), Cluster([TEST_NODE]), tmp_path / "run",
                         RunOptions(catalog=str(tmp_path / "catalog.sqlite"), time_limit=5.0,
                                    trial=TrialOptions(warmup_steps=1, measure_steps=2)),
                         on_event=events.append)
    retrained = {e.task for e in events if e.kind == "rung_retrained"}
    assert retrained == {"later"}, [e.message for e in events]
    assert {t.task: t.status for t in again.tasks}["typo"] in ("done", "stopped")
    with RunStore(tmp_path / "run") as store:
        for name in ("typo", "raises", "later"):
            assert [d[1] for d in store.decisions() if d[0] == name][:1] == [6], name
            assert store.evaluation(name).get("accuracy") is not None
        again_from = [s.start_step for s in store.slices("later")][1]
        assert again_from == 0  # its only checkpoint was the rung's: from the start
        assert store.slices("raises")[0].start_step == 0


def test_an_evaluate_that_fails_in_its_profiling_trial_is_said_before_training(
        tmp_path) -> None:
    """Said first where the task evaluated (for a task with no eval_every, after all its
    training); its training goes on, as a failed evaluation's does."""
    from dione.orchestrate.options import RunEvent
    from dione.spec.workload import load_workload
    from helpers import TEST_NODE

    file = tmp_path / "noted.py"
    # The same functions, one task whose evaluate raises and no rule judges it.
    file.write_text(UNJUDGEABLE.split("workload = ")[0]
                    + 'workload = Workload([task("alone", evaluate=broken)])\n')
    events: list[RunEvent] = []
    result = run_workload(list(load_workload(file)), Cluster([TEST_NODE]), tmp_path / "run",
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), time_limit=5.0,
                                     trial=TrialOptions(warmup_steps=1, measure_steps=2)),
                          on_event=events.append)
    assert [(t.task, t.status) for t in result.tasks] == [("alone", "done")]
    said = [e.message for e in events if e.kind == "evaluation_failed"]
    assert said[0] == ("alone: its evaluation failed in its profiling trial (RuntimeError: "
                       "no held-out split): it will fail where the task evaluates, its "
                       "training kept; fix evaluate, then `dione evaluate RUN_DIR` (from "
                       "Python: dione.evaluate(run_dir)) once the "
                       "run ended records it at the task's end (one at a rung is not run "
                       "again: stop and resume before it)"), said
    kinds = [e.kind for e in events]
    assert kinds.index("evaluation_failed") < kinds.index("slice_started")


def test_a_metric_the_catalogs_evaluation_did_not_return_is_said_before_training(
        tmp_path) -> None:
    """Where the catalog knows the evaluation's cost, no trial runs it: a rule's metric
    or keep_best it does not return was found only at the task's first rung (or never).
    The names it returned when it was timed are kept beside its cost; where they lack
    the metric, the evaluation runs once again in profiling (evaluate may have changed
    since), and a metric it still lacks fails the task before it trains (a warning
    trained a whole sweep to its first rung on a typo: review)."""
    from dione.orchestrate.options import RunEvent
    from helpers import TEST_NODE

    options = RunOptions(catalog=str(tmp_path / "catalog.sqlite"), time_limit=5.0,
                         trial=TrialOptions(warmup_steps=1, measure_steps=2))
    first = run_workload([digits_task("first", steps=8, evaluate=digits_accuracy)],
                         Cluster([TEST_NODE]), tmp_path / "first", options)
    assert [t.status for t in first.tasks] == ["done"]
    events: list[RunEvent] = []
    second = run_workload([digits_task(f"second-{i}", steps=8, evaluate=digits_accuracy,
                                       eval_every=4, keep_best="acc", keep_best_mode="max")
                           for i in range(2)],
                          Cluster([TEST_NODE]), tmp_path / "second", options,
                          on_event=events.append)
    assert [t.status for t in second.tasks] == ["failed"] * 2
    assert [t.steps for t in second.tasks] == [0, 0]
    assert second.tasks[0].error == (
        "keep_best names 'acc', which its evaluate does not return (it returned "
        "'accuracy', 'test_loss' in its profiling trial): name one of those, or return it "
        "from evaluate, then resume (nothing was trained)")
    # One run of the evaluation for both (one evaluate function), none of its steps kept.
    assert [e.kind for e in events].count("slice_started") == 0
    with RunStore(tmp_path / "second") as store:
        assert store.slices() == []


def test_an_evaluate_that_returns_no_dict_of_numbers_is_named() -> None:
    """It read "TypeError: 'float' object is not iterable" from dione's own code."""
    import torch

    from dione.techniques.evaluate import evaluate_model

    for returned, said in ((0.5, "returned float 0.5: it must return a dict of metric "
                                 "names to numbers"),
                           ({"acc": "high"}, "returned 'acc': 'high', which is not a number"),
                           # float() takes these: a rule ranked a flag, and a formatted
                           # "0.500" passed where "50.0%" failed mid-run (a review).
                           ({"acc": "0.5"}, "returned 'acc': '0.5', which is not a number"),
                           ({"ok": True}, "returned 'ok': True, which is not a number"),
                           ({"ok": torch.tensor(True)}, "returned 'ok': tensor\\(True\\), "
                            "which is not a number")):
        task = dataclasses.replace(digits_task("e"), evaluate=lambda model, r=returned: r)
        with pytest.raises(TypeError, match=said):
            evaluate_model(task, task.model())
    task = dataclasses.replace(digits_task("e"),
                               evaluate=lambda model: {"a": torch.tensor(0.5), "b": 2})
    assert evaluate_model(task, task.model()) == {"a": 0.5, "b": 2.0}


def test_dione_evaluate_records_a_fixed_evaluation_of_a_finished_task(
        tmp_path, capsys) -> None:
    """A final evaluation that failed stayed failed: resume does not evaluate a done
    task again, and the advice was to load the model and evaluate it by hand (the
    leaderboard and report never had it). `dione evaluate` runs the fixed evaluate on
    the final weights and records it as the run would have."""
    from dione.cli import main
    from dione.spec.workload import load_workload
    from helpers import TEST_NODE

    head = UNJUDGEABLE.split("workload = ")[0]
    broken_file, fixed_file = tmp_path / "broken.py", tmp_path / "fixed.py"
    broken_file.write_text(head + 'workload = Workload([task("alone", evaluate=broken), '
                           'task("fine", evaluate=digits_accuracy), task("plain")])\n')
    fixed_file.write_text(head + 'workload = Workload([task("alone", evaluate=digits_accuracy'
                          '), task("fine", evaluate=digits_accuracy), task("plain")])\n')
    run_dir = tmp_path / "run"
    result = run_workload(list(load_workload(broken_file)), Cluster([TEST_NODE]), run_dir,
                          RunOptions(catalog=str(tmp_path / "catalog.sqlite"), time_limit=5.0,
                                     trial=TrialOptions(warmup_steps=1, measure_steps=2)))
    assert [t.status for t in result.tasks] == ["done"] * 3
    with RunStore(run_dir) as store:
        assert store.task("alone").error.startswith("evaluation failed")
        fine = store.evaluation("fine")
    from dione.report import write_report

    assert "evaluation failed" in (write_report(run_dir) / "summary.csv").read_text()
    assert "## Evaluations that failed" in (run_dir / "report" / "summary.md").read_text()
    with RunStore(run_dir) as store:
        heard = store.last_heard()
    capsys.readouterr()
    # Still broken: said, exit 1, nothing recorded; "fine" has its evaluation already.
    assert main(["evaluate", str(run_dir), "--workload", str(broken_file)]) == 1
    out, err = capsys.readouterr()
    assert "evaluation failed: alone: RuntimeError: no held-out split" in err
    assert "fine" not in out and "0 of 1 task(s) evaluated" in out
    with RunStore(run_dir) as store:
        assert store.task("alone").error.startswith("evaluation failed")
        assert store.evaluations("alone") == {}
    assert main(["evaluate", str(run_dir), "--workload", str(fixed_file)]) == 0
    out, _ = capsys.readouterr()
    assert "alone at step 12: accuracy" in out and "1 of 1 task(s) evaluated" in out
    with RunStore(run_dir) as store:
        assert store.task("alone").error is None
        assert set(store.evaluations("alone")) == {"accuracy", "test_loss"}
        assert [s for s, _ in store.evaluations("alone")["accuracy"]] == [12]
    summary = (run_dir / "report" / "summary.csv").read_text()
    assert "evaluation failed" not in summary
    # The report agrees with itself, and no time moved: a killed run's slices end
    # where the store last heard it (a review saw one run on to the evaluate's time).
    assert "## Evaluations that failed" not in (run_dir / "report" / "summary.md").read_text()
    with RunStore(run_dir) as store:
        assert store.last_heard() == heard
    # Nothing left to evaluate; a task named is evaluated again, as the run did.
    assert main(["evaluate", str(run_dir), "--workload", str(fixed_file)]) == 0
    assert "every done task" in capsys.readouterr().out
    assert main(["evaluate", str(run_dir), "fine", "--workload", str(fixed_file)]) == 0
    with RunStore(run_dir) as store:
        assert store.evaluation("fine") == fine
    # From Python the same: a task named, its result said.
    import dione

    again = dione.evaluate(run_dir, "alone", workload=fixed_file)
    assert [(r.task, r.step, r.error) for r in again] == [("alone", 12, None)]
    with RunStore(run_dir) as store:
        assert store.evaluation("alone") == again[0].evaluation
    # A metric that is not finite is kept out, the one recorded before left.
    nan_file = tmp_path / "nan.py"
    nan_file.write_text(head + 'workload = Workload([task("fine", evaluate=diverged)])\n')
    assert main(["evaluate", str(run_dir), "fine", "--workload", str(nan_file)]) == 0
    out = capsys.readouterr().out
    assert "(accuracy nan: not finite, not recorded)" in out and "gave no finite" in out
    with RunStore(run_dir) as store:
        assert store.evaluation("fine") == fine
    # One named task with nothing to evaluate: none is evaluated (not half of them).
    assert main(["evaluate", str(run_dir), "fine", "plain", "--workload",
                 str(fixed_file)]) == 2
    assert "task(s) 'plain' have no evaluate" in capsys.readouterr().err
    assert main(["evaluate", str(run_dir), "plain", "nobody", "--workload",
                 str(fixed_file)]) == 2
    assert "the run has no task 'nobody'" in capsys.readouterr().err
    # A read-only copy of the run: said, exit 2 (a traceback from the lock before).
    from helpers import read_only

    with read_only(run_dir) as archived:
        assert main(["evaluate", str(archived), "alone", "--workload", str(fixed_file)]) == 2
        err = capsys.readouterr().err
        assert "cannot record evaluations in" in err and "copy it somewhere writable" in err
        assert "Traceback" not in err
    # A run a launcher trains now: said first ("every done task has its evaluation", or
    # "resume the run", of one that runs, before).
    from dione.state.lock import RunLock

    with RunLock(run_dir):
        assert main(["evaluate", str(run_dir), "--workload", str(fixed_file)]) == 2
        assert "is being trained now by a dione launcher" in capsys.readouterr().err


HUNG = '''
import functools, os, time, torch
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train


def hangs(model):
    with open("PIDFILE", "w") as said:  # for a test to kill it by
        said.write(str(os.getpid()))
    time.sleep(3600)
    return {"never": 1.0}


workload = Workload([Task(name="h", model=functools.partial(digits_mlp, hidden=16, depth=1),
                          data=digits_train, loss=torch.nn.functional.cross_entropy,
                          optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
                          batch_size=16, steps=4, evaluate=hangs)])
'''


def test_an_evaluate_that_hangs_keeps_the_training_it_follows(tmp_path) -> None:
    """An evaluate that never returns, its gang stopped by the slice's timeout: the
    slice had trained and saved, and that stands (it was thrown away, the slice trained
    again from its start three times, and no message named the evaluation: review);
    the evaluation is recorded failed, naming the hang and `dione evaluate`."""
    from dione.launch import local_placement, run_slice
    from dione.spec.workload import load_workload
    from helpers import TEST_NODE

    file = tmp_path / "hung.py"
    pid_file = tmp_path / "evaluating.pid"
    file.write_text(HUNG.replace("PIDFILE", str(pid_file)))
    [task] = list(load_workload(file))
    run_dir = tmp_path / "run"
    result = run_slice(task, "ddp", run_dir, local_placement(TEST_NODE, [0, 1]),
                       evaluate=True, timeout=12)
    assert result.end_step == 4 and result.checkpoint is not None and len(result.losses) == 4
    assert result.evaluation == {}
    assert result.evaluation_error.startswith(
        "its evaluate did not return: stopped by the slice's timeout of 12 s; the slice had "
        "trained and saved step 4, which is kept")
    assert f"dione evaluate {run_dir} h" in result.evaluation_error
    with RunStore(run_dir) as store:
        [record] = store.slices()
        assert record.status == "done" and record.end_step == 4
        assert store.latest_checkpoint("h").step == 4
        assert store.task("h").status == "done"
        assert store.task("h").error.startswith("evaluation failed")
        # Its time is the training's, to the checkpoint, not the hang's after it, and
        # so is the task's in the results table, `dione status` and the report.
        assert record.timings["wall"] == record.timings["saved"]
        from dione.state.summaries import summaries

        [summary] = summaries(store)
        assert summary.seconds == record.timings["wall"] < record.ended_at - record.started_at
    # Ctrl-C in the evaluation: the stop goes on, the training it followed recorded (a
    # resume found the task untrained and trained the slice again: review).
    import threading
    import time

    from dione.launch.local import GangInterrupted
    from dione.orchestrate.records import Cancel

    cancel = Cancel()
    stopped = tmp_path / "stopped"

    def stop_once_saved() -> None:
        while not list(stopped.glob("checkpoints/h/step-00000004/digests.json")):
            time.sleep(0.2)
        time.sleep(2.0)  # the "trained" message on its way
        cancel.reason = "interrupted by the user"
        cancel.set()

    threading.Thread(target=stop_once_saved, daemon=True).start()
    with pytest.raises(GangInterrupted):
        run_slice(task, "single", stopped, local_placement(TEST_NODE, [0]), timeout=300,
                  cancel=cancel)
    with RunStore(stopped) as store:
        assert [s.status for s in store.slices()] == ["done"]
        assert store.latest_checkpoint("h").step == 4
        assert "its evaluation was cut short by the run's stop; the slice had trained and " \
            "saved step 4, which is kept" in store.task("h").error
    # Its process killed in the evaluation, no timeout given (the message needed one,
    # and a TypeError threw the training away: review).
    import os
    import signal

    pid_file.unlink(missing_ok=True)

    def kill_once_evaluating() -> None:
        while not pid_file.exists() or not pid_file.read_text():
            time.sleep(0.2)
        time.sleep(1.0)
        os.kill(int(pid_file.read_text()), signal.SIGKILL)

    threading.Thread(target=kill_once_evaluating, daemon=True).start()
    killed = run_slice(task, "single", tmp_path / "killed", local_placement(TEST_NODE, [0]),
                       evaluate=True)
    assert killed.evaluation_error.startswith(
        "its evaluate did not return: its process was killed; the slice had trained and "
        "saved step 4")
    # An evaluate that calls sys.exit: its process ends, not said as returned (it was,
    # and the slice failed, its training thrown away: review).
    exits = tmp_path / "exits.py"
    exits.write_text(HUNG.replace("PIDFILE", str(tmp_path / "exits.pid"))
                     .replace("time.sleep(3600)", "raise SystemExit(3)"))
    [leaves] = list(load_workload(exits))
    left = run_slice(leaves, "single", tmp_path / "exited", local_placement(TEST_NODE, [0]),
                     evaluate=True)
    assert left.checkpoint is not None and left.evaluation == {}
    assert left.evaluation_error.startswith("its evaluate did not return: ")
    # A profiling trial's evaluation that hangs times the trial out, as before: kept as a
    # finished slice, the hang was cached as the option's start-up (300 s a slice).
    from dione.launch.slice import SliceError, TrialProbe

    # Its message says so: it was told to raise its timeout (a review).
    with pytest.raises(SliceError, match=r"ran past its timeout.*it had trained: it ran "
                       "out of time in the task's evaluate, which the trial times too"):
        run_slice(task, "single", tmp_path / "trial", local_placement(TEST_NODE, [0]),
                  timeout=10, trial=TrialProbe(evaluate=True))
