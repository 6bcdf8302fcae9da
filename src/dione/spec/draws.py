"""Torch's CPU, Python's and NumPy's global generators: seeded for a block, or kept as
they were, so that a data set's or a collate function's random draws depend on a seed
alone and the caller's own draws go on as if the block had not run."""

from __future__ import annotations

import contextlib
import math
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["HeldDraws", "draws_kept", "generators_kept", "global_draws", "seeded_draws"]


@contextlib.contextmanager
def draws_kept() -> Iterator[None]:
    """Python's and (if loaded) NumPy's global generators as they were before the
    block: the caller's draws go on as if it had not run (torch's: ``fork_rng``)."""
    numpy = sys.modules.get("numpy")
    python_state = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)


@contextlib.contextmanager
def generators_kept() -> Iterator[None]:
    """All three global generators as they were before the block: torch's CPU one
    (``fork_rng``), Python's and NumPy's (``draws_kept``)."""
    with draws_kept(), torch.random.fork_rng(devices=[]):
        yield


def global_draws() -> tuple[bytes, object, bytes | None]:
    """The states of torch's CPU, Python's and (if loaded) NumPy's global generators, to
    compare: a call that moved one drew from it."""
    numpy = sys.modules.get("numpy")
    return (bytes(torch.get_rng_state().numpy()), random.getstate(),
            None if numpy is None else numpy.random.get_state()[1].tobytes())


@contextlib.contextmanager
def seeded_draws() -> Iterator[Callable[[int], None]]:
    """A function that seeds torch's CPU, Python's and (if loaded) NumPy's global
    generators; all three put back as they were on exit."""
    numpy = sys.modules.get("numpy")

    def seed_all(seed: int) -> None:
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        if numpy is not None:  # all 63 bits, as two 32-bit words
            numpy.random.seed([seed & 0xFFFFFFFF, seed >> 32])

    with generators_kept():
        yield seed_all


class HeldDraws(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """torch's random draws made constant: a normal's mean, a uniform's middle, an
    integer range's start, a Bernoulli's likelier outcome, a permutation in order, a
    dropout that keeps everything. What a sample's loss is then does not depend on the
    draws of the other samples of its batch, nor on how many there are."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in ("rrelu_with_noise", "rrelu_with_noise_") and (
                args[4] if len(args) > 4 else kwargs.get("training", False)):
            return _mean_rrelu(name, args, kwargs)
        out = func(*args, **kwargs)
        with torch.no_grad():
            if name in ("randn", "randn_like"):
                out.zero_()
            elif name in ("normal", "normal_"):
                mean = kwargs.get("mean", args[1] if name == "normal_" and len(args) > 1
                                  else args[0] if name == "normal" and args else 0.0)
                target = args[0] if name == "normal_" else out
                if isinstance(mean, torch.Tensor):
                    target.copy_(mean.expand_as(target))
                else:
                    target.fill_(float(mean))
            elif name in ("rand", "rand_like"):
                out.fill_(0.5)
            elif name == "uniform_":
                low = kwargs.get("from", args[1] if len(args) > 1 else 0.0)
                high = kwargs.get("to", args[2] if len(args) > 2 else 1.0)
                args[0].fill_((float(low) + float(high)) / 2)
            elif name in ("randint", "randint_like"):
                out.fill_(int(args[1]) if name == "randint_like" and len(args) > 2 else
                          int(args[0]) if name == "randint" and len(args) > 2 and
                          not isinstance(args[1], (list, tuple, torch.Size)) else 0)
            elif name == "bernoulli":
                chances = args[1] if len(args) > 1 and not isinstance(args[1], torch.Tensor) \
                    else args[0]
                if isinstance(chances, torch.Tensor):
                    out.copy_((chances >= 0.5).to(out.dtype))
                else:
                    out.fill_(float(chances >= 0.5))
            elif name == "bernoulli_":
                chances = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
                args[0].copy_((chances >= 0.5).to(args[0].dtype).expand_as(args[0])
                              if isinstance(chances, torch.Tensor)
                              else torch.full_like(args[0], float(chances >= 0.5)))
            elif name == "randperm":
                out.copy_(torch.arange(out.numel(), dtype=out.dtype))
            elif name == "random_":  # from its range's start (0 where none is given)
                args[0].fill_(int(args[1]) if len(args) > 2 else 0)
            elif name == "exponential_":  # its mean, 1 / lambda
                args[0].fill_(1.0 / float(args[1] if len(args) > 1 else kwargs.get("lambd", 1.0)))
            elif name == "geometric_":  # its mean, 1 / p
                args[0].fill_(1.0 / float(args[1] if len(args) > 1 else kwargs["p"]))
            elif name == "log_normal_":  # its median, e ** mean
                args[0].fill_(math.exp(float(args[1] if len(args) > 1 else
                                             kwargs.get("mean", 1.0))))
            elif name == "cauchy_":  # its median
                args[0].fill_(float(args[1] if len(args) > 1 else kwargs.get("median", 0.0)))
            elif name in ("poisson", "_standard_gamma"):  # their mean: the rates, alpha
                out.copy_(args[0])
            elif name == "_sample_dirichlet":  # its mean
                out.copy_(args[0] / args[0].sum(-1, keepdim=True))
            elif name == "binomial":  # its mean, rounded
                out.copy_((args[0] * args[1]).round())
            elif name == "multinomial":  # the likeliest categories, in order
                count = int(args[1])
                again = args[2] if len(args) > 2 else kwargs.get("replacement", False)
                out.copy_(args[0].argmax(-1, keepdim=True).expand_as(out) if again
                          else args[0].topk(count, -1).indices)
            elif name == "native_dropout" and len(args) > 2 and args[2]:
                out[0].copy_(args[0])
                out[1].fill_(True)
        return out


def _mean_rrelu(name: str, args: Any, kwargs: Any) -> torch.Tensor:
    """A training rrelu at its mean slope, (lower + upper) / 2, on every negative input
    (the slope its evaluation takes), its noise tensor written to say so."""
    x: torch.Tensor = args[0]
    noise: torch.Tensor = args[1]
    low = float(args[2] if len(args) > 2 else kwargs.get("lower", 1 / 8))
    high = float(args[3] if len(args) > 3 else kwargs.get("upper", 1 / 3))
    with torch.no_grad():
        slope = torch.where(x >= 0, 1.0, (low + high) / 2).to(x.dtype)
        noise.copy_(slope)
    if name == "rrelu_with_noise_":
        with torch.no_grad():
            return x.mul_(slope)
    return x * slope

