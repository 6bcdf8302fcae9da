"""The options of a trial; no torch here, so the CLI reads their defaults at start-up."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TrialOptions"]


@dataclass(frozen=True)
class TrialOptions:
    """How trials measure: steps discarded, steps timed, limits."""

    warmup_steps: int = 5
    measure_steps: int = 20
    timeout: float = 300.0
    memory_cap_bytes: int | None = None  # per device; None: the device's own limit
    repeats: int = 1  # runs of each option's chosen setting, at different moments

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError(f"TrialOptions.repeats is {self.repeats}: each trial runs at "
                             "least once, so use 1 (the default) or more")
