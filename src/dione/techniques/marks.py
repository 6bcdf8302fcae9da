"""What a user set on a parameter (a tag its optimizer factory groups by), kept on the
new parameter object a technique puts in its place."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["carry_marks", "marks_by_name", "put_marks"]


def carry_marks(old: torch.Tensor, new: torch.Tensor) -> None:
    """Set on ``new`` each attribute of ``old``'s own that ``new`` lacks (a parameter's
    copy, moved to meta or a device or sharded, is a new object without them: a bias
    tagged for no weight decay took it)."""
    _set_missing(new, vars(old))


def marks_by_name(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Each parameter's own attributes, by name (those with any)."""
    return {name: dict(vars(p)) for name, p in model.named_parameters() if vars(p)}


def put_marks(model: nn.Module, marks: dict[str, dict[str, Any]]) -> None:
    """Set ``marks`` (``marks_by_name`` of the model before) on its parameters now."""
    for name, parameter in model.named_parameters():
        _set_missing(parameter, marks.get(name, {}))


def _set_missing(target: torch.Tensor, attributes: dict[str, Any]) -> None:
    """Each of ``attributes`` that ``target`` lacks, set on it."""
    for key, value in attributes.items():
        if not hasattr(target, key):
            setattr(target, key, value)
