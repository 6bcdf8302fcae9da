"""The technique interface, the slice a gang trains, and the worker-side helpers."""

from __future__ import annotations

import contextlib
import functools
import resource
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from dione.spec.batch import split_problem
from dione.spec.devices import DeviceKind, torch_device
from dione.spec.task import Task
from dione.state.checkpoint import (
    Progress,
    checkpoint_path,
    load_checkpoint,
    reseed,
    save_checkpoint,
)
from dione.techniques.batches import batch_map
from dione.techniques.gradients import clip_gradients

__all__ = [
    "Knobs",
    "SliceContext",
    "SliceOutcome",
    "SliceSpec",
    "Technique",
    "TechniqueError",
]

Knobs = Mapping[str, Any]


class TechniqueError(ValueError):
    """A technique asked to do what it cannot (wrong device count, unknown knob, ...)."""


@dataclass(frozen=True)
class SliceSpec:
    """One slice of one task, steps ``[start_step, end_step)``: what every worker needs.

    ``resume_from`` is the checkpoint to start from (None: from scratch, which must be
    step 0); the new checkpoint goes to ``<run_dir>/checkpoints/<task>/step-<end_step>``.
    """

    task: Task
    technique: Technique
    knobs: Knobs
    device_kind: DeviceKind
    device_ids: tuple[int, ...]
    start_step: int
    end_step: int
    resume_from: str | None
    run_dir: str  # the checkpoints' root: the run's storage (``--storage``)
    save: bool = True
    evaluate: bool = False
    # Trials only: the memory a device may use (exceeding it is an out-of-memory
    # failure, as on a GPU), and whether to time a load of the checkpoint just saved.
    memory_cap_bytes: int | None = None
    probe_load: bool = False

    @property
    def world(self) -> int:
        return len(self.device_ids)


@dataclass
class SliceOutcome:
    """What a slice produced, as rank 0 reports it.

    ``losses`` are the global mean loss of each step (the same numbers single-device
    training prints); ``step_seconds`` each step's wall time on this rank.
    """

    losses: list[float]
    step_seconds: list[float]
    checkpoint: str | None
    timings: dict[str, float] = field(default_factory=dict)
    peak_memory_bytes: int = 0
    evaluation: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class Technique(ABC):
    """How one task trains on g devices. Register instances with ``dione.register``.

    ``knobs`` maps each knob to its default; ``knob_settings`` proposes the settings
    worth trying on g devices, cheapest (fastest) first, and none where the technique
    does not apply. ``train`` runs inside every worker process of the gang.
    """

    name: ClassVar[str]
    exact: ClassVar[bool] = True
    knobs: ClassVar[Mapping[str, Any]] = {}
    # Whether train() needs torch.distributed initialised even on one device (FSDP's
    # device mesh does); a one-rank slice of a technique that does not runs without one.
    needs_process_group: ClassVar[bool] = True
    # Whether more devices mean less memory per device (sharding, stages); the trial
    # runner skips a replicating technique where one with fewer devices ran out of memory.
    shards_memory: ClassVar[bool] = False
    # Boolean knobs that only trade speed for memory when on (recomputation, resharding,
    # offloading): the trial runner tries a setting with one on only where the same
    # setting with it off ran out of memory.
    memory_knobs: ClassVar[tuple[str, ...]] = ()

    def knob_settings(self, task: Task, devices: int, kind: DeviceKind) -> list[dict[str, Any]]:
        """Settings worth profiling for ``task`` on ``devices`` devices (default: defaults)."""
        return [] if self.check(task, devices, {}, kind) else [dict(self.knobs)]

    def check(self, task: Task, devices: int, knobs: Knobs, kind: DeviceKind) -> list[str]:
        """Why this technique cannot train ``task`` so (empty: it can)."""
        reasons = []
        if not task.allows(self.name):
            allowed = ", ".join(task.techniques or ())
            reasons.append(f"task {task.name!r} allows only: {allowed}")
        for knob, value in knobs.items():
            if knob not in self.knobs:
                known = ", ".join(self.knobs) or "none"
                reasons.append(f"{self.name} has no knob {knob!r} (its knobs: {known})")
            elif type(value) is not type(self.knobs[knob]):
                reasons.append(
                    f"{self.name} knob {knob!r} takes a {type(self.knobs[knob]).__name__}, "
                    f"not {value!r}"
                )
        parts, what = self.batch_parts(devices, self.resolve(knobs))
        problem = (split_problem(task.batch_size, parts, what, task.name)
                   if isinstance(parts, int) else None)
        if problem is not None:
            reasons.append(problem)
        return reasons

    def lighter(self, knobs: Knobs) -> list[dict[str, Any]]:
        """Settings that must have run out of memory before ``knobs`` is worth a trial:
        ``knobs`` with one boolean memory knob off (override for other memory knobs)."""
        return [{**knobs, knob: False} for knob in self.memory_knobs
                if knobs.get(knob) is True]

    def batch_parts(self, devices: int, knobs: Knobs) -> tuple[int, str]:
        """Into how many equal parts the global batch is split, and what they are called
        (data parallelism: one share per device)."""
        return devices, "devices"

    def rank_role(self, rank: int, world: int) -> str:
        """What ``rank`` does in the gang, for error messages (e.g. its pipeline stage)."""
        return ""

    def resolve(self, knobs: Knobs) -> dict[str, Any]:
        """The knobs with defaults filled in."""
        return {**self.knobs, **knobs}

    @abstractmethod
    def train(self, ctx: SliceContext) -> SliceOutcome:
        """Train ``ctx.spec``'s steps from its checkpoint to a new one (in every worker)."""

    def __repr__(self) -> str:
        return f"<technique {self.name}>"


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
        # Set by the worker: hands a progress record to the launcher (no file involved).
        self.on_progress: Callable[[dict[str, Any]], None] | None = None
        self._last_progress = float("-inf")  # the first step reports at once
        self._first_step_done = self.timings["begin"]

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

    def step_done(self, loss: torch.Tensor | None = None) -> None:
        """After each step: enforce the memory cap, and at most once a second send this
        rank's progress (steps done, latest loss it holds) for the orchestrator's display."""
        self.check_memory()
        self.steps_done += 1
        now = time.perf_counter()
        if self.steps_done == 1:
            self._first_step_done = now
        if self.on_progress is None or now - self._last_progress < 1.0:
            return
        self._last_progress = now
        record = {"step": self.spec.start_step + self.steps_done,
                  "loss": None if loss is None else float(loss),
                  "seconds": now - self.timings["begin"],
                  # The pace since the first step: start-up excluded.
                  "seconds_per_step": (now - self._first_step_done) / (self.steps_done - 1)
                  if self.steps_done > 1 else None}
        self.on_progress(record)

    def check_memory(self) -> None:
        """Fail like an out-of-memory GPU when this rank's peak passes the slice's cap."""
        cap = self.spec.memory_cap_bytes
        if cap is not None:
            peak = _peak_memory_bytes(self.device)
            if peak > cap:
                raise torch.OutOfMemoryError(
                    f"peak memory {peak / 2**20:.0f} MiB exceeds the device's memory cap of "
                    f"{cap / 2**20:.0f} MiB")

    def outcome(
        self,
        losses: Sequence[torch.Tensor],
        step_seconds: Sequence[float],
        checkpoint: str | None,
        loss_ranks: Sequence[int] | None = None,
    ) -> SliceOutcome:
        """Average each step's loss over the ranks in ``loss_ranks`` (default: all)."""
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
