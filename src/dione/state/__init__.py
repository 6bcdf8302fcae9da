"""Checkpoints (torch.distributed.checkpoint) and the SQLite run store."""

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
from dione.state.lock import LockHolder, RunDirBusy, RunLock, lock_holder
from dione.state.private import UnsafePathError, check_private, private_dir
from dione.state.store import CheckpointRecord, RunStore, SliceRecord, TaskRecord

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
