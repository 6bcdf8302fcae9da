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
    from dione.report.dashboards import open_dashboards

    try:
        boards = open_dashboards(args.run_dir, tensorboard=args.tensorboard,
                                 mlflow=args.mlflow)
        for board in boards:
            board.close()
    except (RuntimeError, ValueError) as err:  # the extra is missing; a bad place
        raise BadInput(str(err)) from None
    if args.tensorboard:
        console.print(f"TensorBoard: tensorboard --logdir {args.tensorboard}")
    for board in boards:
        left_out = getattr(board, "models_left_out", None)
        uri = getattr(board, "uri", None)
        if uri:
            console.print(f"MLflow: mlflow ui --backend-store-uri {uri}"
                          + (f" (models left out: {left_out})" if left_out else ""))
    return 0
