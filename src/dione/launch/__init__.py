"""Gangs of workers: local processes (Ray to come), the worker entry point, slices."""

from dione.launch.local import GangError, GangInterrupted, Placement, run_local_gang
from dione.launch.slice import (
    SliceError,
    SliceResult,
    TrialSettings,
    local_placement,
    run_slice,
    total_steps,
)

__all__ = [
    "GangError",
    "GangInterrupted",
    "Placement",
    "SliceError",
    "SliceResult",
    "TrialSettings",
    "local_placement",
    "run_local_gang",
    "run_slice",
    "total_steps",
]
