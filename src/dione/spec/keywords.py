"""A keyword argument one of dione's classes does not take, named with the fields it does
and with dione's name for it where the argument is a peer tool's (Ray Tune's
``grace_period``, Optuna's ``n_warmup_steps``, a trainer's ``learning_rate``)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["named_keywords"]

# A peer tool's keyword (Ray Tune's schedulers, Optuna's pruners, trainers' arguments),
# and what stands for it in dione.
_PEERS = {
    "grace_period": "min_steps: Ray Tune's grace_period",
    "reduction_factor": "eta: Ray Tune's and Optuna's reduction_factor",
    "max_t": "the task's steps: a rule needs no length of its own",
    "time_attr": "nothing: a rule counts the task's optimizer steps",
    "brackets": "tasks of other lengths: a rule is one bracket",
    "n_warmup_steps": "min_steps: Optuna's n_warmup_steps",
    "interval_steps": "every: Optuna's interval_steps",
    "n_min_trials": "min_tasks: Optuna's n_min_trials",
    "n_startup_trials": "min_tasks, the values at a rung before any is judged",
    "min_resource": "min_steps: Optuna's min_resource",
    "lr": "optimizer=functools.partial(torch.optim.AdamW, lr=...)",
    "learning_rate": "optimizer=functools.partial(torch.optim.AdamW, lr=...)",
    "max_steps": "steps",
    "num_train_epochs": "epochs",
    "train_dataset": "data, a factory returning the dataset",
    "dataset": "data, a factory returning the dataset",
    "eval_fn": "evaluate",
    "metric_fn": "evaluate",
    "per_device_train_batch_size": "batch_size, the whole batch of a step over all devices",
    "gradient_accumulation_steps": "nothing: accumulation is a knob the profiler chooses "
                                   "for memory; batch_size is the whole batch",
    "max_grad_norm": "clip_grad_norm",
    "scheduler": "lr_scheduler",
}

C = TypeVar("C", bound=type)


def named_keywords(cls: C) -> C:
    """``cls`` (a dataclass) whose constructor, given keywords it does not take, raises a
    TypeError naming each at once, with what it likely meant (dione's name for a peer
    tool's keyword, else the nearest field) and the fields it takes (Python's own said
    only the first, in its words: a misspelt ``allow_inexact`` went unsaid behind a
    misspelt ``steps``)."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    public = [f.name for f in dataclasses.fields(cls)
              if f.init and f.repr and not f.name.startswith("_")]

    @functools.wraps(init)
    def checked(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = [k for k in kwargs if k not in known]
        if unknown:
            named = f"(name={kwargs['name']!r})" if isinstance(kwargs.get("name"), str) else ""
            raise TypeError(f"{cls.__name__}{named} got {len(unknown)} unknown field(s): "
                            f"{', '.join(_meant(k, public) for k in unknown)}; its fields: "
                            f"{', '.join(public)}")
        init(self, *args, **kwargs)

    type.__setattr__(cls, "__init__", checked)
    return cls


def _meant(keyword: str, fields: list[str]) -> str:
    """``keyword`` with what it likely meant."""
    if keyword in _PEERS:
        return f"{keyword!r} (use {_PEERS[keyword]})"
    close = difflib.get_close_matches(keyword, fields, 1)
    return f"{keyword!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
