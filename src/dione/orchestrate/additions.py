"""Tasks added to a live run: from Python (a ``TaskInbox`` the caller fills while
``dione.run`` trains) or from the command line (``dione add``: a request in the run's
store). Each is validated and profiled beside the run (the catalog serves a task whose
speed it knows: a sweep's new learning rate needs no trial), then planned at the next
re-plan, which a task the plan does not cover is owed at once.

    loop turn:  poll ─ (a batch is taken) ─ ... ─ ready: records added, re-plan owed
    thread:            └── load, validate, profile(batch) ──┘
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from dione.launch.local import Launcher
from dione.profile.catalog import Catalog
from dione.profile.options import TrialOptions
from dione.profile.profiler import profile_workload
from dione.profile.results import Profile
from dione.spec.cluster import Cluster
from dione.spec.task import Task
from dione.state.store import Addition, RunStore

__all__ = ["Arrival", "Intake", "TaskInbox"]


class TaskInbox:
    """Tasks for a live ``dione.run(..., inbox=)``, added from any thread while it trains.

    A run given an inbox goes on while the inbox is open, even with nothing left to
    train (a sequential searcher adds the next configuration when one ends), and ends
    once it is closed and every task has ended. A task the run cannot take (its name
    is taken, it is invalid, no technique fits) is refused: ``refused`` says why, and
    the other tasks go on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[Task] = []
        self._closed = False
        self.refused: dict[str, str] = {}  # task name -> why the run did not take it
        self.taken: dict[str, Task] = {}  # task name -> the task, once the run added it
        # Called (in the run's thread) with a refused task's name and why, as it is
        # refused: a searcher waiting on that task's end proposes another instead.
        self.on_refused: Callable[[str, str], None] | None = None

    def add(self, *tasks: Task) -> None:
        """Give the run these tasks; they are planned at its next re-plan."""
        for task in tasks:
            if not isinstance(task, Task):
                raise TypeError(f"a TaskInbox takes dione.Task objects, not "
                                f"{type(task).__name__}")
        with self._lock:
            if self._closed:
                raise RuntimeError("this TaskInbox is closed: the run takes no more tasks; "
                                   "add them before close(), or start another run")
            self._waiting.extend(tasks)

    def refuse(self, name: str, why: str) -> None:
        """The run did not take task ``name`` (the run's loop says so)."""
        self.refused[name] = why
        if self.on_refused is not None:
            self.on_refused(name, why)

    def close(self) -> None:
        """No more tasks: the run ends once those it has end."""
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        """Closed: it takes no more tasks."""
        with self._lock:
            return self._closed

    @property
    def drained(self) -> bool:
        """Closed, and every task added taken by the run: none will come."""
        with self._lock:
            return self._closed and not self._waiting

    def take(self) -> list[Task]:
        """The tasks added since the last take (for the run's loop)."""
        with self._lock:
            taken, self._waiting = self._waiting, []
        return taken

    def __enter__(self) -> TaskInbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Arrival:
    """What one intake made of a batch: the tasks to add with their profile, and what
    it refused (a task by name, a request by id) with why."""

    tasks: list[Task]
    profile: Profile | None
    requests: list[Addition]
    refused: dict[str, str] = field(default_factory=dict)
    requests_refused: dict[int, str] = field(default_factory=dict)
    present: set[str] = field(default_factory=set)  # asked for, and in the run already
    # Per request, names it shares with a task the run has or an earlier request of
    # the batch brings (two `dione add`s of one file), with why: refused for it alone.
    duplicates: dict[int, dict[str, str]] = field(default_factory=dict)
    from_inbox: set[str] = field(default_factory=set)  # names of the inbox's tasks added
    trials: str = ""  # what profiling cost, as the run's first profile says it


@dataclass(frozen=True)
class Profiling:
    """How the run profiles: its catalog, trial options, launcher and storage."""

    catalog: str | None
    trial: TrialOptions
    launcher: Launcher
    storage: str | None


class Intake:
    """Gathers added tasks for the run's loop and profiles them on a thread of its own,
    one batch at a time (the store is read and written on the loop's thread only)."""

    def __init__(self, store: RunStore, inbox: TaskInbox | None, profiling: Profiling) -> None:
        self.store = store
        self.inbox = inbox
        self.profiling = profiling
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dione-intake")
        self._job: Future[Arrival] | None = None
        self._tasks: list[Task] = []  # taken from the inbox, not yet profiled
        self._batch: tuple[list[Task], list[Addition]] = ([], [])  # the one profiling
        # A resumed run takes again what an earlier session took: its records are gone.
        self._requests = store.additions("waiting", "taken")
        self._seen = {r.id for r in self._requests}  # every request this session took

    def poll(self, known: Collection[str], cluster: Cluster) -> None:
        """Take what was added since, and start profiling it unless a batch is
        (``known``: the run's task names, copied only when a batch starts)."""
        if self.inbox is not None:
            self._tasks.extend(self.inbox.take())
        # A request stays waiting in the store until its batch is profiled: take it once.
        for request in self.store.additions("waiting"):
            if request.id not in self._seen:
                self._seen.add(request.id)
                self._requests.append(request)
        if self._job is None and (self._tasks or self._requests):
            tasks, requests, self._tasks, self._requests = self._tasks, self._requests, [], []
            self._batch = (tasks, requests)
            self._job = self._pool.submit(_intake, tasks, requests, set(known), cluster,
                                          self.profiling)

    def ready(self) -> Arrival | None:
        """A profiled batch, if one is; one whose intake failed as a whole (the catalog
        could not be opened, say) comes back with every task refused, and the run goes
        on."""
        if self._job is None or not self._job.done():
            return None
        job, self._job = self._job, None
        try:
            return job.result()
        except Exception as err:
            tasks, requests = self._batch
            why = f"its intake failed: {type(err).__name__}: {err}"
            return Arrival([], None, requests, refused={t.name: why for t in tasks},
                           requests_refused={r.id: why for r in requests})

    def expecting(self) -> bool:
        """Whether more tasks may come: a batch is being profiled or waits, or the inbox
        is open."""
        return (self._job is not None or bool(self._tasks) or bool(self._requests)
                or (self.inbox is not None and not self.inbox.drained))

    def waitable(self) -> list[Future[Arrival]]:
        return [] if self._job is None else [self._job]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _intake(tasks: list[Task], requests: list[Addition], known: set[str], cluster: Cluster,
            profiling: Profiling) -> Arrival:
    """Load the requests' workload files, validate every task, profile the valid ones."""
    from dione.spec.validate import repeated_names
    from dione.spec.workload import load_workload
    from dione.techniques.validation import trained_by_none, valid_tasks

    arrival = Arrival([], None, requests)
    wanted: list[tuple[Task, int | None]] = [(t, None) for t in tasks]  # and who asked
    for request in requests:
        if request.unreadable:  # a damaged row: refused, the others go on
            arrival.requests_refused[request.id] = request.unreadable
            continue
        try:
            defined = list(load_workload(request.workload))
        except Exception as err:  # any workload error refuses this request only
            arrival.requests_refused[request.id] = (
                f"{request.workload} could not be loaded: {type(err).__name__}: {err}")
            continue
        by_name = {t.name: t for t in defined}
        missing = [n for n in request.names if n not in by_name]
        twice = sorted(set(request.names) & set(repeated_names(defined)))
        if missing or twice:  # which of two of a name was asked for, no one can tell
            arrival.requests_refused[request.id] = (
                f"{request.workload} no longer defines task(s) {', '.join(missing)}"
                if missing else f"{request.workload} defines more than one task named "
                f"{', '.join(map(repr, twice))}: give each a name of its own")
            continue
        # A name the run has (the run's workload file grew to define it, or a resumed
        # run took the request before) is in the run already: nothing to add.
        arrival.present.update(n for n in request.names if n in known)
        wanted += [(by_name[n], request.id) for n in request.names if n not in known]
    fresh: list[Task] = []
    brought: dict[str, int | None] = {}  # name -> the request adding it (None: the inbox)
    for task, source in wanted:
        if task.name in known:
            earlier = brought.get(task.name)
            why = (f"request {earlier} asks for it as well: it is that request's"
                   if earlier is not None
                   else f"the run already has a task named {task.name!r}; give the new one "
                   "a name of its own")
            if source is None:  # an inbox task: refused as a task
                arrival.refused[task.name] = why
            else:  # the request's duplicate only: the task another brought is added
                arrival.duplicates.setdefault(source, {})[task.name] = why
        else:
            known.add(task.name)
            brought[task.name] = source
            fresh.append(task)
            if source is None:  # not a `dione add` request's
                arrival.from_inbox.add(task.name)
    valid, problems = valid_tasks(fresh) if fresh else ([], [])  # none: no "no tasks"
    if valid:  # one no technique it allows trains: refused now, as a run's own are
        widest = max(cluster, key=lambda n: n.devices)
        valid, untrainable = trained_by_none(valid, widest.devices, widest.kind)
        problems = [*problems, *untrainable]
    for problem in problems:  # a task may have several; one of the workload's names none
        name = problem.task or "(workload)"
        arrival.refused[name] = "; ".join(filter(None, [arrival.refused.get(name),
                                                        str(problem)]))
    if valid:
        with Catalog(profiling.catalog) as catalog:
            arrival.profile = profile_workload(
                valid, cluster, catalog, options=profiling.trial, launcher=profiling.launcher,
                storage=profiling.storage)
        arrival.tasks = valid
        arrival.trials = (f"{arrival.profile.trials_run} trial(s) run, "
                          f"{arrival.profile.trials_cached} taken from the catalog")
    return arrival


def request_message(request: Addition, arrival: Arrival) -> tuple[str, str]:
    """(state, message) to settle ``request`` with, from what the intake made of it."""
    if request.id in arrival.requests_refused:
        return "refused", arrival.requests_refused[request.id]
    duplicates = arrival.duplicates.get(request.id, {})
    refused = [f"{n}: {duplicates.get(n) or arrival.refused[n]}" for n in request.names
               if n in duplicates or n in arrival.refused]
    added = [n for n in request.names if n not in arrival.refused and n not in duplicates
             and n not in arrival.present]
    present = [n for n in request.names if n in arrival.present and n not in duplicates]
    if refused and not added and not present:
        return "refused", "; ".join(refused)
    said = [*(["added " + ", ".join(added)] if added else []),
            *(["in the run already: " + ", ".join(present)] if present else []),
            *(["refused " + "; ".join(refused)] if refused else [])]
    return "taken", "; ".join(said)

