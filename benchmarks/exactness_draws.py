"""Randomness no layer's name shows, and the label each slice gets: per-step losses of a
model with noise in its forward and of a data set with a generator of its own, under
single, ddp on 2 devices and single with accumulation 2 (8 steps each; deterministic).

    python benchmarks/exactness_draws.py LABEL [--out DIR]     # about 30 s on 2 cores

Each line: LABEL | task | how | max |loss - single's| over the steps | the slice's label.
"""
import argparse
import functools
import sys
import tempfile

import cloudpickle
import numpy as np
import torch
from torch import nn

from dione import Task
from dione.launch import local_placement, run_slice
from dione.spec.cluster import Node
from dione.techniques.validation import valid_task
from dione.zoo import digits_train

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Noise(nn.Module):
    def forward(self, x):
        return x + 0.5 * torch.randn_like(x) if self.training else x


class OwnGenerator(torch.utils.data.Dataset):
    def __init__(self):
        self.inner = digits_train()
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, i):
        x, y = self.inner[i]
        return x + float(self.rng.normal()) * 0.5, y


def noisy_model():
    return nn.Sequential(nn.Linear(64, 16), Noise(), nn.ReLU(), nn.Linear(16, 10))


def plain_model():
    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))


def task(name, model, data):
    return Task(name=name, model=model, data=data, loss=nn.functional.cross_entropy,
                optimizer=functools.partial(torch.optim.SGD, lr=0.1), batch_size=16, steps=8)


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("label", help="a name for this tree's lines (a commit)")
parser.add_argument("--out", default=None, help="run directories (default: a temporary one)")
args = parser.parse_args()
out = args.out or tempfile.mkdtemp(prefix="exactness-draws-")
node = Node("n", 2, "cpu")
for name, model, data in (("noise", noisy_model, digits_train),
                          ("own-generator", plain_model, OwnGenerator)):
    t, problems = valid_task(task(name, model, data))
    assert not problems, problems
    runs = {}
    for label, technique, ids, knobs in (("single", "single", [0], {}),
                                         ("ddp x2", "ddp", [0, 1], {}),
                                         ("single accumulation 2", "single", [0],
                                          {"accumulation": 2})):
        r = run_slice(t, technique, f"{out}/run-{name}-{label.replace(' ', '_')}",
                      local_placement(node, ids), knobs=knobs, timeout=300)
        runs[label] = r
    base = runs["single"].losses
    for label, r in runs.items():
        off = max(abs(a - b) for a, b in zip(r.losses, base, strict=True))
        print(f"{args.label} | {name} | {label} | max |loss - single's| {off:.3g} | "
              f"{r.extra.get('exactness', 'exact')[:70]}")
