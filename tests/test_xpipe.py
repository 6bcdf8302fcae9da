"""XPipe: its schedule and version accounting, weight prediction, and real runs."""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

import pytest
import torch
from torch import nn

from dione.launch import local_placement, run_slice
from dione.schedules import StageTimes, gpipe, simulate, xpipe
from dione.schedules.messages import link_plan, unwaited_sends_peak
from dione.spec import Node
from dione.state import load_model_weights
from dione.techniques import get_technique
from dione.techniques.pipeline.prediction import (
    future_rates,
    predict_weights,
    prediction_problem,
    scheduler_problem,
)
from helpers import TEST_NODE, char_task, check_real_timeline, digits_task

TWO = [0, 1]


def test_schedule_and_staleness_follow_the_design_example() -> None:
    """DESIGN.md: K = 2, T = 2; stage 0's bellwether F2 starts before U0 (s = 1),
    stage 1's after it (s = 0)."""
    schedule = xpipe(2, 2, 2)
    assert schedule.text() == ("stage 0: F0 F1 B0 F2 B1 U0 F3 B2 B3 U1\n"
                               "stage 1: F0 B0 F1 B1 U0 F2 B2 F3 B3 U1")
    assert schedule.staleness() == {(0, 0): 0, (1, 0): 1, (0, 1): 0, (1, 1): 0}


def test_deeper_pipelines_are_staler_and_more_micro_batches_fresher() -> None:
    def steady(stages: int, micro: int) -> list[int]:
        found = xpipe(stages, micro, 12).staleness()
        return [found[(10, k)] for k in range(stages)]

    assert steady(4, 1) == [3, 2, 1, 0]  # stage k: K-k-1 updates behind
    assert steady(4, 4) == [1, 1, 1, 0]
    assert steady(2, 4) == [1, 0]
    assert all(a >= b for a, b in zip(steady(4, 1), steady(4, 4), strict=True))


def test_no_flush_means_no_bubble_in_steady_state() -> None:
    stages, micro, minibatches = 4, 4, 16
    times = StageTimes.uniform(stages, 1.0, 2.0)
    asynchronous = simulate(xpipe(stages, micro, minibatches), times)
    synchronous = simulate(gpipe(stages, micro, minibatches), times)
    # Only the fill and drain of the whole slice are idle: (K-1) of (n*T + K-1) slots.
    assert asynchronous.makespan == pytest.approx((minibatches * micro + stages - 1) * 3.0)
    assert synchronous.makespan == pytest.approx(minibatches * (micro + stages - 1) * 3.0)
    assert asynchronous.bubble_fraction < 0.05 < synchronous.bubble_fraction
    # Stage 0 holds at most K micro-batches in flight, as in 1F1B.
    assert max(xpipe(stages, micro, minibatches).in_flight_peak(k)
               for k in range(stages)) == stages


@pytest.mark.parametrize(
    ("factory", "first", "then", "steps"),
    [
        # betas 0: the moments are the last gradient, so the same gradient again makes
        # the optimizer's next steps exactly the predicted ones.
        (functools.partial(torch.optim.Adam, lr=0.1, betas=(0.0, 0.0)),
         [0.3, -0.2, 1.0], [0.3, -0.2, 1.0], 2),
        (functools.partial(torch.optim.AdamW, lr=0.1, betas=(0.0, 0.0), weight_decay=0.5),
         [0.3, -0.2, 1.0], [0.3, -0.2, 1.0], 1),
        # SGD, momentum 0.75: a first gradient g leaves buffer g; then gradients of
        # (1 - 0.75) * g keep the buffer, so every step is lr * buffer.
        (functools.partial(torch.optim.SGD, lr=0.1, momentum=0.75),
         [1.6, -3.2, 0.8], [0.4, -0.8, 0.2], 3),
        # maximize: torch negates the gradient before it enters the moments and the
        # momentum buffer, so the step direction needs no second negation (issue 19:
        # Adam from [1.1, -2.1, 0.6] was predicted at [1.0, -2.0, 0.5], reached [1.4, ...]).
        (functools.partial(torch.optim.Adam, lr=0.1, betas=(0.0, 0.0), maximize=True),
         [0.3, -0.2, 1.0], [0.3, -0.2, 1.0], 2),
        (functools.partial(torch.optim.AdamW, lr=0.1, betas=(0.0, 0.0), weight_decay=0.5,
                           maximize=True),
         [0.3, -0.2, 1.0], [0.3, -0.2, 1.0], 1),
        (functools.partial(torch.optim.SGD, lr=0.1, momentum=0.75, maximize=True),
         [1.6, -3.2, 0.8], [0.4, -0.8, 0.2], 3),
    ],
    ids=["adam", "adamw-decoupled-decay", "sgd-momentum", "adam-maximize",
         "adamw-maximize", "sgd-momentum-maximize"],
)
def test_prediction_is_the_optimizers_own_next_steps(factory, first, then, steps) -> None:
    param = nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    optimizer = factory([param])
    param.grad = torch.tensor(first)
    optimizer.step()
    predicted = predict_weights(optimizer, {"w": param}, steps)["w"]
    for _ in range(steps):
        param.grad = torch.tensor(then)
        optimizer.step()
    torch.testing.assert_close(predicted, param.detach())
    assert predicted.requires_grad and predicted.is_leaf


@pytest.mark.parametrize(
    "scheduler",
    [functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5),
     functools.partial(torch.optim.lr_scheduler.LambdaLR, lr_lambda=lambda t: 1 / (1 + t)),
     functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=5)],
    ids=["step", "lambda", "cosine"],
)
def test_prediction_takes_the_rates_the_scheduler_will_set(scheduler) -> None:
    """SGD, momentum 0.75, with the buffer held constant (as above): every step is
    lr_t * buffer, so the prediction over 3 steps is exact only at the scheduler's own
    rates for them; the current rate three times (the old rule) is not."""
    param = nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))
    optimizer = torch.optim.SGD([param], lr=0.1, momentum=0.75)
    schedule = scheduler(optimizer)
    param.grad = torch.tensor([1.6, -3.2, 0.8])
    optimizer.step()
    schedule.step()
    state = schedule.state_dict()
    rates = future_rates(optimizer, schedule, scheduler, 3)
    predicted = predict_weights(optimizer, {"w": param}, 3, rates)["w"]
    at_current = predict_weights(optimizer, {"w": param}, 3)["w"]
    assert schedule.state_dict() == state  # foreseeing the rates did not step it
    for _ in range(3):
        param.grad = torch.tensor([0.4, -0.8, 0.2])
        optimizer.step()
        schedule.step()
    torch.testing.assert_close(predicted, param.detach())
    assert not torch.allclose(at_current, param.detach())


def test_nesterov_and_a_scheduler_that_needs_a_metric_are_refused() -> None:
    params = [nn.Parameter(torch.ones(2))]
    nesterov = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True)
    assert "Nesterov" in str(prediction_problem(nesterov))
    plateau = functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, patience=1)
    assert "prediction=false" in str(scheduler_problem(
        torch.optim.Adam(params), plateau))  # type: ignore[arg-type]
    task = digits_task(optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9,
                                                   nesterov=True), allow_inexact=True)
    assert any("Nesterov" in r for r in get_technique("xpipe").check(task, 2, {}, "cpu"))


def test_parameters_the_optimizer_leaves_out_stay_under_xpipe(tmp_path: Path) -> None:
    """An optimizer over some of the model's parameters (the biases left out, so never
    updated): xpipe trains the rest, as single does, and leaves those alone."""
    task = digits_task(steps=4, allow_inexact=True, optimizer=lambda params: torch.optim.Adam(
        [p for p in params if p.dim() > 1], lr=1e-2))
    result = run_slice(task, "xpipe", tmp_path, local_placement(TEST_NODE, TWO),
                       knobs={"micro_batches": 2})
    assert len(result.losses) == 4
    torch.manual_seed(task.seed)  # the initial weights, as every technique builds them
    initial, trained = task.model(), task.model()
    load_model_weights(result.checkpoint, trained)
    for name, value in trained.named_parameters():
        changed = not torch.equal(value, initial.get_parameter(name))
        assert changed == (value.dim() > 1), name


def test_prediction_before_any_step_keeps_the_weights() -> None:
    param = nn.Parameter(torch.ones(3))
    predicted = predict_weights(torch.optim.Adam([param]), {"w": param}, 5)["w"]
    assert torch.equal(predicted, param.detach()) and predicted is not param


def test_optimizers_without_a_rule_are_named() -> None:
    params = [nn.Parameter(torch.ones(2))]
    assert prediction_problem(torch.optim.Adam(params)) is None
    assert prediction_problem(torch.optim.SGD(params, lr=0.1, momentum=0.9)) is None
    assert "SGD without momentum" in str(prediction_problem(torch.optim.SGD(params, lr=0.1)))
    assert "not Adagrad; set the xpipe knob prediction=false" in str(
        prediction_problem(torch.optim.Adagrad(params)))
    task = digits_task(optimizer=functools.partial(torch.optim.Adagrad, lr=0.1),
                       allow_inexact=True)
    technique = get_technique("xpipe")
    assert any("not Adagrad" in r for r in technique.check(task, 2, {}, "cpu"))
    assert technique.check(task, 2, {"prediction": False}, "cpu") == []


def test_real_run_uses_the_versions_the_schedule_says(tmp_path: Path) -> None:
    steps, micro = 6, 2
    task = char_task(steps=steps, allow_inexact=True)
    result = run_slice(task, "xpipe", tmp_path, local_placement(TEST_NODE, TWO),
                       knobs={"micro_batches": micro})
    staleness = xpipe(2, micro, steps).staleness()
    for stage, logged in enumerate(result.extra["versions"]):
        assert [i for i, _, _ in logged] == list(range(steps))
        for i, version, s in logged:
            assert i - version == s == staleness[(i, stage)]
    # The first mini-batch sees the initial weights everywhere: single's first loss.
    single = run_slice(char_task(steps=1), "single", tmp_path / "single",
                       local_placement(TEST_NODE, [0]))
    assert result.losses[0] == pytest.approx(single.losses[0], rel=1e-5)
    check_real_timeline(get_technique("xpipe").real_timeline(result.extra, steps))


def test_sends_are_waited_on_in_a_long_deep_pipeline(tmp_path: Path) -> None:
    # Three stages, the middle one sending both ways, hundreds of sends per stage: the
    # unwaited sends (and their buffers) stay at the plan's few, however long the slice,
    # and waiting on them never stalls the gang.
    steps, micro = 30, 2
    three = Node("three", 3, "cpu")
    task = digits_task(steps=steps, allow_inexact=True)
    result = run_slice(task, "xpipe", tmp_path, local_placement(three, [0, 1, 2]),
                       knobs={"micro_batches": micro}, timeout=300)
    assert len(result.losses) == steps
    schedule = xpipe(3, micro, steps)
    kept = [unwaited_sends_peak(link_plan(schedule, k)) for k in range(3)]
    assert result.extra["most_unwaited_sends"] == kept == [3, 2, 1]


@pytest.mark.parametrize(
    "optimizer",
    [functools.partial(torch.optim.Adam, lr=3e-3),
     functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)],
    ids=["adam", "sgd-momentum"],
)
def test_prediction_lands_closer_than_stale_weights(optimizer, tmp_path: Path) -> None:
    """Mean of |W_hat - W_target| / |W_stale - W_target| over every update with s > 0."""
    task = char_task(steps=16, optimizer=optimizer, allow_inexact=True)
    result = run_slice(task, "xpipe", tmp_path, local_placement(TEST_NODE, TWO),
                       knobs={"micro_batches": 1, "log_prediction": True})
    ratios = [hat / stale for stage in result.extra["prediction"] for _, _, hat, stale in stage
              if stale > 0]
    assert len(ratios) >= 10
    assert statistics.mean(ratios) < 1


def test_an_xpipe_checkpoint_resumes_under_any_technique(tmp_path: Path) -> None:
    task = char_task(steps=6, allow_inexact=True)
    first = run_slice(task, "xpipe", tmp_path, local_placement(TEST_NODE, TWO), steps=3,
                      knobs={"prediction": False})
    assert (first.start_step, first.end_step) == (0, 3)
    rest = run_slice(task, "single", tmp_path, local_placement(TEST_NODE, [0]))
    assert (rest.start_step, rest.end_step) == (3, 6)
    assert rest.losses[-1] < first.losses[0]
