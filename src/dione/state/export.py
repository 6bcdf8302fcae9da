"""A task's trained model out of a run directory: into Python, or into safetensors files.

The weights come from the task's checkpoint (whatever technique and device count wrote
it), loaded into a fresh, unwrapped model of the task; the export is the model's plain
``state_dict`` in ``model.safetensors`` (shared tensors such as tied embeddings stored
once), or, for a model with ``save_pretrained`` (Hugging Face), that method's output,
which ``from_pretrained`` reads back. ``dione.json`` beside it says where it came from.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from shlex import quote
from typing import Any, cast

import torch
from torch import nn

from dione.spec.settings import training_settings
from dione.spec.task import Task
from dione.state.checkpoint import (
    CorruptCheckpoint,
    latest_on_disk,
    load_model_weights,
    read_progress,
    verify_checkpoint,
)
from dione.state.private import write_whole
from dione.state.store import (
    SIMULATED_FILE,
    STORE_FILE,
    RunStore,
    SliceRecord,
    not_a_run,
    trained_by_train,
)
from dione.state.summaries import best_kept, exactness_of, inexact_spans, techniques_in_turn

__all__ = [
    "PROVENANCE_FILE",
    "ExportError",
    "check_export_folder",
    "export_model",
    "kept_checkpoint",
    "load_trained",
    "loaded_provenance",
    "model_edited",
    "trained_checkpoint",
    "workload_of_run",
    "workload_of_task",
]

WEIGHTS_FILE = "model.safetensors"
PROVENANCE_FILE = "dione.json"
EXTRA_STATE_FILE = "extra_state.pt"  # non-tensor extra state: torch.load(weights_only=True)
_STAGING = ".dione-export-"  # a folder an export saves into before its files replace any


class ExportError(ValueError):
    """The run directory has no trained model of that task to give (the message says why)."""


def trained_checkpoint(run_dir: str | Path, task: str, latest: bool = False) -> Path:
    """The checkpoint holding ``task``'s trained weights: its final one once the run
    store says it is done; with ``latest``, its newest one whatever its status. A run
    directory of ``dione train`` (no store) gives its newest checkpoint."""
    run = _trained_run(run_dir)
    if not (run / STORE_FILE).is_file():
        found = latest_on_disk(run, task)
        if found is None:
            raise ExportError(f"{run} holds no checkpoint of task {task!r} (and no run "
                              f"store); check the task's name and the run directory")
        return _intact(found)
    with RunStore(run) as store:
        record = store.task(task)
        names = [t.name for t in store.tasks()]
        checkpoint = store.latest_checkpoint(task) if record is not None else None
        ever_saved = record is not None and bool(store.checkpoints(task))
        elsewhere = record is not None and store.checkpoints_elsewhere(task)
        invalid = store.invalid().get(task) if record is None else None
    if invalid:
        raise ExportError(f"task {task!r} of run {run} was invalid and never trained "
                          f"({'; '.join(invalid)}): fix it, then `dione resume` the run")
    if record is None:
        raise ExportError(f"run {run} has no task {task!r}; its tasks: "
                          + (", ".join(names) if names else "none yet (a run records its "
                             "tasks once it has profiled them: it may be profiling still)"))
    if record.status in ("stopped", "diverged") and checkpoint is None:
        anew = ("change what made it diverge (a lower learning rate, say) and train it "
                "anew" if record.status == "diverged" else "train its configuration anew")
        raise ExportError(f"task {task!r} is {record.status} and was never checkpointed: "
                          f"it holds no weights to give and will not train again; {anew} "
                          "to get them")
    if record.status != "done" and not latest:
        status = _as_left(run, task, record.status)
        step = f"; its newest checkpoint is at step {checkpoint.step}" if checkpoint else ""
        latest_fix = "take its newest checkpoint as it is (--latest; dione.load(..., latest=True))"
        if record.status in ("stopped", "diverged"):  # resume never trains it again
            raise ExportError(f"task {task!r} is {record.status}, not done{step}, and will "
                              f"not train again: {latest_fix}")
        from dione.state.lock import launcher_gone

        if not launcher_gone(run):  # `dione resume` of it is refused (a review)
            raise ExportError(f"task {task!r} is {status}, not done{step}: a dione launcher "
                              f"is training the run now; wait for it to finish (`dione "
                              f"status {quote(str(run))}` follows it), or {latest_fix}")
        how = (f"`dione resume {quote(str(run))}`" if (run / "run.json").is_file() else
               f"`dione train WORKLOAD --task {quote(task)} --out {quote(str(run))}`"
               if trained_by_train(run)
               else "dione.run (or dione.optuna.optimize) again with this run directory")
        raise ExportError(f"task {task!r} is {status}, not done{step}: finish it with "
                          f"{how}, or {latest_fix}")
    if checkpoint is None and record.status in ("pending", "running", "paused"):
        raise ExportError(f"task {task!r} of run {run} has no checkpoint yet: none of its "
                          "slices has ended; ask again once one has")
    if checkpoint is None and not ever_saved:
        # It never saved one (it failed before): "deleted; its weights are gone" said
        # otherwise (a review).
        raise ExportError(f"task {task!r} of run {run} is {record.status} and never saved a "
                          "checkpoint: it has no weights to give")
    if checkpoint is None or not Path(checkpoint.path).is_dir():
        raise ExportError(f"task {task!r} of run {run} has no checkpoint on disk"
                          + (f" (the store names {checkpoint.path})" if checkpoint else "")
                          + (": its checkpoints' disk not mounted (--storage)? Mount it; "
                             "else the weights are gone: train the task anew" if elsewhere
                             else ": deleted; its weights are gone: train the task anew"))
    if record.status == "done" and not latest and checkpoint.step < record.total_steps:
        # Its final checkpoint's folder went (deleted, or a disk lost): an older one is
        # no trained model (it was exported as one, unsaid: review).
        how = (f"`dione resume {quote(str(run))}` trains its last steps again from step "
               f"{checkpoint.step}" if (run / "run.json").is_file() else
               f"`dione train WORKLOAD --task {quote(task)} --out {quote(str(run))}` trains "
               "its last steps again" if trained_by_train(run) else
               "train it again to its end")
        raise ExportError(f"task {task!r} is done, but its final checkpoint (step "
                          f"{record.total_steps}) is no longer on disk; its newest is at step "
                          f"{checkpoint.step}: {how}, or export that one as it is (--step "
                          f"{checkpoint.step}; --latest; dione.load(..., latest=True))")
    return _intact(Path(checkpoint.path))


def kept_checkpoint(run_dir: str | Path, task: Task, *, best: bool = False,
                    step: int | None = None) -> tuple[Path, dict[str, Any]]:
    """A checkpoint ``task`` keeps besides its final one, whatever its status: the one
    at ``step``, or (``best``) the one where its ``keep_best`` metric was best, by the
    metric and direction the run pruned by (the task's own where it recorded none); and
    why it is that one (``dione.json``'s ``chosen``)."""
    run = _trained_run(run_dir)
    if not (run / STORE_FILE).is_file():
        raise ExportError(f"{run} has no run store ({STORE_FILE}), which says what each "
                          "checkpoint is; give the run directory that `dione run --out` or "
                          "`dione train --out` wrote")
    with RunStore(run) as store:
        if store.task(task.name) is None:
            names = [t.name for t in store.tasks()]
            raise ExportError(f"run {run} has no task {task.name!r}; its tasks: "
                              f"{', '.join(names) or 'none'}")
        kept = [c for c in store.checkpoints(task.name) if c.complete]
        steps = ", ".join(str(c.step) for c in kept) or "none"
        if not best:
            found = next((c for c in kept if c.step == step), None)
            if found is None:
                raise ExportError(f"task {task.name!r} keeps no checkpoint at step {step}; "
                                  f"it keeps steps: {steps} (a run keeps the newest two, "
                                  "and the best evaluated with keep_best)")
            return _intact(Path(found.path)), {"by": "step"}
        chosen = best_kept(store, task.name, (task.keep_best, task.best_mode()))
    if isinstance(chosen, str):
        raise ExportError(f"task {task.name!r} {chosen}; it keeps steps: {steps} (--step; "
                          "dione.load(..., step=))")
    record, value, metric, mode = chosen
    return _intact(Path(record.path)), {"by": "best", "metric": metric, "mode": mode,
                                        "value": value}


def _intact(checkpoint: Path) -> Path:
    """``checkpoint`` once its files match the digests written with it."""
    try:
        verify_checkpoint(checkpoint)
    except CorruptCheckpoint as err:
        raise ExportError(f"{err}: its weights cannot be trusted. `dione resume` sets it "
                          "aside and trains again from the checkpoint before it") from None
    return checkpoint


def _trained_run(run_dir: str | Path) -> Path:
    """``run_dir``, once it is a folder where tasks trained (not a simulated run)."""
    run = Path(run_dir)
    if not run.is_dir():
        raise ExportError(f"{run} is not a directory; give the run directory that "
                          "`dione run --out` or `dione train --out` wrote")
    _not_simulated(run)
    return run


def _not_simulated(run: Path) -> None:
    if (run / SIMULATED_FILE).is_file():
        raise ExportError(f"{run} is a simulated run (`dione simulate`): no task trained "
                          "there, so it holds no weights")


def workload_of_run(run_dir: str | Path) -> str:
    """The workload file ``dione run`` started ``run_dir`` with (from its run.json)."""
    saved = Path(run_dir) / "run.json"
    _not_simulated(Path(run_dir))
    if not saved.exists() and not (Path(run_dir) / STORE_FILE).is_file():
        raise ExportError(f"{not_a_run(run_dir)}; give "
                          "the folder `dione run --out` (or dione.run's run_dir) wrote")
    if trained_by_train(run_dir):
        raise ExportError(f"{run_dir} was written by `dione train`, which records no "
                          "workload: give it (--workload FILE; dione.load(..., workload=FILE))")
    if not saved.exists() and (Path(run_dir) / STORE_FILE).is_file():
        raise ExportError(
            f"{run_dir} was trained from Python with task objects (dione.run(tasks), "
            "dione.optuna), not from a workload file: it has no run.json to name one. Give "
            "the tasks: dione.load(run_dir, task, workload=[...]); a dione.optuna run's "
            "trial: dione.optuna.load(study, make_task, trial_number, run_dir=...)")
    try:
        workload = str(json.loads(saved.read_text())["workload"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ExportError(f"cannot tell which workload {run_dir} was run with ({saved}: "
                          f"{type(err).__name__}); give the workload file "
                          "(--workload; dione.load(..., workload=))") from None
    if not Path(workload).is_file():
        raise ExportError(f"{run_dir} was run with {workload}, which is gone; give the "
                          "workload file (--workload; dione.load(..., workload=))")
    return workload


def workload_of_task(run_dir: str | Path, task: str) -> str:
    """The workload file that defines ``task`` of ``run_dir``: the one ``dione add``
    added it from, else the one the run was started with."""
    if not Path(run_dir).is_dir():
        what = "is a file, not a folder" if Path(run_dir).exists() else "does not exist"
        raise ExportError(f"{run_dir} {what}; give the run directory that `dione run "
                          "--out` (or dione.run's run_dir) wrote")
    if (Path(run_dir) / STORE_FILE).is_file():
        with RunStore(run_dir) as store:
            request = store.addition_of(task)
        if request is not None and Path(request.workload).is_file():
            return request.workload
    return workload_of_run(run_dir)


def load_trained(task: Task, checkpoint: str | Path) -> nn.Module:
    """A fresh, unwrapped model of ``task`` on the CPU with the checkpoint's weights, in
    eval mode. The caller's random state is left as it was (a notebook's own draws after
    a load went on from the task's seed)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(task.seed)
        model = task.model()
    load_model_weights(checkpoint, model)
    return model.eval()


def how_trained(run_dir: str | Path, task: str, step: int) -> dict[str, Any]:
    """How ``task``'s first ``step`` steps trained, from the run store: the techniques
    in turn, and ``exact``, ``statistical`` (dropout drew its own masks) or ``inexact``
    with the spans of steps and why (empty where the directory has no store: a ``dione
    train`` run's own checkpoints say their technique)."""
    if not (Path(run_dir) / STORE_FILE).is_file():
        return {}
    with RunStore(run_dir) as store:
        trained = [s for s in store.slices(task)
                   if s.status in ("done", "diverged") and s.start_step < step]
    inexact, statistical = inexact_spans(trained), inexact_spans(trained, "statistical")
    return {"techniques": techniques_in_turn(trained),
            "exactness": exactness_of(inexact, statistical).lower(),
            "inexact": inexact, "statistical": statistical, "spans": _spans(trained, step)}


def _spans(slices: Sequence[SliceRecord], step: int) -> list[dict[str, Any]]:
    """Each stretch of steps up to ``step`` one technique trained on one device count
    with one knob setting (the report's devices; techniques alone hid a move from 1
    device to 8, and the spans an accumulation or micro-batch count: a review)."""
    spans: list[dict[str, Any]] = []
    for s in slices:
        end = min(s.end_step, step)
        if (spans and spans[-1]["technique"] == s.technique
                and spans[-1]["devices"] == len(s.device_ids)
                and spans[-1]["knobs"] == s.knobs
                and spans[-1]["steps"][1] == s.start_step):
            spans[-1]["steps"][1] = end
        else:
            spans.append({"steps": [s.start_step, end], "technique": s.technique,
                          "devices": len(s.device_ids), "knobs": dict(s.knobs)})
    return spans


def loaded_provenance(run_dir: str | Path, task: str, checkpoint: str | Path
                      ) -> dict[str, Any]:
    """What ``dione.load`` says of a model it loads: its task, the checkpoint's step and
    technique, and ``how_trained`` up to that step."""
    progress = read_progress(checkpoint)
    return {"task": task, "step": progress.step, "technique": progress.technique,
            **how_trained(_trained_run(run_dir), task, progress.step)}


def status_in_run(run_dir: str | Path, task: str) -> dict[str, Any]:
    """The task's status in its run (``done``, ``stopped``, ``diverged``, ...), its
    length, and for a stopped one the decision that stopped it (its rung, metric value
    and reason): a model exported from a rung says so (empty with no store)."""
    if not (Path(run_dir) / STORE_FILE).is_file():
        return {}
    with RunStore(run_dir) as store:
        record = store.task(task)
        decisions = store.decisions() if record and record.status == "stopped" else []
    if record is None:
        return {}
    said: dict[str, Any] = {"status": _as_left(run_dir, task, record.status),
                            "total_steps": record.total_steps}
    stop = next((d for d in reversed(decisions) if d[0] == task and d[3]), None)
    if stop is not None:
        _, step, value, _, reason = stop
        said["stopped"] = {"step": step, "value": value if math.isfinite(value) else None,
                           "reason": reason}
    return said


def evaluation_at(run_dir: str | Path, task: str, step: int) -> dict[str, float]:
    """The metrics the run recorded for ``task``'s weights at ``step`` (empty where they
    were not evaluated there; the store keeps no value that was not finite)."""
    if not (Path(run_dir) / STORE_FILE).is_file():
        return {}
    with RunStore(run_dir) as store:
        found = store.evaluations(task)
    return {metric: value for metric, points in found.items() for at, value in points
            if at == step}


def check_export_folder(out: Path) -> None:
    """ExportError where ``out`` holds files and no earlier export (``dione.json``): an
    export writes its files over those of the same names."""
    if (out.is_dir() and not (out / PROVENANCE_FILE).is_file()
            and any(not p.name.startswith(_STAGING) for p in out.iterdir())):
        raise ExportError(f"{out} is not empty and holds no earlier export ({PROVENANCE_FILE}): "
                          "give a new or empty folder (-o), so that nothing of yours is "
                          "written over")


def export_model(model: nn.Module, folder: str | Path, task: Task,
                 checkpoint: str | Path, run_dir: str | Path | None = None,
                 chosen: dict[str, Any] | None = None) -> Path:
    """Write ``model``'s weights into ``folder`` (created; files there are replaced),
    and beside them what they are (``dione.json``: the task, its step, how it trained:
    from ``run_dir``'s store where given; ``chosen``: why this checkpoint, where it is
    not the task's final or newest one)."""
    out = Path(folder)
    check_export_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    for left in out.glob(f"{_STAGING}*"):  # of an export killed part way
        shutil.rmtree(left, ignore_errors=True)
    # Saved beside the folder's files first: a save that fails (a disk full, a model's
    # save_pretrained raising) leaves the earlier export as it was.
    staging = Path(tempfile.mkdtemp(prefix=_STAGING, dir=out))
    try:
        extra = _save(model, staging)
        written = sorted(p.name for p in staging.iterdir())
        # An earlier export's files go (a GPT-2's generation_config.json stayed beside a
        # BERT's weights); files of the user's (a tokenizer copied in) stay, but for one
        # of a name this export writes (a config.json of the user's), which is this
        # export's from then on.
        for name in {*_earlier_export(out), *written}:
            _remove(out / name)
        for name in written:
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress = read_progress(checkpoint)
    write_whole(out / PROVENANCE_FILE, json.dumps({
        "task": task.name, "step": progress.step, "technique": progress.technique,
        **({"chosen": chosen} if chosen else {}),
        **({"trained": how_trained(run_dir, task.name, progress.step),
            "run": status_in_run(run_dir, task.name),
            "evaluation": evaluation_at(run_dir, task.name, progress.step)}
           if run_dir is not None else {}),
        "checkpoint": str(Path(checkpoint).resolve()), "weights": WEIGHTS_FILE,
        **({"extra_state": EXTRA_STATE_FILE, "extra_state_keys": sorted(extra)}
           if extra else {}),
        "hugging_face": _hugging_face(model), "exported_at": time.time(),
        "files": written,  # what the next export into this folder replaces
        # How it was trained, beside what trained it: the recipe a reader of the weights
        # needs where the run directory is not at hand.
        "training": _recipe(task),
        # As JSON has them (a learning rate a number, not "0.001"); anything else as text.
        "hyperparameters": {k: v if isinstance(v, (bool, int, float, str, type(None)))
                            and not (isinstance(v, float) and not math.isfinite(v)) else str(v)
                            for k, v in task.hyperparameters.items()},
    }, indent=1) + "\n", 0o666)  # shared as the user's umask has it
    # safetensors writes its file readable by its owner only (save_pretrained's too); an
    # export is to be shared as the provenance beside it is (the user's umask).
    shared = (out / PROVENANCE_FILE).stat().st_mode & 0o777
    for name in written:
        _share(out / name, shared)
    return out


def _save(model: nn.Module, folder: Path) -> dict[str, Any]:
    """``model``'s weights into ``folder``: ``save_pretrained``'s files for a model that
    has it, else ``model.safetensors``; the non-tensor extra state written apart."""
    if _hugging_face(model):
        model.save_pretrained(str(folder))  # type: ignore[operator]
        return {}
    from safetensors.torch import save_model

    state = model.state_dict()
    # A module's get_extra_state may return anything (a vocabulary, a config):
    # safetensors holds tensors only, so what is not one goes to a file of its own.
    extra = {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}
    save_model(cast(nn.Module, _Tensors(state, extra)) if extra else model,
               str(folder / WEIGHTS_FILE))
    if extra:
        torch.save(extra, folder / EXTRA_STATE_FILE)
    return extra


def _hugging_face(model: nn.Module) -> bool:
    return callable(getattr(model, "save_pretrained", None))


def _remove(path: Path) -> None:
    """A file, link or folder (a save_pretrained's: a PEFT adapter's) gone, if there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _share(path: Path, mode: int) -> None:
    """``path`` (a folder: all it holds) readable as ``mode`` says; folders also
    searchable where readable."""
    if path.is_symlink():
        return
    if not path.is_dir():
        path.chmod(mode)
        return
    searchable = mode | ((mode & 0o444) >> 2)
    path.chmod(searchable)
    for root, folders, files in os.walk(path):
        for name in folders:
            Path(root, name).chmod(searchable)
        for name in files:
            Path(root, name).chmod(mode)


def model_edited(run_dir: str | Path, task: Task, model: nn.Module) -> str | None:
    """Why ``task``'s model is not the one its run trained, where the run recorded it
    (its parameter shapes, layers and the user's classes' code: ``model_shapes``) and it
    reads otherwise now (a ReLU made a Tanh in the workload file); None where alike or
    not recorded. A loaded model had the old weights in the new layers, unsaid, and
    `dione evaluate` recorded its figures as the run's (a review). ``model``: the task's,
    built (not built again here: a pretrained model's factory reads its weights)."""
    from dione.spec.settings import described_model

    if not (Path(run_dir) / STORE_FILE).is_file():
        return None
    with RunStore(run_dir) as store:
        recorded = store.training_settings(task.name).get("model")
    if not recorded:
        return None
    now = described_model(model)
    if now == recorded:
        return None
    return (f"task {task.name!r}'s model is not the one the run trained (recorded "
            f"{recorded}; the workload's now {now}): its weights were trained in the "
            "recorded model; put the workload's model back as it was (or give the "
            "workload the run trained)")


def _as_left(run: str | Path, task: str, status: str) -> str:
    """A task's status as `dione status` says it (``summaries.as_left``): ``interrupted``
    where no launcher holds its run now and it was running (a kill), or pending with
    steps trained or its last slice cut short (the export said "pending" of what status
    called interrupted: a review). Not where a launcher holds the run, this process's
    too (a notebook's run in another thread: a regression review)."""
    from dione.state.lock import launcher_gone
    from dione.state.summaries import as_left, summaries

    if status not in ("pending", "running") or not launcher_gone(run):
        return status
    with RunStore(run) as store:
        found = summaries(store, [task])
    return as_left(found, by_slices=trained_by_train(run))[0].status if found else status


def _recipe(task: Task) -> dict[str, Any]:
    """The task's optimizer and scheduler as the run store records them (with the
    module's numbers they read), its loss, seed, precision, clipping and batch."""
    settings = training_settings(task)
    return {"optimizer": settings["optimizer"], "lr_scheduler": settings["lr_scheduler"],
            "loss": settings["loss"],
            **{k: v for k, v in settings.items() if k.endswith(" reads") and v},
            "seed": task.seed, "precision": task.precision,
            "clip_grad_norm": task.clip_grad_norm, "batch_size": task.batch_size}


def _earlier_export(out: Path) -> list[str]:
    """The files an earlier export wrote into ``out``: those its ``dione.json`` lists, or
    for one that lists none (an older dione), the names exports write."""
    try:
        listed = json.loads((out / PROVENANCE_FILE).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    if isinstance(listed, list):  # names of this folder only (the file may be edited)
        return [n for n in listed if isinstance(n, str)
                and n not in ("", ".", "..", PROVENANCE_FILE)
                and not any(c in n for c in "/\\\x00")]
    known = {WEIGHTS_FILE, EXTRA_STATE_FILE, "config.json", "generation_config.json",
             "model.safetensors.index.json"}
    return [p.name for p in out.glob("*") if p.name in known
            or (p.name.startswith("model-") and p.name.endswith(".safetensors"))]


class _Tensors:
    """A model's state as ``safetensors.torch.save_model`` asks for it, its non-tensor
    extra state left out (save_model reads nothing but ``state_dict``)."""

    def __init__(self, state: dict[str, Any], extra: dict[str, Any]):
        self._state = {k: v for k, v in state.items() if k not in extra}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self._state)
