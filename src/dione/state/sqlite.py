"""An SQLite file as dione keeps them: WAL, explicit immediate transactions, closable."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["SQLiteFile", "StateFileError"]


class StateFileError(ValueError):
    """A state file (a run store, the catalog) that cannot be used: damaged, not a
    database, or where it cannot be opened. The message is one sentence that names the
    file and the way out; the CLI prints it with exit status 2."""


def _busy(err: BaseException) -> bool:
    """A file another process holds for writing right now: not damage (the caller waits
    or says so itself)."""
    return "locked" in str(err) or "busy" in str(err)


def _nearly_full(folder: Path) -> bool:
    """Whether ``folder``'s disk has almost no room left (SQLite says "disk I/O error"
    where it cannot create its journal files on a full disk)."""
    import shutil

    try:
        return shutil.disk_usage(folder).free < 16 * 2**20
    except OSError:
        return False


def _damaged(path: Path, what: str, fix: str, err: BaseException) -> StateFileError:
    if "full" in str(err) or ("disk I/O error" in str(err) and _nearly_full(path.parent)):
        # (A resume on a disk still full read "disk I/O error" and was told to restore the
        # file, which was intact: review.)
        fix = ("its disk is full, the file likely intact: free space on that disk, then "
               "go on (`dione resume` for a run)")
    elif "readonly" in str(err) or "read-only" in str(err):
        # Intact, but where this user may not write (an archived run, a read-only mount,
        # another user's file): it was read from a copy, and this needs to write.
        return StateFileError(f"{path} cannot be written here ({type(err).__name__}: {err}); "
                              "it is not damaged, and is read where it is (status, export), "
                              "but to write it copy its folder somewhere you can write and "
                              "use the copy")
    return StateFileError(f"{path} cannot be used as dione's {what} ({type(err).__name__}: "
                          f"{err}); {fix}")


class _Cursor(sqlite3.Cursor):
    """Rows of a damaged file fail as they are read: as a StateFileError naming it."""

    file: SQLiteFile

    def __next__(self) -> Any:
        try:
            return super().__next__()
        except sqlite3.DatabaseError as err:
            if _busy(err):
                raise
            raise self.file.damaged(err) from None

    def fetchone(self) -> Any:
        try:
            return super().fetchone()
        except sqlite3.DatabaseError as err:
            if _busy(err):
                raise
            raise self.file.damaged(err) from None

    def fetchall(self) -> list[Any]:
        try:
            return super().fetchall()
        except sqlite3.DatabaseError as err:
            if _busy(err):
                raise
            raise self.file.damaged(err) from None


class _Connection(sqlite3.Connection):
    """Every statement's sqlite3.DatabaseError as a StateFileError naming the file
    ("database disk image is malformed", "file is not a database", a full disk)."""

    file: SQLiteFile

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        cursor = self.cursor(_Cursor)
        cursor.file = self.file
        try:
            return cursor.execute(sql, parameters)
        except sqlite3.DatabaseError as err:
            if _busy(err):
                raise
            raise self.file.damaged(err) from None

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        try:
            return super().executemany(sql, parameters)
        except sqlite3.DatabaseError as err:
            if _busy(err):
                raise
            raise self.file.damaged(err) from None


def _create_whole(path: Path, schema: str) -> None:
    """Create ``path`` as a database of ``schema`` all at once, so that no other process
    ever opens it half made: an empty store beside a run's checkpoints reads as a run cut
    to nothing (``dione status`` polling a run that is starting saw that)."""
    part = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.new")
    # Private from its first byte: SQLite gives its -wal and -shm files the database
    # file's permissions.
    os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600))
    try:
        db = sqlite3.connect(part, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(schema)
        finally:
            db.close()  # the last connection folds the WAL back in and removes it
        try:
            os.link(part, path)  # never replaces: whoever made it first, theirs stands
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not path.exists():
                os.replace(part, path)
    finally:
        for leftover in (part, part.with_name(part.name + "-wal"),
                         part.with_name(part.name + "-shm")):
            leftover.unlink(missing_ok=True)


def _read_only(path: Path) -> bool:
    """Whether ``path`` (an existing file) or its folder cannot be written here."""
    return not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))


def _copy_to_read(path: Path) -> Path:
    """A private folder holding a copy of ``path`` and its WAL (changes a run killed
    before its last close left there); SQLite folds the WAL into the copy on opening."""
    try:
        folder = Path(tempfile.mkdtemp(prefix="dione-read-"))
    except OSError as err:
        raise _copy_failed(path, err) from None
    try:
        shutil.copyfile(path, folder / path.name)
        wal = path.with_name(path.name + "-wal")
        if wal.is_file():
            shutil.copyfile(wal, folder / wal.name)
    except OSError as err:
        shutil.rmtree(folder, ignore_errors=True)
        raise _copy_failed(path, err) from None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _copy_failed(path: Path, err: OSError) -> StateFileError:
    """Where the copy to read a read-only file could not be made (the temporary
    folder full, say): not the file's fault, nor its disk's."""
    return StateFileError(f"{path} is read-only here, and is read from a copy in "
                          f"{tempfile.gettempdir()}, which could not be made "
                          f"({err.strerror or err}); free space there or point TMPDIR at a "
                          "folder with room")


class SQLiteFile:
    """One SQLite file with its schema applied; a context manager that closes it.

    Autocommit mode: every change goes through ``_transaction`` (BEGIN IMMEDIATE, so
    writers queue instead of failing), and a nested ``_transaction`` is part of the
    outer one. WAL lets readers in other processes read while one writes.
    """

    # What the file is, and what to do when it is damaged (for StateFileError).
    what: ClassVar[str] = "state file"
    fix: ClassVar[str] = "move it aside and start again"
    # Whether a file that cannot be written here is read from a copy (a run store, for
    # status and export) or refused at once (the catalog, which a run writes as it goes).
    read_from_copy: ClassVar[bool] = False

    def __init__(self, path: Path, schema: str, *, timeout: float = 60.0,
                 any_thread: bool = False) -> None:
        self.path = path
        self._snapshot: Path | None = None
        try:
            if not path.exists():
                _create_whole(path, schema)
            # SQLite writes beside a WAL file even to read it (its -shm index), which a
            # read-only folder (an archived run, a read-only mount) refuses: such a file is
            # read from a private copy, made read-only, so that a write says so.
            opened = path
            if self.read_from_copy and _read_only(path):
                self._snapshot = _copy_to_read(path)
                opened = self._snapshot / path.name
            db = sqlite3.connect(opened, timeout=timeout, isolation_level=None,
                                 check_same_thread=not any_thread, factory=_Connection)
        except (sqlite3.Error, OSError) as err:
            self._remove_snapshot()
            raise self.damaged(err) from None
        except BaseException:  # Ctrl-C while copying or opening: no copy left behind
            self._remove_snapshot()
            raise
        assert isinstance(db, _Connection)
        db.file = self
        self._db: sqlite3.Connection = db
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(schema)  # idempotent; executescript commits on its own
        except sqlite3.DatabaseError as err:
            self.close()
            if _busy(err):
                raise
            raise self.damaged(err) from None
        except BaseException:  # StateFileError, Ctrl-C: no connection nor copy kept
            self.close()
            raise

    @property
    def read_only(self) -> bool:
        """Whether this file is read from a copy (its folder cannot be written)."""
        return self._snapshot is not None

    def refuse_writes(self) -> None:
        """From now on a write fails, as the file itself would fail it (a read-only one's
        copy: after a subclass brought the copy to the current schema)."""
        if self._snapshot is not None:
            self._db.execute("PRAGMA query_only = ON")

    def damaged(self, err: BaseException) -> StateFileError:
        """``err`` as this file's StateFileError."""
        return _damaged(self.path, self.what, self.fix, err)

    def close(self) -> None:
        if hasattr(self, "_db"):
            self._db.close()
        self._remove_snapshot()

    def _remove_snapshot(self) -> None:
        if self._snapshot is not None:
            shutil.rmtree(self._snapshot, ignore_errors=True)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        if self._db.in_transaction:  # nested: part of the outer one
            yield self._db
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
