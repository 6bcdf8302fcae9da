"""Digests of the user's own code, alike in every process and after an edit elsewhere in
its file: what keys a task's trials in the catalog, and what a run records of how a task
trains (a loss or a forward edited between two sessions)."""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
import types
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["code_digest", "fold_code", "model_code", "users_own"]


def fold_code(code: types.CodeType, digest: Any) -> None:
    """Fold ``code``'s instructions, names and constants into ``digest``, nested code
    (a comprehension, a closure) by its own: a constant changed in a workload's loss (a
    sleep of 0.03 s made 0.15 s) kept the trial timed before."""
    digest.update(code.co_code + repr(code.co_names).encode())
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):  # its repr holds a memory address
            fold_code(constant, digest)
        else:
            digest.update(_constant_text(constant).encode())


def _constant_text(constant: object) -> str:
    """A code constant as text alike in every process (a frozenset's order follows the
    process's string hashing: ``x in {"a", "b"}``)."""
    if isinstance(constant, frozenset):
        return "frozenset(" + ",".join(sorted(map(_constant_text, constant))) + ")"
    if isinstance(constant, tuple):
        return "(" + ",".join(map(_constant_text, constant)) + ")"
    return repr(constant)


# Where code is not the user's: Python's own library, installed packages (torch's,
# transformers': their versions decide them) and dione (its version is keyed).
_NOT_USERS = tuple({str(Path(sysconfig.get_paths()[key]).resolve())
                    for key in ("stdlib", "platstdlib", "purelib", "platlib")}
                   | {str(Path(__file__).resolve().parents[1])})


def users_own(value: Any) -> bool:
    """Whether ``value`` (a class, function or module) is the user's own code: a
    script's or a notebook's, or defined in a file outside Python's library, installed
    packages and dione."""
    name = value.__name__ if isinstance(value, types.ModuleType) else getattr(
        value, "__module__", None)
    return _users_module(name or "")


@lru_cache(maxsize=1024)
def _users_module(name: str) -> bool:
    """Whether the module ``name`` is the user's own (once per module: a model of
    thousands of layers asked it of each)."""
    if name == "__main__":  # a script's or a notebook's (which has no file)
        return True
    path = getattr(sys.modules.get(name), "__file__", None)
    if not path:
        return False
    resolved = Path(path).resolve()
    return not any(resolved.is_relative_to(root) for root in _NOT_USERS) and not any(
        part in ("site-packages", "dist-packages") for part in resolved.parts)


def _keyed_value(value: Any) -> bool:
    """Whether a global's value is keyed as it is: numbers, flags and text (a mode
    switch, "naive" or "flash"), and tuples of them; not a path (a folder the file
    keeps would key a moved project's trials apart)."""
    if isinstance(value, tuple):
        return all(_keyed_value(v) for v in value)
    if isinstance(value, str):
        return not os.path.isabs(value) and len(value) <= 200
    return isinstance(value, (bool, int, float))


def _methods(value: Any) -> list[types.FunctionType]:
    """The functions a class holds (its methods, static and class methods, properties'
    accessors) up its user-owned bases; a function itself."""
    if isinstance(value, types.FunctionType):
        return [value]
    found = []
    for base in getattr(value, "__mro__", ()):
        if not users_own(base):
            continue
        for member in vars(base).values():
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            parts = ([member.fget, member.fset, member.fdel] if isinstance(member, property)
                     else [member])
            found += [f for f in parts if isinstance(f, types.FunctionType)]
    return found


def model_code(model: nn.Module) -> str:
    """A digest of the code of the model's classes that are the user's own
    (``code_digest`` of them, with the values they read). A forward edited (a layer
    applied 40 times, not once, by a constant of the workload file) printed and shaped
    alike, and its stale trial was taken from the catalog, 9x too fast."""
    return code_digest([type(module) for module in model.modules()])


def code_digest(roots: Iterable[Any], values: bool = True) -> str:
    """A digest of the code of ``roots`` (classes, functions) that are the user's own:
    their methods, the functions and classes of the user's they call (also through a
    module of the user's), and (``values``) the numbers, flags and text of the module
    globals they read; "" where none is the user's. Not a dunder name nor a path: a
    workload file's ``__name__`` is made from its path, and a folder it keeps would key
    a moved project's trials apart. Without ``values`` for what a run records: a
    module's number may be a time or a pid, new in every process."""
    digest = hashlib.sha1()
    seen: set[int] = set()
    found = False

    def fold(value: Any) -> None:
        nonlocal found
        if id(value) in seen:
            return
        seen.add(id(value))
        if not users_own(value):
            return
        found = True
        digest.update(f"{getattr(value, '__qualname__', '?')}:".encode())
        for function in _methods(value):
            fold_code(function.__code__, digest)
            names = sorted(_names(function.__code__))
            for name in names:
                if name.startswith("__"):
                    continue
                used = function.__globals__.get(name)
                if isinstance(used, types.ModuleType) and users_own(used):
                    # helpers.deep(x), helpers.N: what the code reads of the module
                    for attribute in names:
                        read = getattr(used, attribute, None)
                        if isinstance(read, (types.FunctionType, type)):
                            fold(read)
                        elif values and _keyed_value(read):
                            digest.update(f"{name}.{attribute}={read!r};".encode())
                elif isinstance(used, (types.FunctionType, type)):
                    fold(used)
                elif values and _keyed_value(used):
                    digest.update(f"{name}={used!r};".encode())

    for root in roots:
        fold(root)
    return digest.hexdigest()[:16] if found else ""


def _names(code: types.CodeType) -> set[str]:
    """The global (and attribute) names ``code`` and the code nested in it read."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


