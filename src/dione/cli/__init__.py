"""The ``dione`` command: parses the command line and hands it to one command's module."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from shlex import quote
from typing import Any

from dione.cli.commands import COMMANDS
from dione.cli.console import complain, errors
from dione.cli.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    BadInput,
)
from dione.cli.parser import build_parser

__all__ = ["main"]

EXIT_BROKEN_PIPE = 141  # as a shell reports a process SIGPIPE ended (128 + 13)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: the process's arguments) names; its exit status."""
    from dione.orchestrate.interrupts import interruptible
    from dione.state.disk import DiskFull
    from dione.state.private import UnsafePathError
    from dione.state.sqlite import StateFileError

    parser = build_parser()
    _say_own_warnings()
    try:
        args, extra = parser.parse_known_args(argv)
    except BadInput as err:  # a flag's value checked as it is parsed (an empty path)
        complain("error", str(err))
        return EXIT_BAD_INPUT
    if extra:  # said by the command's own parser, with its usage and a near flag
        _unknown_flags(parser, args.command, extra)
    try:
        with interruptible() as seen:
            status = int(COMMANDS[args.command](args))
        if seen.received is not None:  # raised where Python dropped it: still a stop
            return _stopped(seen.received, "it came where Python could not stop the "
                            "command, which went on to its end")
        return status
    except (BadInput, StateFileError, DiskFull) as err:  # a state file's damage, a full
        # disk: one sentence too
        complain("error", str(err))
        return EXIT_BAD_INPUT
    except PermissionError as err:  # another user's run directory, a symlink refused
        complain("error", str(err) if isinstance(err, UnsafePathError) else
                 f"{err.filename or 'a file'}: permission denied (another user's, or not "
                 "readable by you): run dione as the user who owns it, or use a copy")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as err:  # Terminated too
        return _stopped(err, _STOPPED.get(args.command) or _left(args))
    except BrokenPipeError:  # `dione plan x.json | head`: the reader left; no traceback
        # Python flushes stdout at exit, into the closed pipe again: point it elsewhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _say_own_warnings() -> None:
    """dione's own warnings (a Ray node's devices waited for, another dione on a node)
    said as the command says its warnings, ``warning: ...``, not in Python's form with
    a file, a line number and a line of dione's source; others' warnings as they were."""
    import warnings

    shown = warnings.showwarning
    if getattr(shown, "dione", False):
        return  # installed by an earlier main() in this process
    own = Path(__file__).resolve().parents[1]

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        if Path(filename).resolve().is_relative_to(own):
            complain("warning", str(message))
        else:
            shown(message, category, filename, lineno, file, line)

    show.dione = True  # type: ignore[attr-defined]
    warnings.showwarning = show


# What a stop leaves where it is not a run's gangs and checkpoints.
_STOPPED = {
    "simulate": "the simulation stopped (nothing trains in one), its run directory kept",
    "profile": "every trial was stopped; those that ended are in the catalog, and the "
               "next profile runs the others",
}


def _left(args: argparse.Namespace) -> str:
    """What a stopped command left, and what continues it: "; X continues it" for a
    stopped run's directory, as `dione status` names X (the message named nothing to do
    next); said otherwise where nothing had trained yet (it said gangs were stopped and
    checkpoints kept, of a run that had none) or every task had ended (the stop cut its
    report short, and `dione report` finishes that: review)."""
    kept = "every gang was stopped, checkpoints kept"
    if args.command not in ("run", "resume", "train"):
        return kept
    from dione.cli.inputs import default_run_dir
    from dione.state.store import EVALUATION_FAILED, STORE_FILE, how_to_continue

    given = getattr(args, "run_dir", None) or getattr(args, "out", None)
    run_dir = Path(given) if given else default_run_dir(args.workload)
    if args.command == "run" and not (run_dir / STORE_FILE).is_file():
        return "it stopped before any task trained: nothing to keep"
    if args.command == "run" and _tasks(run_dir) == []:  # stopped while profiling
        return ("it stopped while profiling, before any task trained: the trials that "
                "ended are in the catalog, and the same `dione run` starts again from them")
    if not run_dir.is_dir():
        return kept
    if args.command == "run" and not _started_from(run_dir, args.workload):
        return kept  # runs/<name> of another workload of that name, not this command's
    if args.command == "train":  # its own folder, or a run's: the same command again
        return kept + "; the same `dione train` continues it from them"
    if _all_ended(run_dir):
        owed = [t.name for t in _tasks(run_dir) or ()
                if (t.error or "").startswith(EVALUATION_FAILED)]
        return (f"every task had ended; the stop cut the report short: `dione report "
                f"{quote(str(run_dir))}` writes it"
                + (f"; {', '.join(owed)} owe their evaluation: `dione evaluate "
                   f"{quote(str(run_dir))}`" if owed else ""))
    return f"{kept}; {how_to_continue(run_dir)} continues it"


def _tasks(run_dir: Path) -> list[Any] | None:
    """The run store's tasks (None: it cannot be read)."""
    from dione.state.sqlite import StateFileError
    from dione.state.store import RunStore

    try:
        with RunStore(run_dir) as store:
            return store.tasks()
    except (StateFileError, OSError):
        return None


def _all_ended(run_dir: Path) -> bool:
    """Whether the run's store holds tasks, each ended (done, stopped, failed...)."""
    tasks = _tasks(run_dir)
    return bool(tasks) and all(t.status in ("done", "stopped", "diverged", "failed")
                               for t in tasks or ())


def _started_from(run_dir: Path, workload: str) -> bool:
    """Whether ``run_dir``'s run.json names ``workload`` (this command's run), as `dione
    run` records it (``same_workload`` compares so)."""
    from dione.cli.saved_run import load_saved_run

    try:
        return load_saved_run(run_dir).workload == str(Path(workload).resolve())
    except BadInput:  # none, or damaged
        return False


def _stopped(stop: KeyboardInterrupt, left: str) -> int:
    """Say that Ctrl-C or SIGTERM stopped the command, and what it ``left``; the exit
    status a shell gives each."""
    from dione.orchestrate.interrupts import Terminated

    if isinstance(stop, Terminated):
        errors.print(f"terminated (SIGTERM); {left}")
        return EXIT_TERMINATED
    errors.print(f"interrupted; {left}")
    return EXIT_INTERRUPTED


def _unknown_flags(parser: argparse.ArgumentParser, command: str,
                   extra: Sequence[str]) -> None:
    """Exit (status 2) naming the flags the command does not take, with its usage (not
    the top level's) and, for each, the nearest flag it does take."""
    import difflib

    sub = next(a for a in parser._actions  # argparse keeps its subcommands there only
               if isinstance(a, argparse._SubParsersAction)).choices[command]
    known = [o for a in sub._actions for o in a.option_strings]
    hints = []
    for flag in extra:
        name = flag.split("=", 1)[0]
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
        if near:
            hints.append(f"{name}: did you mean {near[0]}?")
        elif command == "resume" and name == "--devices":
            hints.append(f"{name}: a resumed run keeps the cluster it started with "
                         "(its run.json)")
    sub.error(f"unrecognized arguments: {' '.join(extra)}"
              + ("" if not hints else "; " + "; ".join(hints)))
