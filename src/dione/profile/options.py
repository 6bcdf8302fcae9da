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
        for name, least in (("warmup_steps", 0), ("measure_steps", 1), ("repeats", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"TrialOptions.{name} is {value!r}: a whole number of at "
                                 f"least {least}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) \
                or not self.timeout > 0 or self.timeout == float("inf"):
            raise ValueError(f"TrialOptions.timeout is {self.timeout!r}: a positive, finite "
                             "number of seconds")
        cap = self.memory_cap_bytes
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"TrialOptions.memory_cap_bytes is {cap!r}: a positive whole "
                             "number of bytes, or None")
        if self.repeats < 1:
            raise ValueError(f"TrialOptions.repeats is {self.repeats}: each trial runs at "
                             "least once, so use 1 (the default) or more")
