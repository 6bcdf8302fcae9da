"""Whether tasks of one workload compute the same thing, as far as validation's forwards
can tell: a key of the fields they read, factories compared by what they call (a
``functools.partial`` by its function and arguments), so that a sweep over learning
rates builds and tries its model once, not once per task."""

from __future__ import annotations

import functools
import types
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from dione.spec.task import Task

__all__ = ["task_key"]


def _described(value: Any, loose: bool) -> Hashable:
    """``value`` as a hashable description: equal for equal plain values and for
    partials of one function with equal arguments; any other object by identity (the
    tasks it belongs to are alive while their keys are compared). ``loose``: every
    float counts as any other (an optimizer's learning rate, betas, weight decay)."""
    if isinstance(value, functools.partial):
        return ("partial", _described(value.func, loose),
                tuple(_described(a, loose) for a in value.args),
                tuple(sorted((k, _described(v, loose)) for k, v in value.keywords.items())))
    if isinstance(value, types.MethodType):
        return ("method", id(value.__self__), _described(value.__func__, loose))
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float) and loose:
        return float
    if isinstance(value, (int, float, str, bytes)):
        return (type(value), value)
    if isinstance(value, tuple):
        return ("tuple", tuple(_described(v, loose) for v in value))
    if isinstance(value, Mapping):
        return ("mapping", tuple(sorted((repr(k), _described(v, loose))
                                        for k, v in value.items())))
    return ("object", id(value))


def task_key(task: Task, fields: Iterable[str], loose: Iterable[str] = ()) -> Hashable:
    """A key equal for tasks whose ``fields`` are the same (those in ``loose``: up to
    their floats)."""
    floats = set(loose)
    return tuple((f, _described(getattr(task, f), f in floats)) for f in fields)
