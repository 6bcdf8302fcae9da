"""Warm workers on this machine: one process per device slot, kept between slices.

A worker is started the first time its slot is asked for and handed back after every
slice its gang finished; one whose gang failed, timed out or was cancelled is ended
(with its process group) and the next slice starts a fresh one. So is a worker that
could not put its state back after its slice (it says so, or says nothing in time):
the pool hears that when it takes the worker again, before any job is sent, so the
next slice gets a fresh worker instead of failing for the last. Workers are forked by
the pool's spawner (``spawner.py``), which pays the imports once, so replacing a failed
gang's workers costs milliseconds, not the seconds of a new interpreter; where there is
no spawner (not Linux, or it failed to start) a worker is a process of its own.

A worker starts with the launcher's environment as it is then (a forked one is sent
it); once that environment changes (a notebook sets a variable between runs), idle
workers are replaced rather than reused, since much is read from it only at import (a
fresh process would see the change). The spawner is replaced only when a variable its
own imports may read changes (``spawner.IMPORT_VARIABLES``). Workers die with the
launcher: at exit the pool ends them, and each asked Linux to kill it should its parent
die first (PR_SET_PDEATHSIG, which fires when the *thread* that started the process
ends, so one long-lived thread starts the spawner and every plain worker).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

import cloudpickle

from dione.launch.gang import Lost, signal_name
from dione.launch.scratch import scratch_dir
from dione.launch.spawner import (
    SpawnedProcess,
    Spawner,
    preloadable,
    read_at_import,
    start_module,
)
from dione.launch.worker import RESTORE_SECONDS

__all__ = ["WarmWorker", "WorkerPool", "local_pool", "shutdown_local_pool"]

# Why workers were replaced after a job, each said once per process: a workload that
# patches torch when imported has its worker replaced after every slice (correct, and
# slow: 29 workers for a 2-task run), and the reason was in the worker's log alone.
_REPLACED_SAID: set[str] = set()


def _say_replaced(record: Any) -> None:
    """Warn, once per reason, that a worker could not be put back after a job."""
    why = str(record.get("message", "")) if isinstance(record, dict) else str(record)
    if why in _REPLACED_SAID:
        return
    _REPLACED_SAID.add(why)
    warnings.warn(f"a warm worker is replaced after a job, as it could not be put back as "
                  f"it started ({why}); where this follows every job, each slice pays a "
                  "worker's start", stacklevel=2)

_TERMINATE_GRACE_SECONDS = 3.0
_POLL_SECONDS = 0.02
# How long a worker that stopped answering gets to show its exit status.
_EXIT_GRACE_SECONDS = 5.0
_KILLED_WAIT_SECONDS = 30.0  # for a killed worker to be reaped
_STACKS_SECONDS = 1.0  # for a signalled worker to write its stacks (a few ms each)

Slot = tuple[str, int]  # (device kind, device id)
# How long a new spawner may take to import torch and dione on a loaded machine.
_SPAWNER_START_SECONDS = 300.0


class WorkerProcess(Protocol):
    """A worker's process as the pool sees it: a subprocess.Popen, or one the spawner
    forked (same fields and meaning)."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class WarmWorker:
    """A worker process and the launcher's end of its connection."""

    slot: Slot
    process: WorkerProcess
    connection: Connection
    log: Path  # its output outside jobs (start-up, crashes between jobs)
    environ: int = 0  # fingerprint of the launcher's environment it started with
    slices: int = 0  # slices it has finished
    ready: bool = False  # it has imported what every slice needs
    threads: int = 0  # the threads its pools were sized for (read at import)
    # It was sent a job and has not yet said whether it put its state back after it.
    restoring: bool = False
    unrestored: bool = False  # it said it could not (it ends: it must serve no more)

    def send(self, job: Any) -> bool:
        """Hand over a job; False when the worker is gone."""
        try:
            self.connection.send_bytes(cloudpickle.dumps(job))
        except OSError:
            return False
        self.restoring = True
        return True

    def reply(self) -> tuple[str, Any] | None:
        """The worker's reply if one is waiting: ``("result", outcome)``, ``("error",
        record)``, or ``("lost", None)`` when the connection closed or a reply came
        half-written (the worker died while sending): a failure report must never
        become a second failure; ``("lost", None)`` too once the worker has ended with
        nothing more to read, though a child it forked still holds the connection open
        (then no end of file comes). None while nothing is there. Its word that it
        started, or restored after a job, is noted (``ready``; ``restoring`` and
        ``unrestored``), never returned."""
        # Whether it has ended, asked first: what it sent before it ended is then all in
        # the connection, read below before it is called lost.
        ended = self.process.poll() is not None
        try:
            while self.connection.poll(0):
                kind, payload = cloudpickle.loads(self.connection.recv_bytes())
                if kind == "ready":
                    self.ready = True
                elif kind in ("restored", "unrestored"):
                    self.restoring, self.unrestored = False, kind == "unrestored"
                    if kind == "unrestored":
                        _say_replaced(payload)
                else:
                    return kind, payload
        except Exception:  # EOF, a reset connection, a truncated or unreadable pickle
            return "lost", None
        return ("lost", None) if ended else None

    def wait_ready(self, timeout: float) -> None:
        """Wait until the worker has started (or died, or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        while not self.ready and self.alive() and time.monotonic() < deadline:
            if self.connection.poll(_POLL_SECONDS) and self.reply() is not None:
                return  # not a start-up message: leave it to the gang (cannot happen idle)

    def restored(self, timeout: float) -> bool:
        """Whether it can take another job: it put its state back after its last one
        (waiting up to ``timeout`` for it to say so) and runs. False if it said it could
        not, ended, or said nothing in time: then it must be retired, not blamed."""
        deadline = time.monotonic() + timeout
        while self.restoring and time.monotonic() < deadline:
            if self.reply() is not None:
                return False  # lost (ended), or a message no idle worker sends
            self.connection.poll(_POLL_SECONDS)
        return not (self.restoring or self.unrestored) and self.alive()

    def alive(self) -> bool:
        return self.process.poll() is None

    def lost(self) -> Lost:
        """How it ended, once it stopped answering (its exit status may take a moment)."""
        deadline = time.monotonic() + _EXIT_GRACE_SECONDS
        while self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(_POLL_SECONDS)
        code = self.process.poll()
        if code is None:
            return Lost("exit", "stopped answering")
        if code < 0:
            return Lost("signal", f"was killed by {signal_name(code)}")
        # Mid-job, whatever the status: 0 read as success, and its log is empty (review).
        return Lost("exit", f"exited with status {code} in the middle of its job (the "
                    "task's code or a library it calls ended the process: os._exit, or "
                    "exit() in C)")


def _environ_fingerprint() -> int:
    """A fingerprint of this process's environment variables as they are now."""
    return hash(frozenset(os.environ.items()))


def _import_fingerprint() -> int:
    """A fingerprint of the variables a spawner's imports may read, as they are now."""
    found = {k: v for k, v in os.environ.items() if read_at_import(k)}
    # torch writes its compiler cache's folder here when it first needs it (building an
    # optimizer does, as validation and every spawner do): its default is no change, and
    # a spawner started before it (a slice run straight from Python before any task was
    # validated, as tests do) was replaced for it, its imports paid twice.
    if _CACHE_VARIABLE in found and found[_CACHE_VARIABLE] == _default_cache_dir():
        del found[_CACHE_VARIABLE]
    return hash(frozenset(found.items()))


_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


@functools.cache
def _default_cache_dir() -> str | None:
    """The folder torch writes into ``TORCHINDUCTOR_CACHE_DIR`` when it is unset."""
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        return os.path.abspath(default_cache_dir())
    except Exception:  # another torch: the variable then counts as any other
        return None


def _signal_group(process: WorkerProcess, sig: int) -> None:
    """Signal a worker's process group (its session: it and its own children)."""
    if isinstance(process, SpawnedProcess):
        process.signal_group(sig)  # through its spawner, which knows it is still its own
    else:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)


def write_stacks(workers: Sequence[WarmWorker]) -> None:
    """Have each worker still running write every thread's stack into its job's log
    (``STACKS_SIGNAL``), before it is ended for a stall or a timeout; a moment for them
    to."""
    from dione.launch.worker import STACKS_SIGNAL

    alive = [w for w in workers if w.alive()]
    for w in alive:
        _signal_group(w.process, STACKS_SIGNAL)
    if alive:
        time.sleep(_STACKS_SECONDS)


def _end(workers: Sequence[WarmWorker]) -> None:
    """Terminate each worker's process group, kill what is left, reap all."""
    alive = [w for w in workers if w.alive()]
    for w in alive:
        _signal_group(w.process, signal.SIGTERM)
    deadline = time.monotonic() + _TERMINATE_GRACE_SECONDS
    while any(w.alive() for w in alive) and time.monotonic() < deadline:
        time.sleep(_POLL_SECONDS)
    killed = [w for w in workers if w.process.returncode is None]  # pids still their own
    for w in killed:
        # The whole group: a worker's own children must not outlive it.
        _signal_group(w.process, signal.SIGKILL)
    # Bounded, for them all at once: a process stuck in the kernel (a GPU driver call)
    # dies only when the call returns, and must not hold its gang's thread meanwhile;
    # its spawner (or, without one, Popen) reaps it later.
    deadline = time.monotonic() + _KILLED_WAIT_SECONDS
    for w in killed:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.process.wait(max(0.0, deadline - time.monotonic()))
    for w in workers:
        w.connection.close()


def _end_started(starting: Future[WarmWorker]) -> None:
    """End the worker a start gave, once it has (its caller stopped waiting)."""
    if not starting.cancelled() and starting.exception() is None:
        _end([starting.result()])


class WorkerPool:
    """Warm workers of this process, one per (device kind, device id) when idle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[Slot, WarmWorker] = {}
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dione-starter")
        self._folder: Path | None = None
        self._fork_server: Spawner | None = None
        self._retired: list[Spawner] = []  # replaced, exiting once their workers end
        # Taken by a gang, not given back or ended: id -> worker.
        self._lent: dict[int, WarmWorker] = {}
        self.started = 0  # workers started so far (a measure of warmth)
        # Whether spawners import what this process has of PRELOADED_PACKAGES before they
        # fork (off once a preload set CUDA up in one, or ended or hung it).
        self._preload = True

    def take(self, kind: str, device_ids: Sequence[int], threads: int) -> list[WarmWorker]:
        """A worker for each device: the idle one of its slot, else a new one. If one
        cannot start (or the caller is interrupted meanwhile), those taken end."""
        workers: list[WarmWorker] = []
        environ = _environ_fingerprint()
        try:
            for device in device_ids:
                with self._lock:
                    worker = self._idle.pop((kind, device), None)
                # Its word on the last slice's reset is read only now: the launcher
                # has moved on meanwhile, and a worker that could not reset is replaced
                # here rather than fail the slice it would be given. Read first, as one
                # that could not ends once it has said so (its reason went unsaid).
                if worker is not None:
                    worker.reply()
                if worker is not None and (not worker.alive() or worker.environ != environ
                                           or worker.threads != threads
                                           or not worker.restored(RESTORE_SECONDS)):
                    _end([worker])
                    worker = None
                if worker is None:
                    starting = self._starter.submit(self._start, (kind, device), threads)
                    try:
                        worker = starting.result()
                    except BaseException:
                        # Interrupted while it starts: it ends once started, unseen.
                        starting.add_done_callback(_end_started)
                        raise
                workers.append(worker)
        except BaseException:
            _end(workers)
            raise
        with self._lock:
            self._lent.update((id(w), w) for w in workers)
        return workers

    def warm_up(self, kind: str, device_ids: Sequence[int], threads: int,
                timeout: float = 300.0) -> None:
        """Start the workers of these devices now and wait until each is ready, so that
        no slice (nor a trial that measures one) pays a worker's start."""
        workers = self.take(kind, device_ids, threads)
        for worker in workers:
            worker.wait_ready(timeout)
        self.give_back(workers)

    def give_back(self, workers: Sequence[WarmWorker]) -> None:
        """Keep finished workers for the next slice on their devices."""
        surplus = []
        with self._lock:
            for worker in workers:
                self._lent.pop(id(worker), None)
                worker.slices += 1
                if worker.alive() and worker.slot not in self._idle:
                    self._idle[worker.slot] = worker
                else:
                    surplus.append(worker)
        _end(surplus)

    def idle(self) -> list[WarmWorker]:
        """The workers waiting for a slice now, by slot."""
        with self._lock:
            return [self._idle[slot] for slot in sorted(self._idle)]

    def end(self, workers: Sequence[WarmWorker]) -> None:
        """End workers that must not serve again (their gang failed or was stopped)."""
        with self._lock:
            for worker in workers:
                self._lent.pop(id(worker), None)
        _end(workers)

    def spawner_pids(self) -> list[int]:
        """The pids of this pool's spawners still running (the current one, and any
        replaced one whose last workers have not ended yet)."""
        spawners = [*self._retired, self._fork_server]
        return [s.process.pid for s in spawners if s is not None and s.process.poll() is None]

    def shutdown(self, keep_spawner: bool = False) -> int:
        """End every idle worker (busy ones belong to their gang, which ends them), and
        the spawner unless ``keep_spawner`` or a gang holds workers it forked (they die
        with it: a notebook's dione.shutdown() beside a run in another thread killed its
        slices, each counted a failure of its task, and took their logs; a review).
        Returns how many busy workers were left to their gangs."""
        with self._lock:
            idle, self._idle = list(self._idle.values()), {}
            busy = sum(1 for w in self._lent.values() if w.alive())
        _end(idle)
        if keep_spawner or busy:
            self._close_retired()
            return busy
        with self._lock:
            spawners, self._retired = [*self._retired, self._fork_server], []
            self._fork_server = None
        for spawner in spawners:
            if spawner is not None:
                spawner.close(_TERMINATE_GRACE_SECONDS)
        # Its thread ends too (a notebook's dione.shutdown() left it); the next start
        # makes another.
        with self._lock:
            starter = self._starter
            self._starter = ThreadPoolExecutor(max_workers=1,
                                               thread_name_prefix="dione-starter")
        starter.shutdown(wait=False)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        return 0

    def _close_retired(self) -> None:
        """Close the replaced spawners whose workers have all ended (each exits then)."""
        with self._lock:
            done = [s for s in self._retired if s.idle()]
            self._retired = [s for s in self._retired if s not in done]
        for spawner in done:
            spawner.close(_TERMINATE_GRACE_SECONDS)

    def _current_spawner(self, threads: int) -> Spawner | None:
        """The spawner for the variables read at import, the working folder and the
        workers' threads as they are now; None off Linux or where it cannot run. Runs
        on the pool's one starting thread."""
        if not sys.platform.startswith("linux"):
            return None
        key = hash((_import_fingerprint(), os.getcwd(), threads))
        spawner = self._fork_server
        if spawner is not None and spawner.alive() and spawner.key == key:
            return spawner
        self._close_retired()
        if spawner is not None:
            spawner.retire()  # its busy workers still need it to report their ends
            with self._lock:
                self._retired.append(spawner)
        assert self._folder is not None
        self._fork_server = Spawner.start(key, _worker_environment(_thread_settings(threads)),
                                          self._folder / f"spawner-{self.started}.log")
        return self._fork_server

    def _start(self, slot: Slot, threads: int) -> WarmWorker:
        if self._folder is None:
            self._folder = scratch_dir("pool")
        ours, theirs = socket.socketpair()
        environ = _environ_fingerprint()
        own = _thread_settings(threads)
        log = self._folder / f"worker-{slot[0]}{slot[1]}-{self.started}.log"
        spawner = self._current_spawner(threads)
        process: WorkerProcess | None = None
        if spawner is not None:
            preload = preloadable() if self._preload else []
            process = spawner.spawn(_worker_environment(own), str(log), theirs.fileno(),
                                    _SPAWNER_START_SECONDS, preload)
            if process is None:  # the spawner may still hold ``theirs``: a new pair
                if spawner.poisoned or spawner.preloading:
                    # A preload set CUDA up in it, or it ended or hung while importing
                    # one: the next spawner forks without (each would fail alike).
                    self._preload = False
                    spawner.retire()
                    why = spawner.poisoned or (f"it ended or hung as it imported "
                                               f"{spawner.preloading}")
                    warnings.warn(f"dione's spawner: {why}; workers import such modules "
                                  "themselves from now on", RuntimeWarning, stacklevel=1)
                ours.close()
                theirs.close()
                ours, theirs = socket.socketpair()
        if process is None:
            process = start_module("dione.launch.worker", theirs.fileno(),
                                   _worker_environment(own), log)
        theirs.close()
        self.started += 1
        return WarmWorker(slot, process, Connection(ours.detach()), log, environ,
                          threads=threads)


def _thread_settings(threads: int) -> dict[str, str]:
    """The variables that size a worker's thread pools (read at import by some)."""
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _worker_environment(own: dict[str, str]) -> dict[str, str]:
    """The environment a worker (or the spawner) starts with: the launcher's, plus."""
    env = {
        **os.environ,
        "DIONE_LAUNCHER_PID": str(os.getpid()),
        "PYTHONUNBUFFERED": "1",
        **own,
    }
    # A local gang talks over loopback only: no other host can reach its ranks.
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    return env


_POOL: WorkerPool | None = None
_POOL_LOCK = threading.Lock()


def local_pool() -> WorkerPool:
    """This process's pool of warm workers (created on first use, ended at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkerPool()
            atexit.register(shutdown_local_pool)
        return _POOL


def shutdown_local_pool(keep_spawner: bool = False) -> int:
    """End this process's idle warm workers (and its spawner, unless ``keep_spawner`` or
    a gang holds workers); the next slice starts new ones. Returns how many busy workers
    were left to their gangs."""
    with _POOL_LOCK:
        pool = _POOL
    return pool.shutdown(keep_spawner) if pool is not None else 0
