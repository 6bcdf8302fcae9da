"""Where in the user's code an exception was raised: of a traceback's frames, the last
outside dione and installed packages (else the last outside dione)."""

from __future__ import annotations

import os
from collections.abc import Sequence

__all__ = ["user_frame"]

_OURS = os.path.dirname(os.path.abspath(__file__))  # dione's own source


def user_frame(frames: Sequence[tuple[str, int | None]]) -> tuple[str, int | None] | None:
    """Of (file, line) frames, innermost last, the user's (not dione's, whose messages of
    what a user's function returned name no line; not an installed package's, torch's
    own line where the user's called it), else the last outside dione; None: none."""
    outside = [f for f in frames if not os.path.abspath(f[0]).startswith(_OURS + os.sep)]
    own = [f for f in outside if not any(part in ("site-packages", "dist-packages")
                                         for part in f[0].split(os.sep))]
    found = own or outside
    return found[-1] if found else None
