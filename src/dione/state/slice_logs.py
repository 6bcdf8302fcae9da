"""Where a slice's ranks write their output in a run directory, and which log holds the
traceback of a task's failure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from dione.state.store import SliceRecord

__all__ = ["failure_log", "log_folder"]


def log_folder(run_dir: Path, slice_id: int, task: str) -> Path:
    """Where slice ``slice_id`` of ``task`` keeps its ranks' output."""
    return run_dir / "logs" / f"slice-{slice_id:06d}-{task}"


def failure_log(run_dir: Path, slices: Sequence[SliceRecord], task: str) -> Path | None:
    """The log holding the traceback of ``task``'s newest failed slice (of ``slices``,
    the store's), or cancelled as stalled (its ranks' stacks at the cancel): its first
    rank's that has one, else its first rank's; None where no such slice left a log."""
    for record in reversed([s for s in slices if s.task == task
                            and (s.status == "failed" or s.stalled)]):
        logs = sorted(log_folder(run_dir, record.id, task).glob("rank*.log"),
                      key=lambda p: int(p.stem[4:]) if p.stem[4:].isdigit() else 0)
        for log in logs:
            try:
                # A traceback's, or faulthandler's "(most recent call first)".
                if "(most recent call " in log.read_text(errors="replace"):
                    return log
            except OSError:
                continue
        if logs:
            return logs[0]
    return None
