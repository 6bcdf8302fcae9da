"""Checkpoints (torch.distributed.checkpoint) and the SQLite run store."""

from dione.state.checkpoint import (
    CheckpointError,
    Progress,
    checkpoint_path,
    latest_on_disk,
    load_checkpoint,
    load_model_weights,
    prune_checkpoints,
    read_progress,
    save_checkpoint,
)
from dione.state.store import CheckpointRecord, RunStore, SliceRecord, TaskRecord

__all__ = [
    "CheckpointError",
    "CheckpointRecord",
    "Progress",
    "RunStore",
    "SliceRecord",
    "TaskRecord",
    "checkpoint_path",
    "latest_on_disk",
    "load_checkpoint",
    "load_model_weights",
    "prune_checkpoints",
    "read_progress",
    "save_checkpoint",
]
