"""The dashboards a run is written to as it trains (TensorBoard, MLflow): opened from the
user's flags, kept up to date by the live report's thread, closed with the results."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # `dione report` and `status` start without torch
    from dione.spec.task import Task

__all__ = ["Dashboard", "RunTasks", "open_dashboards"]


class Dashboard(Protocol):
    """Written from the run store: what is new at each ``update``, the results at
    ``close``."""

    def update(self) -> None: ...

    def close(self) -> None: ...


class RunTasks:
    """The run's tasks, for what the store does not hold (a done task's model, each
    step's learning rates): those given (a list the caller may extend as tasks are
    added), else the workload file the run was started with, loaded once; a task
    ``dione add`` added, from its own workload file. ``missing`` says why there are
    none."""

    def __init__(self, run_dir: str | Path, tasks: Sequence[Task] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self._given = tasks
        self._tasks = {t.name: t for t in tasks} if tasks is not None else None
        self._added: dict[str, dict[str, Task]] = {}  # workload file -> its tasks
        self.missing: str | None = None
        self._rates: dict[str, list[list[float]] | None] = {}

    def get(self, name: str) -> Task | None:
        if self._tasks is None and self.missing is None:
            from dione.spec import load_workload
            from dione.state.export import workload_of_run

            try:
                self._tasks = {t.name: t for t in load_workload(workload_of_run(self.run_dir))}
            except Exception as err:  # any workload error: the store's data still goes in
                self.missing = f"the run's workload could not be loaded: {err}"
        if self._tasks is not None and name not in self._tasks and self._given is not None:
            self._tasks = {t.name: t for t in self._given}  # tasks added since
        found = None if self._tasks is None else self._tasks.get(name)
        return found if found is not None else self._added_task(name)

    def _added_task(self, name: str) -> Task | None:
        """A task ``dione add`` added, from the workload file it came from (each file
        loaded once)."""
        from dione.spec import load_workload
        from dione.state.store import RunStore

        with RunStore(self.run_dir) as store:
            request = store.addition_of(name)
        if request is None:
            return None
        if request.workload not in self._added:
            try:
                self._added[request.workload] = {t.name: t for t in
                                                 load_workload(request.workload)}
            except Exception:  # the file changed or moved: that task's extras go
                self._added[request.workload] = {}
        return self._added[request.workload].get(name)

    def learning_rates(self, name: str, total: int) -> list[list[float]] | None:
        """Per parameter group, the rate of each step 1..``total`` (None: unknown)."""
        if name not in self._rates:
            from dione.report.learning_rates import learning_rates

            task = self.get(name)
            self._rates[name] = None if task is None else learning_rates(task, total)
        return self._rates[name]


def open_dashboards(run_dir: str | Path, *, tensorboard: str | Path | None = None,
                    mlflow: str | bool | None = None,
                    tasks: Sequence[Task] | None = None) -> list[Dashboard]:
    """TensorBoard's writer into ``tensorboard`` (a folder) and MLflow's into ``mlflow``
    (a tracking URI, or True for MLflow's default), each if asked. RuntimeError (naming
    the extra to install) where the package is missing; ValueError naming the fix where
    the folder cannot be made or MLflow cannot use the URI (before any training)."""
    boards: list[Dashboard] = []
    if tensorboard:
        from dione.report.tensorboard import TensorBoardExport

        try:
            Path(tensorboard).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ValueError(f"--tensorboard {tensorboard}: the folder cannot be made "
                             f"({err.strerror or err}); give a folder you can write") from None
        boards.append(TensorBoardExport(run_dir, tensorboard, tasks=tasks))
    if mlflow:
        from dione.report.mlflow_runs import MlflowExport

        uri = mlflow if isinstance(mlflow, str) else None
        try:
            boards.append(MlflowExport(run_dir, uri, tasks=tasks))
        except RuntimeError:
            raise  # the extra is not installed: said so
        except Exception as err:  # MLflow's own errors for a URI it cannot use
            said = " ".join(str(err).split())  # MLflow's whole reason (its own fix too)
            raise ValueError(f"--mlflow {uri or '(MLflow default)'}: MLflow cannot use it "
                             f"({type(err).__name__}: {said[:1000]}); give a tracking URI "
                             "it takes (sqlite:///mlflow.db, http://host:5000)") from None
    return boards
