"""An SQLite file as dione keeps them: WAL, explicit immediate transactions, closable."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["SQLiteFile"]


class SQLiteFile:
    """One SQLite file with its schema applied; a context manager that closes it.

    Autocommit mode: every change goes through ``_transaction`` (BEGIN IMMEDIATE, so
    writers queue instead of failing), and a nested ``_transaction`` is part of the
    outer one. WAL lets readers in other processes read while one writes.
    """

    def __init__(self, path: Path, schema: str, *, timeout: float = 60.0,
                 any_thread: bool = False) -> None:
        self.path = path
        self._db = sqlite3.connect(path, timeout=timeout, isolation_level=None,
                                   check_same_thread=not any_thread)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(schema)  # idempotent; executescript commits on its own

    def close(self) -> None:
        self._db.close()

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
