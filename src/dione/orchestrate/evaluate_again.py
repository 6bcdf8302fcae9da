"""A run's finished tasks evaluated again after it: those whose final evaluation failed
(a bug in ``evaluate`` fixed since) or never ran, on the weights of their final
checkpoint, recorded in the run store as the run would have recorded them."""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dione.spec.task import Task
from dione.state.checkpoint import read_progress
from dione.state.export import load_trained, model_edited, trained_checkpoint
from dione.state.lock import RunLock
from dione.state.store import EVALUATION_FAILED, SIMULATED_FILE, STORE_FILE, RunStore, not_a_run
from dione.techniques.evaluate import evaluate_model

__all__ = ["EvaluationAgain", "evaluate_again", "tasks_to_evaluate", "to_evaluate"]


@dataclass
class EvaluationAgain:
    """One task evaluated again: at which step, its metrics, or why it failed."""

    task: str
    step: int
    evaluation: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # the traceback, where its evaluate raised again

    @property
    def not_finite(self) -> list[str]:
        """Its metrics that are NaN or infinite: not recorded (a loser's, as a run
        keeps them out), the value recorded before left."""
        return sorted(k for k, v in self.evaluation.items() if not math.isfinite(v))


def to_evaluate(run_dir: str | Path, names: Sequence[str] = ()) -> list[str]:
    """The tasks ``evaluate_again`` takes: ``names`` once each is done in the run, else
    every done task whose final evaluation failed or is missing (ValueError naming the
    problem and the fix otherwise)."""
    run = Path(run_dir)
    if not (run / STORE_FILE).is_file():
        raise ValueError(f"{not_a_run(run)}; give the "
                         "folder `dione run --out` (dione.run's run_dir) wrote")
    if (run / SIMULATED_FILE).is_file():
        raise ValueError(f"{run} is a simulated run (`dione simulate`): no task trained "
                         "there, so there are no weights to evaluate")
    with RunStore(run) as store:
        tasks = {t.name: t for t in store.tasks()}
        if names:
            unknown = [n for n in names if n not in tasks]
            if unknown:
                raise ValueError(f"the run has no task {', '.join(map(repr, unknown))}; its "
                                 f"tasks: {', '.join(tasks) or 'none'}")
            undone = [f"{n} ({tasks[n].status})" for n in names if tasks[n].status != "done"]
            if undone:
                raise ValueError(
                    f"task(s) {', '.join(undone)} not done: their final weights are not "
                    "trained yet (resume the run) or never will be (stopped, diverged, "
                    "failed); dione.load(RUN_DIR, TASK, latest=True) gives the newest "
                    "weights of one to evaluate by hand")
            return list(dict.fromkeys(names))
        return [name for name, t in tasks.items() if t.status == "done" and (
            (t.error or "").startswith(EVALUATION_FAILED)
            or store.latest_evaluation(name)[0] != t.total_steps)]


def tasks_to_evaluate(run_dir: str | Path, names: Sequence[str],
                      workload_for: Callable[[str], Iterable[Task]]) -> list[Task]:
    """The tasks ``evaluate_again`` takes (``to_evaluate``'s), each found in the workload
    ``workload_for(name)`` gives; with no ``names``, only those that evaluate (KeyError
    naming the workload's tasks where one is not there)."""
    chosen = []
    for name in to_evaluate(run_dir, names):
        given = list(workload_for(name))
        found = next((t for t in given if t.name == name), None)
        if found is None:
            raise KeyError(f"the workload has no task {name!r}; its tasks: "
                           + ", ".join(t.name for t in given))
        chosen.append(found)
    return chosen if names else [t for t in chosen if t.evaluate is not None]


def evaluate_again(run_dir: str | Path, tasks: Sequence[Task], device: str = "cpu",
                   told: Callable[[EvaluationAgain], None] | None = None
                   ) -> list[EvaluationAgain]:
    """Each of ``tasks`` (done in the run; ``to_evaluate`` says which) evaluated on its
    final checkpoint's weights in this process, on ``device``; its metrics recorded at
    its last step (an earlier figure there replaced; one not finite kept out) and its
    failed evaluation cleared where one was recorded.
    One whose evaluate raises again is left as it was, its traceback returned: the
    others are evaluated all the same. ``told`` hears each as it is done."""
    import torch

    lacking = [t.name for t in tasks if t.evaluate is None]
    if lacking:  # before any is evaluated: none half done
        raise ValueError(f"task(s) {', '.join(map(repr, lacking))} have no evaluate in the "
                         "workload given: give each an evaluate(model) returning its "
                         "metrics, or give the workload that has one (--workload)")

    done = []
    # Held as a run holds it: a resume started meanwhile would evaluate beside us, and
    # `dione status` says the run is in use.
    lock = RunLock(run_dir)
    try:
        lock.acquire()
    except OSError as err:  # a read-only copy of a run: its store cannot take a figure
        import errno

        fix = ("the run's directory must be writable: copy it somewhere writable (cp -a) "
               "and evaluate the copy" if err.errno in (errno.EROFS, errno.EACCES,
                                                        errno.EPERM)
               else "fix that, then evaluate again")
        raise ValueError(f"cannot record evaluations in {run_dir}: {err.strerror or err} "
                         f"({err.filename or run_dir}); {fix}") from None
    with lock:
        checkpoints = [trained_checkpoint(run_dir, task.name) for task in tasks]
        for task, checkpoint in zip(tasks, checkpoints, strict=True):
            outcome = EvaluationAgain(task.name, read_progress(checkpoint).step)
            try:
                model = load_trained(task, checkpoint)
                edited = model_edited(run_dir, task, model)
                if edited:  # its figures would be recorded as the trained model's
                    raise ValueError(edited)
                outcome.evaluation = evaluate_model(task, model.to(torch.device(device)))
            except Exception as err:  # the user's evaluate: any error, said with its task
                outcome.error = "".join(traceback.format_exception(type(err), err,
                                                                   err.__traceback__))
            else:
                with RunStore(run_dir) as store:
                    store.record_evaluation(task.name, outcome.step, outcome.evaluation)
            done.append(outcome)
            if told is not None:
                told(outcome)
    return done
