"""How a command fails: the exit statuses and the BadInput exception that means status 2."""

from __future__ import annotations

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_TERMINATED", "BadInput"]

EXIT_FAILED = 1  # training failed
EXIT_BAD_INPUT = 2  # the command, workload or cluster is wrong: nothing started
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports a SIGINT
EXIT_TERMINATED = 143  # SIGTERM, as a shell reports it


class BadInput(Exception):
    """An input problem: printed as is, exit status 2."""
