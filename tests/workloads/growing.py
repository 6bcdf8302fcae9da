"""A sweep that grows: one task per learning rate listed in rates.json beside this file
(a test appends a rate, then adds its task to the run); every training step waits
while the file HOLD_FILE names exists, so a test can keep the run live."""
import functools
import json
import os
import time
from pathlib import Path

import torch

from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train


def held_loss(output, target):
    hold = os.environ.get("HOLD_FILE")
    # Training only, in a worker the spawner started (validation, in the launcher,
    # computes gradients of the loss too: those of a batch and of its halves).
    if (hold and Path(hold).exists() and torch.is_grad_enabled()
            and os.environ.get("DIONE_LAUNCHER_PID")):
        Path(hold + ".held").touch()
        while Path(hold).exists():
            time.sleep(0.05)
    return torch.nn.functional.cross_entropy(output, target)


def task(lr, steps=8):
    return Task(name=f"lr-{lr:g}", model=functools.partial(digits_mlp, hidden=16, depth=1),
                data=digits_train, loss=held_loss,
                optimizer=functools.partial(torch.optim.Adam, lr=lr), batch_size=16,
                steps=steps, seed=5, hyperparameters={"lr": lr}, techniques=("single",))


workload = Workload([task(lr) for lr in
                     json.loads((Path(__file__).parent / "rates.json").read_text())])
