"""``dione report``: (re)write a run's report and print its summary."""

from __future__ import annotations

import argparse

from dione.cli.console import console
from dione.cli.errors import BadInput

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    import sqlite3

    from dione.report import write_report

    try:
        folder = write_report(args.run_dir)
    except FileNotFoundError as err:
        raise BadInput(str(err)) from None
    except (OSError, ValueError, sqlite3.Error) as err:
        raise BadInput(f"{args.run_dir} cannot be reported ({type(err).__name__}: {err}); "
                       "`dione status` says what it can still read") from None
    console.print((folder / "summary.md").read_text())
    console.print(f"written: {folder}")
    if args.tensorboard:
        from dione.report.tensorboard import TensorBoardExport

        try:
            board = TensorBoardExport(args.run_dir, args.tensorboard)
        except RuntimeError as err:
            raise BadInput(str(err)) from None
        board.close()
        console.print(f"TensorBoard: tensorboard --logdir {args.tensorboard}")
    return 0
