"""Gangs on a Ray cluster: warm actors per device, pinned to their node, running the same
job as a local warm worker (``worker.run_job``), watched by the same loop (``gang``).

    RayLauncher(address)            ray.init(address); the alive nodes become dione Nodes
      per node: a placement group, one bundle per device, STRICT_PACK, pinned to the node
                (label ray.io/node-id), reserved while the launcher lives
      per device: one actor in its bundle, started on first use, kept across slices;
                ended (and replaced later) when its gang fails, times out or is cancelled
      per gang:  a rendezvous folder with a random name (the gang's secret) that the
                ranks create privately in their node's temporary folder: a gang never
                spans nodes, so no port is opened for it; removed by its first
                rank when it finishes, or, when it failed, by a task on its node
                once its ended ranks have let go of it (shutdown waits for those);
                one that all its ranks left (its node lost, its launcher killed)
                by the next actor started on that machine

An actor streams what its job says back as Ray objects (a streaming generator): its
progress, its output (kept in the gang's folder on its node, sent as it grows), then
its result or error; it resets itself after the reply, while the gang moves on. Before
its next job the launcher asks it whether that reset worked (an actor runs one call at a
time, so the question waits for the reset): one that could not reset, or does not
answer in time, is ended and replaced there, so the next slice never fails for the
last. Nothing travels through files the nodes would have to share. An actor that dies
is a lost rank, and one whose node left the cluster is reported as "node lost". Ray is
optional: ``pip install dione[ray]``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from dione.launch.gang import Lost, Placement, watch_gang, workload_sources
from dione.launch.local import OnProgress, collective_timeout
from dione.launch.signals import stop_handlers_kept
from dione.launch.worker import RESTORE_SECONDS, Job, rendezvous_path
from dione.spec.cluster import ClusterError, Node, NodeBusyError
from dione.spec.devices import threads_per_slot
from dione.techniques.base import SliceOutcome, SliceSpec

__all__ = ["RayLauncher", "RayNotInstalled"]


# How often a running job's new output is sent back (and its progress, at the latest).
_LOG_SECONDS = 0.5
# How long shutdown waits for the folders of gangs to be removed, on every node.
_CLEANUP_SECONDS = 20.0
# How long the removal of a failed gang's folder waits for its ended ranks to let go
# (``ray.kill`` returns before the process is gone); then it removes the folder anyway.
# Below shutdown's wait, so that a removal started just before shutdown still ends.
_RELEASE_SECONDS = 15.0
# A gang folder no rank holds is taken for abandoned only once it has not changed for
# this long: the ranks of a starting gang make it, then each takes its hold at once.
_ABANDONED_SECONDS = 60.0
# The names of Ray gangs' folders; a local gang's (``dione-gang-<pid>-*``, see
# ``scratch``) never match, and are its launcher's to remove.
GANG_PREFIX = "dione-raygang-"


def accelerator_model(resources: Mapping[str, float]) -> str | None:
    """The GPU model Ray names among a node's resources (``accelerator_type:A100``), if
    one: nodes of several models are profiled and planned each as a kind of its own."""
    models = [k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")]
    return models[0] if len(models) == 1 else None


class RayNotInstalled(ClusterError):
    """``--ray`` without Ray installed."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayNotInstalled("Ray is not installed; install it with `pip install "
                              "'dione[ray]'` (or `pip install ray`) on every node") from None
    return ray


def _remove_group(group: Any) -> None:
    from ray.util import remove_placement_group

    remove_placement_group(group)


class _Actor:
    """The warm worker as a Ray actor: the local worker's job runner and reset."""

    def __init__(self) -> None:
        import dione.techniques  # noqa: F401 - the built-in techniques, registered once
        from dione.launch.worker import Baseline, warm_torch

        warm_torch()  # before its first job, as the spawner does for local workers
        self.baseline = Baseline()
        self.reset_worked = True  # whether the reset after its last job did
        # What no launcher can remove: gangs whose node left the cluster, or whose
        # launcher was killed, before their folders went (this machine's, as any).
        # Best effort: a folder that cannot be read must not stop the actor starting.
        with contextlib.suppress(Exception):
            remove_abandoned_gangs()

    def run(self, job: Job) -> Iterator[bytes]:
        """Run ``job`` in a thread while streaming what it says: progress records, the
        output it adds to its log, then its reply; the reset comes after the reply."""
        from dione.launch.worker import rendezvous_folder, restore_after_job

        said: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        folder = Path(rendezvous_folder(job.store))
        log = folder / f"rank{job.rank}.log"
        # The folder is in use while the job runs and while its output is streamed (a
        # hold each, either may end first); both go with the process, however it ends.
        working = _hold(folder, job.rank)
        try:
            streaming = _hold(folder, job.rank)
        except BaseException:
            _release(working)
            raise
        try:
            yield from self._stream(job, log, said, working)
        finally:
            _release(streaming)
        self.reset_worked = restore_after_job(self.baseline, job.rank)[0] == "restored"

    def restored(self) -> bool:
        """Whether the reset after its last job worked; asked before the next one."""
        return self.reset_worked

    def _stream(self, job: Job, log: Path, said: queue.SimpleQueue[tuple[str, Any]],
                working: int | None) -> Iterator[bytes]:
        from dione.launch.worker import _error_record, redirected, run_job

        def work() -> None:
            try:
                with redirected(str(log)):
                    reply = run_job(job, lambda kind, payload: said.put((kind, payload)))
            except BaseException as err:  # the redirect failed: the job never ran
                reply = ("error", _error_record(job.rank, err))
            _release(working)
            said.put(("done", reply))

        try:
            threading.Thread(target=work, name="dione-job", daemon=True).start()
        except BaseException:
            _release(working)
            raise
        offset = 0
        while True:
            try:
                message: tuple[str, Any] | None = said.get(timeout=_LOG_SECONDS)
            except queue.Empty:
                message = None
            text, offset = _grown(log, offset)
            if text:
                yield cloudpickle.dumps(("log", text))
            if message is None:
                continue
            if message[0] != "done":
                yield cloudpickle.dumps(message)
                continue
            try:
                data: bytes = cloudpickle.dumps(message[1])
            except Exception as err:  # an outcome that cannot travel is this rank's error
                data = cloudpickle.dumps(("error", _error_record(job.rank, err)))
            yield data
            break

    def forget(self, store: str) -> None:
        """Remove a finished gang's rendezvous folder on this node."""
        _remove_rendezvous_folders([store])

    def source(self) -> tuple[int, str, str]:
        """Its pid, and the dione it runs: version and folder (a worker whose node has
        another installed runs that one, whatever the driver imports)."""
        return os.getpid(), *_dione_source()

    def pid(self) -> int:
        return os.getpid()


def _dione_source() -> tuple[str, str]:
    """This process's dione: its version and the folder it is imported from."""
    import dione

    return dione.__version__, str(Path(dione.__file__).resolve().parent)


def _remove_rendezvous_folders(stores: list[str]) -> None:
    """Remove these gangs' rendezvous folders (and their ranks' logs) on this node."""
    import shutil

    from dione.launch.worker import rendezvous_path

    for store in stores:
        shutil.rmtree(rendezvous_path(store), ignore_errors=True)


def _remove_when_released(store: str, wait: float) -> None:
    """Remove a failed gang's folder on this node once no rank holds it (its actors were
    ended, and a hold goes with its process), or after ``wait`` seconds at most."""
    import time

    folder = Path(rendezvous_path(store))
    deadline = time.monotonic() + wait
    while folder.is_dir() and _held(folder) and time.monotonic() < deadline:
        time.sleep(0.2)
    _remove_rendezvous_folders([store])


def _hold(folder: Path, rank: int) -> int | None:
    """A shared lock on ``rankN.held`` in the gang's folder (a file descriptor for
    ``_release``): the folder is in use. The lock goes with the process, however it
    ends. None where the file system has no locks: the file alone then keeps the
    folder (``_in_use`` cannot probe it either)."""
    import fcntl

    held = os.open(folder / f"rank{rank}.held", os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW,
                   0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_SH)
    except OSError:
        os.close(held)
        return None
    return held


def _release(held: int | None) -> None:
    if held is not None:
        os.close(held)


def _in_use(folder: Path) -> bool:
    """Whether a rank may still use the gang's folder: one holds a lock in it, or its
    locks cannot be probed; a folder without a hold file is not a Ray rank's."""
    return _held(folder) or not list(folder.glob("*.held"))


def _held(folder: Path) -> bool:
    """Whether a rank holds a lock in the gang's folder, or its locks cannot be probed."""
    import fcntl

    for path in folder.glob("*.held"):
        try:
            probe = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return True
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held (BlockingIOError), or no locks here: leave it
            return True
        finally:
            os.close(probe)  # (and with it the probe's own lock)
    return False


def remove_abandoned_gangs(root: str | Path | None = None,
                           age: float = _ABANDONED_SECONDS) -> list[Path]:
    """Remove this user's Ray gang folders of this host in ``root`` (the temporary
    folder) that no rank holds and that have not changed for ``age`` seconds; those
    removed."""
    import shutil
    import stat
    import time

    removed = []
    now = time.time()
    ours = Path(rendezvous_path(f"{GANG_PREFIX}*"))
    for folder in Path(root or ours.parent).glob(ours.name):
        with contextlib.suppress(OSError):
            info = folder.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() \
                    or now - info.st_mtime < age or _in_use(folder):
                continue
            shutil.rmtree(folder)
            removed.append(folder)
    return removed


def _grown(log: Path, offset: int) -> tuple[bytes, int]:
    """What ``log`` gained past ``offset`` (bytes: a character may straddle two
    reads), and the new offset."""
    try:
        with open(log, "rb") as file:
            file.seek(offset)
            data = file.read()
    except OSError:
        return b"", offset
    return data, offset + len(data)


# How long an actor Ray cannot reach may wait for its node to be marked dead: Ray's
# default health checks (every 3 s, 5 misses, after 5 s) mark a dead node within ~20 s.
NODE_DEATH_SECONDS = 45.0
# How long a gang waits for a device another gang of this launcher holds (a trial of a
# task added to a live run, beside the run's slices) before starting an actor anyway.
BUSY_WAIT_SECONDS = 600.0


class _RayMember:
    """One rank's actor and its job in flight."""

    def __init__(self, launcher: RayLauncher, node: Node, device: int, actor: Any) -> None:
        self.launcher = launcher
        self.node = node
        self.device = device
        self.actor = actor
        self.stream: Any = None  # the job's messages (a Ray ObjectRefGenerator)
        self.death = ""
        # Ray called the actor unreachable, perhaps for now: its node may be going.
        self.unreachable = False

    def send(self, job: Job) -> bool:
        self.stream = self.actor.run.options(num_returns="streaming").remote(job)
        return True

    def reply(self) -> tuple[str, Any] | None:
        ray = self.launcher.ray
        if self.stream is None:
            return None
        ready, _ = ray.wait([self.stream], timeout=0)
        if not ready:
            return None
        try:
            kind, payload = cloudpickle.loads(ray.get(next(self.stream)))
            return str(kind), payload
        except StopIteration:  # cannot happen: the stream ends with the reply
            self.death = "ended its job without a reply"
            return "lost", None
        except Exception as err:  # the actor died, or its node went away
            self.death = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
            self.unreachable = isinstance(err, ray.exceptions.ActorUnavailableError)
            return "lost", None

    def lost(self) -> Lost:
        # A node that went away abruptly (a preempted machine) reads first as an actor
        # Ray cannot reach, and its node as alive until Ray's health checks miss it
        # (10-15 s): asked at once, the slice was blamed ("was killed", a failure the
        # task pays for) and retried on the dead node. An unreachable actor's node is
        # watched until it is marked dead or the wait ends.
        deadline = time.monotonic() + (NODE_DEATH_SECONDS if self.unreachable else 0.0)
        while True:
            if not self.launcher.node_alive(self.node):
                return Lost("node_lost", f"was lost with its node {self.node.name} (node lost)")
            if time.monotonic() >= deadline:
                return Lost("signal", f"was killed ({self.death})")
            time.sleep(0.5)


def _reachable(address: str | None, seconds: float = 10.0) -> None:
    """A ``HOST:PORT`` or ``ray://HOST[:PORT]`` (Ray Client, port 10001 by default)
    address that nothing answers at is refused in seconds (``ray.init`` kept retrying a
    cluster's for over five minutes, a client's for 33 s: review); ``auto`` and other
    schemes go to Ray as given."""
    if not address or address == "auto":
        return
    target = address.removeprefix("ray://")
    if target != address and ":" not in target.rstrip("/"):
        target = target.rstrip("/") + f":{RAY_CLIENT_PORT}"
    if "://" in target or ":" not in target:
        return
    host, _, port = target.rstrip("/").rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=seconds):
            return
    except (OSError, ValueError) as err:
        start = (f"a head's Ray Client server answers on port {RAY_CLIENT_PORT} (`ray start "
                 "--head`)" if target != address else f"`ray start --head --port {port}`")
        raise ClusterError(
            f"cannot reach a Ray cluster at {address!r} ({getattr(err, 'strerror', None) or err}"
            f"): start one there ({start}) or give the address `ray start` printed (--ray "
            "HOST:PORT), or --ray auto on a node of the cluster") from None


RAY_CLIENT_PORT = 10001  # Ray Client's port, where a ray:// address names none

# How long a node's devices may take to be reserved before the run says who holds them.
GROUP_READY_SECONDS = 120.0
# Past this, the wait is said (a free node's are granted at once): a run sat silent.
GROUP_SAID_SECONDS = 10.0


class RayLauncher:
    """Runs gangs on the nodes of a Ray cluster; one per run (``shutdown`` at its end)."""

    def __init__(self, address: str | None = "auto", env: dict[str, str] | None = None) -> None:
        """Connect to the cluster at ``address`` (unless this process already is);
        ``env``: environment variables the actors get besides dione's own."""
        self.ray = _ray()
        self.env = dict(env or {})
        if not self.ray.is_initialized():
            _reachable(address)
            try:
                # ray.init puts its own handler on SIGTERM, which aborted a run (exit
                # 134, a C++ dump) where dione's stops it cleanly, exit 143 (review).
                with stop_handlers_kept():
                    self.ray.init(address=address, log_to_driver=False,
                                  logging_level="ERROR", configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as err:
                raise ClusterError(f"cannot connect to a Ray cluster at {address!r}: {err}; "
                                   "where something answers there, Ray's own lines above say "
                                   "why it refused (an authentication token, a version "
                                   "apart); else start one (`ray start --head`) or give its "
                                   "address (--ray HOST:PORT)") from None
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)  # a device's gang ended
        self._ids: dict[str, str] = {}  # dione node name -> Ray node id
        self._groups: dict[str, Any] = {}  # node name -> placement group
        # Nodes whose placement group Ray has not granted yet (another job holds their
        # devices): node name -> (group, its ready reference). Kept asked for, so Ray
        # grants it once they are free; the node joins the run then (``alive_nodes``).
        self._waiting: dict[str, tuple[Any, Any]] = {}
        # One lock per node for its reservation: the wait for one node's devices holds
        # up neither the other nodes' nor the gangs handing devices back (``_lock``).
        self._reserving: dict[str, threading.Lock] = {}
        self._idle: dict[tuple[str, int], Any] = {}  # (node, device) -> actor
        self._busy: set[Any] = set()
        # (node, device) whose actor a gang holds or is being given (a device's actor
        # holds its placement group's bundle: a second one waits for it for ever).
        self._busy_at: set[tuple[str, int]] = set()
        # Removals of gangs' folders on their nodes (by a finished gang's actor, or by a
        # task for a failed gang's): awaited at shutdown, dropped here once done.
        self._forgetting: list[Any] = []
        self.failed_gangs: list[str] = []  # the folders' names, for the tests to look at
        self._actor_class = self.ray.remote(_Actor)
        self.actors_started = 0
        self._warned_source: set[str] = set()  # nodes said to run another dione

    # -- the cluster -----------------------------------------------------------------

    def nodes(self) -> list[Node]:
        """The alive nodes with devices: their GPUs, else their CPUs as slots; where any
        has GPUs, those only (a head started on a CPU machine holds no device of the run:
        its CPUs, planned alike with GPUs, would take slices). The first is the widest:
        the profiler measures options on it, up to its width (taken in the order Ray
        lists nodes, a 1-device node first profiled no option wider, and tasks that
        need two devices failed while a wider node idled)."""
        found = self._alive()
        if any(node.kind == "cuda" for _, node in found):
            found = [(i, node) for i, node in found if node.kind == "cuda"]
        return [node for _, node in sorted(found, key=lambda f: (-f[1].devices, f[0]))]

    def _alive(self) -> list[tuple[str, Node]]:
        """Every alive node with devices, GPU or CPU, with its Ray node id (a run planned
        on CPU nodes keeps them when a GPU node joins: they are looked up here)."""
        found = []
        for info in self.ray.nodes():
            resources = info.get("Resources", {})
            gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
            if not info.get("Alive") or (gpus == 0 and cpus == 0):
                continue
            name = f"{info.get('NodeManagerHostname', 'node')}-{info['NodeID'][:6]}"
            self._ids[name] = info["NodeID"]
            found.append((info["NodeID"], Node(name, gpus or cpus, "cuda" if gpus else "cpu",
                                               max(cpus, 1), accelerator_model(resources))))
        if not found:
            raise ClusterError("the Ray cluster has no alive node with CPUs or GPUs")
        return found

    def alive_nodes(self) -> list[Node] | None:
        """The nodes alive now whose devices are not waited for: a run plans a node that
        joined, or whose devices another job let go of, at its next re-plan."""
        return [node for _, node in self._alive()  # the run keeps those of its kind
                if not self._still_waited_for(node.name)]

    def _still_waited_for(self, name: str) -> bool:
        """Whether node ``name``'s placement group is asked for and not granted yet (one
        granted since is taken as the node's)."""
        with self._lock:
            waiting = self._waiting.get(name)
        if waiting is None:
            return False
        if not self.ray.wait([waiting[1]], num_returns=1, timeout=0)[0]:
            return True
        with self._lock:
            if self._waiting.get(name) is waiting:
                del self._waiting[name]
                self._groups[name] = waiting[0]
        return False

    def next_join(self) -> float | None:
        return None  # a node joins when someone starts it: nothing says when

    def joining_later(self) -> list[Node]:
        return []

    def node_alive(self, node: Node) -> bool:
        node_id = self._ids.get(node.name)
        return any(n["NodeID"] == node_id and n.get("Alive") for n in self.ray.nodes())

    def placement(self, node: Node, device_ids: Sequence[int]) -> Placement:
        """A gang's placement on ``node``: Ray, not dione, pins processes to cores."""
        return Placement(node.name, node.kind, tuple(device_ids),
                         threads_per_slot(node.devices, node.cores or node.devices))

    # -- actors ----------------------------------------------------------------------

    def _group(self, node: Node) -> Any:
        """The node's placement group: one bundle per device, all on that node; waits up
        to ``GROUP_READY_SECONDS`` for Ray to grant it (NodeBusyError past that: the
        request stays, and the node can be used once Ray grants it)."""
        with self._lock:
            if node.name in self._groups:
                return self._groups[node.name]
            reserving = self._reserving.setdefault(node.name, threading.Lock())
        with reserving:
            with self._lock:
                if node.name in self._groups:  # granted while this thread waited its turn
                    return self._groups[node.name]
                waiting = self._waiting.get(node.name)
            if waiting is None:
                waiting = self._ask_for_group(node)
                with self._lock:
                    self._waiting[node.name] = waiting
            group, ready = waiting
            try:
                self._wait_for_group(node, ready)
            except Exception as err:
                if type(err).__name__ == "GetTimeoutError":  # still asked for, kept
                    raise NodeBusyError(
                        f"cannot reserve the {node.devices} devices of node {node.name} on "
                        f"Ray: Ray gave none in {GROUP_READY_SECONDS:.0f} s; other jobs may "
                        "hold them (a node's devices are counted whole, free or not): `ray "
                        "status` says what is free; end those jobs, or start a node for "
                        "dione", node.name) from None
                with self._lock:
                    self._waiting.pop(node.name, None)
                with contextlib.suppress(Exception):  # removed already (shutdown)
                    _remove_group(group)
                raise ClusterError(f"cannot reserve the {node.devices} devices of node "
                                   f"{node.name} on Ray: {err}") from None
            with self._lock:
                self._waiting.pop(node.name, None)
                self._groups[node.name] = group
            return group

    def _wait_for_group(self, node: Node, ready: Any) -> None:
        """Wait for Ray to grant the node's placement group (``ready``), up to
        ``GROUP_READY_SECONDS``; a wait past ``GROUP_SAID_SECONDS`` is said at once (the
        run sat silent for two minutes before it said the node was held: a review)."""
        said = min(GROUP_SAID_SECONDS, GROUP_READY_SECONDS)
        try:
            self.ray.get(ready, timeout=said)
            return
        except Exception as err:
            if type(err).__name__ != "GetTimeoutError" or said >= GROUP_READY_SECONDS:
                raise
        import warnings

        warnings.warn(f"waiting up to {GROUP_READY_SECONDS - said:.0f} s more for Ray to "
                      f"grant the {node.devices} devices of node {node.name}: none in "
                      f"{said:.0f} s; another job may hold them (`ray status` says what "
                      "is free)", stacklevel=2)
        self.ray.get(ready, timeout=GROUP_READY_SECONDS - said)

    def _ask_for_group(self, node: Node) -> tuple[Any, Any]:
        """Ask Ray for the node's placement group; the group and its ready reference."""
        from ray.util import placement_group

        bundle = {"GPU": 1.0} if node.kind == "cuda" else {"CPU": 1.0}
        group = placement_group([bundle] * node.devices, strategy="STRICT_PACK",
                                bundle_label_selector=[{"ray.io/node-id":
                                                        self._ids[node.name]}]
                                * node.devices)
        return group, group.ready()

    def _actor(self, node: Node, device: int, threads: int) -> Any:
        """The device's actor for a gang (the device is then the caller's until it gives
        it back: ``_give_back``, or the actor returned to the idle pool)."""
        key = (node.name, device)
        with self._released:
            # A device another gang of this launcher holds (a trial of a task added to
            # a live run, beside the run's gangs): its actor comes back when that gang
            # ends; one started meanwhile waited for the actor's bundle for ever.
            self._released.wait_for(lambda: key not in self._busy_at, BUSY_WAIT_SECONDS)
            actor = self._idle.pop(key, None)
            self._busy_at.add(key)  # the caller's until it gives the device back
        try:
            return self._ready_actor(node, device, threads, actor)
        except BaseException:
            self._give_back({key})
            raise

    def _ready_actor(self, node: Node, device: int, threads: int, actor: Any) -> Any:
        """``actor`` (the device's idle one, or None) if it reset itself, else a new one."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if actor is not None:
            # Also as it is on a node that has gone: an actor in its place would wait
            # for it forever, where this one reads as lost, and the node with it.
            if self._restored(actor) or not self.node_alive(node):
                return actor
            self._end([actor])  # half reset, or died: the next slice gets a fresh one
        group = self._group(node)  # not under ``_lock``: it may wait for minutes
        env = {**self.env, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
               # A gang stays on its node: its ranks talk over loopback.
               "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
               "NCCL_SOCKET_IFNAME": os.environ.get("NCCL_SOCKET_IFNAME", "lo")}
        if "DIONE_TEST_SESSION" in os.environ:  # lets the test suite count its workers
            env["DIONE_TEST_SESSION"] = os.environ["DIONE_TEST_SESSION"]
        resources = {"num_gpus": 1} if node.kind == "cuda" else {"num_cpus": 1}
        self.actors_started += 1
        return self._actor_class.options(
            **resources, runtime_env={"env_vars": env}, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, device),
        ).remote()

    def _restored(self, actor: Any) -> bool:
        """Whether an idle actor reset itself after its last job, waiting up to
        ``RESTORE_SECONDS`` for the reset; False if it could not, is still at it, or died."""
        try:
            return bool(self.ray.get(actor.restored.remote(), timeout=RESTORE_SECONDS))
        except Exception:  # the reset hangs, the actor died, or its node went away
            return False

    def _end(self, actors: list[Any]) -> None:
        for actor in actors:
            with contextlib.suppress(Exception):  # already gone with its node
                self.ray.kill(actor, no_restart=True)
        with self._lock:
            self._busy.difference_update(actors)

    # -- gangs -----------------------------------------------------------------------

    def run_gang(self, spec: SliceSpec, placement: Placement, folder: str | Path,
                 timeout: float | None = None, cancel: threading.Event | None = None,
                 on_progress: OnProgress | None = None) -> list[SliceOutcome]:
        """Run ``spec`` on one warm actor per device of ``placement.node``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)  # the ranks' logs, as they arrive
        node = next((n for _, n in self._alive() if n.name == placement.node), None)
        if node is None:
            from dione.launch.gang import GangError

            raise GangError(f"node {placement.node} is not in the Ray cluster (node lost)",
                            None, "node_lost")
        held = {(node.name, device) for device in placement.device_ids}
        taken: dict[int, Any] = {}
        try:  # in device order: two gangs wanting two devices each never wait on each other
            for device in sorted(placement.device_ids):
                taken[device] = self._actor(node, device, placement.threads)
        except BaseException as err:  # the device that failed was given back by ``_actor``
            self._end(list(taken.values()))
            self._give_back({(node.name, device) for device in taken})
            if isinstance(err, NodeBusyError):  # a node that joined, held by another job:
                from dione.launch.gang import GangError  # the run plans on the others

                raise GangError(str(err), None, "node_lost") from None
            raise
        members = [_RayMember(self, node, device, taken[device])
                   for device in placement.device_ids]
        actors = [m.actor for m in members]
        with self._lock:
            self._busy.update(actors)
        store = f"{GANG_PREFIX}{uuid.uuid4().hex}"  # the gang's secret
        payload, modules = cloudpickle.dumps(spec), workload_sources()
        visible = 0 if node.kind == "cuda" else None  # Ray shows each actor its one GPU
        jobs = [Job(payload, modules, rank, store, None, placement.threads, None,
                    collective_timeout(), visible_device=visible)
                for rank in range(len(members))]
        try:
            outcomes = watch_gang(members, jobs, spec, placement, folder,
                                  lambda: self._end(actors), timeout, cancel, on_progress)
        except BaseException:
            self._end(actors)
            self._give_back(held)
            self._remove_failed(node.name, store)
            raise
        # Awaited at shutdown (ending the actor first would drop it, the folder left).
        self._removing(actors[0].forget.remote(store))
        with self._released:
            self._busy.difference_update(actors)
            surplus = []
            for device, actor in zip(placement.device_ids, actors, strict=True):
                if (node.name, device) in self._idle:
                    surplus.append(actor)
                else:
                    self._idle[(node.name, device)] = actor
            self._busy_at.difference_update(held)
            self._released.notify_all()
        self._end(surplus)  # outside the lock, which ``_end`` takes
        return outcomes

    def _give_back(self, held: set[tuple[str, int]]) -> None:
        """Devices whose actors were ended: another gang may start fresh ones there."""
        with self._released:
            self._busy_at.difference_update(held)
            self._released.notify_all()

    def _removing(self, removal: Any) -> None:
        """Keep ``removal`` for ``settle`` to wait for; drop those already done (the
        list is never emptied meanwhile: a ``settle`` then would wait for nothing)."""
        with self._lock:
            pending = list(self._forgetting)
        done = self.ray.wait(pending, num_returns=len(pending), timeout=0)[0] if pending \
            else []
        with self._lock:
            self._forgetting = [r for r in self._forgetting if r not in done] + [removal]

    def _remove_failed(self, name: str, store: str) -> None:
        """Remove a failed gang's folder (its ranks' logs in it) on node ``name``: a Ray
        task there, with the actors' environment (their temporary folder), since its
        actors were ended. It starts now (a new worker may take seconds on a busy node)
        and waits for the ended ranks to let go; a node lost meanwhile keeps it, for the
        next actor started on that machine."""
        self.failed_gangs.append(store)
        with contextlib.suppress(Exception):  # Ray shut down, or the node gone
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            remover = self.ray.remote(num_cpus=0, max_retries=0)(_remove_when_released)
            self._removing(remover.options(
                runtime_env={"env_vars": self.env},
                scheduling_strategy=NodeAffinitySchedulingStrategy(self._ids[name],
                                                                   soft=False),
            ).remote(store, _RELEASE_SECONDS))

    def warm_up(self, node: Node) -> None:
        """Start the actors of the devices of ``node`` that have none (idle, or running
        a gang: a task added to a live run profiles beside the run's gangs, and an actor
        for a device one of them holds waited 300 s for its placement group's bundle)
        and wait until they are ready."""
        threads = self.placement(node, range(node.devices)).threads
        with self._lock:
            held = {d for n, d in (*self._idle, *self._busy_at) if n == node.name}
        wanted = [d for d in range(node.devices) if d not in held]
        actors: list[Any] = []
        try:
            for device in wanted:
                actors.append(self._actor(node, device, threads))
            sources = self.ray.get([actor.source.remote() for actor in actors], timeout=300)
            self._same_source(node, sources)
        except BaseException:  # the device that failed was given back by ``_actor``
            self._end(actors)
            self._give_back({(node.name, d) for d in wanted[:len(actors)]})
            raise
        with self._released:
            for device, actor in zip(wanted, actors, strict=True):
                self._idle[(node.name, device)] = actor
                self._busy_at.discard((node.name, device))
            self._released.notify_all()

    def _same_source(self, node: Node, sources: list[tuple[int, str, str]]) -> None:
        """Warn once per node whose actors run another dione than this process (the
        raylet's environment, not the driver's PYTHONPATH: a patched dione tried on
        Ray ran the installed one unsaid)."""
        mine = _dione_source()
        other = next(((v, f) for _, v, f in sources if (v, f) != mine), None)
        if other is None or node.name in self._warned_source:
            return
        self._warned_source.add(node.name)
        import warnings

        warnings.warn(f"the Ray workers on node {node.name} run dione {other[0]} from "
                      f"{other[1]}, this process dione {mine[0]} from {mine[1]}: they train "
                      "with their own; install the same dione there (or pass its folder "
                      "with --ray-env PYTHONPATH=...)", stacklevel=2)

    def forget_node(self, name: str) -> None:
        """Drop what this launcher holds on a node that left the cluster."""
        with self._lock:
            gone = [k for k in self._idle if k[0] == name]
            actors = [self._idle.pop(k) for k in gone]
            groups = [g for g in (self._groups.pop(name, None),
                                  self._waiting.pop(name, (None,))[0]) if g is not None]
        self._end(actors)
        for group in groups:
            with contextlib.suppress(Exception):  # already gone with its node
                _remove_group(group)

    def settle(self) -> None:
        """Wait for the removals of ended gangs' folders on their nodes (up to
        ``_CLEANUP_SECONDS``; a node too slow to answer keeps its folders, for the next
        actor started on that machine)."""
        with self._lock:
            forgetting = list(self._forgetting)
        if forgetting:
            with contextlib.suppress(Exception):  # an actor or node already gone
                _, late = self.ray.wait(forgetting, num_returns=len(forgetting),
                                        timeout=_CLEANUP_SECONDS)
                for call in late:
                    with contextlib.suppress(Exception):
                        self.ray.cancel(call, force=True)
        with self._lock:
            self._forgetting = [r for r in self._forgetting if r not in forgetting]

    def shutdown(self) -> None:
        """End every actor and free every placement group of this launcher."""
        self.settle()  # before the actors that remove them end
        with self._lock:
            actors = [*self._idle.values(), *self._busy]
            self._idle.clear()
            groups = [*self._groups.values(), *(g for g, _ in self._waiting.values())]
            self._groups.clear()
            self._waiting.clear()
        self.settle()  # a gang that ended meanwhile
        self._end(actors)
        for group in groups:
            with contextlib.suppress(Exception):  # already gone with its node
                _remove_group(group)

    def __repr__(self) -> str:
        return f"<RayLauncher on {socket.gethostname()}>"
