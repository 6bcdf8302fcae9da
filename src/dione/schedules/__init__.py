"""Pipeline schedules as data, the cut of blocks into stages, and a simulator: pure data,
no torch (the pipeline wing, ``dione.techniques.pipeline``, runs them)."""

from dione.schedules.actions import Action, Schedule, ScheduleError, gpipe, one_f_one_b, xpipe
from dione.schedules.partition import Partition, PartitionError, balance
from dione.schedules.simulate import Span, StageTimes, Timeline, simulate, spans_of

__all__ = [
    "Action",
    "Partition",
    "PartitionError",
    "Schedule",
    "ScheduleError",
    "Span",
    "StageTimes",
    "Timeline",
    "balance",
    "gpipe",
    "one_f_one_b",
    "simulate",
    "spans_of",
    "xpipe",
]
