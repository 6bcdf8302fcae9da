"""Whether tasks of one workload compute the same thing, as far as validation's forwards
can tell: a key of the fields they read, factories compared by what they call (a
``functools.partial`` by its function and arguments), so that a sweep over learning
rates builds and tries its model once, not once per task. A key that cannot be made is
the task's own: it shares nothing."""

from __future__ import annotations

import functools
import types
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from dione.spec.task import Task

__all__ = ["task_key"]

# A container with more entries than this counts by identity: walking a vocabulary of a
# million entries for each task of a sweep cost seconds a task.
_WALKED = 64


def _described(value: Any) -> Hashable:
    """``value`` as a hashable description: equal for equal plain values and for
    partials of one function with equal arguments; any other object by identity (the
    tasks it belongs to are alive while their keys are compared)."""
    if isinstance(value, functools.partial):
        return ("partial", _described(value.func), tuple(_described(a) for a in value.args),
                tuple((k, _described(v)) for k, v in sorted(value.keywords.items())))
    if isinstance(value, types.MethodType):
        return ("method", id(value.__self__), _described(value.__func__))
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float, str, bytes)):
        return (type(value), value)
    if isinstance(value, tuple) and len(value) <= _WALKED:
        return (type(value), tuple(_described(v) for v in value))
    if isinstance(value, Mapping) and len(value) <= _WALKED:
        return (type(value), frozenset((_described(k), _described(v))
                                       for k, v in value.items()))
    return ("object", id(value))


def task_key(task: Task, fields: Iterable[str]) -> Hashable:
    """A key equal for tasks whose ``fields`` are the same."""
    try:
        return tuple((f, _described(getattr(task, f))) for f in fields)
    except Exception:  # a value that cannot be described (one that holds itself)
        return ("unkeyed", id(task))
