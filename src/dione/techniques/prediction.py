"""XPipe's weight prediction: the weights a stage will hold ``s`` updates from now.

``W_hat = W - lr * s * d``, where ``d`` is the step the optimizer would apply now, read
from its own state (Guan et al. 2019, "XPipe", Sec. 3.2):

- Adam / AdamW: ``d = m_hat / (sqrt(v_hat) + eps)`` with the bias corrections of the
  current step count (``max_exp_avg_sq`` under amsgrad), plus ``weight_decay * W`` when
  the decay is decoupled (AdamW). Adam's own L2 decay is inside the moments already.
- SGD with momentum: ``d`` = the momentum buffer (weight decay and dampening are in it).

``maximize=True`` needs nothing more: torch negates the gradient before it enters the
moments or the buffer, so ``d`` already points the way the optimizer will step.

Before the optimizer's first step there is no state, hence no direction: the weights
are predicted to stay (``W_hat = W``). An optimizer without a rule gets a
PredictionError at check time, naming the way out (``prediction=false``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["PredictionError", "predict_weights", "prediction_problem", "step_direction"]


class PredictionError(ValueError):
    """An optimizer whose next step dione cannot predict."""


def prediction_problem(optimizer: torch.optim.Optimizer) -> str | None:
    """Why weights under ``optimizer`` cannot be predicted (None: they can)."""
    if isinstance(optimizer, torch.optim.Adam):  # AdamW is an Adam
        return None
    if isinstance(optimizer, torch.optim.SGD):
        if all(group["momentum"] > 0 for group in optimizer.param_groups):
            return None
        return ("SGD without momentum keeps no state to predict its next step from; give "
                "it momentum, or set the xpipe knob prediction=false (weight stashing, no "
                "prediction)")
    return (f"xpipe predicts weights for Adam, AdamW and SGD with momentum, not "
            f"{type(optimizer).__name__}; set the xpipe knob prediction=false (weight "
            "stashing, no prediction) or use one of those")


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
                    steps: int) -> dict[str, torch.Tensor]:
    """Fresh leaf tensors (requiring grad) holding each parameter ``steps`` updates ahead;
    ``steps`` = 0 gives a plain copy. The real parameters are not touched."""
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    predicted = {}
    with torch.no_grad():
        for name, param in params.items():
            group = group_of[id(param)]
            direction = step_direction(optimizer, group, param) if steps else None
            if direction is None:
                value = param.detach().clone()
            else:
                value = param.detach() - float(group["lr"]) * steps * direction
            predicted[name] = value.requires_grad_(True)
    return predicted
