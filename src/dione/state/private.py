"""Folders and files only this user can change: what dione may unpickle, import or trust.

A run directory holds checkpoints whose ``.metadata`` torch.distributed.checkpoint
unpickles, and the catalog and store steer what runs; whoever can write there can
run code as the dione user. So dione creates them private (0700 folders, 0600 files)
and refuses to use one that another user owns or that others may write.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

__all__ = ["UnsafePathError", "check_private", "private_dir", "private_file", "write_private",
           "write_whole"]


class UnsafePathError(PermissionError):
    """A path others could have written: dione will not load code or state from it."""


def check_private(path: str | Path) -> None:
    """Raise UnsafePathError unless ``path`` is owned by this user and not writable by
    group or others (what may be unpickled or imported must pass this)."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(f"{path} is a symbolic link; dione trusts only real files and "
                              "folders in a run directory (where it is the run directory "
                              f"itself, give its real path: {os.path.realpath(path)})")
    if info.st_uid != os.getuid():
        raise UnsafePathError(
            f"{path} belongs to user id {info.st_uid}, not to you ({os.getuid()}): another "
            "user could have planted code there; use a run directory of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePathError(
            f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}): anyone "
            f"could plant code there; run `chmod go-w {path}` if you trust what it holds, "
            "or use a new run directory")


def private_dir(path: str | Path) -> Path:
    """Create ``path`` (and missing parents) as 0700, or check that an existing one is
    private; the path."""
    folder = Path(path)
    if not folder.exists():
        missing = [folder, *[p for p in folder.parents if not p.exists()]]
        for item in reversed(missing):  # each folder dione makes for it private too
            # Created meanwhile by another process: it is checked below all the same.
            with contextlib.suppress(FileExistsError):
                item.mkdir(mode=0o700)
    check_private(folder)
    return folder


def private_file(path: str | Path) -> Path:
    """Make an existing file of ours readable and writable by this user only (one that
    another user owns, say a team's shared catalog, is left as it is)."""
    if os.stat(path).st_uid == os.getuid():
        os.chmod(path, 0o600)
    return Path(path)


def write_private(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all (a temporary file, then a rename),
    readable by this user only, never through a symlink."""
    return write_whole(path, text, 0o600)


def write_whole(path: str | Path, text: str, mode: int) -> Path:
    """Write ``text`` to ``path`` whole or not at all (a temporary file, then a rename),
    with ``mode`` (less the umask), never through a symlink: one at ``path`` is
    replaced, not followed (its target may be anyone's file)."""
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.replace(partial, target)
    return target
