"""Seconds this process spends importing modules it had not imported before, while a
slice runs: paid once per worker, so a trial must not count them as every slice's."""

from __future__ import annotations

import builtins
import contextlib
import importlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["counting", "seconds"]

_spent = 0.0
_local = threading.local()  # depth of import calls on this thread


def seconds() -> float:
    """Import seconds counted so far in this process (only inside ``counting``)."""
    return _spent


def _timed(original: Any) -> Any:
    """``original`` (``__import__`` or ``import_module``), its outermost calls that load
    a new module timed; the nested ones are inside them."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        global _spent
        depth = getattr(_local, "depth", 0)
        if depth:
            return original(*args, **kwargs)
        known, began = len(sys.modules), time.perf_counter()
        _local.depth = 1
        try:
            return original(*args, **kwargs)
        finally:
            _local.depth = 0
            if len(sys.modules) > known:
                _spent += time.perf_counter() - began

    return timed


@contextlib.contextmanager
def counting() -> Iterator[None]:
    """Count import seconds while the block runs: every ``import`` statement, and
    ``importlib.import_module`` (how lazy packages such as transformers load a model's
    module the first time its class is named, inside the task's ``model()``)."""
    imported, import_module = builtins.__import__, importlib.import_module
    builtins.__import__ = _timed(imported)
    importlib.import_module = _timed(import_module)
    try:
        yield
    finally:
        builtins.__import__, importlib.import_module = imported, import_module
