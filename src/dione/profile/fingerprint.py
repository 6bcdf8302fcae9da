"""Fingerprints of what decides a task's training speed, so equal-speed trials are shared.

Two tasks that differ only in learning rate, seed or length train at the same speed:
their ``speed_signature`` is equal. A trial's fingerprint adds the technique, its
knobs, the device count and kind (with the CPU slot's thread count or GPU model) and
the torch and dione versions, so a catalog never serves a measurement taken under
different conditions.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dione._version import __version__
from dione.spec.code import fold_code, model_code
from dione.spec.devices import DeviceKind
from dione.spec.task import Task
from dione.spec.validate import build_model
from dione.spec.workload import loaded_workload_files

__all__ = ["callable_name", "code_digest", "device_description", "module_name",
           "speed_signature", "technique_identity", "trial_fingerprint"]

# Optimizer settings that change the work of a step (not its numbers).
_OPTIMIZER_SPEED_KEYS = ("foreach", "fused", "amsgrad", "nesterov", "capturable",
                         "differentiable", "decoupled_weight_decay")


def _shapes(value: Any) -> Any:
    """Shapes and dtypes of a sample (tensors, numbers, nested tuples and dicts)."""
    if isinstance(value, torch.Tensor):
        return [list(value.shape), str(value.dtype)]
    if isinstance(value, (tuple, list)):
        return [_shapes(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _shapes(v) for k, v in value.items()}
    return type(value).__name__


def module_name(value: Any) -> str:
    """The module ``value`` was defined in; for a workload file, ``workload NAME.py``.

    A workload file is imported under a name made from its path's digest, so keying by
    that name would make every trial of a workload that moved (a project folder renamed,
    a clone elsewhere) look new, and profile it again."""
    module = str(getattr(value, "__module__", None) or "?")
    path = loaded_workload_files().get(module)
    return f"workload {Path(path).name}" if path is not None else module


def _workload_code(func: Any) -> str:
    """For a function a workload file defines, a digest of its code: it goes by the file's
    name (``module_name``), which two projects may share with different functions."""
    code = getattr(func, "__code__", None)
    if code is None or getattr(func, "__module__", None) not in loaded_workload_files():
        return ""
    digest = hashlib.sha1()
    fold_code(code, digest)
    return "#" + digest.hexdigest()[:12]


def callable_name(value: Any) -> str:
    """A function's (or a partial's) module and qualified name; for a callable object,
    its module and repr, as catalogs have always keyed it, except where the repr is the
    default one: that holds a memory address, new in every process, and would make
    equal tasks look different; such an object goes by its class."""
    func = getattr(value, "func", value)  # functools.partial
    if hasattr(func, "__qualname__"):
        return f"{module_name(func)}.{func.__qualname__}{_workload_code(func)}"
    kind = type(func)
    own_repr = any("__repr__" in vars(base) for base in kind.__mro__ if base is not object)
    if own_repr:
        return f"{module_name(func)}.{func!r}"
    return f"{module_name(kind)}.{kind.__qualname__}"


@lru_cache(maxsize=64)
def _sample_shapes(data: Any) -> Any:
    """The first sample's shapes (cached per data factory: a data set is built once)."""
    return _shapes(data()[0])


def speed_signature(task: Task) -> dict[str, Any]:
    """What of ``task`` decides its speed: architecture and parameter shapes, global
    batch and sample shapes, loss, optimizer kind, split points. Not: learning rate,
    seed, length, name."""
    model = build_model(task.model)  # as validation built it
    with torch.device("meta"):
        optimizer = task.optimizer(model.parameters())
    params = [[name, list(p.shape), str(p.dtype)] for name, p in model.named_parameters()]
    buffers = [[name, list(b.shape), str(b.dtype)] for name, b in model.named_buffers()]
    defaults = optimizer.defaults
    momentum = defaults.get("momentum")
    try:
        samples = _sample_shapes(task.data)
    except TypeError:  # an unhashable factory: build the data set again
        samples = _shapes(task.data()[0])
    signature = {
        "architecture": _architecture(model),
        "settings": _settings(model),
        "parameters": params,
        "buffers": buffers,
        "batch_size": task.batch_size,
        "sample": samples,
        "loss": callable_name(task.loss),
        "optimizer": [type(optimizer).__qualname__,
                      {k: defaults[k] for k in _OPTIMIZER_SPEED_KEYS if k in defaults},
                      bool(momentum) if momentum is not None else None],
        "lr_scheduler": task.lr_scheduler is not None,
        "split_points": list(task.split_points or ()),
    }
    # Only where set, so that catalogs of tasks without them keep their keys.
    if task.collate_fn is not None:
        # A collator may pad each batch to its own longest item: the first item's shape
        # then says nothing of the batches' (nor whether they vary, which pipelines
        # cannot take), so the first batches' shapes are keyed instead.
        signature["collate_fn"] = callable_name(task.collate_fn)
        signature["batches"] = _batch_shapes(task)
    code = model_code(model)
    if code:  # only where the model has classes of the user's own (catalogs keep keys)
        signature["model_code"] = code
    if task.precision != "fp32":
        signature["precision"] = task.precision
    if task.clip_grad_norm is not None:
        signature["clip_grad_norm"] = True
    return signature


def _batch_shapes(task: Task, batches: int = 3) -> Any:
    """The shapes of the task's first global batches, as its collator makes them."""
    from dione.techniques.batches import BatchSource

    dataset: Any = task.data()
    source = BatchSource(dataset, task.batch_size, task.seed, collate=task.collate_fn)
    count = min(batches, max(1, len(dataset) // task.batch_size))
    return [_shapes(source.global_batch(step)) for step in range(count)]


def _architecture(model: nn.Module) -> str:
    # The module tree as torch prints it: layer types and their constructor arguments.
    return repr(model)


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return isinstance(value, (bool, int))


def _settings(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Each module's own whole-number and flag settings (and tuples of them), which
    torch's print of a custom module leaves out: a loop count, an attention window or a
    recurrence depth decides its speed as its layers do (a model applying one layer 1 or
    64 times printed alike and shared one trial, 70x apart). Not floats or text: a
    time, a temporary path or an id kept on a module would key every build apart."""
    found = {}
    for name, module in model.named_modules():
        own = {k: v for k, v in sorted(vars(module).items())
               if not k.startswith("_") and k != "training" and _plain(v)}
        if own:
            found[name or "."] = own
    return found


@lru_cache(maxsize=4)
def device_description(kind: DeviceKind, threads: int) -> str:
    """The device's model as it affects speed: the GPU's name, or the CPU's model and
    the threads each CPU slot gets."""
    if kind == "cuda":
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cuda"
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}; {threads} thread(s) per slot"


def technique_identity(technique: Any) -> str:
    """What keys a technique's trials in the catalog: a built-in's name (dione's version
    is keyed apart); a user's technique, its name with its class and a digest of the
    class's own code, so that one edited since, or another class registered under a
    built-in's name, is timed anew rather than served another's trials, while an edit
    elsewhere in its file (a learning rate) keeps its trials (reviews)."""
    kind = type(technique)
    if kind.__module__.startswith("dione."):
        return str(technique.name)
    import inspect

    try:  # its source, where a file holds it
        code = inspect.getsource(kind)
    except (OSError, TypeError):  # a notebook's or `python -`'s: its methods' code
        code = repr(sorted((name, _code_of(value)) for name, value in vars(kind).items()))
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    return f"{technique.name} ({module_name(kind)}.{kind.__qualname__}, {digest})"


def _code_of(value: Any) -> str:
    """A class attribute as its code says it: a function's bytecode and constants, a
    plain value's repr (no memory address)."""
    function = getattr(value, "__func__", value)
    code = getattr(function, "__code__", None)
    if code is not None:
        return f"{code.co_code.hex()} {code.co_consts!r:.2000}"
    return type(value).__name__ if " at 0x" in repr(value) else repr(value)


def trial_fingerprint(
    signature: Mapping[str, Any], technique: str, knobs: Mapping[str, Any], devices: int,
    kind: DeviceKind, threads: int, memory_cap_bytes: int | None = None,
    model: str | None = None,
) -> str:
    """A hex digest of everything that decides one trial's speed, and whether it fits:
    under a memory cap (``--memory-cap``) a trial that fits the device may not."""
    key: dict[str, Any] = {
        "signature": signature,
        "technique": technique,
        "knobs": dict(knobs),
        "devices": devices,
        "device": [kind, device_description(kind, threads)],
        "torch": torch.__version__,
        "dione": __version__,
    }
    if memory_cap_bytes is not None:  # only where set: uncapped catalogs keep their keys
        key["memory_cap_bytes"] = memory_cap_bytes
    if model is not None:  # a node's accelerator model, where the cluster names one
        key["model"] = model
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def code_digest(task: Task) -> str:
    """A digest of the source files ``task``'s code comes from (the workload files and
    the modules of its factories): a crash cached under it is run again once they change."""
    files = set(loaded_workload_files().values())
    for factory in (task.model, task.data, task.loss, task.optimizer, task.evaluate):
        module = sys.modules.get(getattr(getattr(factory, "func", factory), "__module__", ""))
        if module is not None and getattr(module, "__file__", None):
            files.add(str(module.__file__))
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode())
        try:
            with open(path, "rb") as file:
                digest.update(file.read())
        except OSError:
            digest.update(b"unreadable")
    return digest.hexdigest()
