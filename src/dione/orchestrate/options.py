"""What a run is told (options) and tells (events); shared by the run loop and its callers."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dione.plan.solve import SOLVERS
from dione.profile.options import TrialOptions
from dione.state.lock import LOCK_FILE, RunDirBusy, RunLock
from dione.state.private import UnsafePathError, private_dir
from dione.state.store import SIMULATED_FILE, STORE_FILE

__all__ = ["RUN_DIR_ENTRIES", "SIMULATION_OPTIONS", "RunDirError", "RunEvent", "RunOptions",
           "claim_run_dir"]


class RunDirError(ValueError):
    """A run directory that cannot be used: another workload's (say, a task with other
    steps), held by another live launcher, not private, or not writable."""


# What dione writes in a run directory (a store's journals beside it): an existing
# folder that holds anything else and no store is someone else's.
RUN_DIR_ENTRIES = frozenset({
    STORE_FILE, *(f"{STORE_FILE}-{journal}" for journal in ("wal", "shm", "journal")),
    LOCK_FILE, "run.json", SIMULATED_FILE, "plans", "report", "logs", "checkpoints",
    "tensorboard"})


def claim_run_dir(run_dir: str | Path, simulated: bool = False) -> RunLock:
    """Create ``run_dir`` private to this user (or check an existing one) and take its
    lock for this launcher; RunDirError saying why not and what to do (an existing folder
    that is not a run's: dione writes over files of its own names and a simulation
    redone clears its folder, so a project folder given as --out would lose files; a
    simulation's folder, for a run that trains (``simulated`` False): its real slices
    read as simulated, its weights not exportable)."""
    folder = Path(run_dir)
    if not simulated and (folder / SIMULATED_FILE).is_file():
        raise RunDirError(f"{folder} holds a simulation (`dione simulate`, {SIMULATED_FILE}"
                          "): a run that trains would mix with it, its slices read as "
                          "simulated and its weights not exported; give another folder "
                          "(--out)")
    if folder.is_dir() and not (folder / STORE_FILE).exists():
        try:
            # Hidden files (.DS_Store, NFS's .nfs*, .gitkeep) and dione's own half-written
            # ones (a run killed mid-write) do not make a folder someone else's.
            others = sorted(e.name for e in folder.iterdir()
                            if e.name.removesuffix(".partial") not in RUN_DIR_ENTRIES
                            and not e.name.startswith("."))
        except OSError:
            others = []  # unreadable: said below, where it is made private and locked
        if others:
            listed = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise RunDirError(f"{folder} is not a dione run directory and is not empty (it "
                              f"holds {listed}): give a new or empty folder (--out)")
    try:
        private_dir(run_dir)
        lock = RunLock(run_dir)
        lock.acquire()
    except (RunDirBusy, UnsafePathError) as err:
        raise RunDirError(str(err)) from None
    except OSError as err:
        where = err.filename or run_dir
        raise RunDirError(f"cannot use run directory {run_dir}: {err.strerror or err} "
                          f"({where}); give a directory you can write " + (
                              "(--out)" if simulated else "(--out for a new run; a run to "
                              "resume: copy it somewhere writable with cp -a and resume "
                              "the copy)")) from None
    return lock


@dataclass(frozen=True)
class RunOptions:
    """How a run (``dione.run``, ``dione run``) profiles, plans, slices and re-plans."""

    solver: str = "cpsat"
    time_limit: float = 10.0  # seconds for the first plan
    replan_time_limit: float = 2.0
    replan: bool = True
    replan_interval: float = 60.0  # seconds between re-plans without a slice end
    replan_margin: float = 0.03  # adopt a plan that ends earlier by more than this share
    # "dione": the triggers and margin above; "saturn": Saturn's introspection (VLDB 2024)
    # for comparison: re-plan only every replan_interval, adopt a plan only where it ends
    # earlier by more than the interval plus 500 s.
    replan_rule: str = "dione"
    # Re-plans wait while their solves (on one core, the next counted at their mean)
    # would pass this share of the run's time; one owed (a pending task the plan lost,
    # a stop that freed devices) does not, nor is it counted in that share.
    replan_share: float = 0.05
    # How a task under a stopping rule is planned: "full", its whole remaining length
    # (a stop re-plans at once); "expected", each stretch after a rung counted at the
    # chance of passing the rungs before it (a halving rule's 1/eta per rung); "rung",
    # up to its next rung only (its whole remaining length after the last); "auto",
    # "rung" under a rule that pauses tasks at its rungs (nothing past a rung trains
    # before a promotion: on simulated sweeps it ended 5 of 6 sooner than "full"),
    # "full" under the others.
    stopping_horizon: str = "auto"
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
    # A slice far past its prediction: said once past ``stall_warning`` times it (plus
    # half the grace), cancelled and retried past ``stall_factor`` times it plus the
    # grace (None: never cancelled; then only ``timeout`` bounds a slice).
    stall_warning: float = 3.0
    stall_factor: float | None = 10.0
    stall_grace: float = 60.0

    def __post_init__(self) -> None:
        """Every field of its type and range (the flags are checked as they are parsed;
        these come from Python callers and from a saved run.json too)."""
        for name, value in vars(self).items():
            rule = _OPTION_RULES.get(name)
            problem = rule(value) if rule is not None else None
            if problem:
                raise ValueError(f"run option {name}={value!r}: {problem}")
        if self.stall_factor is not None and (self.stall_factor < 1 or (
                self.stall_factor == 1 and self.stall_grace == 0)):
            # Every slice that ran as predicted passed it, cancelled as stalled (a review;
            # 1 and a grace, "the prediction plus 10 minutes", is a bound: another).
            raise ValueError(f"run option stall_factor={self.stall_factor!r} with "
                             f"stall_grace={self.stall_grace!r} (--stall-factor, "
                             "--stall-grace; a resume keeps its run's unless given): "
                             "stall_factor must be at least 1, and above 1 with no "
                             "stall_grace (a slice running as predicted would be cancelled "
                             "as stalled), or None never to cancel one")
        if not isinstance(self.trial, TrialOptions):
            raise ValueError(f"run option trial={self.trial!r}: must be a TrialOptions")


def _number(positive: bool = True, optional: bool = False, whole: bool = False
            ) -> Callable[[object], str | None]:
    def rule(value: object) -> str | None:
        if value is None and optional:
            return None
        kinds: tuple[type, ...] = (int,) if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(
                number := float(value)):  # type: ignore[arg-type]  # an int or a float
            return f"must be a {'whole' if whole else 'finite'} number" + (
                " or None" if optional else "")
        if positive and number <= 0:
            return "must be above 0"
        if number < 0:
            return "must not be negative"
        return None
    return rule


def _one_of(*allowed: str) -> Callable[[object], str | None]:
    def rule(value: object) -> str | None:
        return None if value in allowed else f"must be one of {', '.join(allowed)}"
    return rule


def _kind(kind: type, optional: bool = False) -> Callable[[object], str | None]:
    def rule(value: object) -> str | None:
        if (value is None and optional) or (isinstance(value, kind) and (
                kind is not int or not isinstance(value, bool))):
            return None
        return f"must be a {kind.__name__}" + (" or None" if optional else "")
    return rule


_OPTION_RULES: dict[str, Callable[[object], str | None]] = {
    "solver": _one_of(*SOLVERS), "time_limit": _number(), "replan_time_limit": _number(),
    "replan": _kind(bool), "replan_interval": _number(), "replan_margin": _number(False),
    "replan_share": _number(), "replan_rule": _one_of("dione", "saturn"),
    "stopping_horizon": _one_of("auto", "full", "expected", "rung"),
    "slice_steps": _number(optional=True, whole=True),
    "slice_seconds": _number(optional=True), "max_failures": _number(whole=True),
    "timeout": _number(optional=True), "catalog": _kind(str, optional=True),
    "reprofile": _kind(bool), "profile_budget": _number(False, optional=True),
    "storage": _kind(str, optional=True), "stall_warning": _number(),
    "stall_factor": _number(optional=True), "stall_grace": _number(False),
}


@dataclass(frozen=True)
class RunEvent:
    """What a run tells as it goes (``dione run`` prints each as a line; ``on_event``
    gets each), by ``kind``; ``message`` says it in words, ``task`` names its task:

    - the run: ``profiled``, ``planned``, ``replanned``, ``planner_fell_back``,
      ``node_lost``, ``node_joined``, ``node_busy`` (another job holds its devices: the
      run starts without it), ``node_unmeasured`` (a node of a model the run did not
      profile joined: not planned), ``finished``, ``storage_unset`` (several nodes and no
      ``storage``);
    - slices: ``slice_started``, ``slice_finished``, ``slice_failed``, ``slice_slow``,
      ``slice_cancelled``, ``checkpoint_quarantined``, ``checkpoint_missing``;
    - tasks: ``task_added``, ``task_readded``, ``task_refused``, ``task_stopped``,
      ``task_diverged``, ``task_failed``, ``training_changed``, ``task_left_out`` (tasks
      of the run a resume's workload no longer defines);
    - evaluations and stopping rules: ``rung_passed``, ``rung_waiting``,
      ``rung_unjudged``, ``rung_retrained``, ``evaluation_failed``,
      ``evaluation_doubtful``, ``evaluation_not_finite``, ``keep_best_doubtful``,
      ``eval_every_doubtful``, ``stopping_rule_doubtful``, ``stopping_rule_failed``.

    ``data`` holds the numbers a callback would otherwise parse from ``message``:
    ``planned``/``replanned``: ``finish`` (seconds from the run's start), ``solver``,
    ``status``; ``slice_finished``: ``start_step``, ``end_step``, ``seconds``,
    ``predicted`` (seconds, at its launch), ``loss`` (its last step's, or None),
    ``evaluation`` (metric -> value, empty where it did not evaluate), ``technique``,
    ``devices``, ``done``; ``rung_passed``/``task_stopped``: ``step``, ``metric``,
    ``value``. Every step's loss and every evaluation are the run store's
    (``RUN_DIR/report/metrics.csv``, ``evaluations.csv``)."""

    kind: str
    message: str
    task: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict, compare=False)


# What `dione simulate` plans with unless told otherwise (its flags' defaults, and the
# Python API's: they differed, 10 against 1 unit for the first plan): solves bounded by
# CP-SAT's deterministic time, re-planned as a cluster's run is.
SIMULATION_OPTIONS = RunOptions(time_limit=1.0, replan_time_limit=0.1,
                                replan_interval=1000.0, replan_share=0.002)
