"""A run in MLflow: one parent run for the dione run and a nested run per task, written
from the run store (the workers are not slowed), as it trains or after it ended.

Per task: its hyperparameters as params; each slice's technique, knobs, node and
devices as a param ``slice.<first step>``; ``loss``, ``step_seconds``, ``throughput``,
``devices`` and each parameter group's ``learning_rate/group_<k>`` by step; each
evaluation as ``eval/<metric>`` at its step; at the end ``final/<metric>``, a
``dione.status`` tag (and ``dione.stop_reason``, or ``dione.error``), the run's
status (FINISHED for a task done or stopped by its rule, FAILED for failed or
diverged, KILLED for one the run left unfinished) and, once a task
is done, its exported model as the ``model`` artifact (as ``dione export`` writes it).
Writing again into the same tracking store continues the same runs (found by the dione
run's id), so ``dione report --mlflow`` after ``dione run --mlflow`` adds only what is
new. Needs the ``mlflow`` extra.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dione.report.dashboards import RunTasks
from dione.state.store import SIMULATED_FILE, RunStore
from dione.state.summaries import closing_summaries, final_results, short_error

if TYPE_CHECKING:  # imported by `dione report`, which starts without torch
    from dione.spec.task import Task

__all__ = ["MlflowExport"]

# Per-step metrics: at most this many points per task, each the mean of its window of
# steps. MLflow's SQL store takes about 0.4 ms a point here (every step of 12 tasks of
# 2,000 steps, 5 metrics: 50 s); Lightning logs every 50 steps by default, HF's Trainer
# every 500. TensorBoard gets every step (a point costs it some 20 us).
POINTS = 200
_BATCH = 1000  # MLflow takes at most 1,000 metrics and 100 params per log_batch call
_PARAMS = 100
_VALUE = 6000  # MLflow's longest param value
_TERMINAL = {"done": "FINISHED", "stopped": "FINISHED", "failed": "FAILED",
             "diverged": "FAILED"}


def _key(name: str) -> str:
    """A name MLflow takes as a key: letters, digits, ``_ - . / :`` and spaces."""
    return re.sub(r"[^\w\-./: ]", "_", name)


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:_VALUE]


class MlflowExport:
    """Writes what the store holds beyond what it wrote before (``update``), then each
    task's results, status and model (``close``)."""

    def __init__(self, run_dir: str | Path, tracking_uri: str | None = None, *,
                 tasks: Sequence[Task] | None = None, experiment: str = "dione") -> None:
        """``tracking_uri``: MLflow's own default if None (``MLFLOW_TRACKING_URI``, else
        ``sqlite:///mlflow.db`` here, artifacts under ``./mlruns``). ``tasks``: the
        run's tasks, to export each done task's model (without them, the run's
        workload file is loaded; if that fails, models are left out and said so)."""
        try:
            import mlflow
            from mlflow.tracking import MlflowClient
        except ImportError as err:  # the extra is not installed
            raise RuntimeError(f"MLflow output needs mlflow: pip install 'dione[mlflow]' "
                               f"({err})") from None
        self.run_dir = Path(run_dir)
        self.uri = tracking_uri or mlflow.get_tracking_uri()
        self.client = MlflowClient(tracking_uri=self.uri)
        self._tasks = RunTasks(run_dir, tasks)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (found.experiment_id if found is not None
                              else self.client.create_experiment(experiment))
        with RunStore(self.run_dir) as store:
            self.dione_run = store.run_id
        self.parent = self._parent()
        self._children: dict[str, str] = {}  # task -> MLflow run id
        self._steps: dict[str, int] = {}  # last step logged per task
        self._widths: dict[str, int] = {}  # the device count last logged per task
        self._params: dict[str, set[str]] = {}  # param keys logged per task
        self._evaluations: set[tuple[str, int, str]] = set()
        self._models: set[str] = set()
        self._continue()

    def _parent(self) -> str:
        """The dione run's MLflow run (only it is tagged with the dione run's id)."""
        mine = self.client.search_runs(
            [self.experiment_id], f"tags.`dione.run_id` = '{self.dione_run}'")
        if mine:
            return str(mine[0].info.run_id)
        tags = {"dione.run_id": self.dione_run, "dione.run_dir": str(self.run_dir.resolve())}
        if (self.run_dir / SIMULATED_FILE).exists():
            tags["dione.simulated"] = "true"  # nothing trained: the virtual cluster's run
        run = self.client.create_run(self.experiment_id, tags=tags,
                                     run_name=self.run_dir.resolve().name)
        return str(run.info.run_id)

    def _continue(self) -> None:
        """Pick up the nested runs an earlier writer made for this dione run."""
        for run in self.client.search_runs(
                [self.experiment_id], f"tags.`mlflow.parentRunId` = '{self.parent}'"):
            task = run.data.tags.get("dione.task")
            if task is None:
                continue
            run_id = run.info.run_id
            self._children[task] = run_id
            self._params[task] = set(run.data.params)
            for key in run.data.metrics:
                history = self.client.get_metric_history(run_id, key)
                if key == "loss":
                    self._steps[task] = max((m.step for m in history), default=0)
                elif key == "devices" and history:  # logged only where it changes
                    self._widths[task] = int(max(history, key=lambda m: m.step).value)
                elif key.startswith("eval/"):
                    self._evaluations |= {(task, m.step, key[5:]) for m in history}
            if run.data.tags.get("dione.model") == "logged":
                self._models.add(task)

    def _child(self, task: str, hyperparameters: dict[str, Any]) -> str:
        if task not in self._children:
            run = self.client.create_run(
                self.experiment_id, run_name=task,
                tags={"mlflow.parentRunId": self.parent, "dione.task": task})
            self._children[task] = str(run.info.run_id)
            self._params[task] = set()
            self._log(task, [], {_key(k): _value(v) for k, v in hyperparameters.items()})
        return self._children[task]

    def _log(self, task: str, metrics: list[tuple[str, float, int]],
             params: dict[str, str]) -> None:
        """Log ``metrics`` (key, value, step) and the ``params`` not logged before (an
        MLflow param is written once)."""
        from mlflow.entities import Metric, Param

        run_id = self._children[task]
        new = {k: v for k, v in params.items() if k not in self._params[task]}
        now = int(time.time() * 1000)
        entries = [Metric(k, float(v), now, s) for k, v, s in metrics]
        items = [Param(k, v) for k, v in new.items()]
        for at in range(0, len(entries), _BATCH):
            self.client.log_batch(run_id, metrics=entries[at:at + _BATCH])
        for at in range(0, len(items), _PARAMS):
            self.client.log_batch(run_id, params=items[at:at + _PARAMS])
        self._params[task] |= set(new)

    def update(self, final: bool = False) -> None:
        """Log the steps, slices and evaluations recorded since the last call, and the
        model of each task done since (``final``: the last, partial, windows too)."""
        with RunStore(self.run_dir) as store:
            records = store.tasks()
            slices = [s for s in store.slices() if s.status in ("done", "diverged")]
            rows = {r.name: (store.metrics(r.name, after=self._steps.get(r.name, 0)),
                             store.evaluations(r.name))
                    for r in records}
        for record in records:
            self._child(record.name, record.hyperparameters)
            mine = sorted((s for s in slices if s.task == record.name),
                          key=lambda s: s.start_step)
            params = {f"slice.{s.start_step:06d}": _value(
                f"steps {s.start_step}-{s.end_step}: {s.technique} {json.dumps(s.knobs)} on "
                f"{s.node} devices {s.device_ids}") for s in mine}
            last = self._steps.get(record.name, 0)
            metrics: list[tuple[str, float, int]] = []
            steps, evaluations = rows[record.name]
            rates = self._tasks.learning_rates(record.name, record.total_steps)
            every = -(-record.total_steps // POINTS)  # steps per point
            widths = [(s.start_step, len(s.device_ids)) for s in mine]
            window: list[tuple[int, float, float | None]] = []
            for step, loss, seconds in steps:
                if step <= last:
                    continue
                window.append((step, loss, seconds))
                if step % every and step != record.total_steps and not (
                        final and step == steps[-1][0]):  # a stopped task's last steps
                    continue
                metrics += self._point(record.name, record.batch_size, window, rates,
                                       widths)
                self._steps[record.name] = step
                window = []
            for metric, points in evaluations.items():
                for step, value in points:
                    if (record.name, step, metric) not in self._evaluations:
                        self._evaluations.add((record.name, step, metric))
                        metrics.append((_key(f"eval/{metric}"), value, step))
            self._log(record.name, metrics, params)
            if record.status == "done" and record.name not in self._models:
                self._log_model(record.name)

    def _point(self, task: str, batch_size: int,
               window: list[tuple[int, float, float | None]],
               rates: list[list[float]] | None,
               widths: list[tuple[int, int]]) -> list[tuple[str, float, int]]:
        """One point of a task's per-step metrics at the window's last step: the mean
        loss, the learning rates there, the window's step time and samples a second, and
        the device count where it changed."""
        step = window[-1][0]
        points = [("loss", sum(loss for _, loss, _ in window) / len(window), step)]
        points += [(f"learning_rate/group_{group}", rate[step - 1], step)
                   for group, rate in enumerate(rates or [])]
        timed = [seconds for _, _, seconds in window if seconds]
        if timed:
            points.append(("step_seconds", sum(timed) / len(timed), step))
            points.append(("throughput", batch_size * len(timed) / sum(timed), step))
        width = next((d for start, d in reversed(widths) if start < step), None)
        if width is not None and self._widths.get(task) != width:
            self._widths[task] = width
            points.append(("devices", float(width), step))
        return points

    @property
    def models_left_out(self) -> str | None:
        """Why no model could be exported (None: none was left out so)."""
        return self._tasks.missing

    def _log_model(self, name: str) -> None:
        """The task's trained weights, exported as ``dione export`` does, as the
        ``model`` artifact of its run."""
        from dione.state.export import (
            ExportError,
            export_model,
            load_trained,
            trained_checkpoint,
        )

        task = self._tasks.get(name)
        if task is None:
            return
        try:
            checkpoint = trained_checkpoint(self.run_dir, name)
        except ExportError as err:  # its checkpoint is gone: say so on the run
            self.client.set_tag(self._children[name], "dione.model", f"not logged: {err}")
            self._models.add(name)
            return
        with tempfile.TemporaryDirectory(prefix="dione-mlflow-") as folder:
            export_model(load_trained(task, checkpoint), folder, task, checkpoint,
                         self.run_dir)
            self.client.log_artifacts(self._children[name], folder, "model")
        self.client.set_tag(self._children[name], "dione.model", "logged")
        self._models.add(name)

    def close(self) -> None:
        """Log each task's final results and status, and end the runs."""
        self.update(final=True)
        with RunStore(self.run_dir) as store:
            tasks = closing_summaries(store)
        for t in tasks:
            run_id = self._child(t.task, t.hyperparameters)
            results = [(_key(k), v, t.steps) for k, v in final_results(t).items()]
            self._log(t.task, results, {"trained": _value(t.trained or "-")})
            self.client.set_tag(run_id, "dione.status", t.status)
            if t.last_evaluation_failed and t.evaluation:
                self.client.set_tag(run_id, "dione.final_evaluation",
                                    f"failed: its last values, of step {t.evaluated_at}, "
                                    "are in its history, not final/")
            elif "dione.final_evaluation" in self.client.get_run(run_id).data.tags:
                # (a resume that ended the task kept it: a review)
                self.client.delete_tag(run_id, "dione.final_evaluation")
            if t.error:  # a stopped task's "error" is its rule's reason, not a failure
                self.client.set_tag(run_id, "dione.stop_reason" if t.status == "stopped"
                                    else "dione.error", short_error(t.error)[:5000])
            self.client.set_terminated(run_id, _TERMINAL.get(t.status, "KILLED"))
        # As the run's exit status: a task failed or diverged, FAILED (it read FINISHED
        # where `dione run` exited 1); one left unfinished, KILLED.
        ended = all(t.status in _TERMINAL for t in tasks)
        self.client.set_terminated(self.parent, "KILLED" if not ended else "FAILED" if any(
            _TERMINAL[t.status] == "FAILED" for t in tasks) else "FINISHED")
