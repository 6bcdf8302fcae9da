"""How a list of names is said in one line of a message: the first few, and how many more."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["modules", "some"]


def some(names: Sequence[str], shown: int = 3) -> str:
    """The first ``shown`` of ``names``, and how many more there are: "a, b, c and 4 more"
    (a message with hundreds of tasks or nodes in it stays one readable line)."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def modules(names: Sequence[str], shown: int = 3) -> str:
    """Modules by name, said as modules: "module '2'" (an nn.Sequential's layer names
    are numbers, and "the statistics in 2 are each of the batch's 2 shares" read as a
    count), "modules 'a', 'b' and 3 more"."""
    return ("module " if len(names) == 1 else "modules ") + some([repr(n) for n in names],
                                                                  shown)
