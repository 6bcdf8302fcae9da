"""scikit-learn's bundled 8x8 digits (1,797 images) and an MLP for them."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy
import torch
from torch import nn
from torch.utils.data import TensorDataset

__all__ = ["digits_accuracy", "digits_mlp", "digits_test", "digits_train"]

TEST_FRACTION = 0.2
_SPLIT_SEED = 1234  # the train/test split is fixed: tasks differ only in their own seed


def _digits_file() -> Path:
    """Where scikit-learn keeps the digits: found without importing scikit-learn, whose
    import takes about 1.5 s of every slice's start-up on a small CPU."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the digits data set comes with scikit-learn: "
                          "pip install 'dione[examples]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets/data/digits.csv.gz"
    if not path.is_file():  # pragma: no cover - depends on the install
        raise ImportError(f"scikit-learn is installed but {path} is missing: reinstall it")
    return path


@functools.cache
def _split() -> tuple[TensorDataset, TensorDataset]:
    # The layout sklearn.datasets.load_digits reads: 64 pixel columns (0-16), then the label.
    table = torch.from_numpy(numpy.loadtxt(_digits_file(), delimiter=","))
    inputs = table[:, :-1].float() / 16.0
    labels = table[:, -1].long()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(_SPLIT_SEED))
    cut = int(len(labels) * (1 - TEST_FRACTION))
    train, test = order[:cut], order[cut:]
    return TensorDataset(inputs[train], labels[train]), TensorDataset(inputs[test], labels[test])


def digits_train() -> TensorDataset:
    """The training split: 1,437 flattened images in [0, 1] with their labels."""
    return _split()[0]


def digits_test() -> TensorDataset:
    """The held-out split: 360 images."""
    return _split()[1]


def digits_mlp(hidden: int = 128, depth: int = 3) -> nn.Sequential:
    """An MLP as a sequence of blocks (Linear+ReLU), so pipelines can split it anywhere."""
    layers: list[nn.Module] = []
    width = 64
    for _ in range(depth):
        layers.append(nn.Sequential(nn.Linear(width, hidden), nn.ReLU()))
        width = hidden
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


@torch.no_grad()  # called by hand on a loaded model too: no graph, no warning
def digits_accuracy(model: nn.Module) -> dict[str, float]:
    """Accuracy and mean cross-entropy on the held-out split."""
    inputs, labels = digits_test().tensors
    device = next(model.parameters()).device
    logits = model(inputs.to(device)).cpu()
    return {
        "accuracy": float((logits.argmax(dim=1) == labels).float().mean()),
        "test_loss": float(nn.functional.cross_entropy(logits, labels)),
    }
