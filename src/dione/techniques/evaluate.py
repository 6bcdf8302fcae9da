"""Evaluate a task at the end of a slice, on the model it has just trained: the whole
model where a rank holds it (single, ddp), fsdp's sharded model on every rank together,
a pipeline's stages put together on rank 0 in memory; from the checkpoint only for a
technique that does none of these (a user's)."""

from __future__ import annotations

import contextlib
import math
import traceback
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from dione.spec.draws import seeded_draws
from dione.spec.task import Task
from dione.state.checkpoint import load_model_weights

if TYPE_CHECKING:
    from dione.techniques.base import SliceOutcome

__all__ = [
    "EvaluateReturned",
    "evaluate_checkpoint",
    "evaluate_model",
    "fresh_model",
    "metrics_agree",
    "model_from_state",
    "note_evaluation_error",
    "stages_on_rank0",
]


class EvaluateReturned(TypeError):
    """A task's evaluate returned what dione cannot record (not a dict of numbers): said
    as what it returned, not as an exception it raised (a review)."""


@contextlib.contextmanager
def _own_generators() -> Iterator[None]:
    """torch's generators (the host's and every CUDA device's in use) as they were,
    after the block."""
    devices = (list(range(torch.cuda.device_count()))
               if torch.cuda.is_initialized() else [])  # type: ignore[no-untyped-call]
    with torch.random.fork_rng(devices=devices):
        yield


def evaluate_checkpoint(task: Task, checkpoint: str, device: torch.device) -> dict[str, float]:
    """Load the checkpoint into a fresh, unwrapped model and run the task's evaluation,
    in one process with no gang: for a technique (a user's) whose slice evaluated no
    model of its own; the same numbers as the live model's."""
    if task.evaluate is None:
        return {}
    model = fresh_model(task).to(device)
    load_model_weights(checkpoint, model)
    return evaluate_model(task, model)


def evaluate_model(task: Task, model: nn.Module) -> dict[str, float]:
    """The task's evaluation of ``model`` in eval mode without gradients. A metric that
    is NaN or infinite (a perplexity that overflowed, a validation that diverged) is
    returned as it is: a stopping rule judging it stops the task as a loser, as Optuna
    prunes it, and the store leaves it out. Random draws inside it (torch's, NumPy's,
    Python's) start from the task's seed, and the generators are left as they were: a
    sampled evaluation gives the same numbers whichever technique trained the model
    (only torch's were seeded: one sampling with NumPy gave other numbers under fsdp,
    and after a resume under another technique, than under single: a review)."""
    if task.evaluate is None:
        return {}
    model.eval()
    with _own_generators(), seeded_draws() as seed_all, torch.no_grad():
        torch.manual_seed(task.seed)  # every device's generator, as seed_all does not
        seed_all(task.seed)
        metrics = task.evaluate(model)
    if not isinstance(metrics, Mapping):
        raise EvaluateReturned(f"evaluate of task {task.name!r} returned {type(metrics).__name__} "
                        f"{metrics!r:.80}: it must return a dict of metric names to numbers, "
                        "e.g. {'accuracy': 0.93}")
    result = {}
    for name, value in metrics.items():
        try:
            # float() takes "0.5" and True: an f"{acc:.3f}" passed where f"{acc:.1%}"
            # failed mid-run, and a flag was ranked as a metric (a review).
            if isinstance(value, (str, bytes)) or _boolean(value):
                raise TypeError
            number = float(value)
        except (TypeError, ValueError):
            raise EvaluateReturned(f"evaluate of task {task.name!r} returned {name!r}: "
                                   f"{value!r:.80}, "
                            "which is not a number: each metric must be a number (a float, "
                            "an int, a one-element tensor)") from None
        result[str(name)] = number
    return result


def _boolean(value: object) -> bool:
    """Whether ``value`` is True or False (Python's, NumPy's, a boolean tensor's)."""
    dtype = getattr(value, "dtype", None)
    return isinstance(value, bool) or (dtype is not None and str(dtype) in ("bool",
                                                                          "torch.bool"))


def metrics_agree(one: Mapping[str, Any] | None, other: Mapping[str, Any] | None) -> bool:
    """Whether two evaluations gave the same metrics up to rounding (relative 1e-5: a
    GPU's reductions may differ in the last bits from run to run; NaN alike)."""
    if one is None or other is None or one.keys() != other.keys():
        return False
    return all(math.isclose(one[k], other[k], rel_tol=1e-5, abs_tol=1e-12)
               or (one[k] != one[k] and other[k] != other[k]) for k in one)


def stages_on_rank0(model: nn.Module, rank: int, world: int) -> dict[str, Any] | None:
    """Collective over a pipeline's gang: the whole model's weights (the real ones,
    under the user's names) in rank 0's host memory, None on the others; each stage's
    weights copied to its host and gathered on rank 0 over gloo (never through a
    device: NCCL's object gather would stage every rank's weights on rank 0's GPU)."""
    mine = {name: value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor)
            else value for name, value in get_model_state_dict(model).items()}
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    try:
        dist.gather_object(mine, gathered, dst=0, group=group)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
    del mine
    if gathered is None:
        return None
    whole: dict[str, Any] = {}
    for part in gathered:
        whole.update(part)  # a weight two stages share: the same values in both
    return whole


def model_from_state(task: Task, state: dict[str, Any], device: torch.device) -> nn.Module:
    """The task's model as the user defined it, holding ``state`` (every name, strictly),
    on ``device``."""
    model = fresh_model(task)
    model.load_state_dict(state)
    return model.to(device)


def fresh_model(task: Task) -> nn.Module:
    """The task's model as its seed initialises it (on the host), torch's generators
    left as they were."""
    with _own_generators():
        torch.manual_seed(task.seed)
        return task.model()


def note_evaluation_error(outcome: SliceOutcome, err: BaseException) -> None:
    """Record in ``outcome`` why its evaluation failed (its training stands)."""
    outcome.extra["evaluation_error"] = "".join(
        traceback.format_exception(type(err), err, err.__traceback__))
