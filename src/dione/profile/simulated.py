"""The schedule simulator beside a pipeline trial's measurement: which techniques are
pipelines, the simulator's step time from per-stage action times, the cross-check."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence

from dione.profile.catalog import Catalog, TrialRecord
from dione.schedules.simulate import StageTimes, simulate
from dione.techniques.pipeline import PipelineTechnique
from dione.techniques.registry import get_technique

__all__ = ["cross_check", "is_pipeline", "pipeline_technique", "simulated_step_seconds"]


def pipeline_technique(technique: str) -> PipelineTechnique | None:
    """The registered technique named ``technique`` if it is a pipeline (its steps follow
    a schedule of actions per stage, which the simulator can replay), else None."""
    try:
        method = get_technique(technique)
    except KeyError:  # a catalog record of a technique this process has not registered
        return None
    return method if isinstance(method, PipelineTechnique) else None


def is_pipeline(technique: str) -> bool:
    """Whether the technique named ``technique`` is a pipeline."""
    return pipeline_technique(technique) is not None


def simulated_step_seconds(
    technique: str, stage_times: Mapping[str, Sequence[float]], micro_batches: int,
    minibatches: int = 16, shared: Sequence[Sequence[int]] = (),
) -> float:
    """The simulator's steady-state seconds per step (median interval between stage 0's
    updates) for ``technique``'s schedule on the given per-stage action times; ``shared``:
    per weight several stages hold, those stages (their updates wait for each other)."""
    method = pipeline_technique(technique)
    if method is None:
        raise ValueError(f"{technique} is not a pipeline: it has no schedule to simulate")
    times = StageTimes(tuple(stage_times["forward"]), tuple(stage_times["backward"]),
                       tuple(stage_times["update"]))
    stages = len(times.forward)
    timeline = simulate(method.schedule(stages, micro_batches, minibatches), times, shared)
    ends = [s.end for s in timeline.spans[0] if s.action.kind == "U"]
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    return statistics.median(gaps[len(gaps) // 2:]) if gaps else timeline.per_minibatch


def cross_check(results: Mapping[str, TrialRecord], group_of: Mapping[str, str],
                catalog: Catalog) -> None:
    """For pipeline trials, the schedule simulator's step time from per-stage action times
    (the trial's own, or those of another pipeline trial on the same stages and
    micro-batches), with the wait for weights its stages share; the measured time stays
    the one predictions use. A record made before trials kept ``shared_stages`` has
    none: simulated as if nothing were shared."""
    for fingerprint, record in results.items():
        if not record.feasible or not is_pipeline(record.technique):
            continue
        if record.simulated_step_seconds is not None:
            continue
        source = record if "stage_times" in record.extra else None
        if source is None:
            source = next((other for other_fp, other in results.items()
                           if other.feasible and "stage_times" in other.extra
                           and group_of.get(other_fp) == group_of.get(fingerprint)
                           and other.devices == record.devices
                           and other.knobs.get("micro_batches") == record.knobs["micro_batches"]),
                          None)
        if source is None:
            record.simulation_note = ("measured; no per-action stage times to simulate "
                                      "(the trial logged no timeline)")
            continue
        # The trial's own shared stages; the source's (the same task group and
        # stages) for a record that has none.
        shared = record.extra.get("shared_stages") or source.extra.get("shared_stages", [])
        simulated = simulated_step_seconds(record.technique, source.extra["stage_times"],
                                           int(record.knobs["micro_batches"]), shared=shared)
        record.simulated_step_seconds = simulated
        assert record.step_seconds is not None
        error = simulated / record.step_seconds - 1
        record.simulation_note = (
            f"measured {record.step_seconds * 1000:.1f} ms/step used; the simulator gives "
            f"{simulated * 1000:.1f} ms ({error:+.0%}) from "
            f"{'its own' if source is record else source.technique + ' trial'} action times")
        catalog.put(record)
