"""Validation of a workload before anything starts: every problem at once, each named."""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import inspect
import math
import re
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dc_field
from typing import Any

import torch
from torch import nn
from torch.utils.data import RandomSampler, SequentialSampler

from dione.frames import user_frame
from dione.spec.batch import split_problem
from dione.spec.devices import DeviceKind, local_device_kind
from dione.spec.draws import seeded_draws
from dione.spec.metrics import direction_by_name
from dione.spec.sameness import task_key
from dione.spec.stopping import StoppingRule
from dione.spec.task import PRECISIONS, ItemCounter, Task
from dione.spec.waiting import watched
from dione.spec.workload import Workload
from dione.words import some

__all__ = ["REAL_FORWARD_BYTES", "UNKNOWN_DIRECTION", "Problem", "WorkloadError", "alike",
           "build_model", "check_task", "checked_task", "in_a_group", "keep_best_doubts",
           "late_evaluation", "raised_line", "repeated_names", "rule_cadence_doubt",
           "split_valid",
           "training_loss_doubt", "validate_workload"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,99}")  # fullmatch: "$" let "a\n" in
_FACTORIES = ("model", "data", "loss", "optimizer", "evaluate", "lr_scheduler", "collate_fn",
              "loss_items")


# What a keep_best whose direction nothing says is told: a misspelt name is told so
# instead where evaluate is run to see (dione.techniques.checking).
UNKNOWN_DIRECTION = "does not say whether lower or higher is better"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one field of one task (task None: the workload as a whole)."""

    task: str | None
    field: str
    message: str
    # Where splitting a batch is what it is about: what the splitting techniques would
    # train otherwise, as (why, fix), where that is not its field's (``_SPLIT_LOSS``) and
    # the task trains so all the same (single's accumulation, an opt-in).
    split: tuple[str, str] | None = dc_field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        where = f"task {self.task!r}" if self.task is not None else "workload"
        return f"{where}, field {self.field!r}: {self.message}"


class WorkloadError(ValueError):
    """A workload with problems; ``problems`` lists every one of them."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"the workload has {len(self.problems)} problem(s):\n{lines}")


def raised_line(err: BaseException) -> str:
    """``err`` in one line, with where it was raised: the last frame of the user's code
    (not dione's, whose own message of what a user's function returned names no line,
    nor an installed package's, torch's own line where the user's called it), else the
    last outside dione."""
    found = user_frame([(f.filename, f.lineno) for f in traceback.extract_tb(err.__traceback__)])
    where = f" (at {found[0]}:{found[1]})" if found else ""
    return f"{type(err).__name__}: {err}{where}"


def build_model(factory: Callable[[], nn.Module]) -> nn.Module:
    """Build on the meta device (no memory, no time for big models); fall back to CPU,
    for a model whose construction reads a tensor's value."""
    try:
        with torch.device("meta"):
            return factory()
    except Exception:
        return factory()


# A model up to this size is built for real to try one batch through it (meta tensors
# cannot run models that read a tensor's value, as Hugging Face's masks do).
REAL_FORWARD_BYTES = 1 << 30


def _forward_problems(task: Task, model: nn.Module, dataset: Any, resolved: dict[str, Any]
                      ) -> list[Problem]:
    """``_try_forward`` inside a one-process gloo group when none exists: the task's code
    runs in a gang, where it may ask torch.distributed for its rank."""
    with in_a_group():
        return _try_forward(task, model, dataset, resolved)


@contextlib.contextmanager
def in_a_group() -> Iterator[None]:
    """A one-process gloo group around the block when none exists (and torch has them):
    for a task's code run here that asks torch.distributed for its rank, as in a gang."""
    import torch.distributed as dist

    if dist.is_initialized() or not dist.is_available():
        yield
        return
    store = dist.HashStore()  # type: ignore[attr-defined]  # exported untyped by torch
    # The group installs torch's exception hook ("[rank0]: " before every traceback
    # line), and it stays after the group is gone: keep the process's own.
    hook = sys.excepthook
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def _parts(inputs: Any) -> list[Any]:
    """A collated batch's inputs as a list: a dict's values, a tuple's items, or one."""
    return list(inputs.values()) if isinstance(inputs, dict) else (
        list(inputs) if isinstance(inputs, (tuple, list)) else [inputs])


def _dtypes_apart(model: nn.Module, inputs: Any, err: BaseException) -> Problem | None:
    """Where the forward raised of types, and the model's parameters are of one floating
    type while the batch's floating inputs are of others only (a float64 model on float32
    data; float64 data, as numpy makes it, on a float32 model), that, said of the field
    to change: it read as the data's problem, naming torch's file (a review)."""
    said = str(err)
    if not any(word in said for word in ("dtype", "scalar type", "Input type")):
        return None  # another error (a width), not to be said as this one
    held = {p.dtype for p in model.parameters() if p.is_floating_point()}
    parts = _parts(inputs)
    given = {p.dtype for p in parts if isinstance(p, torch.Tensor) and p.is_floating_point()}
    if len(held) != 1 or not given or held & given:
        return None
    [mine] = held
    name = str(mine).removeprefix("torch.")
    theirs = ", ".join(sorted(str(d).removeprefix("torch.") for d in given))
    if mine == torch.float32:  # the data's: float64 as numpy makes it, say
        return Problem(None, "data", f"its inputs are {theirs} and the model's parameters "
                       f"{name}: give the data as {name} (numpy makes float64: "
                       "torch.from_numpy(x).float())")
    return Problem(None, "model", f"its parameters are {name} and the batch's inputs "
                   f"{theirs}: build the model in float32 (precision='bf16' trains in mixed "
                   f"precision), or give data of {name}")


def _without_gradient(task: Task, model: nn.Module | None, inputs: Any,
                      target: Any) -> Problem | None:
    """A loss that follows the model's output but no gradient flows back through (taken
    from ``output.detach()``, ``.item()`` or numpy, or under ``torch.no_grad``), on a
    model as first built: it failed training in each trial as "no configuration fits",
    naming torch's autograd file (a review). Said only where the loss moves with the
    output: one that does not here (a masked loss's zero for a batch with no labelled
    item) may follow it on other batches (a regression review)."""
    from dione.spec.batch import call_model

    if model is None or task.loss is None or not any(p.requires_grad
                                                     for p in model.parameters()):
        return None
    try:
        with torch.enable_grad():
            output = call_model(model, task, inputs)
            loss = task.loss(output, target)
        if not isinstance(output, torch.Tensor) or not output.is_floating_point() or \
                not isinstance(loss, torch.Tensor) or loss.requires_grad:
            return None
        with torch.no_grad():
            moved = task.loss(output.detach() * 1.5 + 0.25, target)
        follows = isinstance(moved, torch.Tensor) and moved.numel() == 1 and bool(
            torch.isfinite(moved).all()) and float(moved) != float(loss)
    except Exception:  # raised otherwise here: training will say it, by rank
        return None
    if not follows:
        return None
    if not output.requires_grad:
        return Problem(task.name, "model", "its output carries no gradient (its forward "
                       "detaches it, or runs under torch.no_grad), so training cannot step: "
                       "return the output as computed")
    return Problem(task.name, "loss", "it follows the model's output, but no gradient flows "
                   "back through it (taken from output.detach(), .item() or numpy, or under "
                   "torch.no_grad), so training cannot step: compute it from the output "
                   "with torch's operations")


def _not_tensors(inputs: Any) -> str | None:
    """What of a collated batch's inputs is text or bytes, not a tensor (``str``), if
    any: default_collate leaves strings as they are."""
    parts = _parts(inputs)
    found = sorted({type(p).__name__ for p in parts if isinstance(p, (str, bytes))}
                   | {type(q).__name__ for p in parts if isinstance(p, (tuple, list))
                      for q in p if isinstance(q, (str, bytes))})
    return ", ".join(found) or None


def _try_forward(task: Task, model: nn.Module, dataset: Any, resolved: dict[str, Any]
                 ) -> list[Problem]:
    """Put a batch of two samples through the model and the loss, as training will (on
    the CPU, in float32): a batch the model cannot take, or a loss the model does not
    return, is named before any worker starts; then find what the loss averages over
    (``_loss_items``, into ``resolved``)."""
    from dione.spec.batch import call_model, own_loss, split_target

    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if size > REAL_FORWARD_BYTES:
        return []  # too big to try here; a worker reports the same error by rank
    try:
        items = [dataset[i] for i in range(min(2, task.batch_size, len(dataset)))]
        batch = task.collate(items)
        inputs, target = split_target(task, batch)
    except Exception as err:
        return [Problem(task.name, "data", f"a batch of its items cannot be made: "
                        f"{raised_line(err)}")]
    torch.manual_seed(task.seed)
    real = _unsynced(task.model())
    try:  # as first built, before any forward: what a resume builds (``_unkept_state``)
        pristine: nn.Module | None = copy.deepcopy(real)
    except Exception:
        pristine = None  # a model that cannot be copied here is not looked into
    try:
        with torch.no_grad():
            output = call_model(real, task, inputs)
    except Exception as err:
        if task.loss is None and isinstance(batch, (tuple, list)) and len(batch) > 1:
            # Without a loss the model gets the whole batch, target too: a model that
            # takes the inputs alone is a loss left out, not a data problem.
            try:
                with torch.no_grad():
                    real(batch[0])
            except Exception:
                pass
            else:
                return [Problem(task.name, "loss", f"none given, so the model gets the "
                                f"whole batch (model(*batch), its {len(batch)} parts) and "
                                f"must return its loss, but it takes the inputs alone "
                                f"({raised_line(err)}); give the task a loss=, e.g. "
                                "torch.nn.functional.cross_entropy")]
        mismatch = _dtypes_apart(real, inputs, err)
        if mismatch:
            return [Problem(task.name, mismatch.field, f"{mismatch.message}; the forward "
                            f"raised {raised_line(err)}")]
        texts = _not_tensors(inputs)
        return [Problem(task.name, "data", f"the model cannot take a batch of this data "
                        f"({type(inputs).__name__}"
                        + (f" with fields {', '.join(map(str, inputs))}"
                           if isinstance(inputs, dict) else "")
                        + f"): {raised_line(err)}"
                        # Its items hold text, not tensors: the data's doing, not the
                        # model's (a review read "the model cannot take").
                        + (f"; its inputs hold {texts}, not tensors: give a collate_fn that "
                           "makes tensors of them (a tokenizer's), or a data set whose "
                           "items are tensors" if texts else ""))]
    try:
        with torch.no_grad():
            loss = (own_loss(task, output, batch) if task.loss is None
                    else task.loss(output, target))
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            return [Problem(task.name, "loss", "must return a one-number tensor (the batch's "
                            f"mean loss), not {type(loss).__name__}"
                            + (f" of shape {tuple(loss.shape)}"
                               if isinstance(loss, torch.Tensor) else ""))]
    except Exception as err:
        field = "loss"
        message = str(err) if task.loss is None else f"raised {raised_line(err)}"
        return [Problem(task.name, field, message)]
    ungraded = _without_gradient(task, copy.deepcopy(pristine) if pristine is not None
                                 else None, inputs, target)
    if ungraded:
        return [ungraded]
    try:  # another batch for what a resume sees next (an ActNorm set up by the first)
        later = task.collate([dataset[i] for i in range(2, 4)]) if len(dataset) >= 4 \
            else batch
    except Exception:
        later = batch
    unkept = _unkept_state(task, pristine, batch, later) if pristine is not None else None
    if unkept:
        return [unkept]
    resolved["loss_items"], problems = _loss_items(task, real, dataset)
    # A batch its loss or model couples, where the task opted into inexact training (the
    # refusal said allow_inexact=True would train it, and it did not: a review).
    coupled = all(p.field in ("model", "loss") and not _raised_on_half(p) for p in problems)
    if task.techniques == ("single",) or (task.allow_inexact and coupled):
        # Nothing but accumulation splits its batch: what keeps its loss from combining
        # over parts makes accumulation inexact, no problem of the task (in-batch
        # negatives are why a task allows only single).
        said = next((p.split or _SPLIT_LOSS[p.field]
                     for p in problems if p.field in _SPLIT_LOSS), None)
        # What the slices record where the task opted in says what differs, not single's
        # fix.
        resolved["split_loss"] = (None if said is None else "; ".join(said)
                                  if task.techniques == ("single",) else said[0])
        return []
    return problems


def _unkept_state(task: Task, model: nn.Module, batch: Any, later: Any) -> Problem | None:
    """A problem where a resume trains ``model`` (a copy as first built, no forward yet;
    trained here) otherwise than going on would: after ``FORWARDS_BEFORE_RESUME``
    training forwards on ``batch`` (no step), a copy of the model as first built that
    loads its state_dict, as a resume does, gives another loss on ``later`` (another
    batch: a layer set up from the first batch it sees, an ActNorm with a plain flag,
    looks alike on the same one) and the same draws (torch's, NumPy's, Python's, as a
    checkpoint restores them) than the model itself. State a forward moves and no
    checkpoint keeps (a plain number attribute, a non-persistent buffer: an annealing
    counter) then trains each slice after the first otherwise (7e-2 off single, under
    the same technique, unmarked: a review); what the loss does not read (a number kept
    for a diagnostic), a cache filled alike, and state in persistent buffers are no
    problem."""
    from dione.spec.batch import loss_of

    going_on = model.train()  # the caller's copy, as first built
    try:
        resumed = copy.deepcopy(model).train()
    except Exception:
        return None  # a model that cannot be copied here is not looked into
    numbers = _loose_numbers(going_on)

    try:
        with seeded_draws() as seed_all, torch.no_grad():
            def loss(of: nn.Module, on: Any) -> torch.Tensor:
                seed_all(task.seed)  # the same draws each time: only the state differs
                return loss_of(of, task, on).detach()

            for _ in range(FORWARDS_BEFORE_RESUME):
                loss(going_on, batch)
            resumed.load_state_dict(going_on.state_dict())
            if alike(loss(going_on, later), loss(resumed, later)):
                return None
    except Exception:
        return None  # a forward that fails is said by the checks that need it
    moved = sorted(n for n, v in _loose_numbers(going_on).items()
                   if n in numbers and not alike(v, numbers[n]))
    return Problem(task.name, "model", (
        "its training forward changes state that its state_dict does not hold, and the "
        "loss with it"
        + (f" ({some(moved, 3)}: a plain attribute or a non-persistent buffer)" if moved
           else "") + ": a checkpoint cannot keep it, so every slice after the first "
        "(dione trains in slices, cut where the plan says) would start it anew, and a "
        "batch split in parts would move it once per part: the plan would change what the "
        "task learns; keep it in a persistent buffer (self.register_buffer('calls', "
        "torch.zeros((), dtype=torch.long))), which checkpoints hold"))


# Training forwards before the resume played in memory: state that acts only from a
# later call on (a warm-up counter) was missed after one (a regression review).
FORWARDS_BEFORE_RESUME = 3


def _loose_numbers(model: nn.Module) -> dict[str, Any]:
    """The model's plain number attributes and non-persistent buffers, by name: what a
    checkpoint does not keep, to name in a problem."""
    found: dict[str, Any] = {}
    for prefix, module in model.named_modules():
        at = f"{prefix}." if prefix else ""
        found.update({at + n: v for n, v in vars(module).items()
                      if type(v) in (int, float, bool) and not n.startswith("__")})
        found.update({at + n: b.detach().clone()
                      for n, b in module.named_buffers(recurse=False)
                      if n in module._non_persistent_buffers_set})
    return found


def alike(a: Any, b: Any) -> bool:
    """Equal, NaN where the other is NaN (a number or a buffer left NaN did not move):
    two tensors, or two plain values."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if not a.is_floating_point():
            return torch.equal(a, b)
        return a.shape == b.shape and bool(torch.isclose(a, b, rtol=0, atol=0,
                                                         equal_nan=True).all())
    return bool(a == b or (a != a and b != b))


# Why a task that allows only single trains otherwise under accumulation, by the field
# whose problem validation found (of another task, a refusal), and the fix: a task that
# allows only single is told both, one opted into inexact training records the why.
_SPLIT_LOSS = {
    "loss_items": ("its targets hold -100 (padding), and its loss says neither what it "
                   "averages over (loss_items=dione.tokens, dione.shifted_tokens or "
                   "dione.samples) nor takes num_items_in_batch, so the parts cannot be "
                   "weighed as single's mean", "give loss_items, or leave accumulation at 1"),
    "loss": ("the halves of a batch do not combine to the whole batch's loss (it is not a "
             "mean over its samples or tokens: in-batch negatives?)",
             "leave accumulation at 1, or give loss_items= where it averages over what that "
             "counts"),
    "model": ("its output for a sample depends on the other samples of its batch",
              "leave accumulation at 1"),
    "data": ("its collate_fn pads a part of a batch otherwise than the whole, and the "
             "parts' losses do not combine to the whole's (left padding?)",
             "leave accumulation at 1, or pad on the right or to a fixed length"),
}

# What splitting the batch does to a task whose gradients do not combine, where it trains
# all the same.
_SPLIT_GRADIENTS = ("the gradients of a batch's halves do not combine to the whole batch's "
                    "(a batch-wide term of its loss: a load-balancing loss?)",
                    "leave accumulation at 1")

# The largest relative difference between the halves' combined loss and the whole
# batch's that float32 rounding explains (measured: below 1e-6 on the zoo's models).
_SPLIT_TOLERANCE = 1e-4

# What a loss that raises on a part of a batch is said to do.
_FAILS_ON_HALF = "fails on half of a batch"


def _raised_on_half(problem: Problem) -> bool:
    """Whether ``problem`` is a loss (or model) raising on a part of a batch, no coupling."""
    return problem.message.startswith(_FAILS_ON_HALF)


def _varied(items: list[Any]) -> list[Any] | None:
    """``items`` with the first half of the first item's token labels set to -100, so
    that samples count different numbers of tokens (None: no token labels to vary)."""
    from dione.spec.batch import IGNORE_INDEX, LABELS

    first = items[0]
    labels = first.get(LABELS) if isinstance(first, dict) else (
        first[1] if isinstance(first, (tuple, list)) and len(first) == 2 else None)
    if not (isinstance(labels, torch.Tensor) and not labels.is_floating_point()
            and labels.dim() >= 1 and labels.numel() >= 2):
        return None
    masked = labels.clone()
    masked.view(-1)[: masked.numel() // 2] = IGNORE_INDEX
    changed = {**first, LABELS: masked} if isinstance(first, dict) else (first[0], masked)
    return [changed, *items[1:]]


def _combines(task: Task, model: nn.Module, counter: Any, items: list[Any],
              draws: bool) -> bool:
    """Whether, counting items with ``counter``, the halves of ``items`` combine to the
    loss of all of them, as a technique combines its parts (``ItemShare``). ``draws``:
    the task's collate function draws random numbers (``collate_draws``)."""
    whole, combined = _whole_and_halves(task, model, counter, items, draws)
    expected, together = float(whole()), float(combined())
    return math.isclose(together, expected, rel_tol=_SPLIT_TOLERANCE, abs_tol=1e-7) or not (
        math.isfinite(expected) and math.isfinite(together))


def _whole_and_halves(task: Task, model: nn.Module, counter: Any, items: list[Any],
                      draws: bool) -> tuple[Callable[[], torch.Tensor],
                                            Callable[[], torch.Tensor]]:
    """The loss of all of ``items`` and the loss its halves combine to, as a technique
    combines its parts (``ItemShare``, counting with ``counter``), each to compute."""
    from dione.spec.batch import (
        ItemCounting,
        ItemShare,
        collated,
        item_counting,
        loss_of,
        slice_batch,
    )

    half = len(items) // 2
    whole = collated(task, items, task.seed)
    # A collate function that draws (random masking) draws otherwise for each half: the
    # halves are the whole batch's rows, so that only the loss's averaging is compared.
    halves = ((slice_batch(whole, 0, half), slice_batch(whole, half, len(items)))
              if draws else (task.collate(items[:half]), task.collate(items[half:])))
    counting: ItemCounting | None = item_counting(replace(task, loss_items=counter), model)
    total = counting.count(whole) if counting is not None else 0

    def combined() -> torch.Tensor:
        parts = [loss_of(model, task, batch, None if counting is None else ItemShare(
            counting.count(batch), total, 2, counting.keyword)) for batch in halves]
        return sum(parts) / 2  # type: ignore[return-value]

    return (lambda: loss_of(model, task, whole)), combined


# The largest difference, relative to its own size, between a parameter's gradient on a
# whole batch and the one its halves combine to that rounding explains (measured in
# float32: about 2e-7 on the zoo's models, and all of a key bias's gradient, which is
# rounding alone; a load-balancing term of weight 1e-3 over the batch gave 1.1e-3 on its
# router). A gap found in float32 refuses only if float64 confirms it.
_GRADIENT_TOLERANCE = 1e-4


def _gradients_apart(task: Task, model: nn.Module, counter: Any, items: list[Any],
                     draws: bool, floor_share: float = 1e-6) -> tuple[str, float] | None:
    """The parameter whose gradient on ``items`` differs most from the one their halves
    combine to, and by how much (relative to its own, plus ``floor_share`` of the whole
    gradient's), where beyond rounding (None: alike). The losses may agree where the
    gradients do not: a batch-wide term small on a model as built (a load-balancing loss
    on a router near uniform) moves it all the same."""
    whole, combined = _whole_and_halves(task, model, counter, items, draws)
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trained:
        return None
    with torch.enable_grad():
        apart = [torch.autograd.grad(loss(), [p for _, p in trained], allow_unused=True)
                 for loss in (whole, combined)]
    sizes = [float(g.norm()) if g is not None else 0.0 for g in apart[0]]
    floor = floor_share * math.sqrt(sum(size * size for size in sizes))
    worst: tuple[str, float] | None = None
    for (name, _), one, other, size in zip(trained, *apart, sizes, strict=True):
        if one is None or other is None:
            continue
        gap = float((one - other).norm()) / (size + floor + 1e-30)
        if gap > _GRADIENT_TOLERANCE and math.isfinite(gap) and (
                worst is None or gap > worst[1]):
            worst = (name, gap)
    return worst


def _model_couples(task: Task, model: nn.Module, items: list[Any]) -> bool:
    """Whether ``model``'s outputs for the first half of ``items`` differ alone from in
    the batch of all of them, in eval mode (dropout would make any two forwards differ):
    the model, not its loss, ties a sample to the others. False where that cannot be
    told (the halves pad otherwise, an output with no batch dimension)."""
    from dione.spec.batch import call_model, split_target

    half = len(items) // 2
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            whole = _batch_tensor(call_model(model, task, split_target(
                task, task.collate(items))[0]), len(items))
            alone = _batch_tensor(call_model(model, task, split_target(
                task, task.collate(items[:half]))[0]), half)
    except Exception:
        return False
    finally:
        model.train(training)
    if whole is None or alone is None or whole.shape[1:] != alone.shape[1:]:
        return False
    return not torch.allclose(whole[:half], alone, rtol=1e-4, atol=1e-5)


def _batch_tensor(output: Any, size: int) -> torch.Tensor | None:
    """The first floating tensor of ``output`` (a tensor, a tuple, a dict or a Hugging
    Face output) whose first dimension is the batch's ``size``."""
    values = (output.values() if isinstance(output, Mapping)
              else output if isinstance(output, (tuple, list)) else [output])
    for value in values:
        if (isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim()
                and value.shape[0] == size):
            return value
    return None


class _PlainBatchNorm(nn.modules.batchnorm._BatchNorm):
    """A SyncBatchNorm's computation in one process (any input rank, as its own)."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        pass


def _unsynced(model: nn.Module) -> nn.Module:
    """``model`` with each SyncBatchNorm replaced by a plain batch norm of the same
    weights and statistics: in one process the same computation, but one that runs on
    the CPU, where validation tries a batch (torch's SyncBatchNorm refuses a CPU tensor
    under its one-process group, which refused every such model, a GPU run's too)."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.SyncBatchNorm):
                plain = _PlainBatchNorm(child.num_features, child.eps, child.momentum,
                                        child.affine, child.track_running_stats)
                plain.load_state_dict(child.state_dict())
                plain.train(child.training)
                setattr(module, child_name, plain)
    if isinstance(model, nn.SyncBatchNorm):  # the model itself: in a holder, taken out
        holder = nn.Sequential(model)
        _unsynced(holder)
        return holder[0]
    return model


def _loss_items(task: Task, model: nn.Module, dataset: Any
                ) -> tuple[ItemCounter | None, list[Problem]]:
    """``_loss_items_checked``, with the random numbers the model and loss draw held still
    (``HeldDraws``) where they draw any in eval mode: a VAE sampling in every mode, a
    diffusion loss drawing its steps and noise, drew otherwise for a batch and its
    halves, and were refused as coupling their batch (a review). Not where the held
    values leave the loss without a number (a subset of anchors drawn at 0.3 is empty
    at the held 0.5: every check passed on NaN, a regression review), nor where code
    cannot run so (a compiled model): as it is, then."""
    from dione.spec.draws import HeldDraws

    if not _draws_in_eval(task, model, dataset):
        return _loss_items_checked(task, model, dataset)
    try:
        with HeldDraws():  # type: ignore[no-untyped-call]
            held = _first_losses(task, model, dataset)
            found = (_loss_items_checked(task, model, dataset)
                     if all(math.isfinite(loss) for loss in held) else None)
    except Exception:
        found = None
    if found is None or any(_raised_on_half(p) for p in found[1]):
        return _loss_items_checked(task, model, dataset)
    return found


def _first_losses(task: Task, model: nn.Module, dataset: Any) -> list[float]:
    """The loss of the first four samples' batch, and of its halves, in eval mode."""
    from dione.spec.batch import loss_of

    items = [dataset[i] for i in range(min(4, len(dataset)))]
    half = max(1, len(items) // 2)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return [float(loss_of(model, task, task.collate(part)))
                    for part in (items, items[:half], items[half:]) if part]
    finally:
        model.train(training)


def _draws_in_eval(task: Task, model: nn.Module, dataset: Any) -> bool:
    """Whether the first samples' loss in eval mode moves with torch's seed."""
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            one = _first_losses(task, model, dataset)
            torch.manual_seed(2)
            two = _first_losses(task, model, dataset)
    except Exception:  # its own checks say why it cannot run
        return False
    return not all(alike(a, b) for a, b in zip(one, two, strict=True))


def _loss_items_checked(task: Task, model: nn.Module, dataset: Any
                     ) -> tuple[ItemCounter | None, list[Problem]]:
    """What the task's loss averages over (``dione.spec.batch.item_counting``'s rule, or
    another that fits the model better), checked on its first four samples and on four
    spread over its data (its first and last among them: a data set sorted by class or
    by length, as folders of images and length-bucketed text are, has four alike at its
    start, and a class-weighted or padded loss passed, to train otherwise than single,
    recorded exact): for each, the halves of a batch must combine to its loss, as
    every technique that splits the batch combines its parts. The first sample's token
    labels are half masked first, so that samples count different numbers of tokens; a
    model or loss that takes ``num_items_in_batch`` divides by the count it is given, so
    a rule that counts otherwise than the model does not fit. Eval mode: dropout would
    make forwards differ.

    A loss of the task's own, on targets holding -100 (padding), that says neither what
    it averages over (``loss_items``) nor takes ``num_items_in_batch`` is a problem: a
    token mean and a sample mean differ there, and on an untrained model the halves
    cannot tell which it is (every token's loss is about the same)."""
    from dione.spec.batch import (
        IGNORE_INDEX,
        item_counting,
        labels_of,
        samples,
        shifted_tokens,
    )
    from dione.spec.batch import tokens as token_count

    size = min(task.batch_size, len(dataset))
    if size < 2:
        return task.loss_items, []  # nothing splits the batch
    count = 4 if size >= 4 else 2
    first = list(range(count))
    samplings = [[dataset[i] for i in at] for at in dict.fromkeys(
        (tuple(first), tuple(_spread(len(dataset), count))))]
    by_class = (_by_class(task, model, samplings[0], dataset)
                if _may_weigh_classes(task.loss) else None)
    if by_class is not None:  # a class-weighted mean shows only where halves differ so
        samplings.append(by_class)
    guess = item_counting(task, model)
    own = guess.counter if guess is not None else samples
    if task.loss_items is not None:
        candidates = [task.loss_items]
    elif task.loss is None:
        candidates = [own, shifted_tokens, token_count, samples]
    elif guess is not None:  # the loss takes num_items_in_batch
        candidates = [own, shifted_tokens]
    else:
        try:
            padded = any(bool((labels_of(task.collate(items)) == IGNORE_INDEX).any())
                         for items in samplings)
        except (ValueError, TypeError):
            padded = False
        if padded:
            return None, [Problem(task.name, "loss_items", (
                "its targets hold -100 (padding), so its loss may be a mean over tokens "
                "rather than over samples, and dione cannot tell which on an untrained "
                "model: say what it averages over, loss_items=dione.tokens (targets that "
                "are not -100; dione.shifted_tokens if it predicts each from the ones "
                "before) or loss_items=dione.samples, so that every technique that splits "
                "the batch weighs its parts as single's mean does"))]
        candidates = [samples]
    fits = list(dict.fromkeys(candidates))
    model.eval()
    try:
        for items in samplings:  # a rule must fit each
            fitting = _fitting(task, model, fits, items)
            if isinstance(fitting, Problem):
                return task.loss_items, [fitting]
            fits = [c for c in fits if c in fitting]
            if not fits:
                break
    finally:
        model.train()
    if fits:
        chosen = own if own in fits else fits[0]
        found = task.loss_items if chosen is own else chosen
        coupled = _coupled_gradients(task, model, chosen, samplings)
        return found, [coupled] if coupled is not None else []
    if any(_model_couples(task, model, items) for items in samplings):
        return task.loss_items, [Problem(task.name, "model", (
            f"its output for a sample depends on the other samples of its batch (half of "
            f"{count} of its samples alone give other outputs than in their batch: a batch "
            "statistic, a routing capacity), so every technique that "
            "splits the batch (ddp, fsdp, pipelines, accumulation) would train differently "
            "from single: give it techniques=('single',), or allow_inexact=True to train it "
            "so, recorded inexact"))]
    counted = ("the items its loss_items counts" if task.loss_items is not None
               else "its samples nor its tokens (labels that are not -100)")
    if any(_pads_apart(task, items) for items in samplings):
        # The collator, not the loss: a sample's positions move with its batch mates
        # under left padding to the longest (a review was told to fix its loss).
        return task.loss_items, [Problem(task.name, "data", (
            f"the halves of a batch of {count} of its samples do not combine to the whole "
            "batch's loss, and its collate_fn pads a half otherwise than the whole (to "
            "each batch's longest item): where padding moves a sample's positions (left "
            "padding, positions counted from the padded start), every technique that "
            "splits the batch (ddp, fsdp, pipelines, accumulation) would train "
            "differently from single; pad on the right or to a fixed length, or give the "
            "model position ids from the attention mask"))]
    return task.loss_items, [Problem(task.name, "loss", (
        f"the halves of a batch of {count} of its samples do not combine to the whole "
        f"batch's loss: it is not a mean over {counted}, so every technique that splits the "
        "batch (ddp, fsdp, pipelines, accumulation) would train differently from single. If "
        "it averages over something else, give the task loss_items=(a function counting "
        "it in a batch; a class-weighted mean, cross_entropy's weight=W: lambda batch: "
        "W[batch[1]].sum()); if it depends on the whole batch (in-batch negatives), give "
        "it techniques=('single',), or allow_inexact=True to train it so, recorded "
        "inexact"))]


def _coupled_gradients(task: Task, model: nn.Module, counter: Any,
                       samplings: list[list[Any]]) -> Problem | None:
    """A problem where, on any of ``samplings``, a parameter's gradient on the batch is
    not the one its halves combine to, though their losses combine (in eval mode)."""
    from dione.spec.batch import collate_draws

    training = model.training
    model.eval()
    try:
        for items in samplings:
            try:
                draws = collate_draws(task, items)
                apart = _gradients_apart(task, model, counter, items, draws)
                if apart is not None:
                    apart = _apart_in_double(task, model, counter, items, draws)
            except Exception:  # a loss autograd cannot differentiate here: its trials say
                return None
            if apart is not None:
                name, gap = apart
                return Problem(task.name, "loss", (
                    f"the halves of a batch of {len(items)} of its samples give losses that "
                    f"combine to the whole batch's, but gradients that do not ({name}: "
                    f"{gap:.1e} apart, relative to its own): its loss couples the samples "
                    "of a batch by a term small on the model as built (a load-balancing "
                    "loss over the batch, a batch-wide regulariser), so every technique "
                    "that splits the batch (ddp, fsdp, pipelines, accumulation) would "
                    "train differently from single: give it techniques=('single',), or "
                    "allow_inexact=True to train it so, recorded inexact"),
                    split=_SPLIT_GRADIENTS)
    finally:
        model.train(training)
    return None


def _apart_in_double(task: Task, model: nn.Module, counter: Any, items: list[Any],
                     draws: bool) -> tuple[str, float] | None:
    """``_gradients_apart`` again in float64 (a copy of the model, the samples' floats):
    a gradient that is zero but for rounding (an attention's key bias: softmax ignores a
    shift of every key) is all rounding in float32, and read 1e-3 apart there (a
    regression review refused CLIP, ViT and a plain attention so). In float64 rounding
    is 1e-16 of the whole gradient's size, and a coupled batch still 1e-3 of its own.
    None where the model cannot run so (a float32 tensor made in its forward)."""
    from dione.spec.batch import batch_map

    try:
        double = copy.deepcopy(model).double()
        wider = [batch_map(lambda t: t.double() if t.is_floating_point() else t, item)
                 for item in items]
        return _gradients_apart(task, double, counter, wider, draws, floor_share=1e-9)
    except Exception:
        return None


# The most classes a class-weighted loss is tried on beside the first (each a sample),
# and how many samples spread over the data set are looked at for the classes it holds.
BY_CLASS = 15
CLASS_LOOKS = 32


def _may_weigh_classes(loss: Any) -> bool:
    """Whether ``loss`` may weigh samples by their class: any of the user's own, but not
    torch's cross-entropy as it is (a grid's usual loss: looking for classes fetched 64
    samples a task, and tripled validation's time: a regression review)."""
    from torch.nn import functional

    plain = (functional.cross_entropy, functional.nll_loss)
    if loss is None or loss in plain:
        return False
    if isinstance(loss, functools.partial) and loss.func in plain:
        return loss.keywords.get("weight") is not None
    if isinstance(loss, (nn.CrossEntropyLoss, nn.NLLLoss)):
        return loss.weight is not None
    return True


def _by_class(task: Task, model: nn.Module, items: list[Any], dataset: Any
              ) -> list[Any] | None:
    """Of a classifier's (input, class) items: a half of one class and a half of up to
    ``BY_CLASS`` other classes, each seen among ``CLASS_LOOKS`` samples spread over
    ``dataset``, on the same inputs, so that a mean weighted by class (cross_entropy's
    ``weight=``) differs between halves. Samples as they come seldom show it: eight
    digits held five classes, and a weight on another trained otherwise than single
    under every technique, recorded exact (a review). None where the items are not such
    pairs, fewer than two classes are seen, or the loss cannot take the batch so made
    (classes beyond what it indexes, as a centre loss's: a regression review)."""
    from dione.spec.batch import collated, loss_of

    first = items[0]
    if not (isinstance(first, (tuple, list)) and len(first) == 2):
        return None
    label = first[1]
    if isinstance(label, torch.Tensor):
        if label.dim() != 0 or label.is_floating_point() or label.dtype == torch.bool:
            return None
    elif not isinstance(label, int) or isinstance(label, bool):
        return None
    try:
        seen = sorted({int(dataset[i][1]) for i in _spread(len(dataset), min(
            CLASS_LOOKS, len(dataset)))})
    except Exception:
        return None
    if len(seen) < 2:
        return None
    count = min(BY_CLASS, len(seen) - 1)
    others = [seen[1 + round(k * (len(seen) - 2) / max(1, count - 1))] for k in range(count)]

    def of_class(k: int, value: int) -> Any:
        inputs = items[k % len(items)][0]
        return (inputs, torch.tensor(value, dtype=label.dtype)
                if isinstance(label, torch.Tensor) else value)

    made = ([of_class(k, seen[0]) for k in range(len(others))]
            + [of_class(k, c) for k, c in enumerate(others)])
    try:
        with torch.no_grad():
            loss_of(model, task, collated(task, made, task.seed))
    except Exception:
        return None
    return made


def _pads_apart(task: Task, items: list[Any]) -> bool:
    """Whether collating either half of ``items`` gives tensors of other shapes than
    collating all of them (beyond the batch dimension): a collator that pads each batch
    to its longest item."""
    from torch.utils._pytree import tree_flatten

    middle = len(items) // 2
    try:
        whole = tree_flatten(task.collate(items))[0]
        halves = [tree_flatten(task.collate(part))[0] for part in (items[:middle],
                                                                    items[middle:])]
    except Exception:
        return False
    return any(len(whole) == len(half) and any(
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == b.dim()
        and a.shape[1:] != b.shape[1:] for a, b in zip(whole, half, strict=True))
        for half in halves)


def _fitting(task: Task, model: nn.Module, candidates: list[Any],
             items: list[Any]) -> list[Any] | Problem:
    """The counting rules among ``candidates`` under which the halves of ``items``
    combine to their batch's loss (tried with the first sample's labels half masked
    first, then as they are where the loss cannot take that), or the loss's failure."""
    from dione.spec.batch import collate_draws, samples

    probes = [p for p in ([items] if candidates == [samples] else [_varied(items), items])
              if p]
    draws: bool | None = None  # once, not per candidate: it collates the items thrice
    fits, error, raised = [], None, 0
    # Each candidate alone: one whose counter cannot read the batch (tokens of a batch
    # with no labels) is left out, not every other with it (a sample mean of the model's
    # own was refused accumulation so: a regression review).
    for candidate in candidates:
        for probe in probes:
            try:
                if draws is None:
                    draws = collate_draws(task, items)
                with torch.no_grad():
                    if _combines(task, model, candidate, probe, draws):
                        fits.append(candidate)
                break
            except Exception as err:  # the labels as they are next, else it is out
                error = err
                raised += probe is probes[-1]
    if raised == len(candidates) and error is not None:
        message = f"{_FAILS_ON_HALF}: {raised_line(error)}"
        # Its own error where it raised (a review read "in-batch negatives?" there).
        return Problem(task.name, "loss", message,
                       split=(f"its loss (or model) {message}", "leave accumulation at 1"))
    return fits


def _spread(length: int, count: int) -> list[int]:
    """``count`` positions of a data set of ``length`` samples, the first and the last
    among them, evenly apart."""
    return [round(i * (length - 1) / (count - 1)) for i in range(count)]


def _check_picklable(task: Task) -> list[Problem]:
    import cloudpickle

    try:
        cloudpickle.dumps(task)
        return []
    except Exception as whole:
        problems = []
        for field in ("name", *_FACTORIES, "hyperparameters"):
            try:
                cloudpickle.dumps(getattr(task, field))
            except Exception as err:
                problems.append(
                    Problem(
                        task.name,
                        field,
                        f"cannot be pickled for worker processes ({raised_line(err)}); "
                        "use a module-level function, functools.partial or a lambda that "
                        "captures no open files, locks or processes",
                    )
                )
        return problems or [Problem(task.name, "task", f"cannot be pickled: {whole}")]


def _numbers(value: Any) -> list[float] | None:
    """The numbers in a hyperparameter (a number, a one-number tensor, or a tuple of
    them, like Adam's betas); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_meta:
        return [float(value)]
    if isinstance(value, (tuple, list)) and value:
        parts = [_numbers(v) for v in value]
        if all(p is not None and len(p) == 1 for p in parts):
            return [p[0] for p in parts if p is not None]
    return None


def _hyperparameter_problems(optimizer: torch.optim.Optimizer) -> list[str]:
    """Non-finite hyperparameters and non-positive learning rates, which would make
    every step's update NaN or send training the wrong way."""
    problems = []
    for index, group in enumerate(optimizer.param_groups):
        where = f" (parameter group {index})" if len(optimizer.param_groups) > 1 else ""
        for key, value in group.items():
            numbers = _numbers(value)
            if key == "params" or numbers is None:
                continue
            if not all(math.isfinite(x) for x in numbers):
                problems.append(f"{key}={value!r}{where} is not a finite number; every "
                                "update would be NaN")
            elif key == "lr" and numbers[0] <= 0:
                problems.append(f"lr={value!r}{where} must be positive: a learning rate "
                                "of zero trains nothing and a negative one climbs the loss")
    return problems


def _check_scheduler(task: Task, optimizer: torch.optim.Optimizer,
                     bad: Callable[[str, str], None]) -> None:
    """Build the task's scheduler on its optimizer: a broken factory fails here, not in
    every trial's workers."""
    assert task.lr_scheduler is not None
    try:
        scheduler = task.lr_scheduler(optimizer)
    except Exception as err:
        bad("lr_scheduler", f"the scheduler factory raised {raised_line(err)}; it is "
            "called with the optimizer alone, e.g. functools.partial(StepLR, step_size=10)")
        return
    missing = [m for m in ("step", "state_dict", "load_state_dict")
               if not callable(getattr(scheduler, m, None))]
    if missing:
        bad("lr_scheduler", f"returned {type(scheduler).__name__}, which has no "
            f"{', '.join(missing)}: return a torch.optim.lr_scheduler scheduler")
        return
    try:
        needed = [p.name for p in inspect.signature(scheduler.step).parameters.values()
                  if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                         p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # no signature to read: its steps will tell
        needed = []
    if needed:  # ReduceLROnPlateau: step(metrics)
        bad("lr_scheduler", f"{type(scheduler).__name__}.step() needs "
            f"{', '.join(needed)}, but dione steps the scheduler once after every "
            "optimizer step with no argument; use a schedule by step (StepLR, "
            "CosineAnnealingLR, LambdaLR, ...), and a stopping rule (stopping=) for "
            "decisions on a metric")
    # OneCycleLR raises when stepped past its length, some way into the training.
    length = getattr(scheduler, "total_steps", None)
    if (isinstance(scheduler, torch.optim.lr_scheduler.OneCycleLR) and isinstance(length, int)
            and isinstance(task.steps, int) and length < task.steps):
        bad("lr_scheduler", f"OneCycleLR is built for {length} steps, but the task trains "
            f"{task.steps}: its step {length + 1} would raise; build it with "
            f"total_steps={task.steps}")


def check_task(
    task: Task, devices: int | None = None, techniques: Iterable[str] | None = None,
    kind: DeviceKind | None = None, inexact: Iterable[str] = (),
) -> list[Problem]:
    """Every problem of one task on its own (names across tasks are the workload's), for
    devices of ``kind`` (default: this machine's); ``inexact`` names the techniques that
    do not train as single does (the task may list them only if it allows that)."""
    return checked_task(task, devices, techniques, kind, inexact)[1]


def checked_task(
    task: Task, devices: int | None = None, techniques: Iterable[str] | None = None,
    kind: DeviceKind | None = None, inexact: Iterable[str] = (),
    seen: dict[Hashable, dict[str, Any]] | None = None,
) -> tuple[Task, list[Problem]]:
    """``check_task``'s problems, and the task as it will train: with the ``loss_items``
    validation found its loss to average over, where dione's own rule does not fit it
    (``_loss_items``). torch's random state is the caller's again after (validation
    builds models from the task's seed: a notebook's own draws went on from there).
    ``seen``: what a batch through the model found for tasks alike (``_FORWARD_FIELDS``)
    checked before without a problem, kept for the next (one workload's)."""
    with torch.random.fork_rng(devices=[]):
        return _checked_task(task, devices, techniques, kind, inexact, seen)


# What a batch through the model (``_try_forward``, ``_loss_items``) reads of a task.
_FORWARD_FIELDS = ("model", "data", "collate_fn", "loss", "loss_items", "batch_size", "seed",
                   "techniques", "precision")


def _checked_task(
    task: Task, devices: int | None, techniques: Iterable[str] | None,
    kind: DeviceKind | None, inexact: Iterable[str],
    seen: dict[Hashable, dict[str, Any]] | None,
) -> tuple[Task, list[Problem]]:
    name = task.name if isinstance(task.name, str) else repr(task.name)
    problems: list[Problem] = []
    resolved: dict[str, Any] = {}

    def bad(field: str, message: str) -> None:
        problems.append(Problem(name, field, message))

    if not isinstance(task.name, str) or not _NAME.fullmatch(task.name):
        bad("name", "must be 1-100 ASCII letters, digits or ._=+- and start with a letter or "
            "digit (it names the task's folder)")
    if not isinstance(task.batch_size, int) or isinstance(task.batch_size, bool) \
            or task.batch_size < 1:
        bad("batch_size", f"must be a positive integer, not {task.batch_size!r}")
    elif (devices is not None and split_problem(task.batch_size, devices, "devices")
          and not any(_allows(task, t) for t in ("single", "ddp", "gpipe", "1f1b"))):
        # Else a plan trains it on fewer devices (single, ddp on one where single is not
        # allowed), or as a pipeline of micro-batches that divide its batch.
        bad("batch_size", f"{task.batch_size} is not divisible by the {devices} devices asked "
            f"for; under data parallelism (ddp, fsdp) each device takes an equal share of "
            f"the global batch: use a multiple of {devices}, or fewer devices, or allow "
            "single, ddp (on fewer devices) or a pipeline (gpipe, 1f1b: micro-batches that "
            f"divide {task.batch_size})")
    if (task.steps is None) == (task.epochs is None):
        bad("steps", "give exactly one of steps or epochs")
    elif task.steps is not None and (not isinstance(task.steps, int)
                                     or isinstance(task.steps, bool) or task.steps < 1):
        bad("steps", f"must be a positive integer, not {task.steps!r}")
    elif task.epochs is not None and not (
        isinstance(task.epochs, (int, float)) and not isinstance(task.epochs, bool)
        and math.isfinite(task.epochs) and task.epochs > 0
    ):
        bad("epochs", f"must be a positive, finite number, not {task.epochs!r}")
    if not isinstance(task.seed, int) or isinstance(task.seed, bool):
        bad("seed", f"must be an integer, not {task.seed!r}")
    elif not 0 <= task.seed < 2 ** 63:  # (NumPy's words said it, from a loss check)
        bad("seed", f"must be from 0 to 2**63 - 1 (what torch's and NumPy's generators "
            f"take), not {task.seed}")
    if not isinstance(task.hyperparameters, Mapping) or not all(
            isinstance(k, str) for k in task.hyperparameters):
        bad("hyperparameters", "must be a dict of names to values (the report's and the "
            f"dashboards' columns, e.g. {{'lr': 0.01}}), not {task.hyperparameters!r}")
    kind = kind or local_device_kind()
    if task.precision not in PRECISIONS:
        bad("precision", f"must be one of {', '.join(PRECISIONS)}, not {task.precision!r}")
    elif task.precision == "fp16" and kind != "cuda":
        bad("precision", "fp16 needs CUDA devices (its loss scaler guards float16's narrow "
            "range on GPUs); on CPU devices use bf16, which has float32's range")
    elif task.precision == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        bad("precision", "this GPU cannot compute in bf16; use fp16")
    clip = task.clip_grad_norm
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))
                             or not math.isfinite(clip) or clip <= 0):
        bad("clip_grad_norm", f"must be a positive, finite number (the largest global "
            f"gradient norm) or None, not {clip!r}")
    if not isinstance(task.allow_inexact, bool):
        bad("allow_inexact", f"must be True or False, not {task.allow_inexact!r}")
    if task.stopping is not None:
        if not isinstance(task.stopping, StoppingRule):
            bad("stopping", "must be a stopping rule (dione.Asha, dione.PausingAsha, "
                "dione.SuccessiveHalving, dione.Median, dione.Patience) or None, not "
                f"{type(task.stopping).__name__}")
        else:
            for reason in task.stopping.mistakes():
                bad("stopping", reason)
            if task.stopping.metric != "loss" and task.evaluate is None:
                bad("stopping", f"its metric {task.stopping.metric!r} comes from evaluate(), "
                    "which the task does not define: give evaluate, or use metric='loss'")

    every = task.eval_every
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            bad("eval_every", f"must be a whole number of steps >= 1 or None, not {every!r}")
        elif task.evaluate is None:
            bad("eval_every", "evaluates with evaluate(), which the task does not define: "
                "give evaluate, or leave eval_every out")
    _check_keep_best(task, bad)
    for field in _FACTORIES:
        value = getattr(task, field)
        optional = field in ("evaluate", "lr_scheduler", "loss", "collate_fn", "loss_items")
        if not callable(value) and not (optional and value is None):
            bad(field, f"must be callable, not {type(value).__name__}"
                + _CALLABLE_FIX.get((field, _kind_of(value)), ""))
        elif field == "loss" and isinstance(value, type) and issubclass(value, nn.Module):
            # Called as CrossEntropyLoss(output, target), the tensors became its settings
            # and torch's message spoke of a tensor's truth value (a review).
            made = (f"torch.nn.{value.__name__}" if value.__module__.startswith("torch.")
                    else value.__name__)
            bad(field, f"is the class {value.__name__}, called with the output and target "
                f"as its settings; give an instance (loss={made}()) or a function")
    if task.techniques is not None:
        known = set(techniques or ())
        if isinstance(task.techniques, str) or not task.techniques:
            bad("techniques", "must be a non-empty tuple of technique names, e.g. ('ddp', 'fsdp')")
        elif techniques is not None:
            for t in task.techniques:
                if t not in known:
                    bad("techniques", f"unknown technique {t!r}; known: {', '.join(sorted(known))}")
        not_exact = set(inexact)
        named = [t for t in task.techniques if t in not_exact]
        if named and not task.allow_inexact and not isinstance(task.techniques, str):
            bad("techniques", f"{', '.join(named)} would not train the task as single does "
                "(not exact); set allow_inexact=True to let it, or leave them out")
    if problems:  # factories are only worth calling once the fields make sense
        return task, problems
    problems += _check_picklable(task)

    model: nn.Module | None = None
    try:
        if isinstance(task.model, nn.Module):  # calling it would run its forward
            raise _Said(f"is a {type(task.model).__name__} instance; give the function or "
                        "class that builds it (model=MyNet, or functools.partial(MyNet, "
                        "...)): each rank and slice builds its own")
        model = watched(functools.partial(build_model, task.model), task.name, "model()")
        if not isinstance(model, nn.Module):
            bad("model", f"returned {type(model).__name__}, not a torch.nn.Module")
            model = None
        elif not any(p.requires_grad for p in model.parameters()):
            bad("model", "the model has no trainable parameters")
            model = None
    except _Said as said:
        bad("model", str(said))
    except Exception as err:
        bad("model", f"the model factory raised {raised_line(err)}")
    if model is not None:
        try:
            optimizer = task.optimizer(model.parameters())
            if not isinstance(optimizer, torch.optim.Optimizer):
                bad("optimizer",
                    f"returned {type(optimizer).__name__}, not a torch.optim.Optimizer")
            else:
                for message in _hyperparameter_problems(optimizer):
                    bad("optimizer", message)
                if task.lr_scheduler is not None:
                    _check_scheduler(task, optimizer, bad)
        except Exception as err:
            bad("optimizer", f"the optimizer factory raised {raised_line(err)}")
        if task.split_points:
            modules = {n for n, _ in model.named_modules()}
            for point in task.split_points:
                if point not in modules:
                    bad("split_points", f"{point!r} is not a submodule of the model")
    try:
        dataset: Any = watched(task.data, task.name, "data()")
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise _Said(f"returned {_a(type(dataset).__name__)}; give a function returning a "
                        "map-style dataset (len() and indexing: a torch Dataset such as "
                        "TensorDataset, or a list): dione batches and shards it itself, so "
                        "not a DataLoader or an iterator"
                        + ("; its sampler goes too (dione draws each epoch's order from the "
                           "task's seed): draw a weighted or balanced selection into the data "
                           "set itself, e.g. Subset(data, indices drawn once, seeded)"
                           if getattr(dataset, "sampler", None) is not None
                           and not isinstance(getattr(dataset, "sampler", None),
                                              (SequentialSampler, RandomSampler)) else ""))
        size = len(dataset)
        if size < task.batch_size:
            bad("data", f"has {size} samples, fewer than one batch of {task.batch_size}: "
                "lower batch_size, or give more data")
        else:
            item = dataset[0]
            if isinstance(item, dict) or (task.loss is None and isinstance(item, (tuple, list))):
                pass  # a dict (labels for the loss), or a batch the model takes whole
            elif not (isinstance(item, (tuple, list)) and len(item) == 2):
                bad("data", "items must be (inputs, target) pairs or dicts of tensors "
                    f"(with 'labels' for the task's loss), not {type(item).__name__}")
            if model is not None and not problems:
                key = task_key(task, _FORWARD_FIELDS)
                if seen is not None and key in seen:  # a task alike tried before
                    resolved.update(seen[key])
                else:
                    found = _forward_problems(task, model, dataset, resolved)
                    problems += found
                    if seen is not None and not found:
                        seen[key] = dict(resolved)
    except _Said as said:
        bad("data", str(said))
    except Exception as err:
        bad("data", f"the data factory (or indexing its result) raised {raised_line(err)}")
    if problems or (resolved.get("loss_items", task.loss_items) is task.loss_items
                    and not resolved.get("split_loss")):
        return task, problems
    return replace(task, loss_items=resolved.get("loss_items", task.loss_items),
                   split_loss=resolved.get("split_loss")), problems


def _allows(task: Task, technique: str) -> bool:
    """``Task.allows``, for an allowlist not checked yet (a string: all; its own problem
    is said below)."""
    return isinstance(task.techniques, str) or task.allows(technique)


def _a(name: str) -> str:
    """``name`` after its article ("an Iterator", "a DataLoader")."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _kind_of(value: Any) -> str:
    """What a non-callable factory field holds, for its fix: "optimizer" (an optimizer
    made already), "dataset" (data made already), "text" or "other"."""
    if isinstance(value, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(value, str):
        return "text"
    if hasattr(value, "__getitem__") and hasattr(value, "__len__"):
        return "dataset"
    return "other"


# What to give instead of a value where a factory goes (each said "must be callable"
# alone, while a model made already had its fix: a review).
_CALLABLE_FIX = {
    ("optimizer", "optimizer"): ": an optimizer made already holds one model's parameters, "
    "and each rank and slice builds its own model; give what makes it from the parameters "
    "(optimizer=functools.partial(torch.optim.Adam, lr=1e-3))",
    ("optimizer", "text"): ": give what makes the optimizer from the parameters "
    "(optimizer=functools.partial(torch.optim.Adam, lr=1e-3)), not its name",
    ("data", "dataset"): ": give the function that builds the data set (data=load_my_data, "
    "or functools.partial(TensorDataset, x, y)), not the data set: each rank calls it",
    ("loss", "text"): ": give the loss function (torch.nn.functional.cross_entropy) or a "
    "module (torch.nn.CrossEntropyLoss()), not its name",
}


class _Said(Exception):
    """A field's problem found while checking it, said as it is (no traceback line)."""


def repeated_names(tasks: Iterable[Task]) -> dict[str, int]:
    """The names more than one of ``tasks`` has, each with how many have it."""
    return {name: count for name, count in Counter(t.name for t in tasks).items()
            if count > 1}


def _name_problems(workload: Workload) -> list[Problem]:
    return [Problem(name, "name", f"{count} tasks share this name; names must be unique "
                    "(grid() makes unique names)")
            for name, count in repeated_names(workload).items()]


def validate_workload(
    workload: Workload, devices: int | None = None, techniques: Iterable[str] | None = None,
    kind: DeviceKind | None = None, inexact: Iterable[str] = (),
) -> list[Problem]:
    """Every problem of the workload; empty when it can start.

    ``devices`` is the device count data parallelism will split batches over (`dione
    validate --devices`); ``techniques`` are the registered technique names a task's
    allowlist may use, ``inexact`` those of them that are not exact.
    """
    problems: list[Problem] = []
    if not len(workload):
        problems.append(Problem(None, "tasks", "the workload has no tasks"))
    problems += _name_problems(workload)
    known = list(techniques) if techniques is not None else None
    for task in workload:
        problems += check_task(task, devices, known, kind, list(inexact))
    return problems


def _check_keep_best(task: Task, bad: Callable[[str, str], None]) -> None:
    """``keep_best`` names an evaluated metric, and which way it is better is known."""
    metric, mode = task.keep_best, task.keep_best_mode
    if mode is not None and mode not in ("min", "max"):
        bad("keep_best_mode", f"must be 'min' (lower is better), 'max' or None, not {mode!r}")
    if metric is None:
        if mode is not None:
            bad("keep_best_mode", "says which way keep_best is better, but keep_best is not "
                "given: name the metric (keep_best='accuracy'), or leave the mode out")
        return
    if not isinstance(metric, str) or not metric:
        bad("keep_best", f"must be the name of a metric evaluate() returns, not {metric!r}")
    elif task.evaluate is None:
        bad("keep_best", f"{metric!r} comes from evaluate(), which the task does not "
            "define: give evaluate (with eval_every, to evaluate during training), or "
            "leave keep_best out")
    elif mode is None and task.best_mode() is None:
        # A misspelt metric the rule names right: the fix is the name, not a mode (which
        # only moved the failure to the run).
        rule = task.stopping.metric if task.stopping is not None else None
        near = rule if isinstance(rule, str) and rule != metric and difflib.get_close_matches(
            metric, [rule], n=1, cutoff=0.75) else None
        bad("keep_best", f"its name {metric!r} {UNKNOWN_DIRECTION}: "
            + (f"did you mean {near!r}, the stopping rule's metric? Else "
               if near else "is it spelt as evaluate returns it (`dione validate` runs "
               "evaluate to see)? If so, ") + "give keep_best_mode='min' or 'max'")


def split_valid(
    workload: Workload, devices: int | None = None, techniques: Iterable[str] | None = None,
    kind: DeviceKind | None = None, inexact: Iterable[str] = (),
) -> tuple[list[Task], list[Problem]]:
    """The tasks that can run, and the problems of the others (a bad task stops only itself)."""
    problems: list[Problem] = []
    if not len(workload):
        problems.append(Problem(None, "tasks", "the workload has no tasks"))
    problems += _name_problems(workload)
    known = list(techniques) if techniques is not None else None
    checked = []
    seen: dict[Hashable, dict[str, Any]] = {}  # a sweep's tasks alike: one model tried
    for task in workload:
        task, found = checked_task(task, devices, known, kind, list(inexact), seen)
        checked.append(task)
        problems += found
    bad = {p.task for p in problems}
    if None in bad:
        return [], problems
    # As problems name them: a name that is no string (refused above) by its repr.
    return [t for t in checked
            if (t.name if isinstance(t.name, str) else repr(t.name)) not in bad], problems


def keep_best_doubts(task: Task, total: int | None = None) -> list[str]:
    """Why ``task``'s ``keep_best`` may not do what it seems to (it evaluates only at its
    end, so its best is its last; a direction given the other way from what the metric's
    name says), each with the fix. ``total``: its steps where known."""
    metric, mode = task.keep_best, task.keep_best_mode
    if not isinstance(metric, str) or not metric or task.evaluate is None:
        return []
    doubts = []
    steps = total if total is not None else task.steps
    if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 \
            and task.evaluation_steps(steps) == [steps]:
        doubts.append(f"keep_best={metric!r} keeps nothing but its last checkpoint: the "
                      "task evaluates only at its end; give eval_every (or a stopping rule "
                      "on that metric)")
    by_name = direction_by_name(metric)
    if mode in ("min", "max") and by_name is not None and by_name != mode:
        better = "higher" if by_name == "max" else "lower"
        doubts.append(f"keep_best_mode={mode!r} keeps the checkpoint where {metric!r} was "
                      f"{'lowest' if mode == 'min' else 'highest'}, but a {better} {metric} "
                      f"is usually better: set keep_best_mode={by_name!r} if so")
    return doubts


def training_loss_doubt(task: Task) -> str | None:
    """Why ``keep_best='loss'`` may not do what it seems to (Ray Tune's and Lightning's
    habit, ``monitor="loss"``): it ranks an evaluated 'loss', not the training loss. Said
    by `dione validate` only: a run checks what evaluate returns in its profiling trial."""
    if task.keep_best != "loss" or task.evaluate is None:
        return None
    return ("keep_best='loss' ranks what evaluate returns as 'loss', not the training "
            "loss (a stopping rule's metric='loss'): unless evaluate returns 'loss', name "
            "the held-out metric it returns (keep_best='test_loss')")


def rule_cadence_doubt(task: Task) -> str | None:
    """Why ``task``'s stopping rule evaluates it more often than its ``eval_every`` asks
    (a rule's ``every``, 1 by default, over an eval_every of 10: an evaluation, a rung
    and a slice's end at every step, unsaid: a review), with the fix; None where not."""
    rule, asked = task.stopping, task.eval_every
    every = getattr(rule, "every", None)
    if (rule is None or rule.metric == "loss" or not isinstance(every, int)
            or not isinstance(asked, int) or isinstance(asked, bool) or every >= asked):
        return None
    return (f"{rule.judged_by} judges {rule.metric!r} every {every} step(s), more often "
            f"than eval_every={asked}: the task is evaluated at each of its rungs, and a "
            f"slice ends at each; give the rule every={asked} to judge it as often as it "
            "is evaluated")


def late_evaluation(task: Task, total: int | None = None) -> str | None:
    """Why ``task``'s ``eval_every`` does nothing (at or past its last step, where it
    evaluates anyway), with the fix; None where it evaluates sooner, or is not set.
    ``total``: its steps where known (else ``steps``, when given)."""
    every, steps = task.eval_every, total if total is not None else task.steps
    if (not isinstance(every, int) or isinstance(every, bool) or every < 1
            or not isinstance(steps, int) or isinstance(steps, bool) or every < steps):
        return None
    rungs = [step for step in task.evaluation_steps(steps) if step < steps]
    where = (f"only at its stopping rule's rungs ({', '.join(map(str, rungs[:4]))}"
             f"{', ...' if len(rungs) > 4 else ''}) and its end" if rungs else "only at its end")
    return (f"eval_every={every} is at or past its last step ({steps}): it evaluates "
            f"{where}; give eval_every a number of steps below that")
