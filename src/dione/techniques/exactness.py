"""What keeps a pipeline from being bitwise single: dropout masks and batch statistics.

- Dropout draws its masks from the RNG in a different order (stages on other ranks,
  micro-batches in turn): training is statistically, not bitwise, equivalent to single.
  Pipelines train on and say so in the slice's outcome (``extra["exactness"]``).
- BatchNorm normalises each micro-batch by the micro-batch's statistics, not the global
  batch's, and torch's pipeline runtime runs each stage once more before the first step
  (to infer shapes, on placeholder inputs) in training mode, which moves running
  statistics: that is different training, not rounding, so pipelines refuse it.

DDP and FSDP shares, and accumulation parts, split the batch too. Each rank seeds its
own RNG stream, so dropout draws other masks than single: statistically the same
training, and they train on and say so (``split_batch_exactness``). BatchNorm sees a
share's or a part's statistics, not the batch's: different training, so a batch split
in parts is inexact for such a model (``split_statistics``), trained only where the
task opts in (``torch.nn.SyncBatchNorm`` shares the statistics over ranks: ddp and fsdp
without accumulation stay exact for it). Other buffers a training forward writes from
the data (a running mean, an ActNorm's first-batch initialisation; found by validation,
``Task.buffers_written``) are each share's or part's alike, and a buffer written on every
call (a counter) moves once per accumulation part (``split_buffers``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, cast

import torch
from torch import nn

from dione.spec.draws import global_draws
from dione.spec.task import Task
from dione.words import modules, some

__all__ = ["batch_norm_layers", "drew_since", "dropout_layers", "generator_states",
           "model_generator_states", "own_generator_draws", "resumed_draws",
           "split_batch_exactness", "split_buffers", "split_draws", "split_inexactness",
           "split_loss", "split_rounding", "split_statistics", "structure_only",
           "synced_norms_on_cpu", "unsaid_split"]


def dropout_layers(model: nn.Module) -> list[str]:
    """Modules that drop activations in training: dropout layers with p > 0, and modules
    with a positive ``*dropout*`` rate they apply functionally (Llama's attention)."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            if module.p > 0:
                found.append(name or "the model")
            continue
        rates = [v for k, v in vars(module).items()
                 if "dropout" in k.lower() and isinstance(v, float) and v > 0]
        if rates:
            found.append(name or "the model")
    return found


def batch_norm_layers(model: nn.Module) -> list[str]:
    """Modules that normalise by the statistics of the batch they see."""
    return [name or "the model" for name, module in model.named_modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm)]


def split_batch_exactness(model: nn.Module, task: Task | None = None,
                          fetched_in_shares: bool = True, drew: bool = False,
                          single_items: bool = False,
                          own_drew: bool | None = None) -> str | None:
    """Why training ``model`` (of ``task``) on shares or parts of the batch is
    statistically, not bitwise, single's (None: nothing keeps it from being so);
    ``fetched_in_shares``: each share or part is fetched apart (not a pipeline's whole
    batch); ``drew``: the slice saw its forward draw (``drew_since``); ``single_items``:
    its one process fetches single's items in single's order (accumulation from step 0);
    ``own_drew``: whether the generators the model keeps drew in the slice (None: not
    watched). BatchNorm is not said here: it is different training (``split_statistics``)."""
    dropout = _dropout_note(dropout_layers(model))
    if dropout:
        return dropout
    kept = own_generator_draws(model, own_drew)
    if kept:
        return kept
    # Found by drawing, not by a layer's name: in validation's probe, or by the slice.
    if drew or (task is not None and task.forward_draws):
        return ("statistical, not bitwise: its training forward draws random numbers (not "
                "in a dropout layer: noise, a drop path), each share, part or stage from "
                "its own stream, not single's")
    stateful = None if single_items else resumed_draws(task)
    if stateful:
        return stateful
    if task is not None and task.fetch_draws and fetched_in_shares:
        return ("statistical, not bitwise: its batch fetch (the data set's __getitems__ or "
                "the task's collate_fn) draws random numbers, seeded per share of the "
                "batch, not per sample")
    return None


def _dropout_note(layers: list[str]) -> str | None:
    """Why dropout in ``layers`` trains a split batch statistically (None: none)."""
    if not layers:
        return None
    return (f"statistical, not bitwise: dropout in {modules(layers)} draws other masks "
            "than single")


def generator_states(device: torch.device) -> tuple[object, ...]:
    """The states of the generators a forward may draw from (``global_draws``': torch's
    host one, Python's and NumPy's; and ``device``'s, a GPU), compared by
    ``drew_since``."""
    own = (bytes(torch.cuda.get_rng_state(device).numpy()),) if device.type == "cuda" else ()
    return (*global_draws(), *own)


def drew_since(before: tuple[object, ...], device: torch.device) -> bool:
    """Whether any of those generators drew since ``before`` (``generator_states``)."""
    return generator_states(device) != before


def _model_generators(model: nn.Module) -> list[tuple[str, object]]:
    """The random generators ``model`` keeps of its own (torch.Generator, a NumPy
    Generator or RandomState, random.Random), each with its module's name: their draws
    follow neither dione's seeds nor its checkpoints."""
    kinds: list[type] = [torch.Generator, random.Random]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kinds += [numpy.random.Generator, numpy.random.RandomState]
    generator = tuple(kinds)

    def held(value: object, depth: int = 0) -> list[object]:
        """A generator, or those in a list, tuple or dict, or on a helper object that is
        no module (its modules are looked at as modules)."""
        if isinstance(value, generator):
            return [value]
        if depth > 1 or isinstance(value, (nn.Module, torch.Tensor, str, bytes,
                                           types.ModuleType)):
            return []  # (a module held, `torch` itself, holds torch's own generator)
        if isinstance(value, (list, tuple, set)):
            return [g for v in value for g in held(v, depth + 1)]
        if isinstance(value, dict):
            return [g for v in value.values() for g in held(v, depth + 1)]
        try:
            attributes = getattr(value, "__dict__", None)
        except Exception:  # a proxy or a __getattr__ that raises: nothing to read
            return []
        if not isinstance(attributes, dict) or isinstance(value, type):
            return []
        return [g for v in attributes.values() for g in held(v, depth + 1)]

    return [(name or "the model", g) for name, module in model.named_modules()
            for k, v in vars(module).items()
            if k not in ("_parameters", "_buffers", "_modules") for g in held(v)]


def model_generator_states(model: nn.Module) -> list[object]:
    """The states of the generators ``model`` keeps of its own, to compare: one that
    moved between two readings drew."""
    states: list[object] = []
    for _, g in _model_generators(model):
        try:
            if isinstance(g, torch.Generator):
                states.append(bytes(g.get_state().numpy()))
            elif isinstance(g, random.Random):
                states.append(g.getstate())
            elif hasattr(g, "bit_generator"):  # NumPy's Generator
                states.append(repr(g.bit_generator.state))
            else:  # NumPy's RandomState, of any bit generator
                states.append(repr(cast(Any, g).get_state(legacy=False)))
        except Exception:  # a state that cannot be read (SystemRandom): taken as moved
            states.append(object())
    return states


def own_generator_draws(model: nn.Module, drew: bool | None = None) -> str | None:
    """Why ``model``'s training is statistically, not bitwise, single's uninterrupted
    wherever a process builds it anew (a rank, a stage, a resumed slice): it keeps a
    generator of its own (None: it does not, or ``drew`` says the slice drew nothing
    from those it keeps: one used only to initialise the weights was flagged, a
    review). Each such process starts the generator from its seed again, and no
    checkpoint keeps its state (a review measured 43% off single's per-step losses under
    ddp, and a resume changing the final loss by 20%)."""
    if drew is False:
        return None
    kept = list(dict.fromkeys(name for name, _ in _model_generators(model)))
    if not kept:
        return None
    return (f"statistical, not bitwise: its model keeps a random generator of its own (in "
            f"{some(kept)}), which every rank, stage and resumed slice starts anew and no "
            "checkpoint keeps; draw from torch's global generator instead (no generator=), "
            "which dione seeds and checkpoints, for single's draws after a resume")


def resumed_draws(task: Task | None) -> str | None:
    """Why ``task``'s items are not single's uninterrupted ones wherever a process
    fetches them from a data set of its own (a share, a stage, a resumed slice), its
    data set (or collate_fn) drawing from a generator of its own (None: it does not)."""
    if task is None or not task.stateful_items:
        return None
    return ("statistical, not bitwise: its data set (or collate_fn) draws from a generator "
            "of its own (a NumPy default_rng or torch.Generator it keeps), so an item "
            "depends on what its process fetched before; every share, stage and resumed "
            "slice fetches from a data set of its own (draw from torch's, Python's or "
            "NumPy's global generators, which dione seeds per item, for the same items "
            "everywhere)")


def unsaid_split(task: Task) -> str | None:
    """Why a technique of the user's that split ``task``'s batch and said nothing of
    it (no ``extra["exactness"]``) trained statistically, not bitwise, as single (None:
    nothing dione knows of keeps it from being exact): what a built-in's loop says."""
    try:  # its dropout layers as the structure has them (a built model's are read)
        dropout = _structure_of(task.model).dropout
    except Exception:  # a factory that is not hashable, or builds nothing here
        dropout = []
    return _dropout_note(dropout) or split_batch_exactness(nn.Module(), task) \
        or split_rounding(task)


def split_rounding(task: Task) -> str | None:
    """Why ``task``, trained on shares or parts of the batch, is not bitwise single's for
    its precision (None: fp32, where the split moves only the reduction order, about
    1e-6 of a loss). Under bf16 or fp16 autocast a share's products round apart from the
    whole batch's (other kernel blocking): a review measured per-step losses up to 1e-3
    from single's on a padded Llama, growing over steps as any two runs' do."""
    if task.precision not in ("bf16", "fp16"):
        return None
    return (f"statistical, not bitwise: under {task.precision} autocast a share or part of "
            "the batch rounds its products apart from the whole batch's (per-step losses "
            "about 1e-3 from single's, against 1e-6 in fp32)")


def _split_norms(model: nn.Module) -> tuple[list[str], list[str]]:
    """``model``'s batch-statistics layers: those torch's SyncBatchNorm syncs over
    ranks, and the others."""
    synced = [n or "the model" for n, m in model.named_modules()
              if isinstance(m, nn.SyncBatchNorm)]
    # An instance norm that tracks running statistics averages each share's into them:
    # its training is single's, its evaluation not.
    tracking = [n or "the model" for n, m in model.named_modules()
                if isinstance(m, nn.modules.instancenorm._InstanceNorm)
                and m.track_running_stats]
    return synced, [n for n in batch_norm_layers(model) if n not in synced] + tracking


@contextlib.contextmanager
def structure_only() -> Iterator[None]:
    """Build a model's structure in the launcher: on the meta device, torch's generators
    and the environment variables left as they were (building the character GPT sets
    torch's TORCHINDUCTOR_CACHE_DIR, and the pool replaces its warm workers once the
    launcher's environment changes)."""
    with _environment_kept(), torch.random.fork_rng(devices=[]), torch.device("meta"):
        yield


@contextlib.contextmanager
def _environment_kept() -> Iterator[None]:
    """The environment variables as they were before the block."""
    environment = dict(os.environ)
    try:
        yield
    finally:
        if dict(os.environ) != environment:
            os.environ.clear()
            os.environ.update(environment)


class _Structure(NamedTuple):
    """What a model's structure says of how a split batch trains it."""

    synced: list[str]  # batch statistics SyncBatchNorm syncs over ranks
    plain: list[str]  # the others
    dropout: list[str]


@functools.lru_cache(maxsize=256)
def _structure_of(factory: Callable[[], nn.Module]) -> _Structure:
    """``_Structure`` of the model ``factory`` builds: its structure only, or, where a
    factory cannot run on the meta device (it reads a weight), the model on the host,
    once (a twin task that opted in could otherwise share a trial under ddp that this
    one cannot train)."""
    try:
        with structure_only():
            model = factory()
    except Exception:
        with _environment_kept(), torch.random.fork_rng(devices=[]):
            model = factory()
    return _Structure(*_split_norms(model), dropout_layers(model))


def _norms_of(factory: Callable[[], nn.Module]) -> tuple[list[str], list[str]]:
    """``_split_norms`` of the model ``factory`` builds (``_structure_of``)."""
    found = _structure_of(factory)
    return found.synced, found.plain


def synced_norms_on_cpu(task: Task) -> str | None:
    """Why ``task`` cannot train on CPU devices: its model's SyncBatchNorm layers, from
    its structure (None where it has none, or it cannot be built here)."""
    try:
        synced = _norms_of(task.model)[0]
    except Exception:
        return None
    return (f"its SyncBatchNorm layers ({some(synced)}) train on GPUs only in torch (a "
            "slice runs under torch.distributed, where it refuses a CPU tensor), and these "
            "nodes' devices are CPUs: for them use torch.nn.BatchNorm") if synced else None


def split_statistics(task: Task, devices: int, accumulation: int,
                     model: nn.Module | None = None) -> str | None:
    """How splitting ``task``'s batch into ``devices`` shares of ``accumulation`` parts
    each trains otherwise than single: its BatchNorm layers normalise each share or
    part by its own statistics (None: it has none, or they are synced over the shares
    and there is no accumulation). ``model``: the task's, built (default: its structure
    on the meta device, else the model on the host; None where neither can be built:
    the slice checks its real model)."""
    if devices * accumulation <= 1:
        return None
    try:
        synced, plain = _split_norms(model) if model is not None else _norms_of(task.model)
    except Exception:  # not on the meta device, or the factory is not hashable
        return None
    norms = plain + (synced if accumulation > 1 else [])
    if not norms:
        return None
    split = (f"{devices} shares" if accumulation == 1 else
             f"{accumulation} accumulation parts" if devices == 1 else
             f"{devices} shares of {accumulation} parts")
    return (f"the batch statistics in {modules(norms)} are each of the batch's {split}, "
            "not the whole batch's: different training, not rounding (a norm without batch "
            "statistics, LayerNorm or GroupNorm, trains alike however the batch is split)")


def split_draws(task: Task, devices: int, accumulation: int) -> str | None:
    """How splitting ``task``'s batch makes each share or part draw which parameters
    its forward skips (LayerDrop: one draw a batch under single), or None."""
    at_random = task.unused_parameters[1]
    if not at_random or devices * accumulation <= 1:
        return None
    return (f"its forward leaves parameters out at random ({some(list(at_random))}: "
            f"layers skipped at random, as LayerDrop does): each of the batch's "
            f"{devices * accumulation} shares or parts draws its own, where single draws "
            "once for the whole batch: different training, not rounding")


def split_buffers(task: Task, devices: int, accumulation: int) -> str | None:
    """How splitting ``task``'s batch into ``devices`` shares of ``accumulation`` parts
    writes the buffers its forward writes otherwise than single (None: it writes none
    that validation saw, or this split leaves them as single's)."""
    by_data, every_call = task.buffers_written
    if by_data and devices * accumulation > 1:
        return (f"its forward writes buffers or parameters from the data "
                f"({some(list(by_data))}): each "
                f"of the batch's {devices * accumulation} shares or parts writes them from "
                "its own samples, not the whole batch's: different training, not rounding")
    if every_call and accumulation > 1:
        return (f"its forward writes buffers or parameters on every call "
                f"({some(list(every_call))}): "
                f"{accumulation} accumulation parts write them {accumulation} times a "
                "step, not once: different training, not rounding")
    return None


def split_inexactness(task: Task, devices: int, accumulation: int,
                      model: nn.Module | None = None) -> str | None:
    """How splitting ``task``'s batch into ``devices`` shares of ``accumulation`` parts
    trains otherwise than single, the first of its batch statistics, the buffers it
    writes and the layers it skips at random (None: none); ``model`` as
    ``split_statistics`` takes it."""
    return (split_statistics(task, devices, accumulation, model)
            or split_buffers(task, devices, accumulation)
            or split_draws(task, devices, accumulation)
            or split_loss(task, devices, accumulation))


def split_loss(task: Task, devices: int, accumulation: int) -> str | None:
    """How splitting ``task``'s batch trains otherwise than single where validation
    found its loss does not combine over parts (``Task.split_loss``; a task that allows
    only single, refused nothing for it)."""
    if task.split_loss is None or devices * accumulation <= 1:
        return None
    return (f"its batch split into {devices * accumulation} parts trains otherwise than "
            f"single: {task.split_loss}")
