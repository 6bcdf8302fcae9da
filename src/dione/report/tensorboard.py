"""A run in TensorBoard: one TensorBoard run per task, written from the run store (the
workers are not slowed), as it trains or after it ended.

Per task: ``loss``, ``step_seconds``, ``throughput`` (samples per second) and each
parameter group's ``learning_rate/group_<k>`` (as its optimizer and scheduler set it:
``dione.report.learning_rates``) by step;
each evaluation as ``eval/<metric>`` at its step; each slice's technique, devices and
node as text at its first step and ``devices`` as a scalar at every step (it changes
where the task moved); at the end its status, and its hyperparameters with its final
loss and metrics in the HParams plugin, so TensorBoard's own HParams view compares the
configurations. Each adopted plan, as an image (the plan's Gantt chart against the
slices that had started by then), in a TensorBoard run of its own, ``_plans``. Needs
the ``tensorboard`` extra.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dione.report.dashboards import RunTasks
from dione.state.store import SIMULATED_FILE, RunStore
from dione.state.summaries import closing_summaries, final_results, short_error

if TYPE_CHECKING:  # imported by `dione report`, which starts without torch
    from dione.spec.task import Task

__all__ = ["PLANS_RUN", "TensorBoardExport"]

PLANS_RUN = "_plans"  # the TensorBoard run holding each adopted plan's chart
# HParams' session status by task status, as MLflow's runs end (the plugin has no
# "stopped": a task its rule stopped ended as the sweep meant it to). Any other status
# (a run that stopped before the task ended) is STATUS_UNKNOWN.
SESSION_STATUS = {"done": "STATUS_SUCCESS", "stopped": "STATUS_SUCCESS",
                  "failed": "STATUS_FAILURE", "diverged": "STATUS_FAILURE"}


def _hparam(value: Any) -> Any:
    """A value the HParams plugin takes (a number, a string or a bool)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, default=str)


class TensorBoardExport:
    """Writes what the store holds beyond what it wrote before (``update``), then the
    tasks' statuses and hyperparameters (``close``)."""

    def __init__(self, run_dir: str | Path, out: str | Path,
                 tasks: Sequence[Task] | None = None) -> None:
        """``tasks``: the run's, for each step's learning rates (default: the run's
        workload file, loaded when first needed)."""
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # the extra is not installed
            raise RuntimeError(f"TensorBoard output needs the tensorboard package: pip "
                               f"install 'dione[tensorboard]' ({err})") from None
        from tensorboard.compat.proto.summary_pb2 import (  # type: ignore[import-untyped]
            Summary,
        )

        self._writer_type = SummaryWriter
        self._summary, self._value = Summary, Summary.Value
        self._tasks = RunTasks(run_dir, tasks)
        self.run_dir = Path(run_dir)
        self.out = Path(out)
        self._writers: dict[str, Any] = {}
        self._steps: dict[str, int] = {}  # last step written per task
        self._slices: set[int] = set()
        self._evaluations: set[tuple[str, int, str]] = set()
        self._plans = 0  # adopted plans drawn

    def _writer(self, task: str) -> Any:
        if task not in self._writers:
            # A queue that never fills: with the default (10 events) every add_scalar
            # waited for the writer thread, 20 s of a 24,000-step run's close.
            # purge_step 0: this export writes the task's whole history from the store,
            # so what an earlier export (a report before, the run before a resume) left
            # in the folder is hidden, not shown twice.
            self._writers[task] = self._writer_type(log_dir=str(self.out / task),
                                                    max_queue=1_000_000, flush_secs=3600,
                                                    purge_step=0)
        return self._writers[task]

    def update(self) -> None:
        """Write the steps, slices and evaluations recorded since the last call."""
        with RunStore(self.run_dir) as store:
            batch = {t.name: t.batch_size for t in store.tasks()}
            totals = {t.name: t.total_steps for t in store.tasks()}
            devices: dict[str, list[tuple[int, int]]] = {}
            for s in store.slices():
                if s.status not in ("done", "diverged"):
                    continue
                devices.setdefault(s.task, []).append((s.start_step, len(s.device_ids)))
                if s.id not in self._slices:
                    self._slices.add(s.id)
                    self._writer(s.task).add_text(
                        "slice", f"steps {s.start_step}-{s.end_step}: {s.technique} "
                        f"{json.dumps(s.knobs)} on {s.node} devices {s.device_ids}",
                        global_step=s.start_step)
            for task, size in batch.items():
                writer = self._writer(task)
                last = self._steps.get(task, 0)
                spans = sorted(devices.get(task, []))
                rates = self._tasks.learning_rates(task, totals[task])
                for step, loss, seconds in store.metrics(task, after=last):
                    values = [("loss", loss)]
                    values += [(f"learning_rate/group_{group}", rate[step - 1])
                               for group, rate in enumerate(rates or [])]  # as set
                    if seconds:
                        values += [("step_seconds", seconds), ("throughput", size / seconds)]
                    while len(spans) > 1 and spans[1][0] < step:
                        spans.pop(0)  # the slices before this step's
                    if spans and spans[0][0] < step:
                        values.append(("devices", spans[0][1]))
                    # One event a step with every scalar (add_scalar makes one each: a
                    # 24,000-step run's close took 20 s).
                    writer.file_writer.add_summary(self._summary(
                        value=[self._value(tag=tag, simple_value=float(v))
                               for tag, v in values]), step)
                    self._steps[task] = step
                for metric, points in store.evaluations(task).items():
                    for step, value in points:
                        if (task, step, metric) not in self._evaluations:
                            self._evaluations.add((task, step, metric))
                            writer.add_scalar(f"eval/{metric}", value, step)
                writer.flush()
            self._draw_plans(store)

    def _draw_plans(self, store: RunStore) -> None:
        """Each plan adopted since the last call, as an image at its index: its Gantt
        chart against the slices that had started when it was adopted."""
        import matplotlib.image

        from dione.orchestrate.plans import read_plans
        from dione.report.gantt import draw_gantt

        plans = read_plans(self.run_dir)
        if len(plans) <= self._plans:
            return
        slices = store.slices()
        zero = min([p.clock_zero for p in plans] + [s.started_at for s in slices])
        simulated = (self.run_dir / SIMULATED_FILE).is_file()
        order = [t.name for t in store.tasks()]  # the report's colours
        writer = self._writer(PLANS_RUN)
        with tempfile.TemporaryDirectory(prefix="dione-tb-") as folder:
            for index in range(self._plans, len(plans)):
                plan = plans[index]
                adopted = plan.clock_zero + plan.at
                path = Path(folder) / f"plan-{index}.png"
                # What had run by then: later slices left out, running ones cut there.
                seen = [replace(s, ended_at=min(s.ended_at or adopted, adopted))
                        for s in slices if s.started_at <= adopted]
                draw_gantt(plan, seen, zero, path, simulated,
                           f"plan {index + 1}, adopted at {adopted - zero:.0f} s",
                           order=order)
                image = matplotlib.image.imread(path)[..., :3]  # RGBA floats: RGB
                writer.add_image("plan", image, index, dataformats="HWC")
        writer.flush()
        self._plans = len(plans)

    def close(self) -> None:
        """Write each task's status, hyperparameters and final results; let go."""
        self.update()
        with RunStore(self.run_dir) as store:
            tasks = closing_summaries(store)
        for t in tasks:
            writer = self._writer(t.task)
            earlier = (f"; its last evaluation failed, so no final/ metric (its values of "
                       f"step {t.evaluated_at} are in its scalars)"
                       if t.last_evaluation_failed and t.evaluation else "")
            writer.add_text("status", f"{t.status} at step {t.steps} of {t.total_steps}"
                            + (f": {short_error(t.error)}" if t.error else "") + earlier,
                            t.steps)
            results = final_results(t)
            self._write_hparams(writer, {k: _hparam(v) for k, v in t.hyperparameters.items()}
                                or {"task": t.task}, results, t.status)
        for writer in self._writers.values():
            writer.close()

    def _write_hparams(self, writer: Any, hparams: dict[str, Any],
                       results: dict[str, float], status: str) -> None:
        """What ``add_hparams`` writes, but with the task's session status: torch's
        writes STATUS_SUCCESS for every session, a diverged task's too."""
        from tensorboard.plugins.hparams.api_pb2 import (  # type: ignore[import-untyped]
            Status,
        )
        from tensorboard.plugins.hparams.plugin_data_pb2 import (  # type: ignore[import-untyped]
            HParamsPluginData,
        )
        from torch.utils.tensorboard.summary import hparams as hparams_summaries

        experiment, start, end = hparams_summaries(hparams, results)  # type: ignore[no-untyped-call]
        data = HParamsPluginData.FromString(end.value[0].metadata.plugin_data.content)
        data.session_end_info.status = Status.Value(SESSION_STATUS.get(status,
                                                                       "STATUS_UNKNOWN"))
        end.value[0].metadata.plugin_data.content = data.SerializeToString()
        # In an event file of its own, as torch writes it: in the task's file, these
        # step-0 events after its last step read to TensorBoard as a restart, which
        # hides every step before.
        with self._writer_type(log_dir=writer.get_logdir()) as own:
            for summary in (experiment, start, end):
                own.file_writer.add_summary(summary)
            for name, value in results.items():
                own.add_scalar(name, value)
