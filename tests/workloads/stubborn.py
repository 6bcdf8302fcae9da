"""Tasks whose models install a module-registration hook that cannot be removed: the
reset after a slice raises (or hangs), and one innocent task."""
import collections
import functools
import time

import torch

from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train


class Stubborn(collections.OrderedDict):
    hang = False

    def __delitem__(self, key):
        time.sleep(3600 if self.hang else 3)
        raise RuntimeError("this hook cannot be removed")


def stubborn_model(hang):
    model = digits_mlp(hidden=8, depth=1)
    registry = Stubborn(stuck=lambda module, name, submodule: None)
    registry.hang = hang
    torch.nn.modules.module._global_module_registration_hooks = registry
    return model


def task(name, model):
    return Task(name=name, model=model, data=digits_train,
                loss=torch.nn.functional.cross_entropy, optimizer=torch.optim.SGD,
                batch_size=8, steps=2, seed=1)


workload = Workload([task("raises", functools.partial(stubborn_model, hang=False)),
                     task("hangs", functools.partial(stubborn_model, hang=True)),
                     task("innocent", functools.partial(digits_mlp, hidden=8, depth=1))])
