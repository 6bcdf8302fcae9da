"""Package attributes imported on first use, so that importing a package costs nothing.

``import dione`` (and so ``dione --help``, ``dione plan``, ``dione status``, every
worker's start) must not pay for torch; the names a package re-exports are imported
from their modules the first time someone reads them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``name`` from the module
    ``exports[name]`` on first access (and keeps it, so the next access is plain)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
