"""What keeps a pipeline from being bitwise single: dropout masks and batch statistics.

- Dropout draws its masks from the RNG in a different order (stages on other ranks,
  micro-batches in turn): training is statistically, not bitwise, equivalent to single.
  Pipelines train on and say so in the slice's outcome (``extra["exactness"]``).
- BatchNorm normalises each micro-batch by the micro-batch's statistics, not the global
  batch's, and torch's pipeline runtime runs each stage once more before the first step
  (to infer shapes, on placeholder inputs) in training mode, which moves running
  statistics: that is different training, not rounding, so pipelines refuse it.
"""

from __future__ import annotations

from torch import nn

__all__ = ["batch_norm_layers", "dropout_layers"]


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
