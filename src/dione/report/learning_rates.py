"""Each parameter group's learning rate at every step of a task, as its optimizer and
scheduler set it: worked out in the launcher from the task itself (the workers report
none, and are not slowed), for the dashboards."""

from __future__ import annotations

from dione.spec.task import Task
from dione.techniques.pipeline.prediction import future_rates

__all__ = ["learning_rates"]


def learning_rates(task: Task, total: int) -> list[list[float]] | None:
    """Per parameter group, the rate of steps 1..``total`` (None where the task's
    optimizer or scheduler cannot be stepped apart from training: a scheduler that reads
    a metric, a factory that needs the data)."""
    import torch

    try:
        with torch.device("meta"):  # the model's shapes only: no memory for its weights
            optimizer = task.optimizer(task.model().parameters())
        scheduler = task.lr_scheduler(optimizer) if task.lr_scheduler else None
        return future_rates(optimizer, scheduler, task.lr_scheduler, total)
    except Exception:
        return None
