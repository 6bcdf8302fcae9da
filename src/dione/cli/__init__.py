"""The ``dione`` command: parses the command line and hands it to one command's module."""

from __future__ import annotations

from collections.abc import Sequence

from dione.cli.commands import COMMANDS
from dione.cli.console import complain, errors
from dione.cli.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED, BadInput
from dione.cli.parser import build_parser

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: the process's arguments) names; its exit status."""
    from dione.orchestrate.interrupts import Terminated, interruptible
    from dione.state.sqlite import StateFileError

    args = build_parser().parse_args(argv)
    try:
        with interruptible():
            return int(COMMANDS[args.command](args))
    except (BadInput, StateFileError) as err:  # a state file's damage: one sentence too
        complain("error", str(err))
        return EXIT_BAD_INPUT
    except Terminated:
        errors.print("terminated (SIGTERM); every gang was stopped, checkpoints kept")
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        errors.print("interrupted; every gang was stopped, checkpoints kept")
        return EXIT_INTERRUPTED
