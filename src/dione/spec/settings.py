"""A task's training settings as text alike in every process: a resumed run compares them."""

from __future__ import annotations

import functools
import types
from typing import Any

from dione.spec.task import Task

__all__ = ["described", "training_settings"]

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


def described(value: Any) -> str:
    """``value`` (a function, a partial, a class, an object) as the same text in any
    process: what ``training_settings`` says of each setting."""
    return _describe(value)


def _describe(value: Any, depth: int = 0) -> str:
    """``value`` as stable text: simple values by repr (floats exactly), containers
    item by item, a partial with its arguments, a function by its name with the numbers
    it reads (what its closure and its module hold: ``lambda p: Adam(p, lr=lr)`` made in
    a loop or in a notebook), a class by its name, anything else by its repr unless
    that holds a memory address (then its type's name and its numbers)."""
    if depth > 4:
        return "..."
    if isinstance(value, _SIMPLE):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_describe(v, depth + 1) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_describe(k, depth + 1)}: {_describe(v, depth + 1)}"
                               for k, v in sorted(value.items(), key=lambda kv: repr(kv[0])))\
            + "}"
    if isinstance(value, (set, frozenset)):  # in one order under any string hashing
        return "{" + ", ".join(sorted(_describe(v, depth + 1) for v in value)) + "}"
    if isinstance(value, functools.partial):
        arguments = [_describe(a, depth + 1) for a in value.args] + [
            f"{k}={_describe(v, depth + 1)}" for k, v in sorted(value.keywords.items())]
        return f"{_describe(value.func, depth + 1)}({', '.join(arguments)})"
    if isinstance(value, types.MethodType):  # a bound method: its object's numbers too
        return f"{_describe(value.__self__, depth + 1)}.{value.__func__.__name__}"
    if isinstance(value, types.FunctionType):
        return _function(value, depth)
    if isinstance(value, type):
        return value.__qualname__
    text = repr(value)
    if " at 0x" not in text:
        return text
    held = [f"{k}={_describe(v, depth + 1)}" for k, v in sorted(vars(value).items())
            if _read(v) and not isinstance(v, str)] if hasattr(value, "__dict__") else []
    return f"{type(value).__qualname__}({', '.join(held)})"


def _function(function: types.FunctionType, depth: int) -> str:
    """A function by its own name (a lambda's is ``<lambda>``; the names around it are
    left out, so renaming the function that made it changes nothing), with what it
    reads that sets a number: its closure's and its module's numbers, tuples and
    partials (not a dict or an object, which may hold a run's name or a time), its
    defaults."""
    code = function.__code__
    cells = [(n, c.cell_contents) for n, c in zip(code.co_freevars, function.__closure__ or (),
                                                  strict=False) if _filled(c)]
    module = [(n, function.__globals__[n]) for n in code.co_names
              if n in function.__globals__]
    # A module's strings are left out: a run's name or a path set where it loads.
    read = {**{n: v for n, v in module if not isinstance(v, str)}, **dict(cells)}
    held = [f"{n}={_describe(v, depth + 1)}" for n, v in sorted(read.items()) if _read(v)]
    defaults = [_describe(d, depth + 1) for d in function.__defaults__ or ()]
    if defaults:
        held.append(f"defaults={', '.join(defaults)}")
    return f"{function.__name__}[{', '.join(held)}]" if held else function.__name__


def _read(value: Any) -> bool:
    """Whether a value a function reads counts as a setting: a number, a flag, a
    string, a tuple of such, or a partial (not a module, a class, a function, a dict or
    an object: those are code, or may hold what changes from run to run)."""
    if isinstance(value, tuple):
        return all(_read(v) for v in value)
    return isinstance(value, (*_SIMPLE, functools.partial))


def _filled(cell: Any) -> bool:
    """Whether a closure's cell holds a value yet (an empty one raises on reading)."""
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True
