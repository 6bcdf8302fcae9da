"""A task's training settings as text alike in every process: a resumed run compares them."""

from __future__ import annotations

import dis
import functools
import math
import numbers
import os
import re
import types
from typing import Any

from dione.spec.code import code_digest
from dione.spec.task import Task

__all__ = ["READ_SETTINGS", "SAID_SETTINGS", "described", "described_model", "kept_as_recorded",
           "model_shapes", "read_changes", "training_settings"]

_SIMPLE = (bool, int, float, str, type(None))


# What a factory reads besides its own arguments and closure (its module's numbers, a
# callable object's): a change there is said on resume, not refused. Such a value may
# differ from process to process for no fault of the task (a time, a pid, a flag from
# the environment), which would refuse every resume.
READ_SETTINGS = ("optimizer reads", "lr_scheduler reads")
# What a task computes and on what, in two parts: what its code is (``NAME code``:
# refused where changed) and all it holds (``NAME``: said), paths and an object's
# settings among them, which move with the workload's folder or count its calls.
COMPUTED = ("loss", "loss_items", "collate_fn", "data")
# Said, not refused, where changed: those, what the computed parts hold, and the
# model's shapes the run records (``model_shapes``). A false change must not keep a
# task from its resume; a model truly changed fails at its checkpoint's load, or, for a
# task that has ended, is said.
SAID_SETTINGS = (*READ_SETTINGS, *COMPUTED, "model")


def training_settings(task: Task) -> dict[str, str]:
    """What sets how ``task`` learns, besides its model, its steps and its batch: the
    optimizer and scheduler with their arguments (a ``functools.partial``'s, or the
    values a closure holds: ``lambda p: AdamW(p, lr=lr)`` made in a loop), the seed, the
    precision and the clipping; its loss, loss items, collator and data factory, with a
    digest of their code where it is the user's (``_with_code``); and
    (``READ_SETTINGS``) the numbers the two factories read from their module or object
    (a notebook's ``lr``). Written so that the same task gives the same text in any
    process (no memory addresses), and a changed learning rate gives another."""
    return {
        "optimizer": _describe(task.optimizer),
        "lr_scheduler": _describe(task.lr_scheduler),
        "seed": repr(task.seed),
        "precision": repr(task.precision),
        "clip_grad_norm": repr(task.clip_grad_norm),
        # What it computes, and on what: a loss, a collator or a data factory edited
        # between sessions trained the steps left, unsaid (a review).
        **{f"{name} code": _with_code(getattr(task, name)) for name in COMPUTED},
        **{name: _describe(getattr(task, name), settings=True) for name in COMPUTED},
        "optimizer reads": _reads(task.optimizer),
        "lr_scheduler reads": _reads(task.lr_scheduler),
    }


def model_shapes(task: Task) -> str | None:
    """What ``task``'s model factory builds, as its parameters' shapes: its class, how
    many parameters, and a digest of every name and shape, sorted by name (a ModuleDict
    from a set orders its names otherwise in each process), built on the meta device
    from the task's seed as a worker builds it (a width drawn from torch's generator).
    A finished task whose model was edited since (a notebook cell run again with a
    narrower layer) was given the old model's results, unsaid: no slice ran to find the
    checkpoint did not fit (a review). The run records it beside ``training_settings``,
    having validated (built) the model: a slice alone does not build it here (a model
    factory's side effects stay in the workers). Once per factory, seed and what the
    factory reads from its module (a grid's equal partials are one; a notebook's global
    changed, another). None: it cannot be built here."""
    from dione.spec.sameness import same_function

    # What it reads and the code it calls (a notebook's model class edited and run again,
    # the factory's cell not: its cached shapes were the old class's; a review).
    factory = task.model
    reads = (_reads(factory), _user_code(factory) + _classes_read(factory))
    known = next((shapes for built, seed, read, shapes in _BUILT
                  if seed == task.seed and read == reads and same_function(built, factory)),
                 "")
    if known != "":
        return known
    shapes = _shapes(factory, task.seed)
    _BUILT.append((factory, task.seed, reads, shapes))
    del _BUILT[:-16]  # the latest only: a notebook's old factories (and all they hold) go
    return shapes


# (factory, seed, what it reads and its code, its shapes) of this process, latest last.
_BUILT: list[tuple[Any, Any, tuple[str, str], str | None]] = []


def _shapes(factory: Any, seed: Any) -> str | None:
    import torch

    from dione.spec.draws import generators_kept
    from dione.spec.validate import build_model

    try:
        with generators_kept():  # a CPU build draws
            torch.manual_seed(seed)
            return described_model(build_model(factory))
    except Exception:
        return None


def described_model(model: Any) -> str:
    """A built model as ``model_shapes`` says it: its class, parameter count, a digest
    of its parameters' names and shapes, and one of its layers and the user's code."""
    import hashlib

    named = sorted((name, tuple(p.shape)) for name, p in model.named_parameters())
    count = sum(math.prod(shape) for _, shape in named)
    digest = hashlib.sha256(repr(named).encode()).hexdigest()[:12]
    # Its layers as torch prints each (a ReLU made a Tanh), sorted by name as the shapes,
    # and its classes' code where they are the user's (a forward edited), shaped alike:
    # said on resume (a review).
    printed = re.sub(r" at 0x[0-9a-fA-F]+", "", repr(sorted(
        (name, type(m).__qualname__, m.extra_repr()) for name, m in model.named_modules())))
    layers = hashlib.sha256((printed + code_digest(
        [type(m) for m in model.modules()], values=False)).encode()).hexdigest()[:12]
    return f"{type(model).__name__} of {count:,} parameters (shapes {digest}, layers {layers})"


def read_changes(task: str, changed: list[str], ended: str | None = None,
                 resumed: bool = False) -> list[str]:
    """Of a store's changed settings (``RunStore.changed_settings``), what to say of
    those in ``READ_SETTINGS``: one line each (the run and ``dione train`` say them);
    ``ended``: the status of a task that trains no more (done, stopped, diverged);
    ``resumed``: it has a checkpoint its next slice loads."""
    said = []
    for change in changed:
        setting = change.split(":")[0]
        if setting not in SAID_SETTINGS:
            continue
        if ended:
            then = (f"the task has ended ({ended}), every step of it trained with the "
                    "recorded value: its results are not the new value's (another task name "
                    "or a new run directory trains it with that)")
        elif resumed and setting == "optimizer reads":
            then = ("the task resumes from its checkpoint, whose optimizer state puts the "
                    "recorded value back (torch's load restores each group's lr, momentum, "
                    "betas, ...): the steps left train with it, as recorded (another task "
                    "name or a new run directory trains the new value)")
        elif resumed and setting == "model":
            then = ("the steps left train the model as it is now from its checkpoint's "
                    "weights, and its results mix the two (another task name or a new run "
                    "directory trains the new model from the start)")
        elif resumed and setting == "lr_scheduler reads":
            then = ("the task resumes from its checkpoint, whose scheduler state puts back "
                    "the arguments a scheduler keeps (StepLR's step_size, OneCycleLR's "
                    "max_lr), as recorded; a function it calls (LambdaLR's) reads the new "
                    "value for the steps left (a new run directory trains one value "
                    "throughout)")
        else:
            then = "steps trained from now read the new value (a new run directory trains " \
                "it anew)"
        said.append(f"{task}: {change} since the run recorded it: {then}")
    return said


def kept_as_recorded(ended: bool, resumed: bool) -> tuple[str, ...]:
    """The settings a store keeps as it recorded them though the task now reads another
    value (``read_changes`` says which and why): all said ones of a task that has ended
    (no step reads the new value), the optimizer's of one resuming from a checkpoint (it
    puts the recorded value back). Recording the new value there wrote a rate the task
    never trained with (a review)."""
    if ended:
        return SAID_SETTINGS
    return ("optimizer reads",) if resumed else ()


def described(value: Any) -> str:
    """``value`` (a function, a partial, a class, an object) as the same text in any
    process: what ``training_settings`` says of each setting."""
    return _describe(value)


def _describe(value: Any, depth: int = 0, portable: bool = False,
              settings: bool = False) -> str:
    """``value`` as stable text: simple values by repr (floats exactly), containers
    item by item, a partial with its arguments, a function by its name with the numbers
    its closure holds (``lambda p: Adam(p, lr=lr)`` made in a loop), a class by its
    name, anything else by its repr unless that holds a memory address (then its
    type's name). ``portable``: alike wherever the workload moved and however an object
    was used: a path as ``<path>``, an object by its type (``_object``); ``settings``: an
    object by its type and public settings."""
    if depth > 4:
        return "..."

    def inner(part: Any) -> str:
        return _describe(part, depth + 1, portable, settings)

    if portable and (isinstance(value, os.PathLike)
                     or (isinstance(value, str) and os.path.isabs(value))):
        return "<path>"
    if isinstance(value, os.PathLike):
        return repr(os.fspath(value))
    if isinstance(value, _SIMPLE):
        return repr(value)
    if isinstance(value, (list, tuple)):
        items = ", ".join(inner(v) for v in value)
        return f"({items})" if isinstance(value, tuple) else f"[{items}]"
    if isinstance(value, dict):
        return "{" + ", ".join(
            f"{inner(k)}: {inner(v)}"
            for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))) + "}"
    if isinstance(value, (set, frozenset)):  # in one order under any string hashing
        return "{" + ", ".join(sorted(inner(v) for v in value)) + "}"
    if isinstance(value, functools.partial):
        arguments = [inner(a) for a in value.args] + [
            f"{k}={inner(v)}" for k, v in sorted(value.keywords.items())]
        return f"{inner(value.func)}({', '.join(arguments)})"
    if isinstance(value, types.MethodType):
        return f"{inner(value.__self__)}.{value.__func__.__name__}"
    if isinstance(value, types.FunctionType):
        return _function(value, depth, portable, settings)
    if isinstance(value, type):
        return value.__qualname__
    if portable:
        return _object(value)
    if settings:  # its public settings, as an object's own repr may not show them
        return _object(value, every=True)
    text = repr(value)
    return type(value).__qualname__ if " at 0x" in text else text


def _object(value: Any, every: bool = False) -> str:
    """An object by its type, not its repr (a loss object counting its calls read as a
    changed loss at every resume: a regression review); one of torch's modules (a loss
    module), or any with ``every``, with its settings: its public numbers, flags and
    text, and a torch module's buffers (``CrossEntropyLoss(label_smoothing=0.5)`` read
    as ``CrossEntropyLoss()``)."""
    kind = type(value)
    torchs = kind.__module__.startswith("torch.nn") and hasattr(value, "_buffers")
    if not (torchs or every) or not hasattr(value, "__dict__"):
        return kind.__qualname__
    settings = [f"{k}={_describe(v, 1, not every)}" for k, v in sorted(vars(value).items())
                if not k.startswith("_") and k != "training" and _read(v)]
    if torchs:
        settings += [f"{k}=#{_tensor_digest(b)}" for k, b in sorted(value._buffers.items())
                     if b is not None]
    return f"{kind.__qualname__}({', '.join(settings)})"


def _tensor_digest(tensor: Any) -> str:
    """A short digest of a tensor's values (its dtype and shape where it has none to
    read: on the meta device; bfloat16 as its bytes)."""
    import hashlib

    import torch

    try:
        data = tensor.detach().cpu().contiguous().view(-1).view(dtype=torch.uint8).numpy()
    except Exception:  # meta, or a dtype that cannot be viewed as bytes
        return f"{tensor.dtype}{list(tensor.shape)}"
    return hashlib.sha256(data.tobytes()).hexdigest()[:8]


def _function(function: types.FunctionType, depth: int, portable: bool = False,
              settings: bool = False) -> str:
    """A function by its own name (a lambda's is ``<lambda>``; the names around it are
    left out, so renaming the function that made it changes nothing), with the numbers,
    strings, tuples and partials its closure holds (not a dict or an object, which may
    hold a run's name or a time) and its defaults."""
    code = function.__code__
    cells = [(n, c.cell_contents) for n, c in zip(code.co_freevars, function.__closure__ or (),
                                                  strict=False) if _filled(c)]
    held = [f"{n}={_describe(v, depth + 1, portable, settings)}" for n, v in sorted(cells)
            if _read(v)]
    defaults = [_describe(d, depth + 1, portable, settings) for d in function.__defaults__ or ()]
    if defaults:
        held.append(f"defaults={', '.join(defaults)}")
    return f"{function.__name__}[{', '.join(held)}]" if held else function.__name__


def _with_code(value: Any) -> str:
    """``value`` as ``_describe`` says it, with a digest of its code where that is the
    user's own (a lambda's body, a workload's function and what it calls of the user's;
    not the numbers it reads from its module, which may be a time or a pid)."""
    code = _user_code(value)
    said = _describe(value, portable=True)
    return f"{said} (code {code})" if code else said


def _user_code(value: Any) -> str:
    """A digest of the code ``value`` (a function, a partial, a class, a callable object)
    runs, where it is the user's (``code_digest``, without the values it reads); ""."""
    if value is None:
        return ""
    target = value.func if isinstance(value, functools.partial) else value
    if isinstance(target, types.MethodType):
        target = target.__func__
    root = target if isinstance(target, (types.FunctionType, type)) else type(target)
    return code_digest([root], values=False)


def _classes_read(value: Any) -> str:
    """The classes and functions ``value``'s code loads from its module, by their
    module and name (a global ``ACTIVATION = nn.ReLU`` made ``nn.Tanh``)."""
    found = _globals_read(value.func if isinstance(value, functools.partial) else value)
    return ",".join(f"{getattr(v, '__module__', '?')}.{v.__qualname__}"
                    for _, v in sorted(found.items()) if isinstance(v, (type, types.FunctionType)))


def _globals_read(function: Any) -> dict[str, Any]:
    """The module globals ``function``'s code (and the functions nested in it) loads by
    name, with their values now; none where it is not a function."""
    if not isinstance(function, types.FunctionType):
        return {}
    return {name: function.__globals__[name] for name in _global_names(function.__code__)
            if name in function.__globals__}


def _reads(value: Any) -> str:
    """The numbers ``value`` reads besides its arguments and closure: the module
    globals its code (and the functions nested in it) loads by name, a callable object's
    (or a bound method's object's) attributes; as ``name=value``, sorted."""
    found: dict[str, Any] = {}
    target = value.func if isinstance(value, functools.partial) else value
    if isinstance(target, types.MethodType):
        target = target.__self__
    if isinstance(target, types.FunctionType):
        found = _globals_read(target)
    elif not isinstance(target, type) and hasattr(target, "__dict__"):
        found = dict(vars(target))
    return ", ".join(f"{n}={_describe(v)}" for n, v in sorted(found.items())
                     if _read(v) and not isinstance(v, str))


def _global_names(code: types.CodeType) -> set[str]:
    """The names ``code`` (and each function defined in it) loads as globals, not the
    attributes it reads (``hp.lr`` loads ``hp``, not ``lr``)."""
    names = {i.argval for i in dis.get_instructions(code)
             if i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(i.argval, str)}
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names


def _read(value: Any) -> bool:
    """Whether a value a function reads counts as a setting: a number (numpy's too), a
    flag, a string, a tuple of such, or a partial (not a module, a class, a function, a
    dict or an object: those are code, or may hold what changes from run to run)."""
    if isinstance(value, tuple):
        return all(_read(v) for v in value)
    return isinstance(value, (*_SIMPLE, numbers.Number, functools.partial))


def _filled(cell: Any) -> bool:
    """Whether a closure's cell holds a value yet (an empty one raises on reading)."""
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True
