"""The demo workload: a small sweep over learning rate and batch size for two model families.

Everything it reads ships with installed packages: scikit-learn's bundled digits, and the
source text of Python's own standard library. Run it with ``dione run examples/demo.py``.
"""

import functools

import torch
from torch.nn.functional import cross_entropy

from dione import Task, Workload, grid
from dione.zoo import (
    CharGPT,
    digits_accuracy,
    digits_mlp,
    digits_train,
    sequence_cross_entropy,
    text_train,
    text_validation_loss,
)


def digits_task(lr: float, batch_size: int) -> Task:
    return Task(
        name="digits",
        model=digits_mlp,
        data=digits_train,
        loss=cross_entropy,
        optimizer=functools.partial(torch.optim.AdamW, lr=lr, weight_decay=0.01),
        batch_size=batch_size,
        epochs=20,
        evaluate=digits_accuracy,
    )


def chargpt_task(lr: float, batch_size: int) -> Task:
    return Task(
        name="chargpt",
        model=CharGPT,
        data=text_train,
        loss=sequence_cross_entropy,
        optimizer=functools.partial(torch.optim.AdamW, lr=lr),
        batch_size=batch_size,
        steps=300,
        evaluate=text_validation_loss,
    )


workload = Workload(
    grid("digits", digits_task, lr=[1e-3, 3e-3], batch_size=[32, 64])
    + grid("chargpt", chargpt_task, lr=[1e-3, 3e-3], batch_size=[16])
)
