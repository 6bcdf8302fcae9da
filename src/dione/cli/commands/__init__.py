"""One module per ``dione`` command, each with ``command(args) -> exit status``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from dione.cli.commands import (
    add,
    evaluate,
    export,
    plan,
    profile,
    report,
    resume,
    run,
    simulate,
    status,
    techniques,
    train,
    validate,
)

__all__ = ["COMMANDS"]

# Each module imports what it needs (torch, OR-Tools, Ray) inside its function, so that
# importing them all here costs `dione --help`, `plan`, `status` and `report` nothing.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": run.command,
    "resume": resume.command,
    "report": report.command,
    "simulate": simulate.command,
    "status": status.command,
    "add": add.command,
    "profile": profile.command,
    "train": train.command,
    "validate": validate.command,
    "plan": plan.command,
    "export": export.command,
    "evaluate": evaluate.command,
    "techniques": techniques.command,
}
