"""Where a model may be cut into pipeline stages: its repeated blocks (pure: structure only).

Two shapes of model are understood, without the user rewriting them:

- an ``nn.Sequential``: its top-level layers are the blocks;
- embeddings → a list of repeated blocks → head (GPT-2, Llama-style decoders, BERT-style
  encoders, and hand-written models of that shape): the blocks are the ``nn.ModuleList``
  of same-class modules holding the most parameters (with no such list, the inner
  ``nn.Sequential`` of them holding the most, as a timm ViT's); the modules with parameters
  registered before it (embeddings) run on the first stage only, those after it (final
  norm, head) on the last stage only::

      GPT2LMHeadModel
      ├── transformer.wte, transformer.wpe      first   (stage 0)
      ├── transformer.h.0 … transformer.h.N-1   blocks  (cut between any two)
      └── transformer.ln_f, lm_head             last    (stage K-1)

A model dione does not recognise (or recognises wrongly) describes itself with a class
attribute, a plain dict, so the model needs nothing from dione::

    class MyNet(nn.Module):
        dione_stages = {"blocks": "body", "first": ["embed"], "last": ["norm", "head"]}

The runtime's contract with such a model (``dione.techniques.pipeline.stages``): its forward
calls each block of ``blocks`` in order, passing the hidden state as the block's first
argument (or ``hidden_states=``), and each block returns it (alone, or first in a tuple).
Modules without parameters (dropout, rotary tables) run on every stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

__all__ = ["STAGES_ATTRIBUTE", "StagePlan", "find_stage_plan"]

STAGES_ATTRIBUTE = "dione_stages"


class _PlanError(ValueError):
    """Raised here, turned into a PartitionError by the caller (which names the task)."""


@dataclass(frozen=True)
class StagePlan:
    """The block container (``""``: the model itself, an ``nn.Sequential``), its blocks'
    full names in order, and the modules outside it that only the first or the last
    stage runs."""

    container: str
    blocks: tuple[str, ...]
    first: tuple[str, ...] = ()
    last: tuple[str, ...] = ()

    @property
    def sequential(self) -> bool:
        return self.container == ""

    def block_name(self, local: str) -> str:
        return f"{self.container}.{local}" if self.container else local


def _has_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _declared(model: nn.Module, declared: object) -> StagePlan:
    if not isinstance(declared, Mapping) or "blocks" not in declared:
        raise _PlanError(f"{STAGES_ATTRIBUTE} must be a dict with 'blocks' (the path of the "
                         "ModuleList of blocks) and optionally 'first' and 'last' (module "
                         f"paths), not {declared!r}")
    container = str(declared["blocks"])
    modules = dict(model.named_modules())
    found = modules.get(container)
    if not isinstance(found, (nn.ModuleList, nn.Sequential)):
        raise _PlanError(f"{STAGES_ATTRIBUTE}['blocks'] = {container!r} is not an "
                         "nn.ModuleList (or nn.Sequential) of the model")
    first = tuple(str(p) for p in declared.get("first", ()))
    last = tuple(str(p) for p in declared.get("last", ()))
    for path in first + last:
        if path not in modules:
            raise _PlanError(f"{STAGES_ATTRIBUTE} names {path!r}, not a module of the model")
    return StagePlan(container, tuple(f"{container}.{n}" for n, _ in found.named_children()),
                     first, last)


def _block_lists(model: nn.Module, kind: type[nn.Module] = nn.ModuleList) -> list[str]:
    """Paths of the ModuleLists (``kind``) of >= 2 same-class modules with parameters,
    the one holding the most parameters first, leaving out those inside it (a block's
    experts). With no ModuleList, the nn.Sequential holding the most parameters that
    is in no list of modules (a timm ViT's ``blocks``; not a block's own MLP), alone: a
    head's Sequential of two Linears is no rival."""
    found: list[tuple[int, str]] = []
    modules = dict(model.named_modules())
    for path, module in modules.items():
        children = list(module.children())
        if (not isinstance(module, kind) or not path or len(children) < 2
                or len({type(c) for c in children}) != 1):
            continue
        parts = path.split(".")
        if kind is nn.Sequential and any(  # one inside a block (its MLP) is no block list
                isinstance(modules[".".join(parts[:i])], (nn.ModuleList, nn.Sequential))
                for i in range(1, len(parts))):
            continue
        size = sum(p.numel() for p in module.parameters())
        if size:
            found.append((size, path))
    found.sort(key=lambda item: -item[0])
    if not found:
        return _block_lists(model, nn.Sequential)[:1] if kind is nn.ModuleList else []
    best = found[0][1]
    return [best] + [path for _, path in found[1:]
                     if not path.startswith(best + ".") and not best.startswith(path + ".")]


def find_stage_plan(model: nn.Module) -> StagePlan:
    """The model's stage plan: declared, an ``nn.Sequential``'s layers, or its block list;
    raises ValueError saying why none was found."""
    declared = getattr(model, STAGES_ATTRIBUTE, None)
    if declared is not None:
        return _declared(model, declared)
    if isinstance(model, nn.Sequential):
        return StagePlan("", tuple(name for name, _ in model.named_children()))
    lists = _block_lists(model)
    if len(lists) > 1:
        raise _PlanError(
            f"its model ({type(model).__name__}) has more than one list of repeated blocks "
            f"({', '.join(lists)}), as an encoder-decoder does, whose second half takes the "
            "first's output beside its hidden state; give the model class a "
            f"{STAGES_ATTRIBUTE} attribute (see dione.techniques.pipeline.stage_plan) if its "
            "forward passes only the hidden state from block to block, or leave the pipelines out")
    container = lists[0] if lists else None
    if container is None:
        single = [path for path, module in model.named_modules()
                  if isinstance(module, nn.ModuleList) and len(list(module.children())) == 1
                  and any(p.numel() for p in module.parameters())]
        if single:  # a one-layer configuration: nothing to cut between
            raise _PlanError(
                f"its model's list of blocks ({single[0]}) holds one block: a pipeline needs "
                "at least two stages to cut between; give the model two or more layers, or "
                "leave the pipelines out of the task's techniques")
        raise _PlanError(
            f"its model is a {type(model).__name__}, neither an nn.Sequential nor a model with "
            "an nn.ModuleList (or nn.Sequential) of repeated blocks; give the model class a "
            f"{STAGES_ATTRIBUTE} = {{'blocks': ..., 'first': [...], 'last': [...]}} attribute "
            "(see dione.techniques.pipeline.stage_plan), or leave the pipelines out of the task's "
            "techniques")
    # Walk from the root to the container: at each level, siblings registered before the
    # branch that leads to the blocks run before them, those after run after them.
    first: list[str] = []
    last: list[str] = []
    module, prefix = model, ""
    parts = container.split(".")
    for depth, part in enumerate(parts):
        own = [n for n, _ in module.named_parameters(recurse=False)]
        if own:  # a stage would not know whether it runs them before or after the blocks
            where = prefix.rstrip(".") or "the model itself"
            raise _PlanError(
                f"{where} holds parameters directly ({', '.join(own)}) beside its blocks "
                f"{container}; give the model class a {STAGES_ATTRIBUTE} attribute (see "
                "dione.techniques.pipeline.stage_plan) naming modules for the first and last stage")
        before = True
        for name, child in module.named_children():
            path = prefix + name
            if name == part:
                before = False
                continue
            if _has_parameters(child):
                (first if before else last).append(path)
        if depth < len(parts) - 1:
            module = getattr(module, part)
            prefix += part + "."
    blocks = getattr(module, parts[-1])
    return StagePlan(container, tuple(f"{container}.{n}" for n, _ in blocks.named_children()),
                     tuple(first), tuple(last))
