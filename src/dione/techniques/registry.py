"""The technique registry: built-ins and the user's own, looked up by name."""

from __future__ import annotations

import sys

from dione.spec.workload import WORKLOAD_MODULE_PREFIX
from dione.techniques.base import Technique

__all__ = ["get_technique", "register", "technique_names", "techniques"]

_REGISTRY: dict[str, Technique] = {}


def _kind(technique: Technique) -> tuple[str, str]:
    # By name, not identity: loading the same workload file again makes a new class
    # object, and one edited since a module of another name (its digest is in it): a
    # workload file's class is known by the file's path.
    module = type(technique).__module__
    if module.startswith(WORKLOAD_MODULE_PREFIX):
        module = str(getattr(sys.modules.get(module), "__file__", None) or module)
    return module, type(technique).__qualname__


def register(technique: Technique, *, replace: bool = False) -> Technique:
    """Make ``technique`` available by its name; returns it (usable as a decorator's body).

    A workload file may register its own technique: the object travels to the workers
    with the slice, so it needs no import on their side.
    """
    if not isinstance(technique, Technique):
        raise TypeError(f"register takes a Technique instance, not {type(technique).__name__}")
    name = getattr(technique, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{type(technique).__name__} needs a class attribute `name`")
    if name in _REGISTRY and not replace and _kind(_REGISTRY[name]) != _kind(technique):
        raise ValueError(f"a technique named {name!r} is registered already; "
                         "pass replace=True to replace it")
    _REGISTRY[name] = technique
    return technique


def get_technique(name: str) -> Technique:
    """The registered technique called ``name`` (KeyError naming those registered)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown technique {name!r}; registered: {', '.join(technique_names())}"
        ) from None


def technique_names() -> list[str]:
    return list(_REGISTRY)


def techniques() -> list[Technique]:
    return list(_REGISTRY.values())
