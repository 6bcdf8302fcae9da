"""Trial runner and catalog: short real runs of each task's configurations, kept in SQLite."""

from dione.profile.catalog import Catalog, TrialRecord, default_catalog_path
from dione.profile.fingerprint import speed_signature, trial_fingerprint
from dione.profile.profiler import profile_workload
from dione.profile.results import Option, Profile, ProfileEvent, TaskProfile
from dione.profile.simulated import simulated_step_seconds
from dione.profile.trial import TrialOptions, TrialSpec, run_trial
from dione.profile.trials import device_counts

__all__ = [
    "Catalog",
    "Option",
    "Profile",
    "ProfileEvent",
    "TaskProfile",
    "TrialOptions",
    "TrialRecord",
    "TrialSpec",
    "default_catalog_path",
    "device_counts",
    "profile_workload",
    "run_trial",
    "simulated_step_seconds",
    "speed_signature",
    "trial_fingerprint",
]
