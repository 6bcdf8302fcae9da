"""The technique interface and the slice a gang trains (its spec and its outcome)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from dione.spec.batch import split_problem
from dione.spec.devices import DeviceKind
from dione.spec.task import Task

if TYPE_CHECKING:
    from dione.techniques.context import SliceContext

__all__ = [
    "Knobs",
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
    # A pipeline's cut of the task into this many stages, as its first slice at that
    # many decided it (``RunStore.cut``); None: decide it now.
    cut: Mapping[str, Any] | None = None

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
    # Whether every knob setting reproduces single's training (``inexactness`` says how
    # a setting does not); a task trains under an inexact one only if it opts in.
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
        inexact = self.task_inexactness(task, devices, self.resolve(knobs))
        if inexact is not None and not task.allow_inexact:
            reasons.append(f"{inexact}; task {task.name!r} trains only as single would "
                           "unless it sets allow_inexact=True")
        if self.name in task.refused_techniques:
            reasons.append(task.refused_techniques[self.name])
        for knob, value in knobs.items():
            if knob not in self.knobs:
                known = ", ".join(self.knobs) or "none"
                reasons.append(f"{self.name} has no knob {knob!r} (its knobs: {known})")
            elif type(value) is not type(self.knobs[knob]):
                reasons.append(
                    f"{self.name} knob {knob!r} takes {_a(type(self.knobs[knob]).__name__)}, "
                    f"not {value!r}"
                )
        parts, what = self.batch_parts(devices, self.resolve(knobs))
        problem = (split_problem(task.batch_size, parts, what, task.name)
                   if isinstance(parts, int) else None)
        if problem is not None:
            reasons.append(problem)
        return reasons

    def inexactness(self, knobs: Knobs) -> str | None:
        """How training under this technique with ``knobs`` (resolved) departs from
        single's, beyond floating-point reduction order (None: it does not)."""
        return None if self.exact else f"{self.name} is not exact"

    def task_inexactness(self, task: Task, devices: int, knobs: Knobs) -> str | None:
        """How training ``task`` under this technique on ``devices`` devices with
        ``knobs`` (resolved) departs from single's (None: it does not): the technique's
        own departure, or its model's (BatchNorm under a split batch)."""
        return self.inexactness(knobs)

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


def _a(noun: str) -> str:
    """``noun`` with its article: "an int", "a bool"."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"
