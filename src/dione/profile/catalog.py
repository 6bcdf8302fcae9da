"""The catalog: one SQLite file of trial results keyed by fingerprint, shared by workloads.

A trial is stored once it has finished, feasible or not (out of memory, crash,
timeout, each with its reason), so a second profile of the same workload runs none.
Trials skipped for a reason of the moment (the profiling budget ran out) are not
stored: the next profile runs them.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dione.state.private import private_dir, private_file
from dione.state.sqlite import SQLiteFile, StateFileError

__all__ = ["Catalog", "TrialRecord", "default_catalog_path"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trials (
    fingerprint TEXT PRIMARY KEY,
    record TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS evaluation_costs (
    key TEXT PRIMARY KEY,
    seconds REAL NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS evaluation_returns (
    key TEXT PRIMARY KEY,
    arguments TEXT NOT NULL,
    metrics TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""
# evaluation_returns: the names of the metrics an evaluation returned when it was timed,
# and the arguments of the partial it was (the key leaves them out); a table of its
# own: an older dione writes evaluation_costs rows of three columns.


def default_catalog_path() -> Path:
    """``$DIONE_CATALOG``, else ``~/.cache/dione/catalog.sqlite`` (shared by workloads)."""
    if os.environ.get("DIONE_CATALOG"):
        return Path(os.environ["DIONE_CATALOG"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "dione" / "catalog.sqlite"


@dataclass
class TrialRecord:
    """One trial's measurements; ``status`` ok | oom | crash | timeout | diverged
    (never stored, as node_lost)
    (a diverged trial is never stored: it depends on the learning rate).

    A slice of N steps is predicted as ``fixed_seconds + warmup_excess_seconds +
    N * step_seconds`` plus ``load_seconds`` when it resumes from a checkpoint:
    ``fixed_seconds`` is the trial's wall time less its steps, its load probe and the
    imports a worker's first slice of the workload pays once (process start, data,
    model build, checkpoint save, exit), all measured.
    """

    fingerprint: str
    technique: str
    knobs: dict[str, Any]
    devices: int
    device: str
    status: str
    reason: str | None = None
    step_seconds: float | None = None  # mean over the measured steps
    spread: float | None = None  # interquartile range / median of the measured steps
    measured_steps: int = 0
    warmup_excess_seconds: float = 0.0
    fixed_seconds: float = 0.0
    load_seconds: float = 0.0
    save_seconds: float = 0.0
    peak_memory_bytes: int | None = None
    trial_seconds: float = 0.0
    simulated_step_seconds: float | None = None  # the schedule simulator's, for pipelines
    simulation_note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.status == "ok"

    def slice_seconds(self, steps: int, resumed: bool = False) -> float:
        """Predicted seconds for a slice of ``steps`` steps under this configuration."""
        if self.step_seconds is None:
            raise ValueError(f"trial {self.fingerprint[:12]} is {self.status}: no prediction")
        return (self.fixed_seconds + self.warmup_excess_seconds + steps * self.step_seconds
                + (self.load_seconds if resumed else 0.0))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> TrialRecord:
        """The record ``data`` holds; ValueError where its times cannot be a trial's
        (a catalog edited or copied by hand: a negative time made every slice end
        before it began, and so every task look stalled)."""
        record = TrialRecord(**data)
        times = {name: getattr(record, name) for name in _TIMES}
        for name, value in times.items():
            if value is not None and not (isinstance(value, (int, float))
                                          and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} {value!r} is not a time")
        if record.feasible and not times["step_seconds"]:
            raise ValueError("a feasible trial without a step time")
        return record


# A record's times: each a finite number of seconds, never negative (None: not measured).
_TIMES = ("step_seconds", "spread", "warmup_excess_seconds", "fixed_seconds", "load_seconds",
          "save_seconds", "trial_seconds", "simulated_step_seconds")


class Catalog(SQLiteFile):
    """Trial results and evaluation costs in one SQLite file, shared by workloads."""

    what = "catalog"
    fix = ("move it aside (the next profile measures again), or point --catalog or "
           "$DIONE_CATALOG at another file")

    def __init__(self, path: str | Path | None = None) -> None:
        path = Path(path) if path is not None else default_catalog_path()
        try:
            if not path.parent.exists():
                private_dir(path.parent)
            if path.exists() and not path.is_file():
                raise IsADirectoryError(f"{path} is not a file")
        except OSError as err:
            raise StateFileError(f"{path} cannot be used as dione's catalog ({err}); "
                                 "point --catalog or $DIONE_CATALOG at a file in a folder "
                                 "you can write") from None
        super().__init__(path, _SCHEMA, timeout=30.0, any_thread=True)
        private_file(path)

    def __enter__(self) -> Catalog:
        return self

    @staticmethod
    def _record(text: str) -> TrialRecord | None:
        """A stored record, or None for one that cannot be read back (a garbage row is a
        trial to run again, which overwrites it)."""
        try:
            return TrialRecord.from_json(json.loads(text))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None

    def get(self, fingerprint: str) -> TrialRecord | None:
        row = self._db.execute("SELECT record FROM trials WHERE fingerprint = ?",
                               (fingerprint,)).fetchone()
        return self._record(row[0]) if row else None

    def put(self, record: TrialRecord) -> None:
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO trials VALUES (?, ?, ?)",
                       (record.fingerprint, json.dumps(record.to_json()), time.time()))

    def records(self) -> list[TrialRecord]:
        rows = self._db.execute("SELECT record FROM trials ORDER BY created_at").fetchall()
        return [r for r in (self._record(row[0]) for row in rows) if r is not None]

    def evaluation_seconds(self, key: str) -> float | None:
        row = self._db.execute("SELECT seconds FROM evaluation_costs WHERE key = ?",
                               (key,)).fetchone()
        try:
            seconds = float(row[0]) if row else None
        except (TypeError, ValueError):
            return None
        # One that cannot be a cost (edited by hand) is measured again, as a missing one.
        return seconds if seconds is not None and math.isfinite(seconds) and seconds >= 0 \
            else None

    def put_evaluation_seconds(self, key: str, seconds: float,
                               metrics: tuple[str, ...] | None = None,
                               arguments: str = "") -> None:
        """The evaluation's cost, and the names of the metrics it returned then (with
        ``arguments``, its partial's; none known: any kept before go)."""
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO evaluation_costs VALUES (?, ?, ?)",
                       (key, seconds, time.time()))
            if metrics is None:
                db.execute("DELETE FROM evaluation_returns WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO evaluation_returns VALUES (?, ?, ?, ?)",
                           (key, arguments, json.dumps(sorted(metrics)), time.time()))

    def evaluation_metrics(self, key: str, arguments: str = "") -> tuple[str, ...] | None:
        """The names of the metrics the evaluation returned when it was timed, where its
        partial's ``arguments`` were these (None: not known, or not readable)."""
        row = self._db.execute("SELECT metrics FROM evaluation_returns WHERE key = ? AND "
                               "arguments = ?", (key, arguments)).fetchone()
        try:
            names = json.loads(row[0]) if row else None
        except (TypeError, ValueError):
            return None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return None
        return tuple(names)
