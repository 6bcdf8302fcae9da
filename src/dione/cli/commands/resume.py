"""``dione resume``: finish a stopped run with the options it was started with, any flag
given now replacing its saved value."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from dione.cli.commands.run import execute
from dione.cli.console import console
from dione.cli.parser import run_options
from dione.cli.saved_run import load_saved_run

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    saved = load_saved_run(run_dir)
    run = dataclasses.replace(saved, options=run_options(vars(args), base=saved.options))
    console.print(f"resuming {run_dir} ({saved.workload})")
    return execute(saved.workload, run, run_dir, record=False)
