"""How a pipeline rank builds its stage: the model's structure without weights, then only
the stage's part on the rank's device, so a model larger than one device can be pipelined.

::

    every rank   the task's factory, parameters created on the meta device (no storage),
                 buffers real on the host ──► cut to its stage (``stages.cut_stage``) ──►
                 ``materialise``: the stage's tensors on its device, nothing else
    values       fresh start: rank 0 builds the whole model on the host from the task's
                 seed (single's weights, bit for bit) and sends each rank the tensors of its
                 stage (``copy_initial_values``), then frees it
                 resume: the checkpoint fills the stage's keys (``SliceContext.restore``);
                 no whole model is built with storage anywhere
    fallback     a factory that cannot run with meta parameters (it reads a weight's value,
                 or computes a non-persistent buffer from one): every rank builds the whole
                 model on the host from the seed, as before, and the outcome says why

Parameters are moved to meta as they are registered (not built under
``torch.device("meta")``) so that buffers stay real: a non-persistent buffer (rotary
tables, position ids) is in no checkpoint, and only the model's own code knows its value.

Memory per rank (P: the whole model's parameters and buffers, S: its stage's, B: the
whole model's buffers, usually small)::

                      host                                    device
    fresh, rank 0     P (the seed's build, freed after) + B   S (+ one tensor being sent)
    fresh, rank > 0   B                                       S
    resume            B                                       S
    fallback          P (until the cut frees other stages')   S

(and on the host, while the factory runs, each parameter as it is created, until its
registration moves it to meta).

``balance=time``: rank 0 times the model with each block, and each module before and after
the blocks, on its device only during that module's own forward (``on_device_for_forward``;
a Sequential layer by layer, ``time_each_layer``); a parameter without a value (meta) runs
on small random values, as the time is all that counts. Copying a module outside the
blocks onto the device counts in the first or the last block's time.

One limit of the meta build: a non-persistent buffer drawn from the random generator is
not single's on a resume (the meta build draws no parameters before it); a persistent one
comes from the checkpoint, and a fresh start takes rank 0's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence, Set
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dione.spec.task import Task
from dione.techniques.marks import carry_marks

__all__ = ["Structure", "build_structure", "copy_initial_values", "device_bytes", "host_model",
           "materialise", "on_device_for_forward", "parameters_on_meta", "swapped_in",
           "time_each_layer"]


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter a module registers meanwhile moves to the meta device at once (the
    factory's own initialisation then runs on meta, a no-op); buffers stay real."""
    original = nn.Module.register_parameter

    def register(self: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(self, name, param)
        held = self._parameters.get(name)
        if held is not None and not held.is_meta and type(held) is nn.Parameter:
            moved = nn.Parameter(held.to("meta"), held.requires_grad)
            carry_marks(held, moved)
            self._parameters[name] = moved

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


@dataclass
class Structure:
    """The model a rank cuts its stage from: parameters on meta (``on_meta``), or the whole
    model built on the host, with the reason the meta build was not possible."""

    model: nn.Module
    on_meta: bool
    reason: str | None = None


def _meta_problem(model: nn.Module) -> str | None:
    """Why a model built under ``parameters_on_meta`` cannot be used: a non-persistent
    buffer without a value (computed from a parameter), which no checkpoint holds."""
    for module_name, module in model.named_modules():
        for name, buffer in module._buffers.items():
            if (buffer is not None and buffer.is_meta
                    and name in module._non_persistent_buffers_set):
                full = f"{module_name}.{name}" if module_name else name
                return (f"its non-persistent buffer {full} is computed from a parameter, so "
                        "it has no value without the parameters' values")
    return None


def _all_on_meta(model: nn.Module) -> None:
    """Move parameters the factory set outside ``register_parameter`` to meta too, a
    parameter two modules share staying one."""
    memo: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is None or param.is_meta:
                continue
            if id(param) not in memo:
                memo[id(param)] = nn.Parameter(param.detach().to("meta"), param.requires_grad)
                carry_marks(param, memo[id(param)])
            module._parameters[name] = memo[id(param)]


def host_model(task: Task) -> nn.Module:
    """The whole model, built on the host from the task's seed: single's initial weights."""
    torch.manual_seed(task.seed)
    return task.model()


def build_structure(task: Task, meta: bool = True) -> Structure:
    """The task's model with its parameters on meta, or (``meta`` False, or a factory that
    cannot run so) built on the host from its seed, saying why."""
    reason = "another rank of the gang could not build it on meta" if not meta else None
    if meta:
        try:
            torch.manual_seed(task.seed)
            with parameters_on_meta():
                model = task.model()
            _all_on_meta(model)
            reason = _meta_problem(model)
        except Exception as err:  # any factory code meta cannot run: build it as before
            reason = (f"its model factory cannot run with parameters on the meta device "
                      f"({type(err).__name__}: {str(err)[:200]})")
        if reason is None:
            return Structure(model, True)
    return Structure(host_model(task), False, reason)


def _unique_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Each distinct parameter and buffer of ``model``, by its first name."""
    seen: set[int] = set()
    found: dict[str, torch.Tensor] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False),
                         *model.named_buffers(remove_duplicate=False)]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            found[name] = tensor
    return found


def materialise(model: nn.Module, device: torch.device) -> None:
    """Every tensor of ``model`` on ``device``, in place: a meta one as uninitialised
    storage (its value comes later), a real one copied; a tensor several modules hold
    stays one. Modules kept out of the children (a stub's meta twin) stay as they are."""
    # New Parameter objects, as ``Module.to_empty`` makes for meta ones (a meta tensor
    # cannot take a device tensor's ``.data``, and ``swap_tensors`` refuses a tensor an
    # LSTM keeps a weak reference to); a module that caches its weights (an LSTM) sees the
    # swap at its next forward.
    memo: dict[int, torch.Tensor] = {}

    def placed(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in memo:
            data = (torch.empty_like(tensor, device=device) if tensor.is_meta
                    else tensor.detach().to(device))
            memo[id(tensor)] = (nn.Parameter(data, tensor.requires_grad)
                                if isinstance(tensor, nn.Parameter) else data)
            carry_marks(tensor, memo[id(tensor)])
        return memo[id(tensor)]

    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                module._parameters[name] = placed(param)  # type: ignore[assignment]
        for name, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[name] = placed(buffer)


def device_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s distinct parameters and buffers that have storage (not meta)."""
    return sum(t.numel() * t.element_size() for t in _unique_tensors(model).values()
               if not t.is_meta)


@torch.no_grad()
def copy_initial_values(model: nn.Module, source: nn.Module | None, rank: int,
                        world: int, device: torch.device) -> None:
    """Collective: each rank's stage takes, tensor by tensor, the values of ``source``, the
    whole model rank 0 built on the host from the seed (None on the other ranks). Rank 0
    sends each tensor to the ranks that hold it, one at a time, in an order all agree on."""
    mine = _unique_tensors(model)
    held: list[Any] = [None] * world
    dist.all_gather_object(held, sorted(mine))
    values: dict[str, torch.Tensor] = {}
    if rank == 0:
        assert source is not None
        values = dict([*source.named_parameters(remove_duplicate=False),
                       *source.named_buffers(remove_duplicate=False)])
    for name in sorted(set().union(*map(set, held))):
        holders = [r for r in range(world) if name in held[r]]
        if rank == 0:
            value = values[name].detach().to(device).contiguous()
            for holder in holders:
                if holder == 0:
                    mine[name].copy_(value)
                else:
                    dist.send(_wire(value), holder)
        elif rank in holders:
            target = mine[name]
            buffer = target if target.is_contiguous() else torch.empty(
                target.shape, dtype=target.dtype, device=target.device)
            dist.recv(_wire(buffer.detach()), 0)
            if buffer is not target:
                target.copy_(buffer)


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as a backend carries it: a bool mask (a causal mask buffer) as bytes,
    which every backend sends."""
    return tensor.view(torch.uint8) if tensor.dtype == torch.bool else tensor


def _filled(tensor: torch.Tensor, device: torch.device,
            generator: torch.Generator) -> torch.Tensor:
    """``tensor`` on ``device``: copied, or (meta: no value) small random values, as a
    freshly initialised layer has, for a forward whose time is all that counts."""
    if not tensor.is_meta:
        return tensor.detach().to(device, copy=True)
    if tensor.is_floating_point():
        values = torch.randn(tensor.shape, generator=generator) * 0.02
        return values.to(device=device, dtype=tensor.dtype)
    return torch.zeros(tensor.shape, dtype=tensor.dtype, device=device)


@contextlib.contextmanager
def swapped_in(modules: Iterable[nn.Module], device: torch.device,
               generator: torch.Generator, skip: Set[int] = frozenset()) -> Iterator[None]:
    """The tensors ``modules`` own (but those in ``skip``) replaced by copies on ``device``
    meanwhile (``_filled``), the originals put back after; autograd keeps the copies a
    forward used until its backward."""
    saved: list[tuple[dict[str, Any], str, Any]] = []
    for module in modules:
        tables: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
        for table in tables:
            for name, tensor in table.items():
                if tensor is None or id(tensor) in skip:
                    continue
                saved.append((table, name, tensor))
                copy = _filled(tensor, device, generator)
                table[name] = (nn.Parameter(copy, tensor.requires_grad)
                               if isinstance(tensor, nn.Parameter) else copy)
    try:
        yield
    finally:
        for table, name, tensor in reversed(saved):
            table[name] = tensor


@contextlib.contextmanager
def on_device_for_forward(model: nn.Module, paths: Sequence[str],
                          device: torch.device) -> Iterator[None]:
    """For timing ``model``'s own forward on a device that may not hold it: each module in
    ``paths`` (the blocks, and the modules before and after them) is on ``device`` during
    its own forward only; every tensor outside them (a rotary table) meanwhile."""
    generator = torch.Generator().manual_seed(0)
    modules = [model.get_submodule(p) for p in paths]
    streamed = {id(t) for m in modules for t in [*m.parameters(), *m.buffers()]}
    open_swaps: dict[int, contextlib.ExitStack] = {}

    def enter(module: nn.Module, *_: Any) -> None:
        stack = contextlib.ExitStack()
        stack.enter_context(swapped_in(module.modules(), device, generator))
        open_swaps[id(module)] = stack

    def leave(module: nn.Module, *_: Any) -> None:
        open_swaps.pop(id(module)).close()

    handles = [h for m in modules for h in (m.register_forward_pre_hook(enter),
                                            m.register_forward_hook(leave, always_call=True))]
    try:
        with swapped_in(model.modules(), device, generator, skip=streamed):
            yield
    finally:
        for handle in handles:
            handle.remove()


def time_each_layer(layers: Sequence[nn.Module], sample: Any, device: torch.device,
                    measure: Callable[[list[nn.Module], Any], list[float]]) -> list[float]:
    """``measure`` (``layer_times``) one layer at a time, each on ``device`` only while it
    is measured, fed the previous layer's output: no more than one layer on the device."""
    generator = torch.Generator().manual_seed(0)
    times: list[float] = []
    x = sample
    for layer in layers:
        with swapped_in(layer.modules(), device, generator):
            times += measure([layer], x)
            with torch.no_grad():
                x = layer(x)
    return times
