"""Private scratch folders of a launcher, and the cleaning of those dead launchers left.

A gang's rendezvous, its pickled slice and its results live in a folder only this user
can enter (``mkdtemp`` makes it 0700), never in a run directory others might reach;
the launcher's pid in the name lets the next launcher remove what a killed one left.
A folder is dione's only if it holds the marker file dione writes into every scratch
folder it makes: a folder of the user's that happens to be named ``dione-x-1-y`` is
never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from dione.state.lock import pid_alive

__all__ = ["clean_stale_scratch", "scratch_dir"]

_PREFIX = "dione-"
MARKER = ".dione-scratch"  # in every scratch folder dione makes, and in no other


def scratch_dir(kind: str) -> Path:
    """A new private folder ``dione-<kind>-<pid>-*`` in the system's temporary folder,
    marked as dione's."""
    folder = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{kind}-{os.getpid()}-"))
    (folder / MARKER).write_text(f"{os.getpid()}\n")
    return folder


def clean_stale_scratch(root: str | Path | None = None) -> list[Path]:
    """Remove this user's scratch folders (those with dione's marker, not a symlink)
    whose launcher is dead; those removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{_PREFIX}*-*-*"):
        parts = folder.name.split("-")
        with contextlib.suppress(OSError, ValueError, IndexError):
            if (folder.is_symlink() or not (folder / MARKER).is_file()
                    or folder.lstat().st_uid != os.getuid() or pid_alive(int(parts[2]))):
                continue
            shutil.rmtree(folder)
            removed.append(folder)
    return removed
