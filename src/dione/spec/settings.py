"""A task's training settings as text alike in every process: a resumed run compares them."""

from __future__ import annotations

import functools
import math
import types
from typing import Any

from dione.spec.task import Task

__all__ = ["training_settings"]

_SIMPLE = (bool, int, float, str, type(None))


def training_settings(task: Task) -> dict[str, str]:
    """What sets how ``task`` learns, besides its code, its steps and its batch: the
    optimizer and scheduler with their arguments (a ``functools.partial``'s, or the
    values a closure holds: ``lambda p: AdamW(p, lr=lr)`` made in a loop), the seed, the
    precision and the clipping. Written so that the same task gives the same text in
    any process (no memory addresses), and a changed learning rate gives another."""
    return {
        "optimizer": _describe(task.optimizer),
        "lr_scheduler": _describe(task.lr_scheduler),
        "seed": repr(task.seed),
        "precision": repr(task.precision),
        "clip_grad_norm": repr(task.clip_grad_norm),
    }


def _describe(value: Any, depth: int = 0) -> str:
    """``value`` as stable text: simple values by repr (floats exactly), containers
    item by item, functions and classes by their qualified names (with a partial's
    arguments and a closure's simple values), anything else by its repr unless that
    holds a memory address (then its type's name)."""
    if depth > 4:
        return "..."
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, _SIMPLE):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v, depth + 1) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_describe(k, depth + 1)}: {_describe(v, depth + 1)}"
                               for k, v in sorted(value.items(), key=lambda kv: repr(kv[0])))\
            + "}"
    if isinstance(value, functools.partial):
        arguments = [_describe(a, depth + 1) for a in value.args] + [
            f"{k}={_describe(v, depth + 1)}" for k, v in sorted(value.keywords.items())]
        return f"{_describe(value.func, depth + 1)}({', '.join(arguments)})"
    if isinstance(value, (types.FunctionType, types.MethodType)):
        function = value.__func__ if isinstance(value, types.MethodType) else value
        name = _name(function)
        held = [f"{n}={_describe(c.cell_contents, depth + 1)}"
                for n, c in zip(function.__code__.co_freevars, function.__closure__ or (),
                                strict=False)
                if _filled(c) and isinstance(c.cell_contents, (*_SIMPLE, tuple, list, dict))]
        defaults = [_describe(d, depth + 1) for d in function.__defaults__ or ()]
        if defaults:
            held.append(f"defaults={', '.join(defaults)}")
        return f"{name}[{', '.join(held)}]" if held else name
    if isinstance(value, (set, frozenset)):  # in one order under any string hashing
        return "{" + ", ".join(sorted(_describe(v, depth + 1) for v in value)) + "}"
    if isinstance(value, type):
        return _name(value)
    text = repr(value)
    return _name(type(value)) if " at 0x" in text else text


def _name(thing: Any) -> str:
    """A function's or class's qualified name (``AdamW``, ``make_optimizer.<locals>.
    <lambda>``): not its module, which for a workload file is named by a digest of its
    text (a comment added to the file would count as changed training), and for a
    library may move between its versions."""
    return str(getattr(thing, "__qualname__", type(thing).__qualname__))


def _filled(cell: Any) -> bool:
    """Whether a closure's cell holds a value yet (an empty one raises on reading)."""
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True
