"""What one training task is: model, data, loss, optimizer, batch, length, seed."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import torch
from torch import nn

from dione.spec.keywords import named_keywords
from dione.spec.stopping import StoppingRule

__all__ = [
    "PRECISIONS",
    "CollateFn",
    "DataFactory",
    "EvaluateFn",
    "ItemCounter",
    "LossFn",
    "ModelFactory",
    "OptimizerFactory",
    "SchedulerFactory",
    "Task",
]

ModelFactory = Callable[[], nn.Module]
# A map-style dataset whose items are (inputs, target) pairs (a TensorDataset's are), or
# dicts of tensors (a tokenizer's output, with "labels" for the target).
DataFactory = Callable[[], "torch.utils.data.Dataset[Any]"]
# (the model's output: a tensor, a tuple or a ModelOutput, and the target) -> mean loss.
LossFn = Callable[[Any, Any], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], "torch.optim.lr_scheduler.LRScheduler"]
EvaluateFn = Callable[[nn.Module], Mapping[str, float]]
# A list of data-set items -> a batch (torch's ``collate_fn``, e.g. a Hugging Face
# ``DataCollatorWithPadding``).
CollateFn = Callable[[list[Any]], Any]
# A batch (as collated) -> how many items its loss is the mean of (e.g. tokens whose
# label is not -100): ``dione.spec.batch.tokens`` and ``shifted_tokens`` are two.
ItemCounter = Callable[[Any], "int | torch.Tensor"]

# Autocast dtypes a task may train in; fp32 is no autocast.
PRECISIONS = ("fp32", "bf16", "fp16")


@named_keywords
@dataclass(frozen=True)
class Task:
    """One model to train; its training is defined here, never by the technique.

    The global batch size, the order of samples (from ``seed``), the optimizer and
    its hyperparameters belong to the task: every exact technique reproduces the
    loss trajectory of single-device training, whatever the device count.

    A batch is what the data set's items collate to. With ``loss`` given, the model is
    called on the inputs (``model(inputs)``, or ``model(**inputs)`` for a dict) and
    ``loss(output, target)`` must return the *mean* over the batch, so that ranks
    holding equal shares of the global batch average to the global loss; for a dict
    batch the target is its ``labels`` field and the model gets the other fields. With
    ``loss`` left out, the model gets the whole batch (``model(**batch)`` for a dict,
    ``model(*batch)`` for a tuple) and returns its own mean loss: a scalar tensor, or an
    output with ``.loss`` (a Hugging Face model given ``labels``).

    A loss averaged over counted items that differ per sample (tokens, with padding
    labelled -100) is exact too: dione counts the items of the whole global batch, and
    weighs each share's, micro-batch's or accumulation part's mean loss by its share of
    them, as Hugging Face's Trainer does with ``num_items_in_batch`` (a model or loss that
    takes that keyword gets it as well, so a part with no counted item adds nothing).
    What is counted: ``loss_items(batch)`` when given; for a Hugging Face model's own loss,
    its labels that are not -100 (after the shift a causal LM applies); for a ``loss``
    that takes ``num_items_in_batch``, the target's entries that are not -100; else every
    sample counts once. Validation checks on a few samples that halves of a batch
    combine to the whole batch's loss, and refuses a task whose loss they do not.

    A technique that is not exact (``xpipe``: asynchronous) trains the task only if it
    sets ``allow_inexact=True``; every slice records whether it trained exactly, and
    reports mark a task any of whose steps did not.

    ``stopping`` (``dione.Asha(...)``, ``dione.PausingAsha(...)``,
    ``dione.SuccessiveHalving(...)``, ``dione.Median(...)``, ``dione.Patience(...)``): a
    rule that stops the task early, at one of its rungs, where its metric falls behind
    the tasks that share the rule (or, under Patience, its own earlier rungs); its
    devices are planned again for the others at once (``dione.spec.stopping``).

    ``precision`` trains under autocast (``bf16``; ``fp16`` with a gradient scaler, on
    CUDA only); the weights and the optimizer stay in float32. ``clip_grad_norm`` clips
    each step's gradient to that global L2 norm (over the whole model, whatever the
    technique shards or stages).
    ``evaluate(model)`` runs once the task has finished, on the model in eval mode,
    and returns named metrics (higher or lower is better as the metric's name says;
    ``hyperparameters`` are free-form labels for reports); with ``eval_every=N`` also
    every N steps during training, and at each rung of a rule judged on an evaluated
    metric (a slice ends at each such step and evaluates in its worker: the live model
    on rank 0 under single and ddp, the live sharded model on every rank under fsdp, a
    pipeline's stages put together on rank 0), each result recorded with its step.
    ``keep_best`` names one of those metrics (never the training loss): the checkpoint of
    the step where it was best is kept beside the newest ones (which a run prunes to two),
    for ``dione export --best`` and ``dione.load(..., best=True)`` (a task that overfits
    is taken at its best evaluation, not its last step; Ray Tune's
    ``checkpoint_score_attribute``). Lower or higher is better as ``keep_best_mode`` says
    ("min", "max"); by default as the task's stopping rule judges that metric, else as
    its name says (a loss, an accuracy).
    """

    name: str
    model: ModelFactory
    data: DataFactory
    _: KW_ONLY
    optimizer: OptimizerFactory
    batch_size: int
    loss: LossFn | None = None
    steps: int | None = None
    epochs: float | None = None
    seed: int = 0
    evaluate: EvaluateFn | None = None
    techniques: tuple[str, ...] | None = None
    split_points: tuple[str, ...] | None = None
    lr_scheduler: SchedulerFactory | None = None
    hyperparameters: Mapping[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    clip_grad_norm: float | None = None
    collate_fn: CollateFn | None = None
    loss_items: ItemCounter | None = None
    allow_inexact: bool = False
    stopping: StoppingRule | None = None  # a stopping rule the sweep's tasks share (spec/stopping)
    eval_every: int | None = None  # also evaluate every this many steps, not just at the end
    keep_best: str | None = None  # keep the checkpoint where this evaluated metric was best
    keep_best_mode: str | None = None  # "min"/"max"; None: the stopping rule's, or the name's
    refused_techniques: Mapping[str, str] = field(default_factory=dict, repr=False,
                                                  compare=False)
    # What validation saw its training forward write in buffers (BatchNorm's aside):
    # (names written from the data, names written on every call alone); a batch split
    # into shares or parts writes them otherwise than single (techniques/exactness.py).
    buffers_written: tuple[tuple[str, ...], tuple[str, ...]] = field(
        default=((), ()), repr=False, compare=False)
    # Trainable parameters validation saw get no gradient in a training step: (in every
    # draw: a head only evaluation uses; in some draws only: layers skipped at random).
    unused_parameters: tuple[tuple[str, ...], tuple[str, ...]] = field(
        default=((), ()), repr=False, compare=False)
    # Why its loss does not combine over parts of a batch, for a task that allows only
    # single (validation found it; None: it does, or was not looked at): accumulation
    # then trains otherwise than single (it was recorded exact: a review).
    split_loss: str | None = field(default=None, repr=False, compare=False)
    # Whether its batch fetch (the data set's ``__getitems__``, its ``collate_fn``) draws
    # random numbers, seeded per share of a split batch: a share drawn otherwise than
    # single's (random masking).
    fetch_draws: bool = field(default=False, repr=False, compare=False)
    # Whether its training forward draws from torch's, Python's or NumPy's generators
    # (dropout, noise, a drop path): each share or stage of a split batch draws from
    # its own stream.
    forward_draws: bool = field(default=False, repr=False, compare=False)
    # Whether its data set draws from a generator of its own (not seeded per item as
    # the global ones are): an item depends on what its process fetched before, so a
    # share, a stage or a resumed slice draws otherwise than single uninterrupted.
    stateful_items: bool = field(default=False, repr=False, compare=False)

    def total_steps(self, dataset_size: int) -> int:
        """Steps to train: ``steps`` as given, or ``epochs`` over a data set of that size."""
        if self.steps is not None:
            return self.steps
        if self.epochs is None:
            raise ValueError(f"task {self.name!r}: give steps or epochs")
        return max(1, math.ceil(self.epochs * dataset_size / self.batch_size))

    def evaluation_steps(self, total: int) -> list[int]:
        """The steps, up to ``total``, after which the task is evaluated: every
        ``eval_every``, each rung of a stopping rule judged on an evaluated metric, and
        the end (none without ``evaluate``)."""
        if self.evaluate is None:
            return []
        steps = {total}
        if self.eval_every:
            steps |= set(range(self.eval_every, total, self.eval_every))
        if self.stopping is not None and self.stopping.metric != "loss":
            steps |= set(self.stopping.rungs(total))
        return sorted(steps)

    def slice_ends(self, total: int) -> list[int]:
        """The steps before ``total`` at which every slice of the task ends, wherever it
        was planned to go on: each step it evaluates after and each rung of its
        stopping rule (a decision is never late)."""
        ends = {s for s in self.evaluation_steps(total) if s < total}
        if self.stopping is not None:
            ends |= set(self.stopping.rungs(total))
        return sorted(ends)

    def best_mode(self) -> str | None:
        """Which way ``keep_best`` is better: "min" or "max" (None: no keep_best, or
        nothing says)."""
        if self.keep_best is None:
            return None
        if self.keep_best_mode is not None:
            return self.keep_best_mode
        rule = self.stopping  # not yet validated: any object
        if getattr(rule, "metric", None) == self.keep_best and (
                mode := getattr(rule, "mode", None)):
            return str(mode)  # as the rule that judges it
        from dione.spec.metrics import direction_by_name

        return direction_by_name(self.keep_best)

    def allows(self, technique: str) -> bool:
        """Whether the task lets ``technique`` train it (no allowlist: every technique)."""
        return self.techniques is None or technique in self.techniques

    def collate(self, items: list[Any]) -> Any:
        """A batch of ``items``, as the task collates them."""
        if self.collate_fn is not None:
            return self.collate_fn(items)
        from torch.utils.data._utils.collate import default_collate

        return default_collate(items)  # type: ignore[no-untyped-call]
