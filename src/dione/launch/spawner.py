"""A fork server for warm workers: it pays for Python, torch and dione once, then forks a
fresh worker per request, so a worker starts in milliseconds rather than seconds.

``python -m dione.launch.spawner FD`` serves its launcher over the socket on FD:

    launcher -> spawner   ("spawn", {the worker's whole environment, log path, modules
                          to import first}) + the worker's end of its connection (a file
                          descriptor, SCM_RIGHTS);
                          ("signal", number, signal) for a worker's process group;
                          ("retire",)
    spawner -> launcher   ("ready", pid) once; ("preloading", package) as it starts to
                          import one for a spawn; ("started", number, pid), ("poisoned",
                          why: a preload set CUDA up, it forks no more) or ("failed",
                          why) per spawn; ("exited", number, code) for each worker that
                          ended, with subprocess's convention (-N: killed by signal N)

Workers are named by the spawner's own count of spawns, never by pid: the spawner is
every worker's parent, so it alone can reap them and learn how they ended; it tells its
launcher, and signals a worker only while it has not reaped it. A pid freed by a reaped
worker may go to the next one forked, so a request naming a pid could reach the wrong
worker; a number is never reused. A retired spawner starts nothing more, reports its
remaining workers' ends, and exits when none is left.

Why a fork is a fresh worker: the spawner only imports (what every worker imports before
its first job, and the modules of ``PRELOADED_PACKAGES`` its launcher has: a worker of
any task then holds them, as its own import would have left them) and never runs a
torch operation, so no torch thread pool, CUDA context or process group exists to be
inherited; it starts with its workers' thread settings
(numpy's BLAS sizes its pool at import) and is replaced when they, the launcher's folder
or a variable that may be read at import change (``IMPORT_VARIABLES``). Each child starts
its own session, takes its own output file and the whole environment its launcher sent
(variables read only at run time, such as a workload's own, need no new spawner), then
runs the worker's loop as a process started by ``python -m dione.launch.worker`` would.
Linux only (elsewhere workers start as plain processes).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dione.launch.worker import die_with_parent

__all__ = ["IMPORT_VARIABLES", "PRELOADED_PACKAGES", "SpawnedProcess", "Spawner", "main",
           "preloadable", "read_at_import", "start_module"]

_HEADER = struct.Struct("!I")
_WAIT_STEP_SECONDS = 0.5  # how often a waiting launcher also looks at the pidfd
_REPORT_GRACE_SECONDS = 2.0  # how long an ended worker's report may take to arrive

# Variables that Python, the C library, torch, the thread and math libraries, the
# collectives or dione may read while the spawner imports (a fork inherits what they
# set up then), by prefix or whole name. A change to any of them needs a new spawner;
# any other variable is only set in each forked worker, before it imports a task.
# (Found in those libraries' sources and binaries: numpy's NPY_ CPU features, OpenBLAS's
# GOTO_ threads, libtorch's KINETO_ and ATEN_ settings, the time zone at ``time``'s
# import, preloaded allocators' settings, ROCm's.)
IMPORT_VARIABLES = (
    "PYTHON", "LD_", "LC_", "LANG", "LOCPATH", "GCONV_PATH", "TZ", "MALLOC_", "GLIBC_",
    "TCMALLOC_", "MIMALLOC_", "JE_", "TORCH", "PYTORCH_", "ATEN_", "KINETO_", "CUDA_",
    "NVIDIA_", "HIP_", "HSA_", "ROCR_", "NCCL_", "GLOO_", "OMP_", "MKL_", "KMP_", "GOMP_",
    "GOTO_", "OPENBLAS_", "BLIS_", "NPY_", "NUMPY_", "NUMEXPR_", "DNNL_", "ONEDNN_",
    "TRITON_", "XLA_", "DIONE_", "TMP", "TEMP", "HOME", "PATH",
    # What the preloaded packages (below) and huggingface_hub read at import: their
    # caches' folders, offline switches, which frameworks to use (USE_TORCH, USE_TF).
    "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "SAFETENSORS_", "USE_", "XDG_",
    "DO_NOT_TRACK", "DISABLE_TELEMETRY", "SCIPY_",
)

# Packages whose modules the launcher has imported (validating a task builds its
# model) a spawner imports too before it forks a worker, so that no worker imports them
# again: transformers costs each new rank 2-4 s of CPU (its lazy import structure, its
# modeling modules, scipy through its losses), paid by every rank of a gang at once. Only
# packages known to touch no GPU as they import (a BLAS thread pool, scipy's as numpy's,
# is fork-safe); the checks after each preload stand guard where one does.
PRELOADED_PACKAGES = ("transformers",)


def read_at_import(name: str) -> bool:
    """Whether the spawner's imports may read the variable ``name`` (``IMPORT_VARIABLES``)."""
    return name.startswith(IMPORT_VARIABLES)


def _package(module: str) -> str:
    """The top-level package of a module's dotted name."""
    return module.partition(".")[0]


def preloadable() -> list[str]:
    """The modules of ``PRELOADED_PACKAGES`` this process has imported, parents first."""
    return sorted(name for name, module in list(sys.modules.items())
                  if module is not None and _package(name) in PRELOADED_PACKAGES)


def send(sock: socket.socket, message: Any, fds: tuple[int, ...] = ()) -> None:
    """One length-prefixed pickled message, with ``fds`` passed along it."""
    data = pickle.dumps(message)
    data = _HEADER.pack(len(data)) + data
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


class Channel:
    """The receiving end of a socket carrying ``send``'s messages. Descriptors go with
    the next message that completes (only spawn requests carry one, one at a time)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._fds: list[int] = []

    def _complete(self) -> tuple[Any, list[int]] | None:
        if len(self._buffer) < _HEADER.size:
            return None
        end = _HEADER.size + _HEADER.unpack_from(self._buffer)[0]
        if len(self._buffer) < end:
            return None
        message = pickle.loads(self._buffer[_HEADER.size:end])
        self._buffer, fds, self._fds = self._buffer[end:], self._fds, []
        return message, fds

    def pending(self) -> bool:
        """Whether a whole message is already read (a select would not show it)."""
        return len(self._buffer) >= _HEADER.size and (
            len(self._buffer) >= _HEADER.size + _HEADER.unpack_from(self._buffer)[0])

    def receive(self) -> tuple[Any, list[int]] | None:
        """The next message and the descriptors that came with it; None at end of
        stream (a message cut off by it is dropped, its descriptors closed)."""
        while (whole := self._complete()) is None:
            data, fds, _, _ = socket.recv_fds(self.sock, 65536, 4)
            self._fds += fds
            if not data:
                for fd in self._fds:
                    os.close(fd)
                return None
            self._buffer += data
        return whole


def start_module(module: str, fd: int, env: dict[str, str], log: Path
                 ) -> subprocess.Popen[bytes]:
    """``python -m MODULE FD`` in a session of its own, serving the socket on ``fd``, its
    output to ``log``: how a spawner, and a worker where there is none, start."""
    with open(log, "wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", module, str(fd)], env=env, stdout=output,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, pass_fds=(fd,),
            start_new_session=True)


class SpawnedProcess:
    """A worker forked by a spawner, as a launcher sees it: what subprocess.Popen offers
    (``pid``, ``returncode``, ``poll``, ``wait``) with the exit code the spawner reports,
    and ``signal_group``, which the spawner carries out while the worker is its unreaped
    child (so a pid the system has given to another process is never signalled)."""

    def __init__(self, spawner: Spawner, number: int, pid: int, pidfd: int | None) -> None:
        self._spawner = spawner
        self.number = number  # the spawner's name for it (its pid may be reused)
        self.pid = pid
        self._code: int | None = None  # set by the spawner's report
        # Opened by the spawner while the worker was its unreaped child, so it is this
        # worker's: where the spawner died (or hangs) before reporting, it tells when the
        # worker really ended. Closed when this object goes.
        self._pidfd = pidfd

    def __del__(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self._pidfd)

    def _ended(self, timeout: float | None) -> bool:
        """Whether the process has ended, by its pidfd (waiting up to ``timeout``);
        without one, whether its spawner is gone (its workers die with it)."""
        if self._pidfd is None:
            return self._spawner.gone()
        watch = select.poll()
        watch.register(self._pidfd, select.POLLIN)
        return bool(watch.poll(None if timeout is None else max(0, int(timeout * 1000))))

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        code, gone = self._spawner.report(self)
        if code is None and gone and self._ended(0):
            return -signal.SIGKILL  # by the parent-death signal, with its spawner
        return code

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = _WAIT_STEP_SECONDS if left is None else min(left, _WAIT_STEP_SECONDS)
            code, gone = self._spawner.await_report(self, step)
            if code is not None:
                return code
            if self._ended(0) and (gone or self._spawner.await_report(
                    self, _REPORT_GRACE_SECONDS)[0] is None):
                # Ended, and the spawner is gone or does not say how: a hung spawner
                # must not hang its launcher.
                code = self._spawner.report(self)[0]
                return -signal.SIGKILL if code is None else code
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group (its session: it and its children)."""
        if not self._spawner.signal(self, sig) and not self._ended(0):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)


class Spawner:
    """The launcher's end of one spawner process: starts workers, hears how they end."""

    def __init__(self, process: Any, sock: socket.socket, key: int) -> None:
        self.process = process  # subprocess.Popen of the spawner
        self.key = key  # the launcher's environment, threads and folder it started with
        self._sock = sock
        self._channel = Channel(sock)
        self._changed = threading.Condition()
        self._ready = False
        self._replies: list[SpawnedProcess | str] = []  # per spawn: the worker, or why not
        self._live: dict[int, SpawnedProcess] = {}  # by number: not yet reported ended
        self._gone = False  # its connection ended or broke: it starts nothing more
        self._failed = False  # a spawn went unanswered: it must not be asked again
        self._retired = False
        self.poisoned = ""  # why it forks no more, where a preload set a GPU up in it
        # The package it is importing before a spawn ('': none): one it died or hung in.
        self.preloading = ""
        self._listener = threading.Thread(target=self._listen, daemon=True,
                                          name="dione-spawner-listener")
        self._listener.start()

    @classmethod
    def start(cls, key: int, env: dict[str, str], log: Path) -> Spawner:
        """Start ``python -m dione.launch.spawner`` with ``env``, its output to ``log``."""
        ours, theirs = socket.socketpair()
        process = start_module("dione.launch.spawner", theirs.fileno(), env, log)
        theirs.close()
        return cls(process, ours, key)

    def _listen(self) -> None:
        while True:
            try:
                message = self._channel.receive()
                if message is None:
                    break
                self._heard(*message)
            except (ConnectionResetError, BrokenPipeError):
                break  # it exited with requests unread: an end like any other
            except Exception:
                # A reply it cannot read: it can no longer be trusted to say who ended,
                # so it is ended (its workers die with it, each noticed by its pidfd).
                if self.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.process.pid, signal.SIGKILL)
                break
        with self._changed:
            self._gone = True
            self._changed.notify_all()

    def _heard(self, message: tuple[Any, ...], fds: list[int]) -> None:
        kind, *args = message
        with self._changed:
            if kind in ("started", "failed", "poisoned"):  # a spawn's reply: preloaded
                self.preloading = ""
            if kind == "ready":
                self._ready = True
            elif kind == "preloading":  # until this spawn's reply
                self.preloading = str(args[0])
            elif kind == "started":
                # Registered here, in the order of the stream, so that its "exited"
                # (which may follow at once) always finds it.
                worker = SpawnedProcess(self, args[0], args[1], fds.pop() if fds else None)
                self._live[worker.number] = worker
                self._replies.append(worker)
            elif kind == "failed":
                self._replies.append(str(args[0]))
            elif kind == "poisoned":  # it forks no more: its preload set a GPU up
                self.poisoned = str(args[0])
                self._replies.append(self.poisoned)
            elif kind == "exited":
                ended = self._live.pop(args[0], None)
                if ended is not None:
                    ended._code = args[1]
            self._changed.notify_all()
        for fd in fds:
            os.close(fd)

    def gone(self) -> bool:
        with self._changed:
            return self._gone

    def alive(self) -> bool:
        """Whether it can start workers (it runs, and answered every request so far)."""
        with self._changed:
            usable = not (self._gone or self._failed or self._retired)
        return usable and self.process.poll() is None

    def idle(self) -> bool:
        """Whether every worker it started has ended (or it is gone, and they with it)."""
        with self._changed:
            return self._gone or not self._live

    def spawn(self, environ: dict[str, str], log: str, connection_fd: int,
              timeout: float, preload: Sequence[str] = ()) -> SpawnedProcess | None:
        """Fork a worker with the environment ``environ`` (all of it) that serves
        ``connection_fd``, once the spawner has imported the modules ``preload`` names
        (``preloadable``; while none of its workers runs); None if the spawner could
        not (it died, did not answer within ``timeout``, the fork failed, or a preload
        set CUDA up in it, ``poisoned`` then saying so: the caller starts one itself)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._ready or self._gone, timeout):
                self._failed = True
                return None
            if self._gone or self._failed or self._retired:
                return None
            try:
                send(self._sock, ("spawn", {"environ": environ, "log": log,
                                            "preload": list(preload)}),
                     (connection_fd,))
            except OSError:
                self._failed = True
                return None
            # Replies come in the order of requests, one request at a time; after one
            # went unanswered a late reply could be taken for the next, so no next.
            if not self._changed.wait_for(lambda: self._replies or self._gone, timeout) \
                    or not self._replies:
                self._failed = True
                return None
            reply = self._replies.pop(0)
            return reply if isinstance(reply, SpawnedProcess) else None

    def report(self, worker: SpawnedProcess) -> tuple[int | None, bool]:
        """The worker's reported exit code (None: none yet), and whether the spawner is
        gone (so none will come)."""
        with self._changed:
            return worker._code, self._gone

    def await_report(self, worker: SpawnedProcess, timeout: float | None
                     ) -> tuple[int | None, bool]:
        """``report``, once there is a code or the spawner is gone (or ``timeout``)."""
        with self._changed:
            self._changed.wait_for(lambda: worker._code is not None or self._gone, timeout)
            return worker._code, self._gone

    def signal(self, worker: SpawnedProcess, sig: int) -> bool:
        """Ask the spawner to signal the worker's group; False if it cannot be asked
        (then it is gone, or going: the caller reads the worker's pidfd)."""
        with self._changed:
            if worker._code is not None:
                return True  # ended and reported: nothing to signal
            if self._gone:
                return False
            try:
                send(self._sock, ("signal", worker.number, sig))
                return True
            except OSError:
                pass
            # Its socket broke: it is exiting. Its listener will say so shortly.
            self._changed.wait_for(lambda: worker._code is not None or self._gone,
                                   _REPORT_GRACE_SECONDS)
            return worker._code is not None

    def retire(self) -> None:
        """Start nothing more; the spawner exits once its last worker has ended (and
        still signals them meanwhile)."""
        with self._changed:
            if self._retired or self._gone:
                self._retired = True
                return
            self._retired = True
            with contextlib.suppress(OSError):
                send(self._sock, ("retire",))

    def close(self, timeout: float) -> None:
        """Retire it and wait (up to ``timeout``) for it to exit; kill it after that
        (its remaining workers die with it)."""
        self.retire()
        try:
            self.process.wait(timeout)
        except Exception:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._listener.join(timeout)  # it reads to the end of the stream, then stops
        self._sock.close()


# -- the spawner process ------------------------------------------------------------------


def _run_worker(request: dict[str, Any], fd: int, spawner_pid: int) -> int:
    """In the forked child: become a fresh worker (own session, environment, output)."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()  # the launcher's environment as it is now, not as it was
    os.environ.update(request["environ"])
    os.environ["DIONE_LAUNCHER_PID"] = str(spawner_pid)  # its parent, for die_with_parent
    from dione.launch.worker import main as worker_main

    return worker_main(fd)


def _reap(sock: socket.socket, children: dict[int, int]) -> None:
    """Tell the launcher of each worker (``children``: number by pid) that ended since
    last time, once what it forked is killed too."""
    while children:
        try:
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if ended is None:
            return
        pid = ended.si_pid
        if pid in children:
            # Its group's leader is a zombie until reaped below, so the group's id is
            # still its own: what it forked (a data loader, a pool holding its connection
            # and a gang's sockets open) dies with it instead of hiding its death.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        number = children.pop(pid, None)
        if number is not None:
            with contextlib.suppress(OSError):
                send(sock, ("exited", number, os.waitstatus_to_exitcode(status)))


def _preload(names: Sequence[str], skipped: set[str], sock: socket.socket) -> str:
    """Import the launcher's ``names`` (``preloadable``) not yet imported here; one that
    fails to (``skipped`` then holds it: it is not tried again) is left to the worker,
    which says why as it imports it. Called only while no worker of this spawner runs,
    so that an import that ends the spawner takes no busy rank with it. '' unless a
    preload set CUDA up, which no fork may inherit: then why the spawner must fork no
    more (its launcher starts workers as processes of their own)."""
    import importlib

    import torch

    wanted = [n for n in names if n not in sys.modules and n not in skipped
              and _package(n) in PRELOADED_PACKAGES]
    if not wanted:
        return ""
    # Said first: should the import end or hang the spawner, its launcher knows why.
    package = _package(wanted[0])
    send(sock, ("preloading", package))
    driver = _cuda_driver_loaded()
    # torch.cuda.is_available() asked at import then goes through NVML (torch's
    # documented switch that leaves a fork able to use CUDA, where NVML works; the
    # checks below catch it where it did not); the workers' environment is their
    # launcher's.
    before = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        for name in wanted:
            try:
                importlib.import_module(name)
            except BaseException:  # SystemExit too: the worker's import will say it
                skipped.add(name)
    finally:
        if before is None:
            del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = before
    initialised = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    if initialised or (_cuda_driver_loaded() and not driver):
        return (f"importing {package} set CUDA up in the spawner, "
                "which a forked worker could not use")
    return ""


def _cuda_driver_loaded() -> bool:
    """Whether CUDA's driver library is mapped into this process (loaded to initialise
    the driver: a fork after cuInit cannot use CUDA, though torch may not know it)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libcuda.so" in line for line in maps)
    except OSError:
        return False


def _fork_worker(request: dict[str, Any], fd: int, sock: socket.socket,
                 wake: tuple[int, int]) -> int:
    """Fork a worker serving ``fd``; its pid (in the spawner). OSError if fork failed."""
    parent = os.getpid()
    # SIGTERM stays blocked across the fork until the child has put its default back: a
    # SIGTERM caught by the spawner's handler in the child's first moments and run only
    # after that swap was dropped (CPython runs a tripped signal's handler as it is when
    # checked, and skips a default one), and the worker lived on (seen once under load).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        raise
    if pid == 0:
        status = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the spawner's is not its own
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # one held: now
            # Nothing of the spawner's: its launcher must see EOF when the spawner ends.
            for own in (*wake, sock.detach()):
                os.close(own)
            status = _run_worker(request, fd, parent)
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(status)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return pid


def main(fd: int) -> int:
    children: dict[int, int] = {}  # the number of each unreaped worker, by pid
    spawner = os.getpid()

    def launcher_gone(*_: Any) -> None:
        if os.getpid() != spawner:
            # A worker just forked, before it put SIGTERM's default back: it is the
            # worker's SIGTERM (the launcher ending it), not the spawner's to act on.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        # The parent-death signal: each worker's group goes too, with what the worker
        # forked (the workers' own parent-death signal would take only them).
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        os._exit(1)

    signal.signal(signal.SIGTERM, launcher_gone)
    die_with_parent(signal.SIGTERM)
    # What every worker imports before its first job, paid here once.
    import cloudpickle  # noqa: F401
    import torch  # noqa: F401

    import dione.launch.worker
    import dione.techniques

    dione.launch.worker.warm_torch()  # once here, before any fork

    sock = socket.socket(fileno=fd)
    channel = Channel(sock)
    wake = os.pipe()
    os.set_blocking(wake[1], False)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
    spawned = 0
    poisoned = ""  # why it forks no more: a preloaded module set a GPU up
    skipped: set[str] = set()  # modules to preload that failed to import here
    send(sock, ("ready", os.getpid()))
    listening, retired = True, False
    # Retired or left by its launcher, it stays while a worker it started lives: its
    # workers die with it (parent-death signal), and only it can report their ends.
    while children or not (retired or not listening):
        if not (listening and channel.pending()):
            watched = [wake[0], sock.fileno()] if listening else [wake[0]]
            readable, _, _ = select.select(watched, [], [], 1.0)
            if wake[0] in readable:
                os.read(wake[0], 4096)
            _reap(sock, children)
            if not listening or sock.fileno() not in readable:
                continue
        message = channel.receive()
        if message is None:
            listening = False
            continue
        (kind, *args), fds = message
        if kind == "spawn" and len(fds) == 1 and not retired and not poisoned:
            _reap(sock, children)
            if not children:  # none of its workers runs to die with it, should it end
                poisoned = _preload(args[0].get("preload", ()), skipped, sock)
        if kind == "spawn" and len(fds) == 1 and not retired and not poisoned:
            try:
                pid = _fork_worker(args[0], fds[0], sock, wake)
            except OSError as err:  # EAGAIN, ENOMEM: this worker, not every gang, fails
                send(sock, ("failed", f"fork failed: {err}"))
            else:
                spawned += 1
                children[pid] = spawned
                # Opened while it is an unreaped child, so it names this worker.
                try:
                    pidfd: tuple[int, ...] = (os.pidfd_open(pid),)
                except (AttributeError, OSError):
                    pidfd = ()
                send(sock, ("started", spawned, pid), pidfd)
                for opened in pidfd:
                    os.close(opened)
        elif kind == "spawn":
            send(sock, ("poisoned", poisoned) if poisoned else (
                "failed", "retired" if retired else "no connection passed"))
        elif kind == "signal":
            # Only a worker not yet reaped: its pid is still its own.
            for pid in [p for p, number in children.items() if number == args[0]]:
                try:
                    os.killpg(pid, args[1])
                except ProcessLookupError:  # not yet in a session of its own
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, args[1])
                except PermissionError:
                    pass
        elif kind == "retire":
            retired = True
        for passed in fds:
            os.close(passed)
    return 0


if __name__ == "__main__":
    status = main(int(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
