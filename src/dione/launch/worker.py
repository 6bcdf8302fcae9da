"""A warm worker: one long-lived process per device slot, ``python -m dione.launch.worker FD``.

It pays for Python, torch and dione once, then serves slices over the connection on
file descriptor FD (a socket its launcher holds the other end of; nothing is read from
disk that others could write):

    loop { take a Job · fresh workload modules · join the gang's rendezvous · train,
           sending progress as it goes · send the outcome or the error · reset,
           then say whether the reset worked ("restored" / "unrestored") }

A worker outlives slices, not failures: after a rank raised, died, hung or was
cancelled its launcher ends the whole gang's workers and starts new ones. What one
slice could leave to the next is reset explicitly (``Baseline``); see there for what
is and is not. A worker whose reset failed ends; its launcher waits for that word
before handing it the next job and starts another in its place, so no slice fails for
what the one before it left (``restore_after_job``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import gc
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = ["COMM_ERROR_MARKERS", "RESTORE_SECONDS", "Baseline", "Job", "Report",
           "die_with_parent", "main", "redirected", "rendezvous_folder", "restore_after_job",
           "run_job"]

# Errors a rank sees because *another* rank died; never the root cause of a failure.
COMM_ERROR_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Gloo connectFullMesh failed",
    "NCCL communicator was aborted",
    "Socket Timeout",
    "Timed out waiting",
    "remote worker crashing",  # gloo: "This is typically caused by a remote worker crashing"
)

# How long a launcher waits for a worker's word that it restored after its last job
# before retiring it. Generous: a reset takes well under a second, and a worker retired
# for being slow costs only a fresh one, never a failed slice.
RESTORE_SECONDS = 30.0


@dataclass(frozen=True)
class Job:
    """One rank's share of a slice, as its launcher sends it."""

    spec: bytes  # the SliceSpec, cloudpickled (its functions refer to the modules below)
    # Workload module name -> (file, source): imported afresh for each job, from the
    # source the launcher read (by value: a worker on another host may not have it).
    modules: dict[str, tuple[str, str]]
    rank: int
    # The gang's rendezvous folder: an absolute path the launcher made private, or a
    # name (holding the gang's secret) the ranks create privately in their node's
    # temporary folder: a gang never spans nodes.
    store: str
    # This rank's output goes to this file for the job; None: to a file in the gang's
    # folder on the worker's node, which the worker sends back as it grows (Ray).
    log: str | None
    threads: int
    cores: tuple[int, ...] | None = None
    timeout_seconds: float = 1800.0  # collectives and the rendezvous
    # Where the runtime shows each worker one GPU as cuda:0 (Ray): that index.
    visible_device: int | None = None


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send this process ``sig`` (default: kill it) if its parent (the
    launcher, or the spawner that forked it) dies, so no gang outlives its launcher."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != int(os.environ.get("DIONE_LAUNCHER_PID", os.getppid())):
        os._exit(1)  # the parent died before prctl took effect


def _error_record(rank: int, err: BaseException) -> dict[str, Any]:
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    dist_error = type(err).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError")
    return {
        "rank": rank,
        "type": type(err).__name__,
        "message": str(err),
        "traceback": text,
        "time": time.time(),
        "communication": dist_error or any(m in text for m in COMM_ERROR_MARKERS),
    }


def _reset_peak_rss() -> None:
    """Start this slice's CPU peak-memory count afresh (Linux: VmHWM := current RSS)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


class Baseline:
    """The process state a fresh worker starts a slice with, taken before the first
    job and put back after each one, so that a slice sees what a fresh process would:

    - environment variables, the working directory, ``sys.path``, the warnings
      filters and the umask (a workload may set any; the umask decides who may read
      the next task's checkpoints);
    - torch's default dtype, grad mode, anomaly detection and deterministic-algorithms
      flags, float32 matmul precision and the TF32, cuDNN benchmark and deterministic
      switches (global switches a training script may flip, which change the next
      task's numbers on a GPU);
    - the handlers of SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2, where jobs run on
      the main thread (a local worker; an actor's run elsewhere and cannot set them);
    - module hooks registered globally (``register_module_forward_hook`` and friends);
    - torch's functions and classes a job patched with code of its own (a model factory
      wrapping ``nn.Linear.forward``: every task the worker trained after it took the
      patch, recorded exact; a review): not put back, the worker is replaced
      (``_torch_code``);
    - CPU affinity; intra-op threads are set per job;
    - the process group (destroyed), garbage (collected; what the worker held before
      its first job is frozen, never collected), CUDA's cache and peak
      statistics (emptied and reset), the CPU peak-memory count (cleared).

    Workload files are imported afresh for every job, so their globals start as on
    import. Not reset: threads a workload started and left running, and modules a
    workload imports from elsewhere keep their globals,
    and caches inside third-party libraries stay warm, which is the point of a warm
    worker; RNG needs no reset (every slice seeds or restores it).
    """

    def __init__(self) -> None:
        import torch

        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.dtype = torch.get_default_dtype()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        self.anomaly = torch.is_anomaly_enabled()
        self.affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.path = list(sys.path)
        self.filters = list(warnings.filters)
        self.umask = os.umask(0o077)
        os.umask(self.umask)
        self.precision = torch.get_float32_matmul_precision()
        self.newer = _read_switches(_NEWER_SWITCHES)
        self.older = _read_switches(_OLDER_SWITCHES)
        self.handlers = ({sig: signal.getsignal(sig) for sig in _SIGNALS}
                         if threading.current_thread() is threading.main_thread() else {})
        self.hooks = {name: dict(getattr(torch.nn.modules.module, name))
                      for name in _GLOBAL_HOOKS}
        self.code = _torch_code()
        # What the worker holds before its first job (Python, torch, dione; Ray in an
        # actor) is never garbage: keep it out of the collection each restore runs,
        # which over a Ray actor's 330,000 objects took 0.13 s of every slice.
        gc.collect()
        gc.freeze()

    def restore(self) -> None:
        import torch
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        os.environ.clear()
        os.environ.update(self.environ)
        with contextlib.suppress(OSError):
            os.chdir(self.cwd)
        torch.set_default_dtype(self.dtype)
        torch.use_deterministic_algorithms(self.deterministic, warn_only=self.warn_only)
        torch.set_grad_enabled(True)
        torch.autograd.set_detect_anomaly(self.anomaly)
        for name, saved in self.hooks.items():
            hooks = getattr(torch.nn.modules.module, name)
            for key in [k for k in hooks if k not in saved]:
                del hooks[key]
        if self.affinity is not None:
            os.sched_setaffinity(0, self.affinity)
        sys.path[:] = self.path
        warnings.filters[:] = self.filters  # type: ignore[index]
        getattr(warnings, "_filters_mutated", lambda: None)()  # drop the filter cache
        os.umask(self.umask)
        for (module, name), value in self.older.items():
            setattr(module, name, value)
        torch.set_float32_matmul_precision(self.precision)
        for (module, name), value in self.newer.items():
            setattr(module, name, value)
        if threading.current_thread() is threading.main_thread():
            for sig, handler in self.handlers.items():
                if signal.getsignal(sig) is not handler and handler is not None:
                    signal.signal(sig, handler)
            # faulthandler's stack writer, whatever the job did to it (its own handler, a
            # library's save-and-restore of SIG_DFL, an unregister: getsignal sees none
            # of it, and the next stack request killed the worker: regression reviews);
            # unregistered first, as it keeps no second registration's handler.
            import faulthandler

            faulthandler.unregister(STACKS_SIGNAL)
            with contextlib.suppress(Exception):  # never the reason a restore fails
                # fd 2, not sys.stderr (a job may leave a StringIO there, or None: the
                # restore failed and retired the worker: a regression review)
                faulthandler.register(STACKS_SIGNAL, file=2, all_threads=True)
        patched = sorted(f"{getattr(owner, '__name__', owner)}.{name}"
                         for (owner, name), value in self.code.items()
                         if (now := vars(owner).get(name)) is not value and _not_torchs(now))
        if patched:
            # Not put back: a module of the user's that patched torch on import stays
            # imported and would not patch it again for its task's next job (a
            # regression review). The worker is replaced (a fresh fork), as for any reset
            # that fails, so no later job of another task sees the patch.
            raise RuntimeError(f"a job patched torch's {', '.join(patched[:5])} with code of "
                               "its own: this worker is replaced, so no later job sees it")
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            torch.cuda.empty_cache()
            for device in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(device)


def _torch_code() -> dict[tuple[Any, str], Any]:
    """What torch's namespaces a training script calls hold: (owner, name) -> value for
    the functions of ``torch``, ``torch.nn``, ``torch.nn.functional`` and ``torch.nn.init``,
    and the members of ``torch.Tensor`` and of every module and optimizer class of
    ``torch.nn`` and ``torch.optim`` (some 3,500 entries: 4 ms to read, 3 ms to check)."""
    import torch

    owners: list[Any] = [torch, torch.nn, torch.nn.functional, torch.nn.init, torch.Tensor,
                         torch.optim, torch.optim.lr_scheduler]
    classes = {id(v): v for space in (torch.nn, torch.optim, torch.optim.lr_scheduler)
               for v in vars(space).values()
               if isinstance(v, type) and v.__module__.startswith("torch.")}
    owners += classes.values()
    return {(owner, name): value for owner in owners
            for name, value in list(vars(owner).items())}


def _not_torchs(value: Any) -> bool:
    """Whether ``value`` is code from outside torch (a function, a method, a class or a
    wrapper a job made), or torch's wrapper around such (an optimizer's ``step`` is
    wrapped by torch's profiling hook when the first instance is made), not something
    torch set up itself since the baseline."""
    import torch

    home = os.path.dirname(torch.__file__)
    for _ in range(16):  # down a chain of functools.wraps wrappers
        if isinstance(value, type):
            return not value.__module__.startswith("torch")
        function = getattr(value, "__func__", value)
        code = getattr(function, "__code__", None)
        if code is not None and not code.co_filename.startswith(home):
            return True
        value = getattr(function, "__wrapped__", None)
        if value is None:
            return False
    return False


_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)

# Sent to a rank the launcher is about to end as stalled or past its timeout: its every
# thread's stack goes to its log (the job's stderr), so the error's log says where it
# hung (it was empty: a review). Also a job's own children, which inherit it.
STACKS_SIGNAL = signal.SIGUSR1


# torch's global numeric switches a workload may flip, under torch.backends: the newer
# fp32_precision family and the older flags. They are put back older first, then the
# matmul precision, then the newer (which that call writes "ieee" into): every switch
# as a fresh process has it, and both families readable (torch 2.13 raises on reading
# a flag of one family once only the other was set; measured for every mix).
_NEWER_SWITCHES = tuple(f"{m}fp32_precision" for m in (
    "", "cuda.matmul.", "cudnn.", "cudnn.conv.", "cudnn.rnn.", "mkldnn.", "mkldnn.matmul.",
    "mkldnn.conv.", "mkldnn.rnn."))
_OLDER_SWITCHES = ("cuda.matmul.allow_tf32", "cuda.matmul.allow_fp16_reduced_precision_reduction",
                   "cuda.matmul.allow_bf16_reduced_precision_reduction", "cudnn.allow_tf32",
                   "cudnn.benchmark", "cudnn.deterministic", "cudnn.enabled")


def _read_switches(names: tuple[str, ...]) -> dict[tuple[Any, str], Any]:
    """(module, attribute) -> value of each switch this torch has and can read now."""
    import torch

    found = {}
    for name in names:
        with contextlib.suppress(Exception):
            *path, attribute = name.split(".")
            module = functools.reduce(getattr, path, torch.backends)
            found[(module, attribute)] = getattr(module, attribute)
    return found


_GLOBAL_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks",
                 "_global_backward_pre_hooks", "_global_backward_hooks",
                 "_global_module_registration_hooks", "_global_parameter_registration_hooks",
                 "_global_buffer_registration_hooks")


def _fresh_module(name: str, path: str, source: str) -> None:
    """Import a workload file anew under the launcher's module name: its globals start
    as a fresh process would see them, whatever the previous slice did to them."""
    import types

    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:  # its sibling modules import (sys.path is reset after)
        sys.path.insert(0, folder)
    exec(compile(source, path, "exec"), module.__dict__)


def rendezvous_path(store: str) -> str:
    """Where the gang's rendezvous folder is on this node (see ``Job.store``). A name
    goes in the temporary folder with this host's name after it: where several nodes
    share one, each sweeps only its own (its locks may not show on the others)."""
    import socket
    import tempfile

    if os.path.isabs(store):
        return store
    return os.path.join(tempfile.gettempdir(), f"{store}.{socket.gethostname()}")


def rendezvous_folder(store: str) -> str:
    """The gang's private rendezvous folder on this node, made if it is not there."""
    from dione.state.private import check_private

    folder = rendezvous_path(store)
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    check_private(folder)
    return folder


Report = Callable[[str, Any], None]


def restore_after_job(baseline: Baseline, rank: int) -> tuple[str, Any]:
    """Put the worker back as ``baseline`` found it after a job: ``("restored", None)``,
    or ``("unrestored", record)`` when that raised; its launcher then retires it before
    the next job, which a half-reset worker would fail (blaming the wrong task)."""
    try:
        baseline.restore()
        return "restored", None
    except BaseException as err:  # the launcher reads the verdict: report everything
        traceback.print_exc()
        return "unrestored", _error_record(rank, err)


def warm_torch() -> None:
    """Pay what torch does once per process before a worker's first job: its first
    optimizer imports its compiler stack (0.4-0.6 s on 2 cores), which every worker's
    first slice paid and a trial counted as each slice's start. Nothing runs (no thread
    starts: the spawner forks workers after it)."""
    import torch

    torch.optim.AdamW(torch.nn.Linear(1, 1).parameters())


def _check_outcome(spec: Any, outcome: Any, rank: int) -> None:
    """ValueError, in one sentence, where a technique's ``train`` (a user's) returned
    what a slice cannot be recorded from: not a SliceOutcome, a loss count that is not
    its steps', or, on rank 0 of a slice that saves, no checkpoint (its training was
    recorded done, and lost)."""
    from dione.techniques.base import SliceOutcome

    name = spec.technique.name
    if not isinstance(outcome, SliceOutcome):
        raise ValueError(f"technique {name!r}: its train() returned {type(outcome).__name__}, "
                         "not a SliceOutcome; end it with `return ctx.outcome(checkpoint)`")
    if rank != 0:
        return
    steps = spec.end_step - spec.start_step
    if len(outcome.losses) != steps or len(outcome.step_seconds) != steps:
        raise ValueError(f"technique {name!r}: its train() returned {len(outcome.losses)} "
                         f"loss(es) and {len(outcome.step_seconds)} step time(s) for the "
                         f"slice's {steps} steps; call ctx.step_done(loss) once a step")
    if spec.save and outcome.checkpoint is None:
        raise ValueError(f"technique {name!r}: its train() saved no checkpoint, so the "
                         "slice's training would be lost; end it with "
                         "`return ctx.outcome(ctx.save(model, optimizer, scheduler))`")


def run_job(job: Job, report: Report | None = None) -> tuple[str, Any]:
    """Train one rank's share of a slice: ``("result", SliceOutcome)`` or ``("error",
    record)``; ``report("progress", record)`` carries the slice's progress meanwhile
    (the launcher's channel: the worker's connection, or a Ray stream)."""
    import cloudpickle
    import torch
    import torch.distributed as dist

    from dione.spec.devices import backend_for
    from dione.techniques import import_clock
    from dione.techniques.base import SliceSpec
    from dione.techniques.context import SliceContext
    from dione.techniques.evaluate import evaluate_checkpoint, note_evaluation_error

    rank = job.rank
    try:
        if job.cores and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, set(job.cores))
        torch.set_num_threads(job.threads)
        _reset_peak_rss()
        known, began = len(sys.modules), time.perf_counter()
        for module, (file, source) in job.modules.items():
            _fresh_module(module, file, source)
        spec: SliceSpec = cloudpickle.loads(job.spec)
        # The workload's own imports (transformers: over a second) are paid once per
        # worker, by its first slice: said apart, so that a trial does not count them
        # as every slice's start.
        first_imports = (time.perf_counter() - began
                         if len(sys.modules) - known > len(job.modules) else 0.0)
        if job.visible_device is not None:
            spec = dataclasses.replace(spec, device_ids=(job.visible_device,) * spec.world)
        world = spec.world
        if spec.device_kind == "cuda":
            torch.cuda.set_device(spec.device_ids[rank])
        # One rank needs no gang: skip the process group, whose communication thread
        # would wake a hundred times a second on the core the rank is pinned to.
        grouped = world > 1 or spec.technique.needs_process_group
        if grouped:
            timeout = timedelta(seconds=job.timeout_seconds)
            store = dist.FileStore(  # type: ignore[attr-defined]
                os.path.join(rendezvous_folder(job.store), "store"), world)
            store.set_timeout(timeout)
            dist.init_process_group(backend_for(spec.device_kind), store=store, rank=rank,
                                    world_size=world, timeout=timeout)
        ctx = SliceContext(spec, rank, world)
        if report is not None:
            ctx.on_progress = functools.partial(report, "progress")
        before = import_clock.seconds()
        with import_clock.counting():
            outcome = spec.technique.train(ctx)
        _check_outcome(spec, outcome, rank)
        # And what the slice imported outside its steps, once per worker: a lazy
        # package's module (transformers loads a model's the first time the task's
        # model() names its class: 2 s of a tiny GPT-2's first trial), the first
        # checkpoint's writer. A trial counted it as every slice's start.
        first_imports += import_clock.seconds() - before - ctx.imports_in_steps
        if first_imports:
            outcome.timings["first_imports"] = first_imports
        if grouped:
            # FSDP's modules sit in reference cycles: free them while their group lives.
            gc.collect()
            dist.destroy_process_group()
        if (rank == 0 and spec.evaluate and not ctx.evaluated
                and outcome.checkpoint is not None):
            # A technique (a user's) that evaluated no live model: its checkpoint.
            # (The other ranks have returned; rank 0 still reports to the launcher.)
            with ctx.evaluating(outcome):  # (a SystemExit there: not said as returned)
                try:  # a broken evaluation must not lose the training it follows
                    began = time.perf_counter()
                    outcome.evaluation = evaluate_checkpoint(spec.task, outcome.checkpoint,
                                                             ctx.device)
                    outcome.timings["evaluate_seconds"] = time.perf_counter() - began
                except Exception as err:
                    note_evaluation_error(outcome, err)
        return "result", outcome
    except BaseException as err:  # the launcher reads the record: report everything
        traceback.print_exc()
        return "error", _error_record(rank, err)


def redirected(path: str) -> contextlib.AbstractContextManager[None]:
    """Point this process's stdout and stderr (C-level too) at ``path`` for a job."""

    @contextlib.contextmanager
    def redirect() -> Any:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.makedirs(os.path.dirname(path), exist_ok=True)  # on a node that lacks it
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])

    return redirect()


def main(fd: int) -> int:
    die_with_parent()
    import faulthandler
    from multiprocessing.connection import Connection

    faulthandler.register(STACKS_SIGNAL, file=2, all_threads=True)  # fd 2: the job's log

    import cloudpickle
    import torch

    import dione.techniques  # noqa: F401 - the built-in techniques, registered once

    connection = Connection(fd)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    baseline = Baseline()
    connection.send_bytes(cloudpickle.dumps(("ready", os.getpid())))
    while True:
        try:
            message = connection.recv_bytes()
        except EOFError:
            return 0  # the launcher closed the pool
        job: Job = cloudpickle.loads(message)

        def report(kind: str, payload: Any) -> None:
            connection.send_bytes(cloudpickle.dumps((kind, payload)))

        with redirected(job.log) if job.log else contextlib.nullcontext():
            kind, payload = run_job(job, report)
        try:
            reply = cloudpickle.dumps((kind, payload))
        except Exception as err:  # an outcome that cannot travel is this rank's error
            reply = cloudpickle.dumps(("error", _error_record(job.rank, err)))
        connection.send_bytes(reply)
        verdict = restore_after_job(baseline, job.rank)
        connection.send_bytes(cloudpickle.dumps(verdict))
        if verdict[0] != "restored":
            return 1  # half reset: no job may run here again (the launcher starts another)


if __name__ == "__main__":
    status = main(int(sys.argv[1]))
    # Skip interpreter teardown: destroying torch's C++ threads at exit has aborted a
    # finished FSDP rank ("terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
