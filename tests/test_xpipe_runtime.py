"""XPipe's runtime against a reference computed in one process, and its memory bounds.

The reference knows nothing of the runtime's loop, messages or interleaving: it walks
the mini-batches in order and runs each on the weights DESIGN.md says it sees. Stashed
(with or without prediction): mini-batch i runs on stage k on the copy taken when the
stage held version ``i - s`` (``s`` from the schedule), predicted ``s`` ahead or not.
Not stashed: micro-batch u's forward on stage k runs on the version the stage holds
when its list reaches F(u), and its backward on the version at B(u).
"""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.func import functional_call

from dione.launch import local_placement, run_slice
from dione.schedules import xpipe
from dione.schedules.messages import link_plan, unwaited_sends_peak
from dione.spec import Node
from dione.spec.task import Task
from dione.state import load_model_weights
from dione.techniques.batches import BatchSource
from dione.techniques.pipeline.gpipe import keep_stage
from dione.techniques.pipeline.partition import partition_model
from dione.techniques.pipeline.prediction import predict_weights
from helpers import digits_task

STEPS = 6
# One process against K, the same float32 operations in the same order per stage: the
# runs agree to a few ulps; Adam turns ulps in near-zero gradients into slightly larger
# parameter differences (see test_equivalence.py).
LOSS_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
PARAMETER_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
MODES = {"predicted": {}, "stashed": {"prediction": False},
         "current": {"prediction": False, "stashing": False}}


def small_task() -> Task:
    """Four layers (up to four stages), a batch every T in 1..4 divides."""
    from dione.zoo import digits_mlp
    return digits_task(steps=STEPS, batch_size=12,
                       model=functools.partial(digits_mlp, hidden=16, depth=3))


def reference(task: Task, stages: int, micro: int, mode: str
              ) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses per step and final parameters, mini-batch by mini-batch in one process."""
    torch.manual_seed(task.seed)
    whole = task.model()
    partition = partition_model(whole, stages, task.name)
    models = [keep_stage(copy.deepcopy(whole), partition, k) for k in range(stages)]
    params = [{n: p for n, p in m.named_parameters()} for m in models]
    optimizers = [task.optimizer(m.parameters()) for m in models]
    schedule = xpipe(stages, micro, STEPS)
    staleness = schedule.staleness()
    source = BatchSource(task.data(), task.batch_size, task.seed)
    history: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(stages)]
    stashed: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def version_reached(k: int) -> None:  # stage k now holds version len(history[k])
        version = len(history[k])
        history[k].append({n: p.detach().clone() for n, p in params[k].items()})
        for i in range(STEPS):
            if i - staleness[(i, k)] == version:
                s = staleness[(i, k)] if mode == "predicted" else 0
                stashed[(i, k)] = predict_weights(optimizers[k], params[k], s)

    def seen_at(k: int, kind: str, u: int) -> int:  # updates before F(u) or B(u) on k
        updates = 0
        for a in schedule.stages[k]:
            if a.kind == "U":
                updates += 1
            elif a.kind == kind and a.minibatch * micro + a.micro == u:  # type: ignore[operator]
                return updates
        raise AssertionError

    for k in range(stages):
        version_reached(k)
    losses = []
    for i in range(STEPS):
        inputs, target = source.global_batch(i)
        grads: list[dict[str, torch.Tensor]] = [{} for _ in range(stages)]
        micro_losses = []
        for j, (x, y) in enumerate(zip(inputs.chunk(micro), target.chunk(micro), strict=True)):
            u = i * micro + j
            if mode == "current":
                weights = [{n: w.clone().requires_grad_(True)
                            for n, w in history[k][seen_at(k, "F", u)].items()}
                           for k in range(stages)]
            else:
                weights = [stashed[(i, k)] for k in range(stages)]
            for k in range(stages):
                x = functional_call(models[k], weights[k], (x,))
            loss = task.loss(x, y)
            micro_losses.append(loss.detach())
            if mode == "current":  # the backward's weights: the version at B(u)
                with torch.no_grad():
                    for k in range(stages):
                        for n, w in weights[k].items():
                            w.data.copy_(history[k][seen_at(k, "B", u)][n])
            (loss / micro).backward()
            if mode == "current":
                for k in range(stages):
                    for n, w in weights[k].items():
                        assert w.grad is not None
                        grads[k][n] = grads[k][n] + w.grad if n in grads[k] else w.grad
        for k in range(stages):
            mine = grads[k] if mode == "current" else {
                n: w.grad for n, w in stashed.pop((i, k)).items()}
            for n, p in params[k].items():
                p.grad = mine[n]
            optimizers[k].step()
            optimizers[k].zero_grad(set_to_none=True)
            version_reached(k)
        losses.append(float(torch.stack(micro_losses).mean()))
    final = {}
    for k in range(stages):
        final.update({n: p.detach() for n, p in params[k].items()})
    return losses, final


def run(task: Task, stages: int, micro: int, mode: str, tmp_path: Path) -> Any:
    node = Node(f"n{stages}", stages, "cpu")
    return run_slice(replace(task, allow_inexact=True), "xpipe", tmp_path,
                     local_placement(node, list(range(stages))),
                     knobs={"micro_batches": micro, **MODES[mode]}, timeout=300)


def slow_if_deep(stages: int, micro: int, mode: str = "predicted") -> Any:
    marks = [pytest.mark.slow] if stages == 4 else []
    return pytest.param(stages, micro, mode, marks=marks, id=f"K{stages}-T{micro}-{mode}")


@pytest.mark.parametrize(
    ("stages", "micro", "mode"),
    [slow_if_deep(k, t) for k, t in [(2, 1), (2, 2), (3, 1), (3, 2), (3, 3), (4, 1), (4, 2),
                                     (4, 4)]]
    + [slow_if_deep(3, 1, "stashed"), slow_if_deep(3, 1, "current"),
       slow_if_deep(2, 2, "current"), slow_if_deep(4, 4, "current")],
)
def test_runs_match_the_reference_within_the_memory_bounds(stages: int, micro: int, mode: str,
                                                          tmp_path: Path) -> None:
    task = small_task()
    result = run(task, stages, micro, mode, tmp_path)
    losses, final = reference(task, stages, micro, mode)
    torch.testing.assert_close(torch.tensor(result.losses), torch.tensor(losses),
                               **LOSS_TOLERANCE)
    model = task.model()
    load_model_weights(result.checkpoint, model)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, final[name], **PARAMETER_TOLERANCE,
                                   msg=lambda m, name=name: f"{name}: {m}")

    schedule = xpipe(stages, micro, STEPS)
    # Weight copies alive between actions: one per mini-batch in flight on the stage, no
    # more (before issue 19, the copy of the last update lived on until the next one).
    copies = [schedule.minibatches_in_flight_peak(k) if mode != "current" else 0
              for k in range(stages)]
    assert result.extra["most_weight_copies"] == copies
    assert max(copies) <= math.ceil(stages / micro) + 1
    # Sends kept unwaited: what the plan keeps, within in-flight activations + 1 (before
    # issue 19: up to 12 x (peak + 1) sends, each header and data counted apart).
    unwaited = [unwaited_sends_peak(link_plan(schedule, k)) for k in range(stages)]
    assert result.extra["most_unwaited_sends"] == unwaited
    assert all(n <= schedule.in_flight_peak(k) + 1 for k, n in enumerate(unwaited))


def test_the_three_weight_modes_are_different_training() -> None:
    """The reference's ablations really differ, so matching them is not vacuous."""
    task = small_task()
    runs = {mode: reference(task, 3, 1, mode)[0] for mode in MODES}
    for a, b in [("predicted", "stashed"), ("stashed", "current"), ("predicted", "current")]:
        assert runs[a][0] == runs[b][0]  # the first mini-batch sees the initial weights
        assert runs[a][1:] != runs[b][1:], (a, b)


def test_no_stashing_refuses_prediction_and_its_log() -> None:
    from dione.techniques import get_technique
    technique = get_technique("xpipe")
    task = replace(small_task(), allow_inexact=True)
    assert technique.check(task, 2, {"prediction": False, "stashing": False}, "cpu") == []
    assert any("prediction=true needs stashing=true" in r
               for r in technique.check(task, 2, {"stashing": False}, "cpu"))
    assert any("log_prediction=true needs stashing=true" in r for r in technique.check(
        task, 2, {"prediction": False, "stashing": False, "log_prediction": True}, "cpu"))
