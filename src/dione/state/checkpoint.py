"""Technique-neutral checkpoints: model and optimizer by parameter name, progress, RNG.

A checkpoint is a folder ``<run>/checkpoints/<task>/step-00000120/``::

    .metadata, *.distcp   model and optimizer state through torch.distributed.checkpoint,
                          keyed by fully qualified parameter names, resharded on load to
                          whatever technique and device count loads it
    rng/rank<r>.pt        each rank's RNG states (restored when the world size matches)
    scheduler.pt          the learning-rate scheduler's state, if the task has one
    progress.json         written last: step, samples seen, who wrote it

It is written to ``step-N.partial`` and renamed once every rank is done, so a folder
without ``.partial`` is always complete.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

__all__ = [
    "CheckpointError",
    "Progress",
    "checkpoint_path",
    "latest_on_disk",
    "load_checkpoint",
    "load_model_weights",
    "prune_checkpoints",
    "read_progress",
    "reseed",
    "save_checkpoint",
]

PROGRESS = "progress.json"
# Optimizer state and hyperparameters keyed per parameter name ("param_groups.<fqn>.lr"),
# not per group index: pipeline stages each hold different parameters, and group 0 of
# one stage must not overwrite group 0 of another in the shared checkpoint.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or belongs to different training."""


@dataclass(frozen=True)
class Progress:
    """Where a task's training stands at a checkpoint, and who wrote it."""

    task: str
    step: int
    samples_seen: int
    batch_size: int
    technique: str
    knobs: dict[str, Any] = field(default_factory=dict)
    world: int = 1
    saved_at: float = 0.0
    torch_version: str = torch.__version__


def checkpoint_path(run_dir: str | Path, task: str, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / task / f"step-{step:08d}"


def read_progress(path: str | Path) -> Progress:
    file = Path(path) / PROGRESS
    try:
        return Progress(**json.loads(file.read_text()))
    except (OSError, ValueError, TypeError) as err:
        raise CheckpointError(f"{path} is not a complete checkpoint ({err})") from None


def latest_on_disk(run_dir: str | Path, task: str) -> Path | None:
    """The newest complete checkpoint folder of ``task`` (None: train from scratch)."""
    folder = Path(run_dir) / "checkpoints" / task
    done = sorted(p for p in folder.glob("step-*") if (p / PROGRESS).is_file()
                  and not p.name.endswith(".partial"))
    return done[-1] if done else None


def _grouped() -> bool:
    """Whether this process is part of a process group (a one-rank slice is not)."""
    return dist.is_available() and dist.is_initialized()


def _rank() -> tuple[int, int]:
    if _grouped():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if _rank()[1] > 1:
        dist.barrier()


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def reseed(seed: int, step: int, rank: int) -> None:
    """A fresh, reproducible RNG stream when saved streams cannot carry over (new world size)."""
    value = (seed * 1_000_003 + step * 1_009 + rank) % (2**63)
    torch.manual_seed(value)
    random.seed(value)
    np.random.seed(value % (2**32))


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    progress: Progress,
    scheduler: Any | None = None,
) -> Path:
    """Collective: every rank of the gang calls it; returns the finished folder."""
    final = Path(path)
    partial = final.with_name(final.name + ".partial")
    rank, _ = _rank()
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)  # left by a gang that died mid-save
        partial.mkdir(parents=True)
    _barrier()
    model_state, optim_state = get_state_dict(model, optimizer, options=_OPTIONS)
    dcp_save({"model": model_state, "optim": optim_state}, checkpoint_id=partial,
             no_dist=not _grouped())
    (partial / "rng").mkdir(exist_ok=True)
    torch.save(_rng_state(), partial / "rng" / f"rank{rank}.pt")
    _barrier()
    if rank == 0:
        if scheduler is not None:
            torch.save(scheduler.state_dict(), partial / "scheduler.pt")
        stamped = Progress(**{**asdict(progress), "saved_at": time.time()})
        (partial / PROGRESS).write_text(json.dumps(asdict(stamped), indent=1))
        if final.exists():  # the same step trained again, e.g. after a failed record
            shutil.rmtree(final)
        partial.rename(final)
    _barrier()
    return final


def load_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    *,
    batch_size: int,
    seed: int,
    scheduler: Any | None = None,
    restore_rng: bool = True,
) -> Progress:
    """Collective: load a checkpoint written by any technique and device count.

    RNG streams are restored rank by rank when the world size matches (so the same
    technique on the same devices continues bit for bit); otherwise each rank starts a
    fresh stream seeded from (seed, step, rank).
    """
    folder = Path(path)
    progress = read_progress(folder)
    if progress.batch_size != batch_size:
        raise CheckpointError(
            f"{folder} was written with global batch size {progress.batch_size}, but the task "
            f"now says {batch_size}: the task's training changed; use a new run directory"
        )
    model_state, optim_state = get_state_dict(model, optimizer, options=_OPTIONS)
    state = {"model": model_state, "optim": optim_state}
    dcp_load(state, checkpoint_id=folder, no_dist=not _grouped())
    set_state_dict(model, optimizer, model_state_dict=cast(Any, state["model"]),
                   optim_state_dict=cast(Any, state["optim"]), options=_OPTIONS)
    if scheduler is not None and (folder / "scheduler.pt").is_file():
        scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=False))
    if restore_rng:
        rank, world = _rank()
        saved = folder / "rng" / f"rank{rank}.pt"
        if world == progress.world and saved.is_file():
            _set_rng_state(torch.load(saved, weights_only=False))
        else:
            reseed(seed, progress.step, rank)
    return progress


def load_model_weights(path: str | Path, model: nn.Module) -> Progress:
    """Load only the model's weights, in one process with no gang (e.g. to evaluate)."""
    folder = Path(path)
    progress = read_progress(folder)
    state = {"model": model.state_dict()}
    dcp_load(state, checkpoint_id=folder, no_dist=True)
    model.load_state_dict(state["model"])
    return progress


def prune_checkpoints(run_dir: str | Path, task: str, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints of ``task``; returns those gone."""
    folder = Path(run_dir) / "checkpoints" / task
    done = sorted(p for p in folder.glob("step-*") if not p.name.endswith(".partial"))
    gone = done[: max(0, len(done) - keep)]
    for old in gone:
        shutil.rmtree(old, ignore_errors=True)
    return gone
