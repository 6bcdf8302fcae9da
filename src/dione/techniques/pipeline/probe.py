"""Try a task's pipelines before anything starts: on a few real batches, in one process.

A pipeline may accept a task it cannot train: batches whose shape changes from step to
step (a collator that pads each batch to its longest sequence) break torch's pipeline
runtime, which fixes each stage's shapes at the first step; a model whose forward reads
into a module another stage holds (a ViT reads its patch embeddings' weights on every
stage) breaks a stage that does not hold it. So the task's stages are run here, on the
CPU, one after the other on a two-sample micro-batch, each stage cut from a copy of the
whole model (``dione.techniques.pipeline.stages``, the code every rank runs), and the last
stage's loss compared with the whole model's:

    whole model ─► loss                    ┐
    stage 0 ─► hidden ─► stage 1 ─► loss   ┘ equal, or the pipelines are refused

What fails becomes ``Task.refused_techniques`` (technique -> the reason), which every
technique's ``check`` reports: the profiler then leaves those techniques out with the
reason, and ``dione validate`` names them.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.data import Subset

from dione.schedules import PartitionError
from dione.spec.batch import collate_draws, loss_of, plain_batch, slice_batch
from dione.spec.draws import HeldDraws, draws_kept
from dione.spec.sameness import task_key
from dione.spec.task import Task
from dione.spec.validate import alike
from dione.techniques.batches import BatchSource, SampleOrder, _fetch
from dione.techniques.data_parallel import DataParallelTechnique, groups_by_name
from dione.techniques.exactness import drew_since, generator_states
from dione.techniques.marks import marks_by_name, put_marks
from dione.techniques.pipeline.gpipe import PipelineTechnique
from dione.techniques.pipeline.partition import partition_model, stage_plan
from dione.techniques.pipeline.stage_plan import STAGES_ATTRIBUTE, StagePlan
from dione.techniques.pipeline.stages import StageModule, batch_fields, cut_stage
from dione.techniques.registry import techniques

__all__ = ["pipeline_refusals", "probe_task", "with_refusals"]

@dataclasses.dataclass(frozen=True)
class Probed:
    """What a probe found of a task: the pipelines that cannot train it (with why), and
    what makes a split batch train otherwise than single (the ``Task`` fields of the
    same names)."""

    refused: dict[str, str] = dataclasses.field(default_factory=dict)
    buffers_written: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    unused_parameters: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    fetch_draws: bool = False
    forward_draws: bool = False
    stateful_items: bool = False

    def found(self) -> bool:
        """Whether it found anything to put in the task."""
        return bool(self.refused or any(self.buffers_written) or any(self.unused_parameters)
                    or self.fetch_draws or self.forward_draws or self.stateful_items)


# A model up to this size is built for real and run stage by stage (as validation does).
_PROBE_BYTES = 1 << 30
_HOST = torch.device("cpu")  # where a probe's forwards run
# Batches compared for their shapes (a batch a collator pads is as long as its longest).
_SHAPE_BATCHES = 3


def _shapes(batch: Any) -> list[tuple[int, ...]]:
    return [tuple(t.shape) for t in tree_flatten(plain_batch(batch))[0]
            if isinstance(t, torch.Tensor)]


def _varying_shapes(task: Task, source: BatchSource, dataset_size: int) -> str | None:
    """Why the task's batches do not all have one shape (None: the first few do)."""
    steps = min(_SHAPE_BATCHES, max(1, dataset_size // task.batch_size))
    seen = [_shapes(source.global_batch(step)) for step in range(steps)]
    for step, shapes in enumerate(seen[1:], 1):
        if shapes != seen[0]:
            return (f"task {task.name!r}: its batches change shape from step to step "
                    f"({seen[0]} at step 0, {shapes} at step {step}: a collator that pads "
                    "each batch to its longest item?), and this pipeline's stages exchange "
                    "tensors of the shape they had at the first step; pad every batch to "
                    "one length (e.g. padding='max_length'), or use another technique")
    return None


def _read_as(plan: StagePlan, model: nn.Module) -> str:
    """What a stage failure may come of where dione found the blocks itself: the list it
    took for them, which may be one the forward does not run one after another (a
    mixture's experts: a review read only a tensor-size error); "" where declared or
    the model is an ``nn.Sequential``."""
    if plan.sequential or getattr(model, STAGES_ATTRIBUTE, None) is not None:
        return ""
    return (f"it took {plan.container} for the blocks its forward runs one after another, "
            "handing each the hidden state: a list of experts or heads it runs side by side "
            "is none; or ")


def _stage_problem(task: Task, model: nn.Module, batch: Any) -> str | None:
    """Why the task's model, cut into two stages and run stage by stage on ``batch``,
    does not give the whole model's loss (None: it does)."""
    try:
        plan = stage_plan(model, task.name)
        partition = partition_model(model, 2, task.name, split_points=task.split_points)
    except PartitionError:
        return None  # each technique's own check says why it cannot cut the model
    model.eval()  # no dropout: the stages must give the whole model's loss exactly
    with torch.no_grad():
        whole = float(loss_of(model, task, batch))
        if not math.isfinite(whole):  # a mean over none (no masked token): no measure
            return None
        _, structure = batch_fields(batch)
        fields, _ = batch_fields(batch)
        received: tuple[torch.Tensor, ...] = ()
        whole_optimised = _optimised(task, model)
        left = set(whole_optimised)  # updated on the whole model, on no stage yet
        for stage in range(partition.stages):
            copied = copy.deepcopy(model)  # a parameter's deepcopy drops its own attributes
            put_marks(copied, marks_by_name(model))  # ... which a rank's stage keeps
            cut = cut_stage(copied, plan, partition, stage)
            try:
                on_stage = _optimised(task, cut)
                stray, left = set(on_stage) - set(whole_optimised), left - set(on_stage)
            except Exception as err:
                return (f"task {task.name!r}: its optimizer factory fails on the parameters "
                        f"of pipeline stage {stage} ({type(err).__name__}: {err}); a pipeline "
                        "builds one optimizer per stage, over that stage's parameters")
            if stray:
                return (f"task {task.name!r}: its optimizer factory, given pipeline stage "
                        f"{stage}'s parameters, picks {', '.join(sorted(stray)[:3])}, which "
                        "it leaves out of the whole model's (it picks them by position, or by an "
                        "attribute set on them, which a stage's copy does not keep?): a "
                        "pipeline builds one optimizer per stage, so choose parameters by "
                        "what they are (p.dim(), p.requires_grad), or use another technique")
            # Groups built by position (the first N parameters at one rate) give a
            # stage's parameters other settings than the whole model's: every parameter
            # is updated, with the wrong learning rate or weight decay.
            regrouped = sorted(n for n in on_stage if n in whole_optimised
                               and on_stage[n] != whole_optimised[n])
            if regrouped:
                return (f"task {task.name!r}: its optimizer factory, given pipeline stage "
                        f"{stage}'s parameters, puts {', '.join(regrouped[:3])} in a group "
                        "of other settings than on the whole model (it builds its groups "
                        "by position, or by an attribute set on the parameters, which a "
                        "stage's copy does not keep?): a pipeline builds one optimizer per "
                        "stage, so choose each group's parameters by what they are (p.dim(), "
                        "their shape), or use another technique")
            module = StageModule(cut, task, plan, partition, stage, structure,
                                 contextlib.nullcontext)
            try:
                out = module(*received, **fields)
            except Exception as err:
                return (f"task {task.name!r}: its model cut into pipeline stages fails on "
                        f"stage {stage} ({partition.describe(stage)}): {type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''} ({_read_as(plan, model)}"
                        "its forward may read into a module another stage holds); use another "
                        "technique, or describe the model's stages with a "
                        f"{STAGES_ATTRIBUTE} attribute (dione.techniques.pipeline.stage_plan)")
            received = (out,)
    if left:
        return (f"task {task.name!r}: its optimizer factory updates "
                f"{', '.join(sorted(left)[:3])} on the whole model but on no pipeline "
                "stage (it picks parameters by position, or by an attribute set on them?): a "
                "pipeline builds one optimizer "
                "per stage, so choose parameters by what they are (p.dim(), "
                "p.requires_grad), or use another technique")
    staged = float(received[0])
    if not math.isclose(staged, whole, rel_tol=1e-5, abs_tol=1e-7):
        return (f"task {task.name!r}: its model cut into pipeline stages gives the loss "
                f"{staged:.6g} where the whole model gives {whole:.6g} on the same samples: "
                "its forward computes something outside its blocks that the stages do not "
                "reproduce (a skip connection from a block to a later stage: keep both its "
                "ends on one stage with the task's split_points); use another technique, or "
                "describe the model's stages (dione.techniques.pipeline.stage_plan)")
    return None


def _staged_alike(task: Task, model: nn.Module, batch: Any) -> str | None:
    """``_stage_problem`` with torch's draws held still (``HeldDraws``): the whole
    model and its stages drew otherwise, and a loss drawing its weights was refused as a
    skip connection across the cut (a regression review). As it is where code cannot
    run so."""
    try:
        with HeldDraws():  # type: ignore[no-untyped-call]
            return _stage_problem(task, model, batch)
    except Exception:
        return _stage_problem(task, model, batch)


def _written_by(task: Task, model: nn.Module, batch: Any, other: Any
                ) -> tuple[list[str], list[str], list[str]]:
    """The buffers and parameters a training forward of ``model`` (copies of it) writes,
    BatchNorm's buffers aside (refused by name where it matters): those two batches leave
    different (a running average, an ActNorm's initialisation from the first batch, an
    embedding's max_norm), and those the second call moved alike (a counter,
    spectral_norm's power iteration); and, of both, the parameters. A cache filled once
    from the shapes alone (rotary embeddings' tables) does not count: one copy runs on
    ``batch`` twice, another on ``other`` (another batch of the same shape). A parameter
    counts as written where its value, its storage or its version counter moved (an
    average of weights that have not moved yet is the weights; a write through ``.data``
    bumps no counter)."""
    copied, twin = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    skip = {f"{m}.{n}" if m else n for m, module in copied.named_modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm)
            for n, _ in module.named_buffers(recurse=False)}
    def as_they_are(module: nn.Module) -> tuple[dict[str, nn.Parameter],
                                                 dict[str, tuple[int, int, torch.Tensor]]]:
        """Its parameters, and each one's version, address and value now."""
        held = dict(module.named_parameters())
        return held, {n: (p._version, p.data_ptr(), p.detach().clone())
                      for n, p in held.items()}

    parameters, before = as_they_are(copied)

    def state(module: nn.Module) -> dict[str, torch.Tensor]:
        return {n: t for n, t in [*module.named_buffers(), *module.named_parameters()]
                if n not in skip}

    watch = _ParameterWrites(parameters)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        try:
            with watch:
                loss_of(copied, task, batch)
        except Exception:  # code the watch cannot run under: values and counters alone
            copied = copy.deepcopy(model).train()
            # ... of the new copy (the old one's addresses read as every parameter
            # written: a regression review)
            parameters, before = as_they_are(copied)
            watch.mutated.clear()
            loss_of(copied, task, batch)
        loss_of(twin, task, other)
        first = {n: b.detach().clone() for n, b in state(copied).items()}
        other_data = state(twin)
        loss_of(copied, task, batch)
        second = state(copied)
    written = [n for n, p in parameters.items() if n in watch.mutated
               or (p._version, p.data_ptr()) != before[n][:2]
               or not alike(first[n], before[n][2])]
    by_data = [n for n, b in first.items() if n in other_data and (
        n not in parameters or n in written) and not alike(b, other_data[n].detach())]
    every_call = [n for n, b in first.items() if n not in by_data and n not in parameters
                  and n in second and not alike(b, second[n].detach())]
    return by_data, every_call + [n for n in written if n not in by_data], written


class _ParameterWrites(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Watches a forward for operators that write into a parameter's memory (an
    in-place op or an ``out=``, through ``.data`` too): a max-norm constraint writes
    nothing while the weights are within it, yet a write it is (``mutated``: names)."""

    def __init__(self, parameters: dict[str, nn.Parameter]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.storages = {p.untyped_storage().data_ptr(): n for n, p in parameters.items()}
        self.mutated: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        for index, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            for tensor in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(tensor, torch.Tensor) and not tensor.is_meta:
                    name = self.storages.get(tensor.untyped_storage().data_ptr())
                    if name is not None:
                        self.mutated.add(name)
        return func(*args, **kwargs)


def _optimised(task: Task, model: nn.Module) -> dict[str, str]:
    """The parameters the task's optimizer factory updates on ``model``, by name, each
    with its group's settings (learning rate, weight decay, ...) as text."""
    optimizer = task.optimizer(model.parameters())
    return {name: _group_settings(optimizer.param_groups[group])
            for name, group in groups_by_name(optimizer, model).items()}


def _group_settings(group: dict[str, Any]) -> str:
    """A parameter group's settings but its parameters, comparable across optimizers."""
    return repr(sorted((key, value.tolist() if isinstance(value, torch.Tensor) else value)
                       for key, value in group.items() if key != "params"))


def pipeline_refusals(task: Task, pipelines: Sequence[PipelineTechnique] | None = None
                      ) -> dict[str, str]:
    """Pipeline techniques (default: every registered one the task allows) that cannot
    train ``task``, with why: tried on its first batches, in this process, on the CPU."""
    return probe_task(task, pipelines).refused


def probe_task(task: Task, pipelines: Sequence[PipelineTechnique] | None = None
               ) -> Probed:
    """``pipeline_refusals``, and, where the task allows a data-parallel technique
    besides single, the buffers its training forward writes (from the data, on every
    call alone: ``Task.buffers_written``) and the parameters a training step leaves
    without a gradient (always, at random: ``Task.unused_parameters``); fsdp refused for
    a model that skips parameters at random (its ranks' collectives would not match)."""
    if pipelines is None:
        pipelines = [t for t in techniques() if isinstance(t, PipelineTechnique)
                     and task.allows(t.name) and (t.exact or task.allow_inexact)]
    # Single's accumulation splits the batch too, but is tried only where memory ran
    # out: a model too large to build here twice more is left to its trials.
    parallel = any(isinstance(t, DataParallelTechnique) and t.name != "single"
                   and task.allows(t.name) for t in techniques())
    written_how: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    unused: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    forward_draws = False
    dataset: Any = task.data()
    # Single's accumulation collates each part: a collate that draws masks otherwise.
    fetch_draws = _fetch_draws(task, dataset)
    # A resumed slice fetches from a new data set: single's too.
    stateful = _stateful_items(task, dataset)
    if not pipelines and not parallel:
        return Probed(fetch_draws=fetch_draws, stateful_items=stateful)
    source = BatchSource(dataset, task.batch_size, task.seed, collate=task.collate_fn)
    refused: dict[str, str] = {}
    varying = _varying_shapes(task, source, len(dataset)) if pipelines else None
    if varying is not None:
        refused.update({t.name: varying for t in pipelines if t.fixed_shapes})
    torch.manual_seed(task.seed)
    model = task.model()
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if size <= _PROBE_BYTES:
        whole = source.global_batch(0)
        batch = slice_batch(whole, 0, min(2, task.batch_size))
        # Other samples of the same shape: the batch's next two, or the next batch's.
        other = (slice_batch(whole, 2, 4) if task.batch_size >= 4 else
                 slice_batch(source.global_batch(1), 0, min(2, task.batch_size)))
        problem = _staged_alike(task, model, batch) if pipelines else None
        if problem is not None:
            refused.update({t.name: problem for t in pipelines if t.name not in refused})
        exact = [t for t in pipelines if t.exact and t.name not in refused]
        by_data, every_call, in_place = (_written_by(task, model, batch, other)
                                         if exact or parallel else ([], [], []))
        # fsdp drops what a forward writes into a gathered parameter at reshard.
        if in_place and parallel and task.allows("fsdp"):
            refused["fsdp"] = (
                f"task {task.name!r}: its forward writes parameters in place ("
                f"{', '.join(in_place[:3])}{', ...' if len(in_place) > 3 else ''}: an "
                "average of the weights kept in parameters, as torch's AveragedModel keeps "
                "it, a max-norm constraint, an embedding's max_norm): fsdp gathers each "
                "parameter for the forward and drops what the forward wrote into it when "
                "it reshards: different training, not rounding; keep such state in buffers "
                "(register_buffer), or use another technique")
        written_how = (tuple(by_data), tuple(every_call))
        always, at_random, forward_draws = _unused(task, model, batch)
        if parallel:
            unused = (always, at_random)
            if unused[1] and task.allows("fsdp"):
                refused["fsdp"] = (
                    f"task {task.name!r}: its training forward leaves parameters out at "
                    f"random ({', '.join(unused[1][:3])}{', ...' if len(unused[1]) > 3 else ''}"
                    ": layers skipped at random, as LayerDrop does): fsdp's ranks would "
                    "each skip others and gather parameters in another order, which stops "
                    "the gang; use another technique")
        written = (by_data + every_call) if exact else []
        if written:  # xpipe, inexact and opted into, trains on: no placeholder pass
            problem = (f"task {task.name!r}: its forward writes buffers (or parameters in "
                       "place) as it trains "
                       f"({', '.join(written[:3])}{', ...' if len(written) > 3 else ''}: a "
                       "running average, a counter, spectral_norm's power iteration, an "
                       "initialisation from the first batch): a "
                       "pipeline writes them once per micro-batch, not once per step, and "
                       "torch's pipeline runtime runs each stage once more before the first "
                       "step, on placeholder inputs: different training, not rounding; use "
                       "another technique (single trains it as written)")
            refused.update({t.name: problem for t in exact})
    return Probed(refused, written_how, unused, fetch_draws, forward_draws, stateful)


def _fetch_draws(task: Task, dataset: Any) -> bool:
    """Whether a batch's fetch draws random numbers where it is called once per share of
    a split batch, seeded by the share's first position: the data set's ``__getitems__``
    (the same samples fetched under two seeds differ; a fetch that only pads them does
    not) or the task's collate function (``collate_draws``)."""
    count = min(2, len(dataset))
    indices = SampleOrder(len(dataset), task.seed).indices(0, count)
    try:
        if task.collate_fn is not None and collate_draws(
                task, _fetch(dataset, indices, task.seed, 0, list)):
            return True
        if getattr(dataset, "__getitems__", None) is None or (
                isinstance(dataset, Subset) and not hasattr(dataset.dataset, "__getitems__")):
            return False
        return _differ(*(_flat_fetch(task, dataset, indices, at) for at in (0, count)))
    except Exception:  # its trials say why it cannot fetch; nothing known here
        return False


def _stateful_items(task: Task, dataset: Any) -> bool:
    """Whether the data set's item at the stream's first position differs when fetched
    again, under the same seeds: its draws come from a generator of its own (a NumPy
    ``default_rng`` kept in the data set), not from the global ones dione seeds per
    item, so an item depends on what the process fetched before it (a share of a split
    batch, a resumed slice: each fetches from a data set of its own)."""
    indices = SampleOrder(len(dataset), task.seed).indices(0, 1)
    try:
        return _differ(*(_flat_fetch(task, dataset, indices, 0) for _ in range(2)))
    except Exception:  # its trials say why it cannot fetch; nothing known here
        return False


def _flat_fetch(task: Task, dataset: Any, indices: torch.Tensor, at: int) -> list[Any]:
    """The items at ``indices`` fetched and collated as stream position ``at`` fetches
    them, flattened to their leaves."""
    return tree_flatten(plain_batch(_fetch(dataset, indices, task.seed, at,
                                           task.collate_fn)))[0]


def _differ(first: list[Any], second: list[Any]) -> bool:
    """Whether two fetches' leaves (``_flat_fetch``) differ: in number, or in a value."""
    if len(first) != len(second):
        return True
    return not all(alike(a, b) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                   else a == b for a, b in zip(first, second, strict=True))


def _unused(task: Task, model: nn.Module, batch: Any, draws: int = 4
            ) -> tuple[tuple[str, ...], tuple[str, ...], bool]:
    """The trainable parameters a training forward of ``model`` (a fresh copy each
    draw) on ``batch`` leaves out of its loss's graph in each of ``draws`` seeded draws,
    and in some only (a layer skipped with probability 1/2 shows in four draws 7 times
    in 8); one draw where the forward drew no random number (torch's, Python's or
    NumPy's generator: no dropout, no LayerDrop). The graph is read, never run
    backward: a parameter whose module runs but whose output does not reach the loss (a
    head computed for a logged number) counts, and one another module reads directly
    (MultiheadAttention's out_proj) does not. Third: whether the forward drew random
    numbers from those generators at all (noise, a drop path, dropout)."""
    left_out = []
    drew = False
    # Python's and NumPy's draws are put back by the caller (with_refusals, validation).
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        for draw in range(draws):
            torch.manual_seed(task.seed + draw)
            before = generator_states(_HOST)
            copied = copy.deepcopy(model).train()  # a model that changes as it runs
            try:
                loss = loss_of(copied, task, batch)
            except Exception:  # its trials say why it cannot train; nothing known
                return (), (), False
            if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
                return (), (), False  # nothing to train here: its trials say so
            reached = _leaves(loss.grad_fn)
            left_out.append({n for n, p in copied.named_parameters()
                             if p.requires_grad and id(p) not in reached})
            del loss, copied
            now = drew_since(before, _HOST)
            drew = drew or now
            if not now:  # no random draw in its forward: another would be the same
                break
    always = set.intersection(*left_out)
    return tuple(sorted(always)), tuple(sorted(set.union(*left_out) - always)), drew


def _leaves(root: Any) -> set[int]:
    """The ids of the tensors whose gradients the autograd graph from ``root`` would
    accumulate (its AccumulateGrad nodes' variables)."""
    seen, found, stack = set(), set(), [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None:
            found.add(id(variable))
        stack.extend(next_node for next_node, _ in getattr(node, "next_functions", ()))
    return found


# What a probe reads of a task; the optimizer whole (a weight decay of 0 can make two
# groups built by position alike, which the pipelines' check compares).
_PROBED_FIELDS = ("model", "data", "collate_fn", "loss", "loss_items", "batch_size", "seed",
                  "techniques", "allow_inexact", "split_points", "precision",
                  "refused_techniques", "optimizer")
_NAME_SLOT = "dione-probed-task-7c1e"

def with_refusals(tasks: Iterable[Task]) -> list[Task]:
    """``tasks``, each with the pipelines that cannot train it in its
    ``refused_techniques`` (a task whose probe itself fails is left as it is: validation
    has named its problem, or its trials will)."""
    result = []
    seen: dict[Hashable, Probed] = {}  # a sweep's tasks alike (over learning rates)
    for task in tasks:
        key = task_key(task, _PROBED_FIELDS)
        if key not in seen:
            try:
                with draws_kept():  # its forwards may draw from them (LayerDrop)
                    # Under a name of its own, put in each task's messages below.
                    seen[key] = probe_task(dataclasses.replace(task, name=_NAME_SLOT))
            except Exception:
                seen[key] = Probed()
        probed = seen[key]
        refused = {t: m.replace(_NAME_SLOT, task.name) for t, m in probed.refused.items()}
        result.append(dataclasses.replace(
            task, refused_techniques={**task.refused_techniques, **refused},
            buffers_written=probed.buffers_written,
            unused_parameters=probed.unused_parameters, fetch_draws=probed.fetch_draws,
            forward_draws=probed.forward_draws, stateful_items=probed.stateful_items)
            if probed.found() else task)
    return result
