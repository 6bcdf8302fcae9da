"""Evaluate a task at the end of a slice: its live model where a rank holds it whole,
else from the checkpoint the slice wrote."""

from __future__ import annotations

import math

import torch

from dione.spec.task import Task
from dione.state.checkpoint import load_model_weights

__all__ = ["evaluate_checkpoint", "evaluate_model"]


def evaluate_checkpoint(task: Task, checkpoint: str, device: torch.device) -> dict[str, float]:
    """Load the checkpoint into a fresh, unwrapped model and run the task's evaluation:
    for a technique whose trained model no rank holds whole (fsdp's shards, a
    pipeline's stages), in one process with no gang; the same numbers as the live
    model's, which single and ddp evaluate (``evaluate_model``)."""
    if task.evaluate is None:
        return {}
    torch.manual_seed(task.seed)
    model = task.model().to(device)
    load_model_weights(checkpoint, model)
    return evaluate_model(task, model)


def evaluate_model(task: Task, model: torch.nn.Module) -> dict[str, float]:
    """The task's evaluation of ``model`` (whole, unwrapped), in eval mode without
    gradients; a metric that is not a finite number is an error."""
    if task.evaluate is None:
        return {}
    model.eval()
    with torch.no_grad():
        metrics = task.evaluate(model)
    result = {}
    for name, value in dict(metrics).items():
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"evaluation metric {name!r} of task {task.name!r} is {number}")
        result[str(name)] = number
    return result
