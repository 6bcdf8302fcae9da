"""The worker entry point: one rank of a gang, ``python -m dione.launch.worker DIR RANK``.

From the launcher's private folder (``$DIONE_PRIVATE_DIR``, checked to be this user's
and writable by no one else) it imports the workload files named in ``modules.json``,
reads the slice from ``slice.pkl``, joins the gang through the FileStore there, runs
the technique and writes ``result-<rank>.pkl``; on any error it writes
``error-<rank>.json`` (with the traceback, atomically) and exits with status 1. Its
progress files go to ``DIR``, the slice's log folder in the run directory.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

__all__ = ["COMM_ERROR_MARKERS", "main"]

# Errors a rank sees because *another* rank died; never the root cause of a failure.
COMM_ERROR_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Gloo connectFullMesh failed",
    "NCCL communicator was aborted",
    "Socket Timeout",
    "Timed out waiting",
)


def _die_with_parent() -> None:
    """Ask Linux to kill this worker if the launcher dies, so no gang outlives it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != int(os.environ.get("DIONE_LAUNCHER_PID", os.getppid())):
        os._exit(1)  # the launcher died before prctl took effect


def _write_atomically(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: the launcher may read it at any moment."""
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)


def _write_error(folder: Path, rank: int, err: BaseException) -> None:
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    dist_error = type(err).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError")
    record = {
        "rank": rank,
        "type": type(err).__name__,
        "message": str(err),
        "traceback": text,
        "time": time.time(),
        "communication": dist_error or any(m in text for m in COMM_ERROR_MARKERS),
    }
    _write_atomically(folder / f"error-{rank}.json", json.dumps(record).encode())


def main(folder: Path, rank: int) -> int:
    _die_with_parent()
    cores = os.environ.get("DIONE_CORES")
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cores.split(",")})
    private = Path(os.environ["DIONE_PRIVATE_DIR"])
    try:
        import cloudpickle
        import torch
        import torch.distributed as dist

        from dione.spec.devices import backend_for
        from dione.spec.workload import import_workload_file
        from dione.state.private import check_private
        from dione.techniques.base import SliceContext, SliceSpec
        from dione.techniques.evaluate import evaluate_checkpoint

        # What follows imports and unpickles: only from a folder no one else can write.
        for path in (private, private / "modules.json", private / "slice.pkl"):
            check_private(path)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        for module, file in json.loads((private / "modules.json").read_text()).items():
            import_workload_file(module, file)
        spec: SliceSpec = cloudpickle.loads((private / "slice.pkl").read_bytes())
        world = spec.world
        if spec.device_kind == "cuda":
            torch.cuda.set_device(spec.device_ids[rank])
        # One rank needs no gang: skip the process group, whose communication thread
        # would wake a hundred times a second on the core the rank is pinned to.
        grouped = world > 1 or spec.technique.needs_process_group
        if grouped:
            timeout = timedelta(
                seconds=float(os.environ.get("DIONE_COLLECTIVE_TIMEOUT", "1800")))
            store = dist.FileStore(str(private / "store"), world)  # type: ignore[attr-defined]
            store.set_timeout(timeout)
            dist.init_process_group(backend_for(spec.device_kind), store=store, rank=rank,
                                    world_size=world, timeout=timeout)
        ctx = SliceContext(spec, rank, world)
        ctx.progress_path = folder / f"progress-{rank}.json"
        outcome = spec.technique.train(ctx)
        if grouped:
            # FSDP's modules sit in reference cycles: free them while their group lives.
            gc.collect()
            dist.destroy_process_group()
        if rank == 0 and spec.evaluate and outcome.checkpoint is not None:
            try:  # a broken evaluation must not lose the training it follows
                began = time.perf_counter()
                outcome.evaluation = evaluate_checkpoint(spec.task, outcome.checkpoint,
                                                         ctx.device)
                outcome.timings["evaluate_seconds"] = time.perf_counter() - began
            except Exception as err:
                outcome.extra["evaluation_error"] = "".join(
                    traceback.format_exception(type(err), err, err.__traceback__))
        _write_atomically(private / f"result-{rank}.pkl", cloudpickle.dumps(outcome))
        return 0
    except BaseException as err:  # the launcher reads the file: report everything
        _write_error(private, rank, err)
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    status = main(Path(sys.argv[1]), int(sys.argv[2]))
    # Skip interpreter teardown: the result is on disk, and destroying torch's C++ threads
    # at exit has aborted a finished FSDP rank ("terminate called without an active
    # exception"), which would fail a slice whose work was done.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
