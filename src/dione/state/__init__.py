"""Checkpoints (torch.distributed.checkpoint) and the SQLite run store."""

from typing import TYPE_CHECKING

from dione._lazy import lazy_exports
from dione.state.lock import LockHolder, RunDirBusy, RunLock, lock_holder
from dione.state.private import UnsafePathError, check_private, private_dir
from dione.state.store import CheckpointRecord, RunStore, SliceRecord, TaskRecord

if TYPE_CHECKING:
    from dione.state.checkpoint import (
        CheckpointError,
        CorruptCheckpoint,
        Progress,
        checkpoint_path,
        latest_on_disk,
        load_checkpoint,
        load_model_weights,
        prune_checkpoints,
        quarantine,
        read_progress,
        save_checkpoint,
        verify_checkpoint,
    )

# Checkpoints need torch; the store, the lock and private folders do not (`dione status`).
__getattr__ = lazy_exports(__name__, dict.fromkeys((
    "CheckpointError",
    "CorruptCheckpoint",
    "Progress",
    "checkpoint_path",
    "latest_on_disk",
    "load_checkpoint",
    "load_model_weights",
    "prune_checkpoints",
    "quarantine",
    "read_progress",
    "save_checkpoint",
    "verify_checkpoint",
), "dione.state.checkpoint"))

__all__ = [
    "CheckpointError",
    "CheckpointRecord",
    "CorruptCheckpoint",
    "LockHolder",
    "Progress",
    "RunDirBusy",
    "RunLock",
    "RunStore",
    "SliceRecord",
    "TaskRecord",
    "UnsafePathError",
    "check_private",
    "checkpoint_path",
    "latest_on_disk",
    "load_checkpoint",
    "load_model_weights",
    "lock_holder",
    "private_dir",
    "prune_checkpoints",
    "quarantine",
    "read_progress",
    "save_checkpoint",
    "verify_checkpoint",
]
