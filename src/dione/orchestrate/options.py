"""What a run is told (options) and tells (events); shared by the run loop and its callers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dione.profile.options import TrialOptions
from dione.state.lock import RunDirBusy, RunLock
from dione.state.private import UnsafePathError, private_dir

__all__ = ["RunDirError", "RunEvent", "RunOptions", "claim_run_dir"]


class RunDirError(ValueError):
    """A run directory that cannot be used: another workload's (say, a task with other
    steps), held by another live launcher, not private, or not writable."""


def claim_run_dir(run_dir: str | Path) -> RunLock:
    """Create ``run_dir`` private to this user (or check an existing one) and take its
    lock for this launcher; RunDirError saying why not and what to do."""
    try:
        private_dir(run_dir)
        lock = RunLock(run_dir)
        lock.acquire()
    except (RunDirBusy, UnsafePathError) as err:
        raise RunDirError(str(err)) from None
    except OSError as err:
        where = err.filename or run_dir
        raise RunDirError(f"cannot use run directory {run_dir}: {err.strerror or err} "
                          f"({where}); give a directory you can write (--out)") from None
    return lock


@dataclass(frozen=True)
class RunOptions:
    """How ``run_workload`` profiles, plans, slices and re-plans."""

    solver: str = "cpsat"
    time_limit: float = 10.0  # seconds for the first plan
    replan_time_limit: float = 2.0
    replan: bool = True
    replan_interval: float = 60.0  # seconds between re-plans without a slice end
    replan_margin: float = 0.03  # adopt a plan that ends earlier by more than this share
    slice_steps: int | None = None  # steps per slice (None: ``slice_seconds`` or all)
    # Aim for slices of about this length (None: auto_slice_seconds, from the start-up
    # each option measured: at least 5 minutes, with start-up at most 5% of a slice).
    slice_seconds: float | None = None
    max_failures: int = 3  # a task whose slices failed this many times is failed
    timeout: float | None = None  # per slice
    catalog: str | None = None
    reprofile: bool = False
    profile_budget: float | None = None
    trial: TrialOptions = field(default_factory=TrialOptions)
    # Where checkpoints (the run's and the trials') go: a folder every node can reach
    # (None: the run directory, which must then be shared for more than one node).
    storage: str | None = None


@dataclass(frozen=True)
class RunEvent:
    """For a live display: ``profiled``, ``planned``, ``replanned``, ``slice_started``,
    ``slice_finished``, ``slice_failed``, ``task_failed``, ``finished``."""

    kind: str
    message: str
    task: str | None = None
