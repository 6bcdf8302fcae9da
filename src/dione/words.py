"""How a list of names is said in one line of a message: the first few, and how many more."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["some"]


def some(names: Sequence[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names``, and how many more there are: "a, b, c and 4 more"
    (a message with hundreds of tasks or nodes in it stays one readable line)."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
