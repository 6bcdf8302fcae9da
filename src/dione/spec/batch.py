"""A task's batches: how the global batch splits, and how a batch reaches the model and
its loss, whatever the batch's shape. One home for each rule: validation, every
technique and the batch source call these.

Splitting: the global batch divides into equal parts (data-parallel shares, pipeline
micro-batches, accumulation parts), each the mean of its samples, so that the mean of
the parts' mean losses is the batch's mean loss. A loss that averages over counted items
(tokens whose label is not -100) is a mean over a different number of them in each
part: there each part's mean is weighed by its share of the global batch's items
(``ItemShare``), so the parts again combine to the whole batch's loss.

With the task's ``loss``, the batch is an ``(inputs, target)`` pair or a dict whose
``labels`` field is the target; the model gets the inputs (a dict as keywords). With
``loss`` left out, the model gets the whole batch (a dict as keywords, a tuple as
arguments) and returns its own loss, as a Hugging Face model does when given
``labels``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dione.spec.draws import global_draws, seeded_draws
from dione.spec.task import ItemCounter, Task

__all__ = [
    "IGNORE_INDEX",
    "LABELS",
    "Batch",
    "ItemCounting",
    "ItemShare",
    "batch_map",
    "batch_rows",
    "call_model",
    "collate_draws",
    "collated",
    "item_counting",
    "labels_of",
    "loss_of",
    "model_arguments",
    "own_loss",
    "plain_batch",
    "samples",
    "shifted_tokens",
    "slice_batch",
    "split_problem",
    "split_target",
    "tokens",
]

LABELS = "labels"
# The label a token-averaged loss leaves out (torch's cross_entropy and Hugging Face's).
IGNORE_INDEX = -100
NUM_ITEMS = "num_items_in_batch"

# A collated batch: tensors, possibly in (nested) tuples, lists and dicts.
Batch = Any


def batch_map(fn: Callable[[torch.Tensor], Any], batch: Batch) -> Batch:
    """``batch`` with ``fn`` applied to each of its tensors, its structure kept."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return type(batch)({k: batch_map(fn, v) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple):
        return tuple(batch_map(fn, v) for v in batch)
    if isinstance(batch, list):
        return [batch_map(fn, v) for v in batch]
    return batch


def batch_rows(batch: Batch) -> int:
    """The number of samples in ``batch`` (its tensors' first dimension)."""
    rows: list[int] = []
    batch_map(lambda t: rows.append(t.shape[0] if t.dim() else 1), batch)
    if not rows:
        raise ValueError("a batch holds no tensor")
    return rows[0]


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Samples ``[start, stop)`` of ``batch``."""
    return batch_map(lambda t: t[start:stop] if t.dim() else t, batch)


def plain_batch(batch: Batch) -> Batch:
    """``batch`` with every mapping in it a dict: torch's pytree takes a mapping of
    another type (a tokenizer's ``BatchEncoding``) for one leaf, so a pipeline schedule
    handed it whole to every micro-batch, and shapes read through it found none."""
    if isinstance(batch, Mapping):
        return {k: plain_batch(v) for k, v in batch.items()}
    if type(batch) in (tuple, list):
        return type(batch)(plain_batch(v) for v in batch)
    return batch


def collated(task: Task, items: list[Any], seed: int) -> Batch:
    """``items`` collated by ``task``, its collate function's random draws (if any)
    seeded by ``seed``."""
    with seeded_draws() as seed_all:
        seed_all(seed)
        return task.collate(items)


def collate_draws(task: Task, items: list[Any]) -> bool:
    """Whether the task's collate function draws random numbers (random masking, as
    Hugging Face's ``DataCollatorForLanguageModeling``): it moves torch's, Python's or
    NumPy's global generator (a low masking rate may mask nothing on a few items), or
    ``items`` collated under two seeds, or twice under one, differ (a generator of its
    own: HF's ``seed=``). Such a function sees a share of a split batch, not the whole,
    so a split batch is drawn otherwise than single's."""
    if task.collate_fn is None:
        return False
    with seeded_draws() as seed_all:
        seed_all(0)
        before = global_draws()
        first = _tensors(task.collate(items))
        if global_draws() != before:
            return True
    return any(not _same_tensors(first, _tensors(collated(task, items, seed)))
               for seed in (0, 1))


def _same_tensors(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return len(first) == len(second) and all(
        a.shape == b.shape and bool(torch.isclose(a, b, rtol=0, atol=0, equal_nan=True).all())
        for a, b in zip(first, second, strict=True))


def labels_of(batch: Any) -> torch.Tensor:
    if isinstance(batch, Mapping) and isinstance(labels := batch.get(LABELS), torch.Tensor):
        return labels
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[1],
                                                                           torch.Tensor):
        return batch[1]
    raise ValueError(f"counting tokens needs a batch with a {LABELS!r} tensor (a dict) or a "
                     "target tensor (an (inputs, target) pair); give the task a loss_items "
                     "function that counts what its loss averages over")


def tokens(batch: Any) -> torch.Tensor:
    """The labels (or targets) in ``batch`` that are not -100: what a token-averaged loss
    counts (torch's ``cross_entropy`` by default, a masked or seq2seq model's own)."""
    return (labels_of(batch) != IGNORE_INDEX).sum()


def shifted_tokens(batch: Any) -> torch.Tensor:
    """The labels a causal language model's own loss counts: each position but the
    first predicts its label from the tokens before it, so the first is left out."""
    return (labels_of(batch)[..., 1:] != IGNORE_INDEX).sum()


def samples(batch: Any) -> int:
    """The samples in ``batch``: a loss that is a mean over samples counts these (every
    sample once), which needs no weighing at all."""
    rows = [t.shape[0] for t in _tensors(batch) if t.dim()]
    if not rows:
        raise ValueError("a batch holds no tensor with a sample dimension")
    return rows[0]


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _causal_language_model(model: nn.Module) -> bool:
    """Whether a Hugging Face model's own loss is a causal LM's (labels shifted by one):
    its loss type says so, or (a model whose class name maps to no loss type, as
    ``GPT2LMHeadModel``, falls back to the causal LM's loss) its class is an LM head."""
    loss_type = getattr(model, "loss_type", None)
    if loss_type is not None:
        return bool(loss_type == "ForCausalLM")
    name = type(model).__name__
    return name.endswith(("ForCausalLM", "LMHeadModel"))


def _takes_num_items(fn: Callable[..., Any], open_keywords: bool) -> bool:
    """Whether ``fn`` takes ``num_items_in_batch`` (by name; with ``open_keywords``, a
    ``**kwargs`` counts too, as Hugging Face models pass theirs to the loss)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == NUM_ITEMS or (open_keywords and p.kind is p.VAR_KEYWORD)
               for p in parameters)


@dataclass(frozen=True)
class ItemShare:
    """A part of the global batch as its loss counts: the items it holds, the global
    batch's, and into how many equal parts the batch is split (over ranks, micro-batches
    and accumulation parts), whose mean losses the technique averages."""

    # Counts, whole where the counter counts (tokens, samples), fractional where it
    # weighs (a class-weighted mean's weights: truncated to whole numbers, they were
    # refused, though the refusal told the user to count them so).
    items: float
    total: float
    parts: int
    keyword: bool  # the model (or loss) takes num_items_in_batch


def whole_if_whole(count: float) -> float:
    """``count`` as an int where it is one (a token count given to a model as
    num_items_in_batch stays an integer)."""
    return int(count) if count.is_integer() else count


@dataclass(frozen=True)
class ItemCounting:
    """How a task's loss counts items: what counts them, and whether the loss's owner
    (the model, for its own loss; else the task's loss) takes ``num_items_in_batch``."""

    counter: ItemCounter
    keyword: bool

    def count(self, batch: Any) -> float:
        return whole_if_whole(float(self.counter(batch)))

    def share(self, batch: Any, total: float, parts: int) -> ItemShare:
        return ItemShare(self.count(batch), total, parts, self.keyword)


def item_counting(task: Task, model: nn.Module) -> ItemCounting | None:
    """How ``task``'s loss counts items on ``model`` (unwrapped); None: by samples, each
    sample once. The task's ``loss_items`` where given (validation sets it where the
    rule below does not fit the model: ``dione.spec.validate``), else: a Hugging Face
    model's own loss counts its labels that are not -100 (shifted by one for a causal
    LM), a ``loss`` that takes ``num_items_in_batch`` its target's, any other samples."""
    if task.loss is None:
        hugging_face = hasattr(model, "loss_function") and hasattr(model, "config")
        keyword = _takes_num_items(type(model).forward, open_keywords=hugging_face)
        counter = task.loss_items or (
            (shifted_tokens if _causal_language_model(model) else tokens) if hugging_face
            else None)
    else:
        keyword = _takes_num_items(task.loss, open_keywords=False)
        counter = task.loss_items or (tokens if keyword else None)
    return None if counter is None or counter is samples else ItemCounting(counter, keyword)


def split_problem(batch_size: int, parts: int, what: str, task: str | None = None) -> str | None:
    """Why a global batch of ``batch_size`` (of ``task``) does not split into ``parts``
    equal ``what`` (e.g. "devices", "micro-batches"); None when it does."""
    if parts < 1 or batch_size % parts == 0:
        return None
    owner = f" of task {task!r}" if task is not None else ""
    return f"batch size {batch_size}{owner} is not divisible by {parts} {what}"


def split_target(task: Task, batch: Any) -> tuple[Any, Any]:
    """(what the model is called with, the target the task's loss takes; None when the
    model computes its own loss from the whole batch)."""
    if task.loss is None:
        return batch, None
    if isinstance(batch, Mapping):
        if LABELS not in batch:
            raise ValueError(
                f"task {task.name!r}: a dict batch needs a {LABELS!r} field for the task's "
                f"loss to compare against (its fields: {', '.join(map(str, batch))}); or "
                "leave loss out if the model returns its own")
        return {k: v for k, v in batch.items() if k != LABELS}, batch[LABELS]
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise ValueError(
        f"task {task.name!r}: with a loss, data items must be (inputs, target) pairs or "
        f"dicts with {LABELS!r}, not {type(batch).__name__}"
        + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else ""))


def model_arguments(inputs: Any, whole: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) to call the model with: a dict as keywords; with ``whole`` (the
    model takes the whole batch) a tuple as arguments; anything else as one argument."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if whole and isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def call_model(model: nn.Module, task: Task, inputs: Any) -> Any:
    """``model``'s output on ``inputs`` (the first part of ``split_target``)."""
    args, kwargs = model_arguments(inputs, whole=task.loss is None)
    return model(*args, **kwargs)


def own_loss(task: Task, output: Any, batch: Any = None) -> torch.Tensor:
    """The loss a model returned itself: a scalar tensor, ``output.loss``,
    ``output["loss"]``, or the first item of a tuple (as Hugging Face's Trainer takes
    ``outputs[0]`` from a model asked for tuples); a clear error when it returned none."""
    if isinstance(output, torch.Tensor) and output.numel() == 1:
        return output.reshape(())
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if (loss is None and isinstance(output, (tuple, list)) and output
            and isinstance(output[0], torch.Tensor) and output[0].numel() == 1):
        loss = output[0]
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.reshape(())
    what = (f"a tensor of shape {tuple(output.shape)}" if isinstance(output, torch.Tensor)
            else type(output).__name__)
    labelled = isinstance(batch, Mapping) and LABELS in batch
    raise ValueError(
        f"task {task.name!r} leaves loss out, so its model must return its loss (a scalar "
        f"tensor, an output with .loss, or a tuple that starts with it, as a Hugging Face "
        f"model does when the batch has {LABELS!r}); it returned {what}"
        + (" with loss=None" if loss is None and hasattr(output, "loss") else "")
        + (f" although the batch has {LABELS!r}: give the task a loss (on the model's "
           "output and the labels)" if labelled
           else ": give the task a loss, or labels in the batch"))


def loss_of(model: nn.Module, task: Task, batch: Any,
            share: ItemShare | None = None) -> torch.Tensor:
    """The task's mean loss on ``batch`` (already on the model's device); with ``share``,
    that mean weighed by the part's share of the global batch's counted items, times the
    number of parts: so the mean of the parts' results is the global batch's loss."""
    inputs, target = split_target(task, batch)
    extra = {NUM_ITEMS: max(share.items, 1)} if share is not None and share.keyword else {}
    if task.loss is None:
        args, kwargs = model_arguments(inputs, whole=True)
        output = model(*args, **kwargs, **extra)
        loss = own_loss(task, output, batch)
    else:
        output = call_model(model, task, inputs)
        loss = task.loss(output, target, **extra)
    if share is None or share.total == 0:  # no counted item anywhere: as single does
        return loss
    if share.items == 0 and not bool(torch.isfinite(loss.detach())):
        # A part with none of the counted items adds nothing to the global batch's
        # mean, as in single; its own mean over none is NaN (and so would its gradient
        # be, times 0). Zero through the output instead: the same gradients, none NaN.
        zero = _zero_through(output)
        if zero is not None:
            return zero
        raise ValueError(
            f"task {task.name!r}: a part of its global batch holds none of the items its "
            "loss counts, and its mean over none is not a number; single, which sees the "
            "whole batch, would not stop here. Let the model (or the loss) take "
            f"{NUM_ITEMS} (a sum over the part divided by it), or use fewer micro-batches "
            "or devices, so that no part is empty")
    return loss * (share.items * share.parts / share.total)


def _zero_through(output: Any) -> torch.Tensor | None:
    """Zero, connected to every finite floating tensor of a model's ``output`` that
    carries a gradient (so a backward through it gives zero gradients); None where it has
    none. Not through a model's own mean over none (NaN: times zero it stays NaN, and its
    backward divides by the count of none)."""
    from torch.utils._pytree import tree_flatten

    parts = output.to_tuple() if callable(getattr(output, "to_tuple", None)) else output
    grad = torch.is_grad_enabled()  # without: any finite output (validation's forwards)
    tensors = [t for t in tree_flatten(parts)[0] if isinstance(t, torch.Tensor)
               and t.is_floating_point() and (t.requires_grad or not grad)
               and bool(torch.isfinite(t.detach()).all())]
    if not tensors:
        return None
    return sum((t.sum() * 0.0 for t in tensors), torch.zeros((), device=tensors[0].device))
