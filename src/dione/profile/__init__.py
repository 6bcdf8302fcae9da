"""Trial runner and catalog: short real runs of each task's configurations, kept in SQLite."""

from typing import TYPE_CHECKING

from dione._lazy import lazy_exports

if TYPE_CHECKING:
    from dione.profile.catalog import Catalog, TrialRecord, default_catalog_path
    from dione.profile.fingerprint import speed_signature, trial_fingerprint
    from dione.profile.options import TrialOptions
    from dione.profile.profiler import profile_workload
    from dione.profile.results import Profile, ProfiledOption, ProfileEvent, TaskProfile
    from dione.profile.simulated import simulated_step_seconds
    from dione.profile.trial import TrialSpec, run_trial
    from dione.profile.trials import device_counts

# Imported on first use: the CLI reads TrialOptions' defaults to build its parser, and
# must not pay for torch to do so.
__getattr__ = lazy_exports(__name__, {
    **dict.fromkeys(("Catalog", "TrialRecord", "default_catalog_path"),
                    "dione.profile.catalog"),
    **dict.fromkeys(("speed_signature", "trial_fingerprint"), "dione.profile.fingerprint"),
    "TrialOptions": "dione.profile.options",
    "profile_workload": "dione.profile.profiler",
    **dict.fromkeys(("ProfiledOption", "Profile", "ProfileEvent", "TaskProfile"),
                    "dione.profile.results"),
    "simulated_step_seconds": "dione.profile.simulated",
    **dict.fromkeys(("TrialSpec", "run_trial"), "dione.profile.trial"),
    "device_counts": "dione.profile.trials",
})

__all__ = [
    "Catalog",
    "Profile",
    "ProfileEvent",
    "ProfiledOption",
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
