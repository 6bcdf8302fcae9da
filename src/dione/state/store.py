"""The run store: one SQLite file per run directory with tasks, slices, metrics, checkpoints.

Only the launching process writes it (workers never do), every change is one
transaction, and a checkpoint is recorded only once its folder is complete, so a crash
at any moment leaves a consistent store whose latest checkpoint is usable.

A loss that is not finite ends its task as ``diverged``: the slice's metrics up to
that step are kept (NaN as NULL), its checkpoint is not, and the task keeps its last
finite checkpoint.

Each slice records whether it trained as single would (``inexactness``: how it did not,
under a technique the task allowed to be inexact). A pipeline's cut of a task into K
stages is decided once, by its first slice at K stages, and kept (``cuts``), so every
later slice, resume and re-plan of the task at K stages trains on the same stages.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shlex
import socket
import sqlite3
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dione import clock
from dione.spec.stopping import rule_key
from dione.state.lock import pid_alive
from dione.state.private import private_dir, private_file
from dione.state.sqlite import SQLiteFile, StateFileError

# How often a live launcher writes its beat to the store: a slice a kill -9 cuts short is
# recorded as ending there (at 5 s, a slice of 2 s read as 0.03 s long).
BEAT_SECONDS = 1.0

__all__ = ["EVALUATION_FAILED", "SIMULATED_FILE", "STORE_FILE", "Addition", "CheckpointRecord",
           "RunStore", "SliceRecord", "TaskRecord", "best_evaluation", "how_to_continue",
           "not_a_run"]

STORE_FILE = "dione.sqlite"
# How the error of a slice or task whose evaluation failed (its training stands) starts.
EVALUATION_FAILED = "evaluation failed"
# Marks a run directory a simulation wrote (``dione simulate``): every view says so.
SIMULATED_FILE = "simulated.json"
# PRAGMA user_version of the schema below; older files are brought to it on open.
_VERSION = 4

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    name TEXT PRIMARY KEY,
    total_steps INTEGER NOT NULL,
    batch_size INTEGER NOT NULL,
    hyperparameters TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'running', 'done', 'failed', 'diverged', 'stopped')),
    error TEXT,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS slices (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task TEXT NOT NULL REFERENCES tasks(name),
    technique TEXT NOT NULL,
    knobs TEXT NOT NULL,
    node TEXT NOT NULL,
    device_ids TEXT NOT NULL,
    start_step INTEGER NOT NULL,
    end_step INTEGER NOT NULL,
    status TEXT NOT NULL
        CHECK (status IN ('running', 'done', 'failed', 'interrupted', 'diverged')),
    started_at REAL NOT NULL,
    ended_at REAL,
    error TEXT,
    checkpoint TEXT,
    host TEXT NOT NULL,
    owner_pid INTEGER NOT NULL,
    timings TEXT,
    peak_memory_bytes INTEGER,
    inexactness TEXT,  -- NULL: trained as single would
    statistical TEXT  -- NULL: bitwise single's, else how only in distribution (dropout)
);
CREATE TABLE IF NOT EXISTS metrics (
    task TEXT NOT NULL,
    step INTEGER NOT NULL,
    slice_id INTEGER NOT NULL REFERENCES slices(id),
    loss REAL,  -- NULL: NaN, which SQLite cannot store (inf it can)
    seconds REAL NOT NULL,
    PRIMARY KEY (task, step)
);
CREATE TABLE IF NOT EXISTS checkpoints (
    task TEXT NOT NULL,
    step INTEGER NOT NULL,
    path TEXT NOT NULL,
    slice_id INTEGER NOT NULL REFERENCES slices(id),
    created_at REAL NOT NULL,
    PRIMARY KEY (task, step)
);
CREATE TABLE IF NOT EXISTS cuts (
    task TEXT NOT NULL,
    stages INTEGER NOT NULL,
    cut TEXT NOT NULL,  -- JSON: the blocks' names and each stage's [start, end)
    slice_id INTEGER NOT NULL REFERENCES slices(id),
    PRIMARY KEY (task, stages)
);
CREATE TABLE IF NOT EXISTS run (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evaluations (
    task TEXT NOT NULL,
    step INTEGER NOT NULL,
    metric TEXT NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (task, step, metric)
);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task TEXT NOT NULL REFERENCES tasks(name),
    rule TEXT NOT NULL,
    step INTEGER NOT NULL,
    metric TEXT NOT NULL,
    value REAL,
    stop INTEGER NOT NULL,
    reason TEXT NOT NULL,
    decided_at REAL NOT NULL,
    UNIQUE (task, rule, step)
);
-- A task waiting at a rung of a rule that holds it there (pausing ASHA, successive
-- halving) until the rule decides; its status stays pending. Gone with the decision.
CREATE TABLE IF NOT EXISTS paused (
    task TEXT PRIMARY KEY REFERENCES tasks(name),
    step INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS additions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload TEXT NOT NULL,  -- the workload file the tasks come from
    names TEXT NOT NULL,  -- JSON: the tasks of it to add
    state TEXT NOT NULL CHECK (state IN ('waiting', 'taken', 'refused')),
    message TEXT,  -- what the run made of them
    added_at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class TaskRecord:
    name: str
    total_steps: int
    batch_size: int
    hyperparameters: dict[str, Any]
    status: str
    error: str | None


@dataclass(frozen=True)
class SliceRecord:
    id: int
    task: str
    technique: str
    knobs: dict[str, Any]
    node: str
    device_ids: list[int]
    start_step: int
    end_step: int
    status: str
    started_at: float
    ended_at: float | None
    error: str | None
    checkpoint: str | None
    timings: dict[str, float]
    peak_memory_bytes: int | None
    inexactness: str | None = None  # how the slice did not train as single would
    # How it trained as single would in distribution only (dropout masks of its own).
    statistical: str | None = None

    @property
    def stalled(self) -> bool:
        """Cancelled as stalled (the run's cancel says so in its error; a stop does not):
        an attempt of its task's, whose ranks' stacks are in its logs."""
        return self.status == "interrupted" and "stalled" in (self.error or "")


@dataclass(frozen=True)
class Addition:
    """A request to add tasks to a run (``dione add``), and what the run made of it."""

    id: int
    workload: str
    names: list[str]
    state: str  # waiting | taken | refused
    message: str | None
    unreadable: str | None = None  # why its names could not be read (it names none)


@dataclass(frozen=True)
class CheckpointRecord:
    task: str
    step: int
    path: str

    @property
    def complete(self) -> bool:
        """Whether its folder is still complete on disk (its progress.json, written last)."""
        return (Path(self.path) / "progress.json").is_file()


def best_evaluation(points: Sequence[tuple[int, float]], mode: str) -> tuple[int, float]:
    """The best of (step, value) points (``mode`` "min": lowest); of equal values the
    later step (trained further)."""
    sign = 1 if mode == "min" else -1
    return min(points, key=lambda p: (sign * p[1], -p[0]))


def _loss(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _migrate(db: sqlite3.Connection) -> None:
    """Bring a store written by an older dione to the current schema, keeping every row:
    version 0 had no ``diverged`` status and a loss that could not be NaN (its tables
    are rebuilt), version 1 no record of a slice's exactness (a column is added: its
    slices trained exactly, or were xpipe's; see ``_old_inexactness``), version 2 no
    ``stopped`` status (the tasks table is rebuilt), version 3 no record of a slice
    trained as single would in distribution only (a column is added: NULL, unknown)."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > _VERSION:  # its tables may mean other things: reading them would guess
        file = db.execute("PRAGMA database_list").fetchone()[2]
        raise StateFileError(f"{file} was written by a newer dione (store schema {version}; "
                             f"this dione knows {_VERSION}): upgrade dione to use it")
    if version == _VERSION:
        return
    had = {row[1] for row in db.execute("PRAGMA table_info(slices)")}
    if version < 1:
        _rebuild_version_0(db)
    elif version < 3:
        _rebuild_tasks_with_stopped(db)
    if "inexactness" not in {row[1] for row in db.execute("PRAGMA table_info(slices)")}:
        db.execute("ALTER TABLE slices ADD COLUMN inexactness TEXT")
    if "inexactness" not in had:
        db.execute("UPDATE slices SET inexactness = ? WHERE technique = 'xpipe'",
                   (_OLD_XPIPE,))
    if "statistical" not in {row[1] for row in db.execute("PRAGMA table_info(slices)")}:
        db.execute("ALTER TABLE slices ADD COLUMN statistical TEXT")
    db.execute(f"PRAGMA user_version={_VERSION}")


# What a slice an older dione trained under xpipe is recorded as: asynchronous.
_OLD_XPIPE = "xpipe is asynchronous (recorded by an older dione, which kept no detail)"


def _rebuild_version_0(db: sqlite3.Connection) -> None:
    old = db.execute("SELECT sql FROM sqlite_master WHERE name = 'tasks'").fetchone()
    if old is not None and "diverged" not in old[0]:
        tables = ("tasks", "slices", "metrics")
        # Renames must not rewrite the foreign keys of the other tables.
        db.execute("PRAGMA foreign_keys=OFF")
        db.execute("PRAGMA legacy_alter_table=ON")
        db.execute("BEGIN IMMEDIATE")
        try:
            for table in tables:
                db.execute(f"ALTER TABLE {table} RENAME TO old_{table}")
            for statement in _SCHEMA.split(";"):
                if any(f"EXISTS {table} (" in statement for table in tables):
                    db.execute(statement)
            for table in tables:
                names = ", ".join(row[1] for row in db.execute(
                    f"PRAGMA table_info(old_{table})"))
                db.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM old_{table}")
            for table in reversed(tables):
                db.execute(f"DROP TABLE old_{table}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        db.execute("PRAGMA legacy_alter_table=OFF")
        db.execute("PRAGMA foreign_keys=ON")


def _rebuild_tasks_with_stopped(db: sqlite3.Connection) -> None:
    """The tasks table again, its status allowed to be ``stopped``, every row kept."""
    old = db.execute("SELECT sql FROM sqlite_master WHERE name = 'tasks'").fetchone()
    if old is None or "'stopped'" in old[0]:
        return
    db.execute("PRAGMA foreign_keys=OFF")
    db.execute("PRAGMA legacy_alter_table=ON")  # the other tables keep naming `tasks`
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("ALTER TABLE tasks RENAME TO old_tasks")
        db.execute(next(statement for statement in _SCHEMA.split(";")
                        if "EXISTS tasks (" in statement))
        names = ", ".join(row[1] for row in db.execute("PRAGMA table_info(old_tasks)"))
        db.execute(f"INSERT INTO tasks ({names}) SELECT {names} FROM old_tasks")
        db.execute("DROP TABLE old_tasks")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    db.execute("PRAGMA legacy_alter_table=OFF")
    db.execute("PRAGMA foreign_keys=ON")


class AlreadyInRun(ValueError):
    """Tasks asked to be added that the run has, or was asked for already."""

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(f"the run already has task(s) {', '.join(names)}")
        self.names = list(names)


class RunStore(SQLiteFile):
    """The SQLite file of one run directory (created on first use)."""

    what = "run store"
    fix = ("the checkpoints are kept: restore the file from a copy, or train the workload "
           "again in a new run directory")
    read_from_copy = True  # an archived run's status and export

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = private_dir(run_dir)
        path = self.run_dir / STORE_FILE
        wal = path.with_name(path.name + "-wal")
        if (path.is_file() and path.stat().st_size == 0
                and not (wal.is_file() and wal.stat().st_size)
                and ((self.run_dir / "checkpoints").is_dir()
                     or (self.run_dir / "run.json").is_file())):
            # An empty file would be taken for a new run: every task from step 0, over
            # the checkpoints of the one it held.
            raise StateFileError(f"{path} is empty, yet {self.run_dir} holds a run (its "
                                 f"checkpoints or run.json): it was cut to nothing; {self.fix}")
        super().__init__(path, _SCHEMA)
        try:
            if not self.read_only:
                private_file(self.path)
            _migrate(self._db)  # a read-only store's copy: an older one read as this one
        except BaseException:  # the connection closed, and a read-only store's copy gone
            self.close()
            raise
        self.refuse_writes()

    def __enter__(self) -> RunStore:
        return self

    # -- tasks -------------------------------------------------------------------------

    def register_task(
        self, name: str, total_steps: int, batch_size: int,
        hyperparameters: Mapping[str, Any] | None = None,
        settings: Mapping[str, str] | None = None, said_only: Collection[str] = (),
        kept: Collection[str] = (),
    ) -> TaskRecord:
        """Record a task, or check that a recorded one still has the same training: its
        steps, batch and ``settings`` (``dione.spec.settings.training_settings``: a
        notebook run again with another learning rate got the first rate's results),
        but for those in ``said_only``, which are recorded anew (the caller says the
        change: ``changed_settings`` before), unless also in ``kept``: no step reads
        their new value (``dione.spec.settings.kept_as_recorded``)."""
        existing = self.task(name)
        if existing is not None:
            if (existing.total_steps, existing.batch_size) != (total_steps, batch_size):
                raise ValueError(
                    f"task {name!r} was recorded in {self.run_dir} with {existing.total_steps} "
                    f"steps of batch {existing.batch_size}; it now says {total_steps} steps of "
                    f"batch {batch_size}: use a new run directory (or another task name) "
                    "for changed training, or put the task back as it was to resume it"
                )
            if settings is not None:
                recorded = self.training_settings(name)
                changed = self.changed_settings(
                    name, {k: v for k, v in settings.items() if k not in said_only})
                if changed and not self.slices(name):
                    # It never trained a step (its profiling trial diverged, say): a new
                    # task under the old name, its training and status taken anew.
                    self._set_run_value(f"training:{name}", dict(settings))
                    self.set_task_status(name, "pending")
                    return replace(existing, status="pending", error=None)
                if changed:
                    raise ValueError(
                        f"task {name!r} was recorded in {self.run_dir} with other training "
                        f"({'; '.join(changed)}): use a new run directory (or another task "
                        "name) for changed training"
                        # Put back, a diverged task diverges again (a review).
                        + (": a diverged task trains again under a new name only"
                           if existing.status == "diverged" else
                           ", or put the task back as it was to resume it"))
                # What the caller does not give stays (a slice records no model shapes:
                # it dropped the run's, once the model was said, not refused).
                stays = {k: v for k, v in recorded.items()
                         if k not in said_only or k not in settings or k in kept}
                if {**settings, **stays} != recorded:  # an older dione's record; said_only
                    self._set_run_value(f"training:{name}", {**settings, **stays})
            return existing
        with self._transaction() as db:
            db.execute(
                "INSERT INTO tasks (name, total_steps, batch_size, hyperparameters, updated_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (name, total_steps, batch_size,
                 json.dumps(dict(hyperparameters or {}), default=str), clock.now()),
            )
            if settings is not None:
                db.execute("INSERT OR REPLACE INTO run VALUES (?, ?)",
                           (f"training:{name}", json.dumps(dict(settings))))
        record = self.task(name)
        assert record is not None
        return record

    def training_settings(self, name: str) -> dict[str, str]:
        """The settings ``register_task`` recorded for task ``name`` (empty: none)."""
        return {str(k): str(v) for k, v in self._run_value(f"training:{name}").items()}

    def changed_settings(self, name: str, settings: Mapping[str, str]) -> list[str]:
        """Each of ``settings`` the store recorded otherwise for task ``name``, as
        ``name: recorded -> now`` (one it did not record, as an older dione, is not
        judged)."""
        recorded = self.training_settings(name)
        return [f"{k}: {recorded[k]} -> {v}" for k, v in settings.items()
                if k in recorded and recorded[k] != v]

    def task(self, name: str) -> TaskRecord | None:
        row = self._db.execute("SELECT * FROM tasks WHERE name = ?", (name,)).fetchone()
        return None if row is None else self._task(row)

    def tasks(self) -> list[TaskRecord]:
        return [self._task(r) for r in self._db.execute("SELECT * FROM tasks ORDER BY rowid")]

    def _task(self, row: sqlite3.Row) -> TaskRecord:
        try:
            return TaskRecord(row["name"], row["total_steps"], row["batch_size"],
                              json.loads(row["hyperparameters"]), row["status"], row["error"])
        except (ValueError, TypeError) as err:
            raise self.damaged(ValueError(f"a row of table tasks is garbage: {err}")) from None

    def set_task_status(self, name: str, status: str, error: str | None = None) -> None:
        with self._transaction() as db:
            db.execute("UPDATE tasks SET status = ?, error = ?, updated_at = ? WHERE name = ?",
                       (status, error, clock.now(), name))

    # -- stopping decisions ------------------------------------------------------------

    def set_paused(self, task: str, step: int) -> None:
        """``task`` waits at rung ``step`` for its rule's decision (``record_decision``
        ends the wait)."""
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO paused (task, step) VALUES (?, ?)",
                       (task, step))

    def paused(self) -> dict[str, int]:
        """The tasks waiting at a rung for their rule's decision, and the rung."""
        return {task: int(step) for task, step in
                self._db.execute("SELECT task, step FROM paused")}

    def record_decision(self, task: str, rule: str, step: int, metric: str,
                        value: float, stop: bool, reason: str) -> None:
        """A stopping rule's decision for ``task`` at ``step`` (a stop also stops the
        task, in the same transaction; a wait at the rung ends)."""
        with self._transaction() as db:
            db.execute("DELETE FROM paused WHERE task = ?", (task,))
            db.execute("INSERT OR REPLACE INTO decisions (task, rule, step, metric, value, "
                       "stop, reason, decided_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (task, rule, step, metric, value if math.isfinite(value) else None,
                        int(stop), reason, clock.now()))
            if stop:
                db.execute("UPDATE tasks SET status = 'stopped', error = ?, updated_at = ? "
                           "WHERE name = ?", (reason, clock.now(), task))

    def decisions(self, rules: Collection[str] | None = None
                  ) -> list[tuple[str, int, float, bool, str]]:
        """(task, step, value, stop, reason) of every decision (of the rules of keys
        ``rules``, as ``rule_key`` makes them), in the order they were made."""
        if isinstance(rules, str):  # one key, not its characters
            rules = {rules}
        rows = self._db.execute(
            "SELECT task, step, value, stop, reason, rule FROM decisions ORDER BY id")
        # Keys compared as ``rule_key`` makes them of the stored text: a store of the
        # version before holds each rule's raw repr (an address, a workload module).
        return [(t, step, _loss(v), bool(stop), reason)
                for t, step, v, stop, reason, by in rows
                if rules is None or rule_key(by) in rules]

    def decided_rules(self, task: str) -> set[str]:
        """The keys of the stopping rules (``rule_key``) under which ``task`` was judged."""
        return {rule_key(rule) for (rule,) in self._db.execute(
            "SELECT DISTINCT rule FROM decisions WHERE task = ?", (task,))}

    # -- tasks added to a live run (``dione add``) ---------------------------------------

    def add_tasks(self, workload: str, names: Sequence[str], *,
                  unless_present: bool = False) -> int:
        """Ask the run to take tasks ``names`` of workload file ``workload``; the
        request's id (its state ``waiting`` until the run takes or refuses it).
        ``unless_present``: AlreadyInRun where the run has one of the names, or was
        asked for it and has not refused (checked and recorded in one transaction: two
        `dione add`s of one file at once both passed a check made before)."""
        with self._transaction() as db:
            if unless_present:
                have = self.names_taken()
                already = [n for n in names if n in have]
                if already:
                    raise AlreadyInRun(already)
            cursor = db.execute(
                "INSERT INTO additions (workload, names, state, added_at) VALUES "
                "(?, ?, 'waiting', ?)", (workload, json.dumps(list(names)), clock.now()))
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def names_taken(self) -> set[str]:
        """The task names the run has, or was asked to add and has not refused."""
        return {t.name for t in self.tasks()} | {
            n for a in self.additions("waiting", "taken") for n in a.names}

    def additions(self, *states: str) -> list[Addition]:
        """The requests to add tasks (in ``states``, else all), in the order made."""
        where = f" WHERE state IN ({', '.join('?' * len(states))})" if states else ""
        rows = self._db.execute(f"SELECT * FROM additions{where} ORDER BY id", states)
        return [self._addition(r) for r in rows]

    def _addition(self, row: sqlite3.Row) -> Addition:
        """A request as recorded; one whose names cannot be read (a damaged row, one a
        script wrote) names no task, and says why, for the run to refuse it and go on."""
        try:
            names = json.loads(row["names"])
            if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
                raise ValueError(f"not a list of names: {row['names']!r:.80}")
        except (ValueError, TypeError) as err:
            return Addition(row["id"], str(row["workload"]), [], row["state"],
                            row["message"], unreadable=f"its record is unreadable ({err})")
        return Addition(row["id"], row["workload"], names, row["state"], row["message"])

    def addition_of(self, task: str) -> Addition | None:
        """The request the run took ``task`` from (the latest, should two name it)."""
        return next((a for a in reversed(self.additions("taken")) if task in a.names), None)

    def settle_addition(self, id: int, state: str, message: str) -> None:
        """Record what the run made of request ``id``: ``taken`` or ``refused``."""
        with self._transaction() as db:
            db.execute("UPDATE additions SET state = ?, message = ? WHERE id = ?",
                       (state, message, id))

    # -- slices ------------------------------------------------------------------------

    def begin_slice(
        self, task: str, technique: str, knobs: Mapping[str, Any], node: str,
        device_ids: Sequence[int], start_step: int, end_step: int,
        inexactness: str | None = None,
    ) -> int:
        """Record a slice as running; returns its id. ``inexactness``: how it will not
        train as single would (None: it will)."""
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO slices (task, technique, knobs, node, device_ids, start_step,"
                " end_step, status, started_at, host, owner_pid, inexactness)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)",
                (task, technique, json.dumps(dict(knobs), sort_keys=True), node,
                 json.dumps(list(device_ids)), start_step, end_step, clock.now(),
                 socket.gethostname(), os.getpid(), inexactness),
            )
            db.execute("UPDATE tasks SET status = 'running', error = NULL, updated_at = ?"
                       " WHERE name = ? AND status != 'done'", (clock.now(), task))
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def finish_slice(
        self, slice_id: int, losses: Sequence[float], step_seconds: Sequence[float],
        checkpoint: str | None, timings: Mapping[str, float] | None = None,
        peak_memory_bytes: int | None = None, evaluation: Mapping[str, float] | None = None,
        evaluation_error: str | None = None, statistical: str | None = None,
    ) -> None:
        """In one transaction: the slice's metrics, checkpoint, evaluation and status
        (``evaluation_error``: why its evaluation failed, kept as the done slice's error
        and the task's after ``EVALUATION_FAILED``; its training stands; ``statistical``:
        how it trained as single would in distribution only)."""
        record = self.slice(slice_id)
        # Said here once, so a simulated slice's reads as a real one's (it lacked it).
        error = evaluation_error and f"{EVALUATION_FAILED}:\n{evaluation_error}"
        with self._transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO metrics (task, step, slice_id, loss, seconds)"
                " VALUES (?, ?, ?, ?, ?)",
                [(record.task, record.start_step + i + 1, slice_id, loss, sec)
                 for i, (loss, sec) in enumerate(zip(losses, step_seconds, strict=True))],
            )
            stored = None if checkpoint is None else self._stored(checkpoint)
            if stored is not None:
                db.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?)",
                           (record.task, record.end_step, stored, slice_id, clock.now()))
            db.executemany("INSERT OR REPLACE INTO evaluations VALUES (?, ?, ?, ?)",
                           [(record.task, record.end_step, k, float(v))
                            for k, v in (evaluation or {}).items()
                            if math.isfinite(v)])  # NaN or inf: no figure to keep
            db.execute(
                "UPDATE slices SET status = 'done', ended_at = ?, checkpoint = ?, timings = ?,"
                " peak_memory_bytes = ?, error = ?, statistical = ? WHERE id = ?",
                (clock.now(), stored, json.dumps(dict(timings or {})), peak_memory_bytes,
                 error, statistical, slice_id),
            )
            total = db.execute("SELECT total_steps FROM tasks WHERE name = ?",
                               (record.task,)).fetchone()[0]
            status = "done" if record.end_step >= total else "pending"
            db.execute("UPDATE tasks SET status = ?, error = ?, updated_at = ? WHERE name = ?",
                       (status, error, clock.now(), record.task))

    def diverge_slice(
        self, slice_id: int, losses: Sequence[float], step_seconds: Sequence[float], error: str,
    ) -> None:
        """In one transaction: a slice whose loss stopped being finite. Its metrics up to
        and including the first such step are kept, its checkpoint is not; the slice
        and its task end ``diverged`` with ``error``."""
        record = self.slice(slice_id)
        with self._transaction() as db:
            db.executemany(
                "INSERT OR REPLACE INTO metrics (task, step, slice_id, loss, seconds)"
                " VALUES (?, ?, ?, ?, ?)",
                [(record.task, record.start_step + i + 1, slice_id,
                  None if math.isnan(loss) else loss, sec)
                 for i, (loss, sec) in enumerate(zip(losses, step_seconds, strict=True))],
            )
            db.execute("UPDATE slices SET status = 'diverged', ended_at = ?, error = ?"
                       " WHERE id = ?", (clock.now(), error, slice_id))
            db.execute("UPDATE tasks SET status = 'diverged', error = ?, updated_at = ?"
                       " WHERE name = ?", (error, clock.now(), record.task))

    def fail_slice(self, slice_id: int, error: str, status: str = "failed",
                   ended_at: float | None = None) -> None:
        """Record why a slice ended without a checkpoint (``ended_at``: when, default
        now); its task goes back to pending."""
        record = self.slice(slice_id)
        with self._transaction() as db:
            db.execute("UPDATE slices SET status = ?, ended_at = ?, error = ? WHERE id = ?",
                       (status, clock.now() if ended_at is None else ended_at, error,
                        slice_id))
            db.execute("UPDATE tasks SET status = 'pending', updated_at = ?"
                       " WHERE name = ? AND status = 'running'", (clock.now(), record.task))

    def recover_interrupted(self) -> list[int]:
        """Mark running slices whose launching process is gone as interrupted, ended when
        the store last heard from the run (the launcher lived at least so long; not now,
        which drew a slice killed in its first second over the whole downtime)."""
        host = socket.gethostname()
        stale = [(row["id"], row["started_at"]) for row in self._db.execute(
            "SELECT id, host, owner_pid, started_at FROM slices WHERE status = 'running'")
            if row["host"] == host and not pid_alive(row["owner_pid"])]
        heard = self.last_heard()
        for slice_id, started_at in stale:
            self.fail_slice(slice_id, "the launching process died before the slice ended",
                            status="interrupted", ended_at=max(heard, started_at))
        return [slice_id for slice_id, _ in stale]

    def set_profiling(self, tasks: int | None) -> None:
        """Say that the run profiles ``tasks`` tasks now (None: it no longer does), for
        `dione status` while the store knows no task yet."""
        self._set_run_value("profiling", {} if tasks is None else
                            {"tasks": tasks, "since": clock.now()})

    def started_by_a_run(self) -> bool:
        """Whether ``dione run`` / ``dione.run`` started this directory (it says when it
        profiles), not ``dione train``."""
        return self._db.execute("SELECT 1 FROM run WHERE key = 'profiling'").fetchone() \
            is not None

    def profiling(self) -> dict[str, Any]:
        """``set_profiling``'s tasks and start (empty: not profiling)."""
        return self._run_value("profiling")

    def beat_every(self, seconds: float = 0.0) -> Callable[..., None]:
        """A callback (a slice's ``on_progress``, called in this store's thread) that
        beats at most every ``seconds`` (default ``BEAT_SECONDS``)."""
        every = seconds or BEAT_SECONDS
        last = [0.0]

        def beat(*_: Any) -> None:
            if clock.now() - last[0] >= every:
                last[0] = clock.now()
                self.beat()

        return beat

    def beat(self) -> None:
        """Say that the run's launcher lives now: a slice a kill -9 cuts short ends at
        the launcher's last beat, not at its own start (the latest slice start or end
        before the kill, which drew a slice of seconds as a sliver of none)."""
        self._set_run_value("heard", {"at": clock.now()})

    def last_heard(self) -> float:
        """The latest time the store holds of the run's doing (a slice's start or end, a
        task's status, a decision, the launcher's beat); 0.0 for an empty store."""
        row = self._db.execute(
            "SELECT MAX(t) FROM (SELECT MAX(started_at) AS t FROM slices UNION ALL "
            "SELECT MAX(ended_at) FROM slices UNION ALL SELECT MAX(updated_at) FROM tasks "
            "UNION ALL SELECT MAX(decided_at) FROM decisions)").fetchone()
        beat = self._run_value("heard").get("at")
        return max(float(row[0] or 0.0), float(beat) if isinstance(beat, (int, float)) else 0.0)

    def slice(self, slice_id: int) -> SliceRecord:
        row = self._db.execute("SELECT * FROM slices WHERE id = ?", (slice_id,)).fetchone()
        if row is None:
            raise KeyError(f"no slice {slice_id} in {self.path}")
        return self._slice(row)

    def slices(self, task: str | None = None) -> list[SliceRecord]:
        if task is None:
            rows = self._db.execute("SELECT * FROM slices ORDER BY id")
        else:
            rows = self._db.execute("SELECT * FROM slices WHERE task = ? ORDER BY id", (task,))
        return [self._slice(r) for r in rows]

    def _slice(self, row: sqlite3.Row) -> SliceRecord:
        try:
            return self._decode_slice(row)
        except (ValueError, TypeError) as err:
            raise self.damaged(ValueError(f"a row of table slices is garbage: {err}")) from None

    def _decode_slice(self, row: sqlite3.Row) -> SliceRecord:
        return SliceRecord(
            row["id"], row["task"], row["technique"], json.loads(row["knobs"]), row["node"],
            json.loads(row["device_ids"]), row["start_step"], row["end_step"], row["status"],
            row["started_at"], row["ended_at"], row["error"],
            None if row["checkpoint"] is None else self._resolved(row["checkpoint"]),
            json.loads(row["timings"] or "{}"), row["peak_memory_bytes"], row["inexactness"],
            row["statistical"],
        )

    # -- the run ---------------------------------------------------------------------

    def set_invalid(self, problems: Mapping[str, Sequence[str]]) -> None:
        """The workload's tasks that validation refused when this run (or its latest
        resume) started, each with its problems: never registered, never trained."""
        self._set_run_value("invalid", {k: list(v) for k, v in problems.items()})

    def invalid(self) -> dict[str, list[str]]:
        """``set_invalid``'s tasks and problems (empty: every task was valid)."""
        return {str(k): list(v) for k, v in self._run_value("invalid").items()}

    def add_directions(self, directions: Mapping[str, str]) -> None:
        """Which way each metric is better ("min" or "max"), as the tasks' stopping
        rules (or an Optuna study) judge it, for the leaderboards; a metric already
        recorded keeps its first direction."""
        known = self.directions()
        fresh = {m: d for m, d in directions.items() if m not in known}
        if fresh:
            self._set_run_value("directions", dict(sorted({**known, **fresh}.items())))

    def directions(self) -> dict[str, str]:
        """``add_directions``'s metrics and their directions (empty: none recorded)."""
        return {str(k): str(v) for k, v in self._run_value("directions").items()}

    def checkpoints_elsewhere(self, task: str) -> bool:
        """Whether ``task``'s checkpoints were written outside the run directory (a
        ``--storage``: one not mounted looks like checkpoints gone)."""
        root = self.run_dir.resolve()
        return any(not Path(c.path).resolve().is_relative_to(root)
                   for c in self.checkpoints(task))

    def optuna_study(self) -> dict[str, Any]:
        """The Optuna study whose trials the run trains (``dione.optuna``): its id and
        name; empty where none was recorded."""
        return self._run_value("optuna_study")

    def set_optuna_study(self, study: Mapping[str, Any]) -> None:
        self._set_run_value("optuna_study", study)

    def verified_checkpoints(self) -> dict[str, Any]:
        """Per checkpoint folder verified whole against its digests, its files' sizes and
        times then (``keep_verified``): unchanged since, it need not be read again."""
        return self._run_value("verified_checkpoints")

    def keep_verified(self, path: str, files: Any) -> None:
        """Record that ``path`` matched its digests with its files as ``files`` says."""
        self._set_run_value("verified_checkpoints",
                            {**self.verified_checkpoints(), path: files})

    def _set_run_value(self, key: str, value: Mapping[str, Any]) -> None:
        """A JSON object kept under ``key`` in the run's own table."""
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO run VALUES (?, ?)",
                       (key, json.dumps(value)))

    def _run_value(self, key: str) -> dict[str, Any]:
        """``_set_run_value``'s object under ``key`` (empty: none kept)."""
        row = self._db.execute("SELECT value FROM run WHERE key = ?", (key,)).fetchone()
        return {} if row is None else dict(json.loads(row[0]))

    @property
    def run_id(self) -> str:
        """A random name of this run, made once: its checkpoints' folder in a storage
        other runs share (``checkpoint_root``)."""
        row = self._db.execute("SELECT value FROM run WHERE key = 'id'").fetchone()
        if row is not None:
            return str(row[0])
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO run VALUES ('id', ?)", (secrets.token_hex(8),))
        return str(self._db.execute("SELECT value FROM run WHERE key = 'id'").fetchone()[0])

    def checkpoint_root(self, storage: str | Path | None) -> Path:
        """Where this run's checkpoints go: the run directory itself, or, in a storage
        other than it (``--storage``), a folder of this run's own (``runs/<run_id>``),
        so that two runs sharing one storage never touch each other's checkpoints."""
        here = self.run_dir.resolve()
        if storage is None or Path(storage).resolve() == here:
            return here
        return Path(storage).resolve() / "runs" / self.run_id

    # -- pipeline cuts -----------------------------------------------------------------

    def cut(self, task: str, stages: int) -> dict[str, Any] | None:
        """The cut of ``task`` into ``stages`` pipeline stages its first such slice
        decided (``{"names": [...], "bounds": [[start, end], ...]}``), if any."""
        row = self._db.execute("SELECT cut FROM cuts WHERE task = ? AND stages = ?",
                               (task, stages)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def keep_cut(self, task: str, stages: int, cut: Mapping[str, Any], slice_id: int) -> None:
        """Keep ``cut`` as the task's cut into ``stages`` stages, unless one is kept."""
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO cuts VALUES (?, ?, ?, ?)",
                       (task, stages, json.dumps(dict(cut), sort_keys=True), slice_id))

    # -- metrics, checkpoints, evaluations ---------------------------------------------

    # (Rows are fetched whole: the cursor's checked iteration costs microseconds a row,
    # seconds for a long run's million steps.)
    def losses(self, task: str) -> list[tuple[int, float]]:
        """(step, loss) of every step trained so far, in order."""
        return [(r[0], _loss(r[1])) for r in self._db.execute(
            "SELECT step, loss FROM metrics WHERE task = ? ORDER BY step", (task,)).fetchall()]

    def mean_loss(self, task: str, window: int, up_to: int | None = None) -> float | None:
        """The mean of the task's last ``window`` losses (of steps up to ``up_to``):
        its "loss" at a rung and at its end, as stopping rules and Optuna judge it
        (None: no step trained)."""
        rows = self._db.execute(
            "SELECT loss FROM metrics WHERE task = ? AND step <= ? ORDER BY step DESC "
            "LIMIT ?", (task, 2**62 if up_to is None else up_to, window)).fetchall()
        losses = [_loss(r[0]) for r in reversed(rows)]  # summed in step order, as before
        return sum(losses) / len(losses) if losses else None

    def last_loss(self, task: str) -> float | None:
        """The loss of the last step trained so far (None: none trained)."""
        row = self._db.execute("SELECT loss FROM metrics WHERE task = ? ORDER BY step DESC "
                               "LIMIT 1", (task,)).fetchone()
        return None if row is None else _loss(row[0])

    def loss_curve(self, task: str, points: int) -> list[tuple[int, float]]:
        """The loss curve in at most about ``points`` points: every step where it has no
        more, else each window of steps as (its last step, its mean loss; NaN if any
        step's was). For a figure: a long run's million steps in a few thousand."""
        count, last = self._db.execute("SELECT COUNT(*), MAX(step) FROM metrics "
                                       "WHERE task = ?", (task,)).fetchone()
        if not count or count <= points:
            return self.losses(task)
        width = -(-int(last) // points)
        return [(r[0], math.nan if r[2] else _loss(r[1])) for r in self._db.execute(
            "SELECT MAX(step), AVG(loss), SUM(loss IS NULL) FROM metrics WHERE task = ? "
            "GROUP BY (step - 1) / ? ORDER BY 1", (task, width)).fetchall()]

    def metrics(self, task: str, after: int = 0) -> list[tuple[int, float, float]]:
        """(step, loss, step seconds) of every step trained so far past step ``after``
        (a reader that keeps up reads only what is new), in order."""
        return [(r[0], _loss(r[1]), r[2]) for r in self._db.execute(
            "SELECT step, loss, seconds FROM metrics WHERE task = ? AND step > ? "
            "ORDER BY step", (task, after)).fetchall()]

    def slice_step_seconds(self, slice_id: int) -> list[float]:
        """Each step's seconds in one slice, in order."""
        return [r[0] for r in self._db.execute(
            "SELECT seconds FROM metrics WHERE slice_id = ? ORDER BY step", (slice_id,))]

    def checkpoints(self, task: str) -> list[CheckpointRecord]:
        return [CheckpointRecord(task, r[0], self._resolved(r[1])) for r in self._db.execute(
            "SELECT step, path FROM checkpoints WHERE task = ? ORDER BY step", (task,))]

    def latest_checkpoint(self, task: str) -> CheckpointRecord | None:
        """The newest recorded checkpoint whose folder is still complete on disk."""
        return next((r for r in reversed(self.checkpoints(task)) if r.complete), None)

    def best_checkpoint(self, task: str, metric: str,
                        mode: str) -> tuple[CheckpointRecord, float] | None:
        """The recorded checkpoint, complete on disk, at the step whose evaluation of
        ``metric`` was best (``mode`` "min": lowest), with that value; of equal values the
        later step (trained further). None: no checkpoint is at an evaluated step."""
        values = dict(self.evaluations(task).get(metric, []))
        kept = {c.step: c for c in self.checkpoints(task) if c.step in values and c.complete}
        if not kept:
            return None
        step, value = best_evaluation([(s, values[s]) for s in kept], mode)
        return kept[step], value

    def set_keep_best(self, task: str, metric: str | None, mode: str | None) -> None:
        """The metric and direction (``Task.keep_best``) the task's checkpoints are pruned
        by now (None, None: by none, once they were), kept for export and load, whatever
        the workload says later."""
        self._set_run_value(f"keep_best:{task}", {"metric": metric, "mode": mode})

    def keep_best(self, task: str) -> tuple[str | None, str | None] | None:
        """``set_keep_best``'s metric and direction for ``task``: (None, None) where it
        was pruned by one and is by none now; None where none was ever recorded."""
        kept = self._run_value(f"keep_best:{task}")
        if not kept:
            return None
        metric, mode = kept.get("metric"), kept.get("mode")
        return (str(metric), str(mode)) if metric and mode else (None, None)

    def forget_checkpoints(self, task: str, paths: Sequence[str]) -> None:
        with self._transaction() as db:
            db.executemany("DELETE FROM checkpoints WHERE task = ? AND path IN (?, ?)",
                           [(task, p, self._stored(p)) for p in paths])

    # A checkpoint inside the run directory is kept by its path relative to it, so the
    # directory can be moved or copied (to shared storage, another machine) and still
    # resume; one elsewhere (``--storage``), and any an older dione wrote, by the
    # absolute path.

    def _stored(self, path: str) -> str:
        """How the store keeps a checkpoint's path."""
        try:
            return Path(path).resolve().relative_to(self.run_dir.resolve()).as_posix()
        except ValueError:
            return path

    def _resolved(self, stored: str) -> str:
        """A kept checkpoint path as the folder it names now."""
        return stored if Path(stored).is_absolute() else str(self.run_dir.resolve() / stored)

    def record_evaluation(self, task: str, step: int, metrics: Mapping[str, float]) -> None:
        """``task``'s metrics at ``step`` evaluated apart from a slice (``dione
        evaluate``), each replacing its value recorded there before (one not finite is
        kept out, as a slice's is, and leaves that one); the failed evaluation its task
        and that step's slice recorded is cleared, but no time is touched (a run killed
        before reads its slices' ends from the times the store heard it last)."""
        finite = {k: float(v) for k, v in metrics.items() if math.isfinite(v)}
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO evaluations VALUES (?, ?, ?, ?)",
                           [(task, step, k, v) for k, v in finite.items()])
            if finite:
                db.execute("UPDATE tasks SET error = NULL WHERE name = ? AND error LIKE ?",
                           (task, f"{EVALUATION_FAILED}%"))
                # A done slice's error is its evaluation's (finish_slice).
                db.execute("UPDATE slices SET error = NULL WHERE task = ? AND end_step = ? "
                           "AND status = 'done'", (task, step))

    def evaluations(self, task: str) -> dict[str, list[tuple[int, float]]]:
        """Per metric, (step, value) of every evaluation of the task, by step."""
        found: dict[str, list[tuple[int, float]]] = {}
        for step, metric, value in self._db.execute(
                "SELECT step, metric, value FROM evaluations WHERE task = ? ORDER BY step",
                (task,)):
            found.setdefault(metric, []).append((step, value))
        return found

    def evaluation(self, task: str) -> dict[str, float]:
        """The metrics of the task's latest evaluation."""
        return self.latest_evaluation(task)[1]

    def latest_evaluation(self, task: str) -> tuple[int | None, dict[str, float]]:
        """The step of the task's latest evaluation (None: none) and its metrics: an
        earlier step than the task trained to where a later evaluation failed or the
        task was stopped between evaluations."""
        rows = self._db.execute(
            "SELECT step, metric, value FROM evaluations WHERE task = ? AND step ="
            " (SELECT MAX(step) FROM evaluations WHERE task = ?)", (task, task)).fetchall()
        return (rows[0][0] if rows else None), {r[1]: r[2] for r in rows}


TRAIN_FOLDER = ("it is a `dione train` folder: `dione train WORKLOAD --task TASK --out "
                "{run}` trains a task on from its latest checkpoint")


def not_a_run(run_dir: str | Path) -> str:
    """Why ``run_dir`` holds no run store, as a message's start: it does not exist, it is
    a file, or it lacks the store (a folder that was never there read as one that is not
    a run's: a review)."""
    path = Path(run_dir)
    if not path.exists():
        return f"{run_dir} does not exist"
    if not path.is_dir():
        return f"{run_dir} is a file, not a folder"
    return f"{run_dir} is not a dione run directory (no {STORE_FILE})"


def how_to_continue(run_dir: str | Path) -> str:
    """What continues the run in ``run_dir``, as a sentence's subject ("... continues
    it"): ``dione resume`` for a run the CLI started (its run.json; ``dione run
    --current-practice`` for one it started so), ``dione train`` for
    its folder, the same Python call for a run ``dione.run`` started (no run.json:
    `dione resume` refused it)."""
    run = Path(run_dir)
    if (run / "run.json").is_file():
        try:
            saved = json.loads((run / "run.json").read_text())
        except (OSError, ValueError):
            saved = {}
        forced = saved.get("current_practice") if isinstance(saved, dict) else None
        if isinstance(forced, str):  # `dione run --current-practice`: resume refuses it
            return (f"`dione run {shlex.quote(str(saved.get('workload')))} "
                    f"--current-practice{' --technique ' + forced if forced else ''}"
                    + (f" --devices {saved['devices']}" if saved.get("devices") else "")
                    + f" --out {shlex.quote(str(run))}`")
        return f"`dione resume {shlex.quote(str(run))}`"
    if trained_by_train(run):
        return f"`dione train WORKLOAD --task TASK --out {shlex.quote(str(run))}`"
    return "calling dione.run (or dione.optuna.optimize) again with this run directory"


def trained_by_train(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` is a ``dione train`` folder (a store, and no run started it:
    no run.json, no plans, no profiling said)."""
    run = Path(run_dir)
    if not (run / STORE_FILE).is_file() or (run / "run.json").exists() \
            or (run / "plans").exists():
        return False
    with RunStore(run) as store:
        return not store.started_by_a_run()
