"""Evaluate a task at the end of a slice, on its live model: the whole model where a
rank holds it, every rank's shards together (fsdp), or a pipeline's stages put together
in memory; from the checkpoint only for a technique that does none of these."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from dione.spec.task import Task
from dione.state.checkpoint import load_model_weights

__all__ = ["evaluate_checkpoint", "evaluate_model", "stages_put_together"]


def evaluate_checkpoint(task: Task, checkpoint: str, device: torch.device) -> dict[str, float]:
    """Load the checkpoint into a fresh, unwrapped model and run the task's evaluation,
    in one process with no gang: for a technique (registered by a user) whose slice
    did not evaluate its live model; the same numbers as the live model's."""
    if task.evaluate is None:
        return {}
    torch.manual_seed(task.seed)
    model = task.model().to(device)
    load_model_weights(checkpoint, model)
    return evaluate_model(task, model)


def evaluate_model(task: Task, model: nn.Module) -> dict[str, float]:
    """The task's evaluation of ``model`` in eval mode without gradients; a metric that
    is not a finite number is an error. Random draws inside it start from the task's
    seed (the training's generators are left as they were): a sampled evaluation gives
    the same numbers whichever technique trained the model, and on every rank of a
    gang that evaluates together."""
    if task.evaluate is None:
        return {}
    model.eval()
    cuda = sorted({p.device for p in model.parameters() if p.device.type == "cuda"},
                  key=str)
    with torch.random.fork_rng(devices=cuda), torch.no_grad():
        torch.manual_seed(task.seed)
        metrics = task.evaluate(model)
    result = {}
    for name, value in dict(metrics).items():
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"evaluation metric {name!r} of task {task.name!r} is {number}")
        result[str(name)] = number
    return result


def stages_put_together(task: Task, stage: nn.Module, rank: int, world: int,
                        device: torch.device) -> nn.Module | None:
    """Collective over the gang: every stage's weights (the real ones, under their own
    names) sent to rank 0 through host memory and loaded there into the task's model as
    the user defined it; that model on rank 0, None on the others. No checkpoint is
    read: the weights are the ones the slice has just trained."""
    state = {name: value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor)
             else value for name, value in get_model_state_dict(stage).items()}
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(state, gathered, dst=0)
    del state
    if gathered is None:
        return None
    whole: dict[str, Any] = {}
    for part in gathered:
        whole.update(part)  # a weight two stages share: the same values in both
    torch.manual_seed(task.seed)
    model = task.model()
    model.load_state_dict(whole)  # strict: every stage's names, and every name in one
    return model.to(device)
