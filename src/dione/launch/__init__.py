"""Gangs of workers: local processes and Ray actors, the worker entry point, slices."""

from typing import TYPE_CHECKING

from dione._lazy import lazy_exports

if TYPE_CHECKING:
    from dione.launch.local import GangError, GangInterrupted, Placement, run_local_gang
    from dione.launch.slice import (
        SliceError,
        SliceRequest,
        SliceResult,
        TrialProbe,
        local_placement,
        run_request,
        run_slice,
        total_steps,
    )

# Imported on first use: a worker (`python -m dione.launch.worker`) imports this package
# first, and must arm its parent-death signal before it pays for torch.
__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("GangError", "GangInterrupted", "Placement", "run_local_gang"),
                    "dione.launch.local"),
    **dict.fromkeys(("SliceError", "SliceRequest", "SliceResult", "TrialProbe",
                     "local_placement", "run_request", "run_slice", "total_steps"),
                    "dione.launch.slice"),
})

__all__ = [
    "GangError",
    "GangInterrupted",
    "Placement",
    "SliceError",
    "SliceRequest",
    "SliceResult",
    "TrialProbe",
    "local_placement",
    "run_local_gang",
    "run_request",
    "run_slice",
    "total_steps",
]
