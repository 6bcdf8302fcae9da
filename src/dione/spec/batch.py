"""A task's batches: how the global batch splits, and how a batch reaches the model and
its loss, whatever the batch's shape. One home for each rule: validation, every
technique and the batch source call these.

Splitting: the global batch divides into equal parts (data-parallel shares, pipeline
micro-batches, accumulation parts), each the mean of its samples, so that the mean of
the parts' mean losses is the batch's mean loss.

With the task's ``loss``, the batch is an ``(inputs, target)`` pair or a dict whose
``labels`` field is the target; the model gets the inputs (a dict as keywords). With
``loss`` left out, the model gets the whole batch (a dict as keywords, a tuple as
arguments) and returns its own loss, as a Hugging Face model does when given
``labels``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dione.spec.task import Task

__all__ = ["LABELS", "call_model", "loss_of", "model_arguments", "own_loss", "split_problem",
           "split_target"]

LABELS = "labels"


def split_problem(batch_size: int, parts: int, what: str, task: str | None = None) -> str | None:
    """Why a global batch of ``batch_size`` (of ``task``) does not split into ``parts``
    equal ``what`` (e.g. "devices", "micro-batches"); None when it does."""
    if parts < 1 or batch_size % parts == 0:
        return None
    owner = f" of task {task!r}" if task is not None else ""
    return f"batch size {batch_size}{owner} is not divisible by {parts} {what}"


def split_target(task: Task, batch: Any) -> tuple[Any, Any]:
    """(what the model is called with, the target the task's loss takes; None when the
    model computes its own loss from the whole batch)."""
    if task.loss is None:
        return batch, None
    if isinstance(batch, Mapping):
        if LABELS not in batch:
            raise ValueError(
                f"task {task.name!r}: a dict batch needs a {LABELS!r} field for the task's "
                f"loss to compare against (its fields: {', '.join(map(str, batch))}); or "
                "leave loss out if the model returns its own")
        return {k: v for k, v in batch.items() if k != LABELS}, batch[LABELS]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(
        f"task {task.name!r}: with a loss, data items must be (inputs, target) pairs or "
        f"dicts with {LABELS!r}, not {type(batch).__name__}"
        + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else ""))


def model_arguments(inputs: Any, whole: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) to call the model with: a dict as keywords; with ``whole`` (the
    model takes the whole batch) a tuple as arguments; anything else as one argument."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if whole and isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def call_model(model: nn.Module, task: Task, inputs: Any) -> Any:
    """``model``'s output on ``inputs`` (the first part of ``split_target``)."""
    args, kwargs = model_arguments(inputs, whole=task.loss is None)
    return model(*args, **kwargs)


def own_loss(task: Task, output: Any) -> torch.Tensor:
    """The loss a model returned itself: a scalar tensor, ``output.loss`` or
    ``output["loss"]``; a clear error when it returned none."""
    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return output.reshape(())
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.reshape(())
    what = (f"a tensor of shape {tuple(output.shape)}" if isinstance(output, torch.Tensor)
            else type(output).__name__)
    raise ValueError(
        f"task {task.name!r} leaves loss out, so its model must return its loss (a scalar "
        f"tensor, or an output with .loss, as a Hugging Face model does when the batch has "
        f"{LABELS!r}); it returned {what}" + (" with loss=None" if loss is None and
                                              hasattr(output, "loss") else "")
        + ": give the task a loss, or labels in the batch")


def loss_of(model: nn.Module, task: Task, batch: Any) -> torch.Tensor:
    """The task's mean loss on ``batch`` (already on the model's device)."""
    inputs, target = split_target(task, batch)
    output = call_model(model, task, inputs)
    if task.loss is None:
        return own_loss(task, output)
    return task.loss(output, target)
