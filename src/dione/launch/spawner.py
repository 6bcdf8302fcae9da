"""A fork server for warm workers: it pays for Python, torch and dione once, then forks a
fresh worker per request, so a worker starts in milliseconds rather than seconds.

``python -m dione.launch.spawner FD`` serves its launcher over the socket on FD:

    launcher -> spawner   ("spawn", {environment overrides, log path}) + the worker's
                          end of its connection (a file descriptor, SCM_RIGHTS)
    spawner -> launcher   ("ready", pid) once; ("started", pid) per spawn;
                          ("exited", pid, code) for each worker that ended, with
                          subprocess's convention (-N: killed by signal N)

The spawner is every worker's parent, so it alone can reap them and learn how they
ended; it tells its launcher. A launcher that half-closes the socket retires it: it
starts nothing more, reports its remaining workers' ends, and exits when none is left.

Why a fork is a fresh worker: the spawner only imports (what every worker imports before
its first job) and never runs a torch operation, so no thread pool, CUDA context or
process group exists to be inherited; each child starts its own session, takes its own
environment overrides and output file, then runs the worker's loop as a process started
by ``python -m dione.launch.worker`` would. Linux only (elsewhere workers start as
plain processes).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import socket
import struct
import sys
import threading
import traceback
from typing import Any

from dione.launch.worker import die_with_parent

__all__ = ["SpawnedProcess", "Spawner", "main"]

_HEADER = struct.Struct("!I")


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


class SpawnedProcess:
    """A worker forked by a spawner, as a launcher sees it: what subprocess.Popen offers
    (``pid``, ``returncode``, ``poll``, ``wait``), with the exit code the spawner reports."""

    def __init__(self, spawner: Spawner, pid: int) -> None:
        self._spawner = spawner
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self._spawner.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return self._spawner.wait(self.pid, timeout)


class Spawner:
    """The launcher's end of one spawner process: starts workers, hears how they end."""

    def __init__(self, process: Any, sock: socket.socket, environ: int) -> None:
        self.process = process  # subprocess.Popen of the spawner
        self.environ = environ  # fingerprint of the environment it started with
        self._sock = sock
        self._channel = Channel(sock)
        self._changed = threading.Condition()
        self._ready = False
        self._started: list[int] = []
        self._exits: dict[int, int] = {}
        self._children: set[int] = set()
        self._gone = False  # its connection ended: every child it had is gone too
        self._failed = False  # a spawn went unanswered: it must not be asked again
        self._listener = threading.Thread(target=self._listen, daemon=True,
                                          name="dione-spawner-listener")
        self._listener.start()

    def _listen(self) -> None:
        while True:
            try:
                message = self._channel.receive()
            except (OSError, pickle.UnpicklingError, EOFError, ValueError):
                message = None
            with self._changed:
                if message is None:
                    self._gone = True
                    self._changed.notify_all()
                    return
                kind, *args = message[0]
                if kind == "ready":
                    self._ready = True
                elif kind == "started":
                    self._started.append(args[0])
                    self._children.add(args[0])
                elif kind == "exited":
                    self._exits[args[0]] = args[1]
                self._changed.notify_all()

    def alive(self) -> bool:
        """Whether it can start workers (it runs, and answered every request so far)."""
        with self._changed:
            return not (self._gone or self._failed) and self.process.poll() is None

    def spawn(self, overrides: dict[str, str], log: str, connection_fd: int,
              timeout: float) -> SpawnedProcess | None:
        """Fork a worker that serves ``connection_fd``; None if the spawner could not
        (it died, or did not answer within ``timeout``: the caller starts one itself)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._ready or self._gone, timeout):
                self._failed = True
                return None
            if self._gone or self._failed:
                return None
            try:
                send(self._sock, ("spawn", {"environ": overrides, "log": log}),
                     (connection_fd,))
            except OSError:
                self._failed = True
                return None
            # Replies come in the order of requests, one request at a time; after one
            # went unanswered a late reply could be taken for the next, so no next.
            if not self._changed.wait_for(lambda: self._started or self._gone, timeout) \
                    or not self._started:
                self._failed = True
                return None
            return SpawnedProcess(self, self._started.pop(0))

    def exit_code(self, pid: int) -> int | None:
        with self._changed:
            if pid in self._exits:
                return self._exits[pid]
            # The spawner is gone: its children were killed with it (parent-death signal).
            return -signal.SIGKILL if self._gone else None

    def wait(self, pid: int, timeout: float | None = None) -> int:
        with self._changed:
            if not self._changed.wait_for(lambda: pid in self._exits or self._gone, timeout):
                raise TimeoutError(f"worker {pid} did not end within {timeout} s")
        code = self.exit_code(pid)
        assert code is not None
        return code

    def retire(self) -> None:
        """Start nothing more; the spawner exits once its last worker has ended."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_WR)

    def close(self, timeout: float) -> None:
        """Retire it and wait (up to ``timeout``) for it to exit; kill it after that."""
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
    os.environ.update(request["environ"])
    os.environ["DIONE_LAUNCHER_PID"] = str(spawner_pid)  # its parent, for die_with_parent
    from dione.launch.worker import main as worker_main

    return worker_main(fd)


def _reap(sock: socket.socket, children: set[int]) -> None:
    """Tell the launcher of each worker that ended since last time."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        with contextlib.suppress(OSError):
            send(sock, ("exited", pid, os.waitstatus_to_exitcode(status)))


def main(fd: int) -> int:
    die_with_parent()
    # What every worker imports before its first job, paid here once.
    import cloudpickle  # noqa: F401
    import torch  # noqa: F401

    import dione.launch.worker
    import dione.techniques  # noqa: F401

    sock = socket.socket(fileno=fd)
    channel = Channel(sock)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the pipe
    children: set[int] = set()
    send(sock, ("ready", os.getpid()))
    serving = True
    while serving or children:
        if not (serving and channel.pending()):
            watched = [sock.fileno(), wake_read] if serving else [wake_read]
            readable, _, _ = select.select(watched, [], [], 1.0)
            if wake_read in readable:
                os.read(wake_read, 4096)
            _reap(sock, children)
            if sock.fileno() not in readable:
                continue
        message = channel.receive()
        if message is None:  # retired: start nothing more, wait for the last worker
            serving = False
            continue
        (kind, request), fds = message
        if kind != "spawn" or len(fds) != 1:
            for extra in fds:
                os.close(extra)
            continue
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for own in (wake_read, wake_write, sock.detach()):
                    os.close(own)
                status = _run_worker(request, fds[0], parent)
            except BaseException:
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(status)
        os.close(fds[0])
        children.add(pid)
        send(sock, ("started", pid))
    return 0


if __name__ == "__main__":
    status = main(int(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
