"""The dashboards a run is written to as it trains (TensorBoard, MLflow): opened from the
user's flags, kept up to date by the live report's thread, closed with the results."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from dione.spec.task import Task

__all__ = ["Dashboard", "open_dashboards"]


class Dashboard(Protocol):
    """Written from the run store: what is new at each ``update``, the results at
    ``close``."""

    def update(self) -> None: ...

    def close(self) -> None: ...


def open_dashboards(run_dir: str | Path, *, tensorboard: str | Path | None = None,
                    mlflow: str | bool | None = None,
                    tasks: Sequence[Task] | None = None) -> list[Dashboard]:
    """TensorBoard's writer into ``tensorboard`` (a folder) and MLflow's into ``mlflow``
    (a tracking URI, or True for MLflow's default), each if asked. RuntimeError (naming
    the extra to install) where the package is missing."""
    boards: list[Dashboard] = []
    if tensorboard:
        from dione.report.tensorboard import TensorBoardExport

        boards.append(TensorBoardExport(run_dir, tensorboard))
    if mlflow:
        from dione.report.mlflow_runs import MlflowExport

        boards.append(MlflowExport(run_dir, mlflow if isinstance(mlflow, str) else None,
                                   tasks=tasks))
    return boards
