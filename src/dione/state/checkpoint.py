"""Technique-neutral checkpoints: model and optimizer by parameter name, progress, RNG.

A checkpoint is a folder ``<run>/checkpoints/<task>/step-00000120/``::

    .metadata, *.distcp   model and optimizer state through torch.distributed.checkpoint,
                          keyed by fully qualified parameter names, resharded on load to
                          whatever technique and device count loads it
    rng/rank<r>.pt        each rank's RNG states (restored when the world size matches)
    scheduler.pt          the learning-rate scheduler's state, if the task has one
    grad_scaler.pt        fp16's loss-scaler state, if the task trains in fp16
    digests.json          the SHA-256 of every file above
    progress.json         written last: step, samples seen, who wrote it, and the
                          SHA-256 of digests.json (so that deleting it is damage too)

It is written to ``step-N.partial`` and renamed once every rank is done, so a folder
without ``.partial`` is always complete. Before a checkpoint is loaded its files are
checked against ``digests.json`` (``verify_checkpoint``); one that fails is renamed
``step-N.corrupt`` and the task resumes from an older one. RNG and scheduler states
load with ``weights_only=True``, which runs no code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from dione.state.private import private_dir
from dione.words import some

__all__ = [
    "CheckpointError",
    "CheckpointMismatch",
    "CorruptCheckpoint",
    "Progress",
    "checkpoint_path",
    "file_times",
    "latest_on_disk",
    "load_checkpoint",
    "load_model_weights",
    "prune_checkpoints",
    "quarantine",
    "read_progress",
    "reseed",
    "save_checkpoint",
    "verify_checkpoint",
]

PROGRESS = "progress.json"
DIGESTS = "digests.json"
_STEP = re.compile(r"step-\d{8}")  # a complete folder's name, as ``checkpoint_path`` makes it
# Optimizer state and hyperparameters keyed per parameter name ("param_groups.<fqn>.lr"),
# not per group index: pipeline stages each hold different parameters, and group 0 of
# one stage must not overwrite group 0 of another in the shared checkpoint.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or belongs to different training."""


class CheckpointMismatch(CheckpointError):
    """A checkpoint of other parameters than the task's model has now (it changed)."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint whose files are not what was written: ``file`` names the first."""

    def __init__(self, message: str, folder: Path, file: str) -> None:
        super().__init__(message)
        self.folder = folder
        self.file = file


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _payload(folder: Path) -> list[Path]:
    """The files a checkpoint's digests cover: all but the digests and progress."""
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and p.name not in (DIGESTS, PROGRESS))


def verify_checkpoint(path: str | Path) -> None:
    """Check every file of a complete checkpoint against its ``digests.json`` (and that
    file against the digest ``progress.json`` keeps of it); raise CorruptCheckpoint
    naming the first file missing, added, changed or not private. A checkpoint written
    before dione kept digests is accepted as it is."""
    from dione.state.private import UnsafePathError, check_private

    folder = Path(path)
    try:
        text = (folder / PROGRESS).read_bytes()
    except FileNotFoundError:
        if not folder.is_dir():  # gone (moved, unmounted): nothing here to set aside
            raise CheckpointError(f"checkpoint {folder} is not there") from None
        text = b""  # a complete folder always had one: it went since
    except OSError as err:  # EIO, EACCES: the disk's trouble, not the checkpoint's
        raise CheckpointError(f"checkpoint {folder}: {PROGRESS} cannot be read "
                              f"({err.strerror or err})") from None
    try:
        progress = Progress(**json.loads(text))
    except (ValueError, TypeError) as err:
        # A folder renamed into place always had a whole one: it was torn after (power
        # lost before the disk had it, or damaged since), like any other file of it.
        raise CorruptCheckpoint(f"checkpoint {folder}: file {PROGRESS} is unreadable "
                                f"({type(err).__name__}: {err})", folder, PROGRESS) from None
    try:
        for item in [folder, *folder.rglob("*")]:
            check_private(item)
    except UnsafePathError as err:
        raise CorruptCheckpoint(f"checkpoint {folder} cannot be trusted: {err}", folder,
                                str(err).split(" ", 1)[0]) from None
    digests_file = folder / DIGESTS
    if not digests_file.is_file():
        if progress.digests is None:  # written before dione kept digests
            return
        raise CorruptCheckpoint(f"checkpoint {folder}: file {DIGESTS} is missing; it was "
                                "written with the checkpoint", folder, DIGESTS)
    if progress.digests is not None and _sha256(digests_file) != progress.digests:
        raise CorruptCheckpoint(f"checkpoint {folder}: file {DIGESTS} does not match the "
                                "digest written with it (changed)", folder, DIGESTS)
    try:
        expected = json.loads(digests_file.read_text())
    except (OSError, ValueError) as err:
        raise CorruptCheckpoint(f"checkpoint {folder}: {DIGESTS} is unreadable ({err})",
                                folder, DIGESTS) from None
    found = {str(p.relative_to(folder)) for p in _payload(folder)}
    for name in sorted(set(expected) | found):
        file = folder / name
        if name not in found:
            problem = "is missing"
        elif name not in expected:
            problem = "was not written with the checkpoint"
        elif _sha256(file) != expected[name]:
            problem = "does not match the digest written with it (changed or truncated)"
        else:
            continue
        raise CorruptCheckpoint(f"checkpoint {folder}: file {name} {problem}", folder, name)


def file_times(path: str | Path) -> list[list[Any]]:
    """Each file of a checkpoint folder with its size and change time, in name order: what
    ``verify_checkpoint`` read whole, to tell later that nothing changed since (a full
    read of every done task's final checkpoint at each resume: 0.5 TB for 50 large
    models, review)."""
    folder = Path(path)
    found = []
    for file in sorted(folder.rglob("*")):
        if file.is_file():
            info = file.stat()
            found.append([str(file.relative_to(folder)), info.st_size, info.st_mtime_ns,
                          info.st_ctime_ns])
    return found


def quarantine(folder: str | Path) -> Path:
    """Move a corrupt checkpoint aside as ``step-N.corrupt`` (kept for a look, never
    loaded again); its new path."""
    source = Path(folder)
    target = source.with_name(source.name + ".corrupt")
    shutil.rmtree(target, ignore_errors=True)
    source.rename(target)
    return target


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
    # The SHA-256 of digests.json (None: written before dione kept it, with or without
    # digests). With it, a checkpoint without its digests is corrupt, not unverified.
    digests: str | None = None


def checkpoint_path(run_dir: str | Path, task: str, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / task / f"step-{step:08d}"


def read_progress(path: str | Path) -> Progress:
    file = Path(path) / PROGRESS
    try:
        return Progress(**json.loads(file.read_text()))
    except (OSError, ValueError, TypeError) as err:
        raise CheckpointError(f"{path} is not a complete checkpoint ({err})") from None


def _complete(folder: Path) -> list[Path]:
    """The complete checkpoint folders in ``folder``, oldest first: ``step-N`` only, not
    ``.partial`` ones being written nor ``.corrupt`` ones set aside."""
    return sorted(p for p in folder.glob("step-*") if _STEP.fullmatch(p.name)
                  and (p / PROGRESS).is_file())


def latest_on_disk(run_dir: str | Path, task: str) -> Path | None:
    """The newest complete checkpoint folder of ``task`` (None: train from scratch)."""
    done = _complete(Path(run_dir) / "checkpoints" / task)
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
    # Plain tensors, numbers and tuples only, so that loading needs no pickled classes
    # (numpy's state holds an ndarray: stored as a tensor).
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (str(kind), torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos),
                  int(has_gauss), float(cached)),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
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
    scaler: Any | None = None,
) -> Path:
    """Collective: every rank of the gang calls it; returns the finished folder."""
    final = Path(path)
    partial = final.with_name(final.name + ".partial")
    rank, _ = _rank()
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)  # left by a gang that died mid-save
        private_dir(partial)  # and the task's folder, private like the run directory
    _barrier()
    model_state, optim_state = get_state_dict(model, optimizer, options=_OPTIONS)
    with _one_process_meant():
        dcp_save({"model": model_state, "optim": optim_state}, checkpoint_id=partial,
                 no_dist=not _grouped())
    (partial / "rng").mkdir(exist_ok=True)
    torch.save(_rng_state(), partial / "rng" / f"rank{rank}.pt")
    _barrier()
    if rank == 0:
        if scheduler is not None:
            torch.save(scheduler.state_dict(), partial / "scheduler.pt")
        if scaler is not None:
            torch.save(scaler.state_dict(), partial / "grad_scaler.pt")
        digests = {str(p.relative_to(partial)): _sha256(p) for p in _payload(partial)}
        (partial / DIGESTS).write_text(json.dumps(digests, indent=1))
        stamped = Progress(**{**asdict(progress), "saved_at": time.time(),
                              "digests": _sha256(partial / DIGESTS)})
        (partial / PROGRESS).write_text(json.dumps(asdict(stamped), indent=1))
        for item in [partial, *partial.rglob("*")]:
            # Private whatever the ranks' umask: a loader refuses what others may write.
            item.chmod(0o700 if item.is_dir() else 0o600)
        # On disk before the rename, and the rename before the store records it: after a
        # power cut a folder named step-N is then whole, never one with empty files.
        _sync(partial)
        if final.exists():  # the same step trained again, e.g. after a failed record
            shutil.rmtree(final)
        partial.rename(final)
        _sync_folder(final.parent)
    _barrier()
    return final


def _sync(folder: Path) -> None:
    """Flush every file and folder under ``folder``, and ``folder``, to the disk."""
    for item in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if item.is_file():
            with open(item, "rb") as file:
                os.fsync(file.fileno())
        else:
            _sync_folder(item)
    _sync_folder(folder)


def _sync_folder(folder: Path) -> None:
    """Flush a folder's entries (files created or renamed in it) to the disk."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def load_checkpoint(
    path: str | Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    *,
    batch_size: int,
    seed: int,
    scheduler: Any | None = None,
    scaler: Any | None = None,
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
    optimizers = ([optimizer] if isinstance(optimizer, torch.optim.Optimizer)
                  else list(optimizer))
    with _empty_groups_aside(optimizers):
        _load_states(folder, model, optimizers)
    if scheduler is not None and (folder / "scheduler.pt").is_file():
        scheduler.load_state_dict(_load_plain(folder / "scheduler.pt"))
    if scaler is not None and (folder / "grad_scaler.pt").is_file():
        scaler.load_state_dict(_load_plain(folder / "grad_scaler.pt"))
    if restore_rng:
        rank, world = _rank()
        saved = folder / "rng" / f"rank{rank}.pt"
        if world == progress.world and saved.is_file():
            _set_rng_state(_load_plain(saved))
        else:
            reseed(seed, progress.step, rank)
    return progress


def _load_states(folder: Path, model: nn.Module, optimizers: list[torch.optim.Optimizer]
                 ) -> None:
    """Collective: the model's and the optimizers' state from the checkpoint."""
    model_state, optim_state = get_state_dict(model, optimizers, options=_OPTIONS)
    try:
        saved: list[str] | None = _saved_keys(folder)  # read once for both checks
    except Exception:  # unreadable: dcp_load says so below, as it did before the check
        saved = None
    optim_state, unstepped = (_unstepped_left_out(saved, optim_state) if saved is not None
                              else (optim_state, set()))
    state = {"model": model_state, "optim": optim_state}
    try:
        with _one_process_meant():
            dcp_load(state, checkpoint_id=folder, no_dist=not _grouped())
    except CheckpointException as err:
        # Either may be it (a layer of another shape fails both loads): "and" said the
        # optimizer changed where only the model had (a review).
        raise _mismatch(folder, err, "model or optimizer") from None
    _refuse_left_out(folder, model_state, "model", collective=_grouped(),  # weights only
                     saved=saved)
    if unstepped:  # without the state get_state_dict gave them: none, as saved
        # The names get_state_dict gives (a wrapper's prefixes, "module." of DDP, left
        # out), by the rule it names them with.
        from torch.distributed.checkpoint.state_dict import _get_fqns

        for name, parameter in model.named_parameters(remove_duplicate=False):
            if _get_fqns(model, name) & unstepped:
                for each in optimizers:
                    each.state.pop(parameter, None)
    set_state_dict(model, optimizers, model_state_dict=cast(Any, state["model"]),
                   optim_state_dict=cast(Any, state["optim"]), options=_OPTIONS)


@contextlib.contextmanager
def _empty_groups_aside(optimizers: list[torch.optim.Optimizer]) -> Iterator[None]:
    """The optimizers without their parameter groups that hold no parameter, put back
    where they were after: a pipeline stage's share of a no-weight-decay recipe can hold
    none of the biases, and torch's loader of a flattened state reads each group's
    settings from its first parameter (IndexError on every resume into such a stage)."""
    aside = [[(i, g) for i, g in enumerate(o.param_groups) if not g["params"]]
             for o in optimizers]
    for optimizer in optimizers:
        optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
    try:
        yield
    finally:
        for optimizer, empty in zip(optimizers, aside, strict=True):
            for index, group in empty:
                optimizer.param_groups.insert(index, group)


def _load_plain(path: Path) -> Any:
    """A torch.save file of tensors, numbers and containers; never runs code from it."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as err:
        raise CheckpointError(
            f"{path} cannot be loaded safely (it holds more than tensors, numbers and "
            f"containers, or is damaged): {type(err).__name__}: {str(err)[:300]}") from None


@contextlib.contextmanager
def _one_process_meant() -> Iterator[None]:
    """Without torch's warning that a save or load without a process group is meant for
    one process: it is (a one-device slice, a load to evaluate or export), and the
    warning was every such slice's whole log, twice."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def load_model_weights(path: str | Path, model: nn.Module) -> Progress:
    """Load only the model's weights, in one process with no gang (e.g. to evaluate)."""
    folder = Path(path)
    progress = read_progress(folder)
    state = {"model": model.state_dict()}
    with _one_process_meant():
        try:
            dcp_load(state, checkpoint_id=folder, no_dist=True)
        except CheckpointException as err:  # a BaseException: `except Exception` missed it
            raise _mismatch(folder, err, "model") from None
    _refuse_left_out(folder, state["model"], "model", collective=False)
    model.load_state_dict(state["model"])
    return progress


def _saved_keys(folder: Path) -> list[str]:
    """The names of what the checkpoint in ``folder`` holds ("model.<name>", "optim.")."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    return list(FileSystemReader(folder).read_metadata().state_dict_metadata)


def _unstepped_left_out(saved: Iterable[str], optim_state: dict[str, Any]
                        ) -> tuple[dict[str, Any], set[str]]:
    """``optim_state`` without the state of parameters the checkpoint (``saved``, its
    keys) holds none of,
    and their names. ``get_state_dict`` gives a fresh optimizer state for every
    parameter (a step at learning rate 0); one that never had a gradient (a head only
    evaluation uses, the copy in ``AveragedModel``) had none when it was saved, and each
    resume failed as a changed optimizer. They are loaded without state, as training
    left them."""
    def owner(key: str) -> str | None:  # "state.<parameter>.<name>": the parameter
        return key[len("state."):key.rindex(".")] if key.startswith("state.") else None

    stepped = {owner(key.removeprefix("optim.")) for key in saved
               if key.startswith("optim.state.")}
    unstepped = {name for name in map(owner, optim_state)
                 if name is not None and name not in stepped}
    return ({key: value for key, value in optim_state.items()
             if owner(key) not in unstepped}, unstepped)


def _refuse_left_out(folder: Path, model_state: Iterable[str], what: str, *,
                     collective: bool, saved: Iterable[str] | None = None) -> None:
    """CheckpointMismatch where the checkpoint holds weights no rank's model has (the
    model lost layers or modules since the slice that wrote it). DCP loads only what the
    model asks for, so they would be dropped without a word: a model edited to fewer
    layers trained on, and was exported, as if it were the one the run trained.
    ``collective``: the gang's ranks each hold a part (a pipeline's stages), gathered
    here; never where one process loads alone (``dione.load`` in a user's torchrun
    script would wait on ranks that never join it). ``saved``: the checkpoint's keys,
    where the caller has read them."""
    names = set(model_state)
    world = _rank()[1] if collective else 1
    if world > 1:
        parts: list[Any] = [None] * world
        dist.all_gather_object(parts, sorted(names))
        names = set().union(*parts)
    weights = [key.removeprefix("model.") for key in
               (_saved_keys(folder) if saved is None else saved) if key.startswith("model.")]
    # A name is the model's where it, or a prefix of it at a dot, is one of the model's
    # own (an entry that is not a tensor is stored flattened under its name).
    gone = sorted(key for key in weights if not any(
        key[:i] in names for i in [len(key), *(j for j, c in enumerate(key) if c == ".")]))
    if gone:
        listed = some(gone, 5)
        raise CheckpointMismatch(
            f"checkpoint {folder} holds {len(gone)} weight(s) the task's model no longer has "
            f"({listed}): the {what} changed since the slice that wrote it; train the changed "
            "task in a new run directory, or put the code back (export and load: give the "
            "workload the run trained)")


def _mismatch(folder: Path, err: CheckpointException, what: str) -> CheckpointMismatch:
    """torch's CheckpointException, which says only "CheckpointException
    ranks:dict_keys([0])", as what it means and the fix."""
    causes = "; ".join(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                       for e, _ in list(err.failures.values())[:1])
    return CheckpointMismatch(
        f"checkpoint {folder} does not fit the task's {what} as "
        f"{'they are' if ' or ' in what else 'it is'} now ({causes}): "
        f"the {what} changed since the slice that wrote it; train the changed task in a "
        "new run directory, or put the code back (export and load: give the workload the "
        "run trained)")


def prune_checkpoints(run_dir: str | Path, task: str, keep: int,
                      recorded: Iterable[str | Path] | None = None,
                      spare: Iterable[str | Path] = ()) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints of ``task`` and those in
    ``spare`` (the task's best evaluated: ``Task.keep_best``); returns those gone.

    ``recorded``: the checkpoints a run store records. Then only those count and only
    those go: a folder the store never recorded (its gang was killed before the slice was)
    may hold a later step than the one just recorded, and counting it would delete the
    checkpoint the task resumes from."""
    done = _complete(Path(run_dir) / "checkpoints" / task)
    if recorded is not None:
        known = {Path(p).resolve() for p in recorded}
        done = [p for p in done if p.resolve() in known]
    spared = {Path(p).resolve() for p in spare}
    gone = [p for p in done[: max(0, len(done) - keep)] if p.resolve() not in spared]
    for old in gone:
        shutil.rmtree(old, ignore_errors=True)
    return gone
