"""What keeps a pipeline from being bitwise single: dropout masks and batch statistics.

- Dropout draws its masks from the RNG in a different order (stages on other ranks,
  micro-batches in turn): training is statistically, not bitwise, equivalent to single.
  Pipelines train on and say so in the slice's outcome (``extra["exactness"]``).
- BatchNorm normalises each micro-batch by the micro-batch's statistics, not the global
  batch's, and torch's pipeline runtime runs each stage once more before the first step
  (to infer shapes, on placeholder inputs) in training mode, which moves running
  statistics: that is different training, not rounding, so pipelines refuse it.

DDP and FSDP shares, and accumulation parts, split the batch too: each rank seeds its
own RNG stream (dropout draws other masks than single) and BatchNorm sees a share's
statistics. They train on, and say so (``split_batch_exactness``).
"""

from __future__ import annotations

from torch import nn

__all__ = ["batch_norm_layers", "dropout_layers", "split_batch_exactness"]


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


def split_batch_exactness(model: nn.Module) -> str | None:
    """Why training on shares or parts of the batch is not bitwise single for ``model``
    (None: nothing keeps it from being so)."""
    reasons = []
    dropout, norms = dropout_layers(model), batch_norm_layers(model)
    if dropout:
        reasons.append(f"dropout in {_some(dropout)} draws other masks than single")
    if norms:
        reasons.append(f"batch statistics in {_some(norms)} are each share's, not the "
                       "batch's (torch.nn.SyncBatchNorm shares them)")
    return "statistical, not bitwise: " + "; ".join(reasons) if reasons else None


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
