"""A worker's view of its slice: rank, device, and the training chores every technique
shares (model and optimizer from the checkpoint, autocast, the update, progress, saving)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from dione.spec.batch import batch_map
from dione.spec.devices import torch_device
from dione.state.checkpoint import (
    Progress,
    checkpoint_path,
    load_checkpoint,
    reseed,
    save_checkpoint,
)
from dione.techniques import import_clock
from dione.techniques.base import SliceOutcome, SliceSpec
from dione.techniques.evaluate import (
    evaluate_model,
    metrics_agree,
    model_from_state,
    note_evaluation_error,
    stages_on_rank0,
)
from dione.techniques.gradients import clip_gradients

__all__ = ["SliceContext"]


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # The peak resident memory since the worker began this slice (VmHWM, which a warm
    # worker resets per slice); ru_maxrss (KiB on Linux, whole process life) elsewhere.
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class SliceContext:
    """A worker's view of its slice: rank, device, and the shared training chores."""

    def __init__(self, spec: SliceSpec, rank: int, world: int) -> None:
        self.spec = spec
        self.task = spec.task
        self.rank = rank
        self.world = world
        self.device = torch_device(spec.device_kind, spec.device_ids[rank])
        self.knobs = spec.technique.resolve(spec.knobs)
        self.timings: dict[str, float] = {"begin": time.perf_counter()}
        self.steps_done = 0
        # Each step's loss on this rank (zero where the rank holds none) and its seconds,
        # kept by ``step_done`` for ``outcome``.
        self.losses: list[torch.Tensor] = []
        self.step_seconds: list[float] = []
        self._step_began = self.timings["begin"]
        # Set by the worker: hands a progress record to the launcher (no file involved).
        self.on_progress: Callable[[dict[str, Any]], None] | None = None
        self._last_progress = float("-inf")  # the first step reports at once
        # Set once the technique evaluated its live model (``evaluate``); else the worker
        # evaluates the slice's checkpoint.
        self.evaluated = False
        self._first_step_done = self.timings["begin"]
        self._imports_before_steps = import_clock.seconds()
        self.imports_in_steps = 0.0

    @functools.cached_property
    def dataset(self) -> Any:
        return self.task.data()

    def build_model(self, on_device: bool = True) -> nn.Module:
        """The task's model, initialised from its seed (identical on every rank); on the
        host with ``on_device=False`` (a pipeline cuts its stage out first)."""
        torch.manual_seed(self.task.seed)
        model = self.task.model()
        return model.to(self.device) if on_device else model

    def start_training(self, model: nn.Module) -> tuple[torch.optim.Optimizer, Any | None]:
        """The task's optimizer and scheduler over ``model``'s parameters, restored from
        the slice's checkpoint (collective), with the model in training mode."""
        optimizer = self.task.optimizer(model.parameters())
        scheduler = self.task.lr_scheduler(optimizer) if self.task.lr_scheduler else None
        self.restore(model, optimizer, scheduler)
        model.train()
        self._step_began = time.perf_counter()  # the first step's time starts here
        self._imports_before_steps = import_clock.seconds()
        return optimizer, scheduler

    def to_device(self, batch: Any) -> Any:
        """``batch`` (a tensor, or tuples and dicts of them) on this rank's device."""
        return batch_map(lambda t: t.to(self.device, non_blocking=True), batch)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The task's precision for a forward and its loss (fp32: nothing to do)."""
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.task.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    @functools.cached_property
    def scaler(self) -> torch.amp.GradScaler | None:
        """fp16's loss scaler (bf16 has float32's range and needs none); checkpointed."""
        if self.task.precision != "fp16":
            return None
        return torch.amp.GradScaler(self.device.type)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled under fp16."""
        scaled = self.scaler.scale(loss) if self.scaler is not None else loss
        scaled.backward()  # type: ignore[no-untyped-call]

    def apply_update(self, optimizer: torch.optim.Optimizer,
                     parameters: Iterable[nn.Parameter],
                     group: dist.ProcessGroup | None = None) -> None:
        """One optimizer step on the gradients ``backward`` left: unscaled (fp16), clipped
        to the task's global norm (summed over ``group``'s ranks when each holds part of
        the model: pipeline stages), then applied."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        if self.task.clip_grad_norm is not None:
            clip_gradients(parameters, self.task.clip_grad_norm, group)
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def restore(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
        scheduler: Any | None = None,
    ) -> None:
        """Load the slice's starting checkpoint (collective), or seed a fresh start."""
        if self.spec.resume_from is None:
            if self.spec.start_step != 0:
                raise RuntimeError("a slice that does not start at step 0 needs a checkpoint")
            reseed(self.task.seed, 0, self.rank)
        else:
            progress = load_checkpoint(
                self.spec.resume_from, model, optimizer, batch_size=self.task.batch_size,
                seed=self.task.seed, scheduler=scheduler, scaler=self.scaler,
            )
            if progress.step != self.spec.start_step:
                raise RuntimeError(
                    f"checkpoint {self.spec.resume_from} is at step {progress.step}, "
                    f"but the slice starts at step {self.spec.start_step}"
                )
        self.timings["restored"] = time.perf_counter()

    def save(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
        scheduler: Any | None = None,
    ) -> str | None:
        """Write the checkpoint at the slice's end step (collective); its folder."""
        self.timings["trained"] = time.perf_counter()
        # Imports inside the steps are in the steps' times (the warm-up's excess).
        self.imports_in_steps = import_clock.seconds() - self._imports_before_steps
        if not self.spec.save:
            return None
        progress = Progress(
            task=self.task.name,
            step=self.spec.end_step,
            samples_seen=self.spec.end_step * self.task.batch_size,
            batch_size=self.task.batch_size,
            technique=self.spec.technique.name,
            knobs=dict(self.knobs),
            world=self.world,
        )
        path = checkpoint_path(self.spec.run_dir, self.task.name, self.spec.end_step)
        folder = save_checkpoint(path, model, optimizer, progress, scheduler, self.scaler)
        self.timings["saved"] = time.perf_counter()
        if self.spec.probe_load:
            # What the next slice's start will pay: the same checkpoint into the same
            # wrapped model. It loads the state just saved, so training is unchanged.
            load_checkpoint(str(folder), model, optimizer, batch_size=self.task.batch_size,
                            seed=self.task.seed, scheduler=scheduler, scaler=self.scaler)
            self.timings["load_probed"] = time.perf_counter()
        return str(folder)

    def step_done(self, loss: torch.Tensor | None, scheduler: Any | None = None) -> None:
        """After each optimizer update: step the learning-rate scheduler, keep the step's
        loss (``None``: this rank holds none, as a pipeline's early stages) and its time,
        enforce the memory cap, and at most once a second send this rank's progress
        (steps done, latest loss it holds) for the orchestrator's display."""
        if scheduler is not None:
            scheduler.step()
        self.losses.append(loss.detach().float() if loss is not None
                           else torch.zeros((), device=self.device))
        self.check_memory()
        self.steps_done += 1
        now = time.perf_counter()
        self.step_seconds.append(now - self._step_began)
        self._step_began = now
        if self.steps_done == 1:
            self._first_step_done = now
        if self.on_progress is None or now - self._last_progress < 1.0:
            return
        self._last_progress = now
        record = {"step": self.spec.start_step + self.steps_done,
                  "loss": None if loss is None else float(loss),
                  "seconds": now - self.timings["begin"], "world": self.world,
                  # The pace since the first step: start-up excluded.
                  "seconds_per_step": (now - self._first_step_done) / (self.steps_done - 1)
                  if self.steps_done > 1 else None}
        self.on_progress(record)

    def trained(self, outcome: SliceOutcome) -> None:
        """Tell the launcher, from rank 0, that the slice trained and saved (its outcome
        so far), before its evaluation: an evaluation that hangs, or whose process dies,
        then costs the training nothing (a hung evaluate threw away the slice it
        followed, three times over, and no message named it: review)."""
        if self.rank == 0 and self.on_progress is not None and outcome.checkpoint:
            self.on_progress({"trained": dataclasses.replace(
                outcome, evaluation={}, timings=dict(outcome.timings),
                extra=dict(outcome.extra))})

    def evaluation_ended(self) -> None:
        """Tell the launcher, from rank 0, that the evaluation returned (or raised, said
        in the outcome): what ends the gang after it is not the evaluation's doing."""
        if self.rank == 0 and self.on_progress is not None:
            self.on_progress({"evaluated": True})

    def evaluate(self, outcome: SliceOutcome, model: nn.Module | None) -> None:
        """The task's evaluation of the live trained model, into rank 0's ``outcome``,
        where the slice asks for one; called after the checkpoint is written, so a
        broken evaluation loses no training (its error goes into ``outcome``).
        ``model``: the whole model as the user defined it, on rank 0 (the others pass
        None)."""
        if not self.spec.evaluate:
            return
        with self.evaluating(outcome):
            if model is not None and self.rank == 0:
                self._evaluate_on_rank0(outcome, model, time.perf_counter(),
                                        import_clock.seconds())

    def evaluate_sharded(self, outcome: SliceOutcome, model: nn.Module) -> None:
        """Evaluate fsdp's live sharded model (collective, where the slice asks for an
        evaluation): every rank runs the task's evaluation on it together, fsdp
        gathering each unit's weights as its forward needs them, as in training, so no
        rank ever holds the whole model (a model sharded because it fits no device
        would not fit for its evaluation either). The ranks draw the same data from
        the task's seed and compute the same numbers; rank 0 keeps them. Where they
        differ beyond rounding or evaluate raised, the whole model is evaluated on rank
        0 instead; an error there goes into ``outcome``; the training is kept."""
        if not self.spec.evaluate:
            return
        with self.evaluating(outcome):
            began, imported = time.perf_counter(), import_clock.seconds()
            metrics: dict[str, float] | None = None
            raised: Exception | None = None
            try:
                metrics = evaluate_model(self.task, model)
            except Exception as err:  # tried on the whole model below
                raised = err
            answers: list[Any] = [None] * self.world
            dist.all_gather_object(answers, metrics)
            # Judged on what every rank holds alike (rank 0's answer against each): a
            # rank's own against the others, under a tolerance, let ranks decide apart
            # and the fallback's collective hang (a regression review).
            if answers[0] is not None and all(metrics_agree(a, answers[0]) for a in answers):
                if self.rank == 0:
                    outcome.evaluation = answers[0]
                    outcome.timings["evaluate_seconds"] = _without_imports(began, imported)
                return
            # The ranks disagree (a metric read from the weights, of which each rank
            # holds a shard: a weight norm read rank 0's half, review) or evaluate
            # raised on the sharded model (a weight used as a plain tensor): evaluated
            # as the user defined the model, whole on rank 0, as ddp's is.
            model.zero_grad(set_to_none=True)  # trained and saved: room for the whole model
            try:
                state = get_model_state_dict(model, options=StateDictOptions(
                    full_state_dict=True, cpu_offload=True))  # rank 0's only
                whole = (model_from_state(self.task, state, self.device)
                         if self.rank == 0 else None)
            except Exception as err:
                if self.rank == 0:
                    note_evaluation_error(outcome, _sharded_disagreed(answers, err, raised))
                return
            del state
            if whole is not None:
                self._evaluate_on_rank0(outcome, whole, began, imported)

    def evaluate_stages(self, outcome: SliceOutcome, model: nn.Module) -> None:
        """Evaluate a pipeline's model, which no rank holds whole (collective, where the
        slice asks for an evaluation): its stages' weights put together on rank 0 in
        memory, then the task's evaluation there of the model as the user defined it.
        What fails after the gathering (rank 0 building or loading the model, or
        evaluating it) goes into ``outcome``; the training is kept."""
        if not self.spec.evaluate:
            return
        with self.evaluating(outcome):
            began, imported = time.perf_counter(), import_clock.seconds()
            model.zero_grad(set_to_none=True)  # trained and saved: room for the whole model
            try:
                state = stages_on_rank0(model, self.rank, self.world)
                whole = (None if state is None
                         else model_from_state(self.task, state, self.device))
            except Exception as err:
                if self.rank == 0:
                    note_evaluation_error(outcome, err)
                return
            del state
            if whole is not None:  # rank 0: its seconds count the gathering too
                self._evaluate_on_rank0(outcome, whole, began, imported)

    @contextlib.contextmanager
    def evaluating(self, outcome: SliceOutcome) -> Iterator[None]:
        """Around an evaluation: the launcher told first that the slice trained and saved
        (``trained``), after that the evaluation returned (``evaluation_ended``)."""
        self.evaluated = True
        self.trained(outcome)
        yield  # an evaluate's Exception is in the outcome; what passes through (its
        # SystemExit, a collective's failure) ends the process: not said as returned,
        # so the launcher keeps the training and owes the evaluation (review)
        self.evaluation_ended()

    def _evaluate_on_rank0(self, outcome: SliceOutcome, model: nn.Module,
                           began: float, imported: float) -> None:
        """The task's evaluation of ``model`` into ``outcome``, with its seconds since
        ``began`` (less the imports since the import clock read ``imported``); its error
        instead, if it fails."""
        try:
            outcome.evaluation = evaluate_model(self.task, model)
        except Exception as err:
            note_evaluation_error(outcome, err)
            return
        outcome.timings["evaluate_seconds"] = _without_imports(began, imported)

    def check_memory(self) -> None:
        """Fail like an out-of-memory GPU when this rank's peak passes the slice's cap."""
        cap = self.spec.memory_cap_bytes
        if cap is not None:
            peak = _peak_memory_bytes(self.device)
            if peak > cap:
                raise torch.OutOfMemoryError(
                    f"peak memory {peak / 2**20:.0f} MiB exceeds the device's memory cap of "
                    f"{cap / 2**20:.0f} MiB")

    def outcome(self, checkpoint: str | None, loss_ranks: Sequence[int] | None = None
                ) -> SliceOutcome:
        """The slice's outcome from the steps ``step_done`` kept: each step's loss averaged
        over the ranks in ``loss_ranks`` (default: all)."""
        losses, step_seconds = self.losses, self.step_seconds
        local = (torch.stack([loss.detach().float() for loss in losses]) if losses
                 else torch.zeros(0, device=self.device))
        holders = list(range(self.world)) if loss_ranks is None else list(loss_ranks)
        if self.world > 1:
            if self.rank not in holders:
                local = torch.zeros(len(step_seconds), device=self.device)
            dist.all_reduce(local)
        mean = (local / len(holders)).cpu().tolist()
        base = self.timings["begin"]
        timings = {k: v - base for k, v in self.timings.items() if k != "begin"}
        return SliceOutcome(
            losses=[float(x) for x in mean],
            step_seconds=list(step_seconds),
            checkpoint=checkpoint,
            timings=timings,
            peak_memory_bytes=_peak_memory_bytes(self.device),
        )


def _sharded_disagreed(answers: Sequence[dict[str, float] | None], err: BaseException,
                       raised: BaseException | None) -> BaseException:
    """Why fsdp's evaluation went to the whole model, which then failed with ``err``;
    ``raised``: what evaluate raised on this rank's sharded model (None: nothing)."""
    if any(a is None for a in answers):
        why = "evaluate raised on fsdp's sharded model" + (
            f" ({type(raised).__name__}: {raised})" if raised is not None else " on a rank")
    else:
        given = [a or {} for a in answers]
        names = sorted({k for a in given for k in a
                        if not metrics_agree({k: a.get(k)}, {k: given[0].get(k)})})
        shown = "; ".join(f"{k}: " + ", ".join(f"{a.get(k)!r} on rank {r}"
                                                for r, a in enumerate(given))
                          for k in names[:3])
        why = (f"evaluate returned other numbers on the ranks of fsdp's sharded model "
               f"({shown}): a metric read from the weights sees each rank's shard")
    failed = RuntimeError(f"{why}; the whole model, put together on rank 0 to evaluate "
                          f"it as single's is, failed: {err}")
    failed.__cause__ = err
    return failed


def _without_imports(began: float, imported: float) -> float:
    """Seconds since ``began``, less the imports counted since the clock read
    ``imported``: an evaluation's first run in a worker imports what it uses (a metric's
    module), which later evaluations do not pay."""
    return time.perf_counter() - began - (import_clock.seconds() - imported)
