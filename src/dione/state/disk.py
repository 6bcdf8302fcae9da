"""A full disk under the checkpoints, said in one sentence (without torch: the CLI
catches it for every command)."""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["DiskFull"]


class DiskFull(RuntimeError):
    """The disk under the checkpoints is full: no slice or trial can write there until
    space is freed. The message is one sentence naming the folder and its free space."""

    def __init__(self, folder: Path, said: str, then: str) -> None:
        where = next((p for p in (folder, *folder.parents) if p.exists()), folder)
        try:
            left = shutil.disk_usage(where).free
            free = (f"{left / 2**20:,.0f} MiB free" if left >= 10 * 2**20
                    else f"{left / 2**10:,.0f} KiB free")
        except OSError as trouble:
            free = f"free space unknown: {trouble}"
        super().__init__(f"the disk under the checkpoints is full ({folder}: {free}; "
                         f"{said}): {then}")
