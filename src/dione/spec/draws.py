"""Torch's CPU, Python's and NumPy's global generators: seeded for a block, or kept as
they were, so that a data set's or a collate function's random draws depend on a seed
alone and the caller's own draws go on as if the block had not run."""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Callable, Iterator

import torch

__all__ = ["draws_kept", "generators_kept", "global_draws", "seeded_draws"]


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
