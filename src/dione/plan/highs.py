"""A HiGHS solver that prints nothing: ``dione plan`` writes its plan to standard output."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["quiet_highs"]


def quiet_highs() -> Any:
    """A ``highspy.Highs`` with its log off (imported here, on first use: the light
    commands that read problems do not pay for it)."""
    import highspy

    with _quiet_stdout():  # HiGHS prints its banner as it is made, before any option
        highs = highspy.Highs()  # type: ignore[no-untyped-call]
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("log_to_console", False)
    return highs


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Send what C code writes to standard output meanwhile to /dev/null: ``dione plan``
    writes its plan there, and a banner before it would make the output not JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
