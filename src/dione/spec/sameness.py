"""Whether tasks of one workload compute the same thing, as far as validation's forwards
can tell: a key of the fields they read, factories compared by what they call (a
``functools.partial`` by its function and arguments), so that a sweep over learning
rates builds and tries its model once, not once per task (a key that cannot be made is
the task's own: it shares nothing); and whether two callables are one function."""

from __future__ import annotations

import functools
import types
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from dione.spec.task import Task

__all__ = ["same_function", "task_key"]

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


def same_function(one: Any, other: Any) -> bool:
    """Whether two callables are one function: the same object, partials of one function
    with equal arguments, one method of one object, or functions of one code with equal
    defaults and captured values (a sweep's ``lambda m: evaluate(m, split)`` made per
    task); not two objects of one class, nor two closures of one factory that captured
    other values, which may each return other metrics."""
    if one is other:
        return True
    try:
        if isinstance(one, functools.partial) and isinstance(other, functools.partial):
            return bool(same_function(one.func, other.func) and one.args == other.args
                        and one.keywords == other.keywords)
        if isinstance(one, types.MethodType) and isinstance(other, types.MethodType):
            # ``evaluator.evaluate`` read once per task: a new bound method each time
            return one.__self__ is other.__self__ and same_function(one.__func__,
                                                                    other.__func__)
        if isinstance(one, types.FunctionType) and isinstance(other, types.FunctionType):
            cells = [(a.cell_contents, b.cell_contents) for a, b in
                     zip(one.__closure__ or (), other.__closure__ or (), strict=True)]
            return bool(one.__code__ is other.__code__ and one.__globals__ is other.__globals__
                        and one.__defaults__ == other.__defaults__
                        and one.__kwdefaults__ == other.__kwdefaults__
                        and all(a is b or a == b for a, b in cells))
    except Exception:  # values that cannot be compared (arrays), empty cells: not the same
        return False
    return False
