"""``dione report``: (re)write a run's report and print its summary."""

from __future__ import annotations

import argparse
import errno
from pathlib import Path

from dione.cli.console import console
from dione.cli.errors import BadInput

__all__ = ["command", "shortened"]

TABLE_ROWS = 20  # a table's rows printed; the file holds them all


def shortened(summary: str, rows: int = TABLE_ROWS) -> str:
    """``summary`` (Markdown) with each table cut to its first ``rows`` rows and a line
    counting the rest: a sweep's hundreds of rows buried where the report went."""
    out: list[str] = []
    body = 0  # rows of the current table past its header and rule
    for line in summary.splitlines():
        if not line.startswith("|"):
            if body - 1 > rows:
                out.append(f"({body - 1 - rows} more row(s) in summary.md)")
            body = 0
            out.append(line)
            continue
        if body == 0 and out and out[-1].startswith("|") and set(line) <= set("|-: "):
            out.append(line)  # the rule under a header
            body = 1
            continue
        if body:
            body += 1
            if body - 1 > rows:
                continue
        out.append(line)
    if body - 1 > rows:
        out.append(f"({body - 1 - rows} more row(s) in summary.md)")
    return "\n".join(out)


def command(args: argparse.Namespace) -> int:
    import sqlite3

    from dione.report import write_report

    if args.out and (out := Path(args.out)).is_dir() and any(out.iterdir()) \
            and not (out / "summary.md").is_file():
        raise BadInput(f"--out {out} holds files that are not a dione report (its files "
                       "would overwrite theirs): give a new or empty folder, or a report's")
    try:
        folder = write_report(args.run_dir, into=args.out)
    except FileNotFoundError as err:
        raise BadInput(str(err)) from None
    except OSError as err:
        # Refused (a folder that is not one's own counts too) or a read-only disk.
        if isinstance(err, PermissionError) or err.errno == errno.EROFS:
            where = "--out DIR: the report's folder" if args.out else "--out DIR to write it"
            own = ", a folder of your own" if isinstance(err, PermissionError) else ""
            raise BadInput(f"{args.run_dir}'s report cannot be written ({err}); give {where} "
                           f"elsewhere{own}") from None
        raise BadInput(f"{args.run_dir} cannot be reported ({type(err).__name__}: {err}); "
                       "`dione status` says what it can still read") from None
    except (ValueError, sqlite3.Error) as err:  # (a store damaged: said by StateFileError)
        raise BadInput(f"{args.run_dir} cannot be reported ({type(err).__name__}: {err}); "
                       "`dione status` says what it can still read") from None
    console.print(shortened((folder / "summary.md").read_text()), markup=False)
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
