"""SIGINT's and SIGTERM's handlers kept as they were across a block (on the main thread:
elsewhere Python handles no signal, and nothing changes)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["stop_handlers_kept"]

_STOPS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_handlers_kept() -> Iterator[bool]:
    """The block's caller's SIGINT and SIGTERM handlers back after it, whatever it put in
    their place (``ray.init`` puts its own on SIGTERM); yields whether this is the main
    thread, where handlers can be set at all."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    before = [signal.getsignal(s) for s in _STOPS]
    try:
        yield True
    finally:
        for signum, handler in zip(_STOPS, before, strict=True):
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
