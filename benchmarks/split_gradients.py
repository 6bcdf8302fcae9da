"""How far apart a parameter's gradient on a batch and the one the batch's halves combine
to lie, as validation measures it (``dione.spec.validate._gradients_apart``): a mixture of
experts with a load-balancing term over the batch at three weights, against a character
GPT and the digits MLP, whose losses are each sample's own (rounding only).

    python benchmarks/split_gradients.py        # a few seconds

Each line: model | the largest relative gap over its parameters | that parameter.
"""
import functools

import torch
from torch import nn
from torch.utils.data import TensorDataset

from dione import Task
from dione.spec.batch import samples, tokens
from dione.spec.validate import _gradients_apart
from dione.zoo import CharGPT, digits_mlp, digits_train, sequence_cross_entropy, text_train


class Experts(nn.Module):
    """Top 2 of 4 experts per token by a router started near uniform (std 0.02), no
    capacity; the Switch Transformer's load-balancing term over the batch's tokens."""

    def __init__(self, width: int = 8, count: int = 4) -> None:
        super().__init__()
        self.router = nn.Linear(width, count, bias=False)
        nn.init.normal_(self.router.weight, std=0.02)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 16), nn.GELU(), nn.Linear(16, width))
            for _ in range(count))
        self.count = count

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.reshape(-1, x.shape[-1])
        probabilities = self.router(flat).softmax(-1)
        weights, chosen = probabilities.topk(2, -1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            out.index_add_(0, token, weights[token, slot, None] * expert(flat[token]))
        routed = nn.functional.one_hot(chosen, self.count).float().sum(1).mean(0) / 2
        balance = self.count * (routed * probabilities.mean(0)).sum()
        return x + out.reshape(x.shape), balance


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.moe, self.head = nn.Linear(8, 8), Experts(), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden, balance = self.moe(self.inp(x))
        return {"logits": self.head(hidden.mean(1)), "balance": balance}


def balanced(output: dict[str, torch.Tensor], target: torch.Tensor,
             weight: float) -> torch.Tensor:
    return nn.functional.cross_entropy(output["logits"], target) + weight * output["balance"]


def sequences() -> TensorDataset:
    draw = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(64, 6, 8, generator=draw),
                         torch.randint(0, 4, (64,), generator=draw))


def gap(task: Task, counter: object) -> tuple[str, float]:
    torch.manual_seed(task.seed)
    model = task.model().eval()
    data = task.data()
    items = [data[i] for i in range(4)]
    found = _gradients_apart(task, model, counter, items, False)
    if found is not None:
        return found
    # Within the tolerance: the largest gap all the same, with a tolerance of 0.
    import dione.spec.validate as validate

    kept, validate._GRADIENT_TOLERANCE = validate._GRADIENT_TOLERANCE, 0.0
    try:
        return _gradients_apart(task, model, counter, items, False) or ("-", 0.0)
    finally:
        validate._GRADIENT_TOLERANCE = kept


def main() -> None:
    adam = functools.partial(torch.optim.Adam, lr=1e-2)
    for weight in (0.0, 0.001, 0.01):
        task = Task(name="moe", model=Classifier, data=sequences, optimizer=adam,
                    loss=functools.partial(balanced, weight=weight), batch_size=8, steps=1)
        name, apart = gap(task, samples)
        print(f"mixture of experts, term weight {weight} | {apart:.1e} | {name}")
    chars = Task(name="chars", model=functools.partial(CharGPT, context=32, width=32,
                                                        layers=2, heads=2),
                 data=functools.partial(text_train, 32), loss=sequence_cross_entropy,
                 optimizer=adam, batch_size=8, steps=1, seed=7)
    name, apart = gap(chars, tokens)
    print(f"character GPT, token mean | {apart:.1e} | {name}")
    digits = Task(name="digits", model=functools.partial(digits_mlp, hidden=32, depth=2),
                  data=digits_train, loss=nn.functional.cross_entropy, optimizer=adam,
                  batch_size=16, steps=1, seed=3)
    name, apart = gap(digits, samples)
    print(f"digits MLP, sample mean | {apart:.1e} | {name}")


if __name__ == "__main__":
    main()
