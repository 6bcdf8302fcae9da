"""Where the command writes: results to stdout, errors and warnings to stderr."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.text import Text

__all__ = ["complain", "console", "errors"]

# Off a terminal (CI logs, pipes) rich would fold tables at 80 columns: give them room.
_WIDTH = None if sys.stdout.isatty() else 160
console = Console(highlight=False, markup=False, width=_WIDTH, soft_wrap=True)
# Errors are never folded: a message must stay greppable whole, whatever the width.
errors = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def complain(label: str, message: str) -> None:
    """Print ``label: message`` to stderr, the label in red (the message never as markup)."""
    errors.print(Text(f"{label}: ", style="red") + Text(message))
