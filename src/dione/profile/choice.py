"""Which trial stands for each option: per task, technique and device count the knob
setting whose steps are fastest; and the runs of repeated trials merged into one record."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from dione.profile.catalog import TrialRecord
from dione.profile.results import ProfiledOption, TaskProfile
from dione.profile.trials import PendingTrial

__all__ = ["choose_options", "merged_runs", "repeats_due", "trial_runs"]


def choose_options(trials: Sequence[TrialRecord], steps: int) -> list[ProfiledOption]:
    """Per (technique, devices) the knob setting whose steps are fastest, its fixed cost
    the median over every feasible setting's trial.

    The knobs (micro-batches, resharding, activation checkpointing) change the steps,
    not the start-up, save and exit that make up the fixed cost; and picking the
    setting with the smallest *whole* prediction would also pick the trial whose
    start-up happened to be quickest: a prediction biased low by the noise of one
    process start (up to 0.5 s on a small CPU).
    """
    by_key: dict[tuple[str, int], list[TrialRecord]] = {}
    for record in trials:
        if record.feasible:
            by_key.setdefault((record.technique, record.devices), []).append(record)
    options = []
    for (technique, devices), records in sorted(by_key.items(), key=lambda kv: kv[0][::-1]):
        best = min(records, key=lambda r: r.warmup_excess_seconds + steps * (r.step_seconds or 0))
        fixed = statistics.median(r.fixed_seconds for r in records)
        options.append(ProfiledOption(technique, dict(best.knobs), devices,
                              dataclasses.replace(best, fixed_seconds=fixed)))
    return options


def trial_runs(record: TrialRecord) -> list[dict[str, float]]:
    """A record's runs: each run's own timings (one run unless the trial was repeated)."""
    return list(record.extra.get("runs") or [{
        "step_seconds": record.step_seconds or 0.0, "fixed_seconds": record.fixed_seconds,
        "warmup_excess_seconds": record.warmup_excess_seconds,
        "load_seconds": record.load_seconds, "trial_seconds": record.trial_seconds}])


def merged_runs(old: TrialRecord, new: TrialRecord) -> TrialRecord:
    """One record from a trial and its repeat: each timing the median over the runs
    (a run that hit a slow spell of a shared machine is outvoted from three on)."""
    if not new.feasible:  # a repeat that failed where the first run fitted: keep the runs
        return dataclasses.replace(old, extra={**old.extra, "failed_repeat": new.reason})
    runs = trial_runs(old) + trial_runs(new)

    def median(key: str) -> float:
        return statistics.median(run[key] for run in runs)

    return dataclasses.replace(
        old, step_seconds=median("step_seconds"), fixed_seconds=median("fixed_seconds"),
        warmup_excess_seconds=median("warmup_excess_seconds"),
        load_seconds=median("load_seconds"),
        measured_steps=old.measured_steps + new.measured_steps,
        trial_seconds=old.trial_seconds + new.trial_seconds,
        peak_memory_bytes=max((m for m in (old.peak_memory_bytes, new.peak_memory_bytes)
                               if m is not None), default=None),
        extra={**old.extra, "runs": runs})


def repeats_due(profiles: Sequence[TaskProfile], by_task: Mapping[str, list[str]],
                wanted: Mapping[str, PendingTrial], results: Mapping[str, TrialRecord],
                repeats: int) -> list[PendingTrial]:
    """The chosen settings (one per task, technique and device count) that have fewer
    than ``repeats`` runs: trials to run again, without timing the evaluation again."""
    due: dict[str, PendingTrial] = {}
    for profile in profiles:
        if profile.error is not None:
            continue
        trials = [results[f] for f in by_task[profile.task] if f in results]
        for option in choose_options(trials, profile.total_steps):
            fingerprint = option.record.fingerprint
            if len(trial_runs(results[fingerprint])) < repeats and fingerprint in wanted:
                due[fingerprint] = dataclasses.replace(
                    wanted[fingerprint], evaluations=[], lighter=[], repeat=True)
    return list(due.values())
