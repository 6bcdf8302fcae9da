"""XPipe's weight prediction: the weights a stage will hold ``s`` updates from now.

``W_hat = W - lr * s * d``, where ``d`` is the step the optimizer would apply now, read
from its own state (Guan et al. 2019, "XPipe", Sec. 3.2):

- Adam / AdamW: ``d = m_hat / (sqrt(v_hat) + eps)`` with the bias corrections of the
  current step count (``max_exp_avg_sq`` under amsgrad), plus ``weight_decay * W`` when
  the decay is decoupled (AdamW). Adam's own L2 decay is inside the moments already.
- SGD with momentum: ``d`` = the momentum buffer (weight decay and dampening are in it).

``maximize=True`` needs nothing more: torch negates the gradient before it enters the
moments or the buffer, so ``d`` already points the way the optimizer will step.

A learning-rate scheduler changes the rate within the horizon: the ``s`` steps are then
taken at the rates it will set for them, ``W_hat = W - (lr_0 + ... + lr_{s-1}) * d``
(``future_rates``), read off a copy of the scheduler stepped ahead on a stand-in
optimizer, so any scheduler the task's factory builds is foreseen as it will run.

Before the optimizer's first step there is no state, hence no direction: the weights
are predicted to stay (``W_hat = W``); a parameter the optimizer does not update is
predicted to stay too. What cannot be predicted is refused at check time, naming the
way out (``prediction=false``): an optimizer without a rule; SGD with Nesterov momentum,
whose step adds the next gradient itself to the buffer's look-ahead (``g + momentum *
buf``), which no state holds; a scheduler whose copy cannot be stepped ahead (one that
needs a metric to step).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["PredictionError", "future_rates", "predict_weights", "prediction_problem",
           "scheduler_problem", "step_direction"]

SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class PredictionError(ValueError):
    """An optimizer whose next step dione cannot predict."""


def prediction_problem(optimizer: torch.optim.Optimizer) -> str | None:
    """Why weights under ``optimizer`` cannot be predicted (None: they can)."""
    if isinstance(optimizer, torch.optim.Adam):  # AdamW is an Adam
        return None
    if isinstance(optimizer, torch.optim.SGD):
        if any(group.get("nesterov") for group in optimizer.param_groups):
            return ("SGD with Nesterov momentum steps along the next gradient plus the "
                    "momentum buffer's look-ahead, and no state holds the next gradient; "
                    "use plain momentum (nesterov=False), or set the xpipe knob "
                    "prediction=false (weight stashing, no prediction)")
        if all(group["momentum"] > 0 for group in optimizer.param_groups):
            return None
        return ("SGD without momentum keeps no state to predict its next step from; give "
                "it momentum, or set the xpipe knob prediction=false (weight stashing, no "
                "prediction)")
    return (f"xpipe predicts weights for Adam, AdamW and SGD with momentum, not "
            f"{type(optimizer).__name__}; set the xpipe knob prediction=false (weight "
            "stashing, no prediction) or use one of those")


def _stand_in(optimizer: torch.optim.Optimizer, factory: SchedulerFactory,
              scheduler: Any) -> tuple[torch.optim.Optimizer, Any]:
    """An optimizer with ``optimizer``'s groups over one tiny tensor each, and a copy of
    ``scheduler`` (built by ``factory``, its state loaded) driving it."""
    groups = [{**{k: v for k, v in g.items() if k != "params"},
               "params": [torch.zeros(1, requires_grad=True)]}
              for g in optimizer.param_groups]
    shadow = torch.optim.SGD(groups, lr=float(optimizer.param_groups[0]["lr"]))
    copy = factory(shadow)
    copy.load_state_dict(scheduler.state_dict())
    for mine, theirs in zip(shadow.param_groups, optimizer.param_groups, strict=True):
        mine["lr"] = theirs["lr"]  # building the copy stepped it once: back to now
    return shadow, copy


def future_rates(optimizer: torch.optim.Optimizer, scheduler: Any,
                 factory: SchedulerFactory | None, steps: int) -> list[list[float]]:
    """Per parameter group, the learning rates of the optimizer's next ``steps`` updates:
    the current one, then each one the scheduler will set (without a scheduler, the
    current one throughout). The scheduler itself is not touched."""
    rates = [[float(g["lr"])] for g in optimizer.param_groups]
    if scheduler is None or factory is None or steps <= 1:
        return [r * max(steps, 0) for r in rates]
    shadow, copy = _stand_in(optimizer, factory, scheduler)
    with warnings.catch_warnings():
        # The copy steps a stand-in optimizer that never steps: torch's warning that
        # the scheduler stepped first would blame the user's code, which is right.
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        for _ in range(steps - 1):
            copy.step()
            for rate, group in zip(rates, shadow.param_groups, strict=True):
                rate.append(float(group["lr"]))
    return rates


def scheduler_problem(optimizer: torch.optim.Optimizer, factory: SchedulerFactory
                      ) -> str | None:
    """Why the rates ``factory``'s scheduler will set for ``optimizer`` cannot be
    foreseen (None: they can)."""
    try:
        future_rates(optimizer, factory(optimizer), factory, 2)
    except Exception as err:
        return ("xpipe predicts weights at the rates the learning-rate scheduler will set, "
                f"stepping a copy of it ahead, which fails here ({type(err).__name__}: "
                f"{err}); set the xpipe knob prediction=false (weight stashing, no "
                "prediction)")
    return None


def step_direction(optimizer: torch.optim.Optimizer, group: Mapping[str, Any],
                   param: torch.Tensor) -> torch.Tensor | None:
    """The direction ``d`` of the optimizer's next step for ``param`` (None: unknown yet)."""
    state = optimizer.state.get(param, {})
    direction: torch.Tensor
    if isinstance(optimizer, torch.optim.Adam):
        if "exp_avg" not in state:
            return None
        step = float(state["step"])
        beta1, beta2 = group["betas"]
        m_hat = state["exp_avg"] / (1 - beta1**step)
        second = state["max_exp_avg_sq"] if group["amsgrad"] else state["exp_avg_sq"]
        v_hat = second / (1 - beta2**step)
        direction = m_hat / (v_hat.sqrt() + group["eps"])
        decoupled = isinstance(optimizer, torch.optim.AdamW) or group.get(
            "decoupled_weight_decay", False)
        if decoupled and group["weight_decay"]:
            direction = direction + group["weight_decay"] * param.detach()
    elif isinstance(optimizer, torch.optim.SGD):
        buffer = state.get("momentum_buffer")
        if buffer is None:
            return None
        direction = buffer
    else:
        raise PredictionError(prediction_problem(optimizer) or "no prediction rule")
    # No sign flip for ``maximize``: torch negates the gradient before it enters the
    # moments and the momentum buffer, and then steps along -lr * d as usual.
    return direction


def predict_weights(optimizer: torch.optim.Optimizer, params: Mapping[str, nn.Parameter],
                    steps: int, rates: Sequence[Sequence[float]] | None = None
                    ) -> dict[str, torch.Tensor]:
    """Fresh leaf tensors (requiring grad) holding each parameter ``steps`` updates ahead,
    each update at its group's rate in ``rates`` (``future_rates``; default: the current
    rate); ``steps`` = 0 gives a plain copy, and so does a parameter the optimizer does
    not update. The real parameters are not touched."""
    group_index = {id(p): i for i, g in enumerate(optimizer.param_groups)
                   for p in g["params"]}
    predicted = {}
    with torch.no_grad():
        for name, param in params.items():
            index = group_index.get(id(param))
            direction = None
            if steps and index is not None:
                direction = step_direction(optimizer, optimizer.param_groups[index], param)
            if direction is None or index is None:
                value = param.detach().clone()
            else:
                total = (sum(rates[index][:steps]) if rates is not None
                         else float(optimizer.param_groups[index]["lr"]) * steps)
                value = param.detach() - total * direction
            predicted[name] = value.requires_grad_(True)
    return predicted
