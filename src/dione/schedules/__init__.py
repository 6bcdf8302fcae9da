"""Pipeline schedules as data, the partitioning of models into stages, and a simulator."""

from dione.schedules.actions import Action, Schedule, ScheduleError, gpipe, one_f_one_b, xpipe
from dione.schedules.partition import (
    Partition,
    PartitionError,
    balance,
    parameter_costs,
    partition_model,
    pipeline_layers,
)
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
    "parameter_costs",
    "partition_model",
    "pipeline_layers",
    "simulate",
    "spans_of",
    "xpipe",
]
