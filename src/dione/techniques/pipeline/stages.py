"""One pipeline stage cut out of the whole model, in place, every name kept.

Every rank builds the model's structure (its parameters on meta,
``dione.techniques.pipeline.stage_build``), keeps its own blocks
(``dione.techniques.pipeline.stage_plan``)
and only then gives the stage's tensors storage on its device. The stage runs the model's
*own* forward on the whole micro-batch (every rank can read the batch), so embeddings,
masks, position ids and the loss are computed exactly as the unsplit model computes them:

    stage 0:   embeddings → its blocks ──► handoff (the hidden state leaves the forward)
    stage k:   (embeddings stubbed) → absent blocks pass through → its first block's
               input replaced by the received hidden state → its blocks ──► handoff
    stage K-1: … → its blocks → final norm, head, loss

- A block of another stage is replaced by ``Absent``, which passes its first argument on.
- A module outside the blocks that another stage runs is replaced by a stub: one from
  before the blocks returns NaN of the shape its real output would have (computed on the
  meta device), so a value that reaches the stage's output by any path other than the
  hidden state cannot go unnoticed (the first step checks); one from after the blocks
  must never be reached and says so.
- A parameter that two stages use (tied input and output embeddings) is kept by both,
  under the name it has in the whole model; ``SharedWeight`` lists them so the technique
  can sum their gradients. The stage's state dict is the whole model's restricted to what
  it holds, so checkpoints stay technique-neutral.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from dione.schedules import Partition, PartitionError
from dione.spec.batch import ItemCounting, item_counting, loss_of, plain_batch
from dione.spec.task import Task
from dione.techniques.pipeline.stage_plan import StagePlan

__all__ = ["Absent", "SharedWeight", "StageModule", "batch_fields", "cut_stage", "meta_twin",
           "shared_weights", "stage_modules"]


class StageHandoff(Exception):
    """Carries the hidden state out of the model's forward after the stage's last block."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__("pipeline stage handoff")
        self.hidden = hidden


class _Twinned(nn.Module):
    """A stand-in for a module another stage runs, keeping a copy of it on the meta
    device (not a child: its weights stay out of the stage), so that the model's forward
    may still read its attributes: a ViT's forward asks its embeddings' projection for
    its dtype on every stage. Reading a value, or running the twin, still fails (on the
    meta device), and ``dione validate`` says so for the pipelines."""

    def __init__(self) -> None:
        super().__init__()
        self.__dict__["_twin"] = None

    def twin_with(self, twin: nn.Module) -> None:
        """Answer reads of attributes it lacks from ``twin`` (set once its own tensors are
        registered: registering checks that no attribute of the name exists)."""
        self.__dict__["_twin"] = twin

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            twin = self.__dict__.get("_twin")
            if twin is None:
                raise
            return getattr(twin, name)


class Absent(_Twinned):
    """A block another stage runs; holds the weights this stage shares with it. One of
    an earlier stage gives NaN of its input's shape (``poisoned``): its output is
    replaced at this stage's first block anyway, and a value read from it by any other
    path (a long skip connection across the cut) must not pass for a real one, as the
    raw input passed on would; one of a later stage is never reached (the stage hands
    off first) and passes its first argument on."""

    def __init__(self, poisoned: bool = False) -> None:
        super().__init__()
        self.poisoned = poisoned

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        given = args[0] if args else kwargs.get("hidden_states")
        if self.poisoned and isinstance(given, torch.Tensor) and given.is_floating_point():
            return torch.full_like(given, float("nan"))
        return given


class _Before(_Twinned):
    """A module before the blocks that an earlier stage runs: NaN of its output's shape
    (its twin's, run on the meta device)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        device = next((t.device for t in tree_flatten((args, kwargs))[0]
                       if isinstance(t, torch.Tensor)), torch.device("cpu"))

        def to_meta(t: Any) -> Any:
            return t.to("meta") if isinstance(t, torch.Tensor) else t

        def poisoned(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            fill = float("nan") if t.is_floating_point() else 0
            return torch.full(t.shape, fill, dtype=t.dtype, device=device)

        with torch.no_grad():
            leaves, spec = tree_flatten((args, kwargs))
            margs, mkwargs = tree_unflatten([to_meta(t) for t in leaves], spec)
            twin: nn.Module = self.__dict__["_twin"]
            out = twin(*margs, **mkwargs)
        leaves, spec = tree_flatten(out)
        return tree_unflatten([poisoned(t) for t in leaves], spec)


class _After(nn.Module):
    """A module after the blocks that only the last stage runs."""

    def __init__(self, path: str, stage: int) -> None:
        super().__init__()
        self.path, self.stage = path, stage

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"pipeline stage {self.stage} called {self.path}, which only the last stage runs: "
            "the model's forward uses it before its last block; describe the model's stages "
            "(dione.techniques.pipeline.stage_plan) or leave the pipelines out")


@dataclass(frozen=True)
class SharedWeight:
    """A parameter that more than one stage uses, by its name in the whole model."""

    name: str
    stages: tuple[int, ...]


def stage_modules(model: nn.Module, plan: StagePlan, partition: Partition,
                  stage: int) -> list[nn.Module]:
    """The modules with parameters that ``stage`` runs: its blocks, the first stage's
    modules before them, the last stage's after them."""
    modules = dict(model.named_modules())
    paths = list(partition.layers(stage))
    if stage == 0:
        paths += plan.first
    if stage == partition.stages - 1:
        paths += plan.last
    return [modules[p] for p in paths]


def _used(modules: list[nn.Module]) -> set[int]:
    return {id(t) for m in modules for t in itertools.chain(m.parameters(), m.buffers())}


def shared_weights(model: nn.Module, plan: StagePlan, partition: Partition,
                   task: str) -> list[SharedWeight]:
    """The trainable parameters more than one stage uses; a PartitionError for one that
    none does (it would silently never train). A frozen one is left out: each stage's
    copy stays as loaded, where a summed zero gradient would let the optimizer's weight
    decay move it (single, DDP and FSDP skip a parameter without a gradient)."""
    used = [_used(stage_modules(model, plan, partition, k)) for k in range(partition.stages)]
    shared = []
    for name, param in model.named_parameters():
        holders = tuple(k for k in range(partition.stages) if id(param) in used[k])
        if not holders and param.requires_grad:
            raise PartitionError(
                f"task {task!r}: parameter {name} is in no block and in no module the stage "
                "plan places before or after the blocks, so no pipeline stage would train it; "
                "describe the model's stages (dione.techniques.pipeline.stage_plan)")
        if len(holders) > 1 and param.requires_grad:
            shared.append(SharedWeight(name, holders))
    return shared


def _hold(holder: nn.Module, source: nn.Module, used: set[int]) -> None:
    """Register on ``holder``, at their paths in ``source``, the tensors of ``source``
    the stage uses elsewhere (so they keep their names in the whole model)."""
    for path, module in source.named_modules():
        kept = [(n, p) for n, p in module._parameters.items() if p is not None and id(p) in used]
        bufs = [(n, b) for n, b in module._buffers.items() if b is not None and id(b) in used]
        if not kept and not bufs:
            continue
        target = holder
        for part in path.split(".") if path else []:
            if part not in target._modules:
                target.add_module(part, nn.Module())
            child = target._modules[part]
            assert child is not None
            target = child
        for n, p in kept:
            target.register_parameter(n, p)
        for n, b in bufs:
            target.register_buffer(n, b, persistent=n not in module._non_persistent_buffers_set)


def meta_twin(module: nn.Module) -> nn.Module:
    """A copy of ``module`` on the meta device, made without copying its weights."""
    memo: dict[int, Any] = {}
    for t in itertools.chain(module.parameters(), module.buffers()):
        meta = torch.empty_like(t, device="meta")
        memo[id(t)] = nn.Parameter(meta, t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(module, memo)


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    parent._modules[name] = new


def _hidden_of(output: Any, whole: bool) -> torch.Tensor:
    """The hidden state a block returned: itself, or (``whole`` False: a model's repeated
    blocks, which return extras after it) the first item of a tuple."""
    hidden = output if isinstance(output, torch.Tensor) or whole else (
        output[0] if isinstance(output, (tuple, list)) and output else None)
    if not isinstance(hidden, torch.Tensor):
        raise RuntimeError(f"a pipeline stage would hand on a {type(output).__name__}; "
                           "stages send tensors only, so no cut may follow this layer")
    # Sent as it is laid out in memory: a channels_last (or any strided) hidden state
    # goes contiguous, which the receiving stage's buffer is.
    return hidden.contiguous()


class StageModule(nn.Module):
    """What a pipeline runtime runs for one stage: ``forward(received, **batch_fields)``
    gives the hidden state to send on, or, on the last stage, the micro-batch's mean loss.
    ``model`` is the cut whole model (optimise and checkpoint that: its names are the
    whole model's)."""

    def __init__(self, model: nn.Module, task: Task, plan: StagePlan, partition: Partition,
                 stage: int, spec: TreeSpec, autocast: Any) -> None:
        super().__init__()
        self.model = model
        self.task, self.plan, self.stage = task, plan, stage
        self.first, self.last = stage == 0, stage == partition.stages - 1
        self.spec, self.autocast = spec, autocast
        # The first step checks that no stubbed module's output leaks into the stage's;
        # ``unchecked`` calls before it are not checked (torch's runtime runs each stage
        # once on placeholder inputs, whose garbage may overflow, to infer shapes).
        self.verify = True
        self.unchecked = 0
        self._incoming: torch.Tensor | None = None
        # A loss averaged over counted items: each micro-batch's mean is weighed by its
        # share of the mini-batch's items (``count_items`` sets the mini-batch's).
        self.counting: ItemCounting | None = (
            item_counting(task, model) if self.last and partition.stages > 1 else None)
        self.items_total: float = 0
        self.parts = 1
        blocks = partition.layers(stage)
        self._entry, self._exit = blocks[0], blocks[-1]
        if not self.first:
            model.get_submodule(blocks[0]).register_forward_pre_hook(self._enter, with_kwargs=True)
        if not self.last:
            model.get_submodule(blocks[-1]).register_forward_hook(self._leave)

    def count_items(self, batch: Any, parts: int) -> None:
        """Before a mini-batch's micro-batches run: the items ``batch`` (the whole
        mini-batch) counts, and into how many micro-batches it is split."""
        if self.counting is not None:
            self.items_total, self.parts = self.counting.count(batch), parts

    def _enter(self, module: nn.Module, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self._incoming is None:
            raise RuntimeError(f"pipeline stage {self.stage}: block {self._entry} ran twice "
                               "in one forward")
        incoming, self._incoming = self._incoming, None
        if args:
            return (incoming, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": incoming}

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        raise StageHandoff(_hidden_of(output, self.plan.sequential))

    def forward(self, *received: torch.Tensor, **fields: torch.Tensor) -> torch.Tensor:
        batch = tree_unflatten([fields[f"batch_{i}"] for i in range(len(fields))], self.spec)
        self._incoming = None if self.first else received[0]
        share = (None if self.counting is None
                 else self.counting.share(batch, self.items_total, self.parts))
        try:
            with self.autocast():
                loss = loss_of(self.model, self.task, batch, share)
        except StageHandoff as handoff:
            hidden = handoff.hidden
            if self.verify:
                self._check(received, hidden)
            return hidden
        except ValueError:
            if not (self.unchecked and share is not None and share.items == 0):
                raise
            # torch's shape inference on placeholder inputs, the first micro-batch holding
            # none of the counted items: its garbage logits leave nothing finite to zero
            # through, and the slice failed (a review); only the loss's shape is read.
            # Zero through what it received: torch's backward shape inference follows.
            self.unchecked -= 1
            return sum(((r * 0.0).sum() for r in received if r.is_floating_point()),
                       torch.zeros((), device=received[0].device if received else None))
        finally:
            self._incoming = None
        if not self.last:
            raise RuntimeError(
                f"pipeline stage {self.stage}: the model's forward returned without running "
                f"block {self._exit}; its forward must call every block of "
                f"{self.plan.container or 'the model'} in order")
        if self.verify and received:
            self._check(received, loss)
        return loss

    def _check(self, received: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        if self.unchecked:
            self.unchecked -= 1
            return
        finite_in = all(bool(torch.isfinite(r).all()) for r in received
                        if r.is_floating_point())
        if finite_in and not bool(torch.isfinite(out).all()):
            before = (f" (the stage plan runs {', '.join(self.plan.first)} before the "
                      "blocks, as they are registered before them: one that runs after "
                      "belongs in the plan's 'last')" if self.plan.first else "")
            raise RuntimeError(
                f"pipeline stage {self.stage}: its output is not finite although its input "
                "is: a module that runs before the blocks or a block of an earlier stage "
                f"(each NaN on this stage){before} feeds it by some path other than the "
                "hidden state, or training diverged at once. A long skip connection across "
                "the cut: keep both its ends on one stage (the task's split_points); a "
                "module before the blocks: describe the model's stages "
                "(dione.techniques.pipeline.stage_plan)")


def batch_fields(batch: Any) -> tuple[dict[str, torch.Tensor], TreeSpec]:
    """``batch`` (a tensor, tuple or dict) as flat keyword tensors every stage receives,
    and the structure to rebuild it."""
    leaves, spec = tree_flatten(plain_batch(batch))
    return {f"batch_{i}": leaf for i, leaf in enumerate(leaves)}, spec


def cut_stage(model: nn.Module, plan: StagePlan, partition: Partition, stage: int) -> nn.Module:
    """``model`` cut to ``stage`` in place: other stages' blocks ``Absent``, modules outside
    the blocks that other stages run stubbed, the tensors it shares with them kept under
    their own names."""
    used = _used(stage_modules(model, plan, partition, stage))
    modules = dict(model.named_modules())
    mine = set(partition.layers(stage))
    first = partition.names.index(partition.layers(stage)[0])
    replacements: list[tuple[str, nn.Module]] = []
    for place, path in enumerate(partition.names):
        if path not in mine:
            absent = Absent(poisoned=place < first)
            _hold(absent, modules[path], used)
            absent.twin_with(meta_twin(modules[path]))
            replacements.append((path, absent))
    last = partition.stages - 1
    for paths, runs_here, before in ((plan.first, stage == 0, True),
                                     (plan.last, stage == last, False)):
        if runs_here:
            continue
        for path in paths:
            stub: nn.Module = _Before() if before else _After(path, stage)
            _hold(stub, modules[path], used)
            if isinstance(stub, _Before):
                stub.twin_with(meta_twin(modules[path]))
            replacements.append((path, stub))
    for path, new in replacements:
        _replace(model, path, new)
    config: Any = getattr(model, "config", None)
    if getattr(config, "use_cache", None):
        config.use_cache = False  # a key-value cache is for generation, not training
    return model
