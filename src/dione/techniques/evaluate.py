"""Evaluate a finished task from its checkpoint, whatever technique wrote it."""

from __future__ import annotations

import math

import torch

from dione.spec.task import Task
from dione.state.checkpoint import load_model_weights

__all__ = ["evaluate_checkpoint"]


def evaluate_checkpoint(task: Task, checkpoint: str, device: torch.device) -> dict[str, float]:
    """Load the checkpoint into a fresh, unwrapped model and run the task's evaluation.

    Done from the checkpoint (not the live, possibly sharded or staged model) so every
    technique is evaluated the same way, in one process with no gang.
    """
    if task.evaluate is None:
        return {}
    torch.manual_seed(task.seed)
    model = task.model().to(device)
    load_model_weights(checkpoint, model)
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
