"""Profile a workload: which trials to run, run them (in parallel where devices allow),
choose each task's options.

Trials are enumerated per task x technique x device count (1, 2, 4, ... and the
node's own count) x knob setting the technique proposes (``trials``); tasks with equal
speed signatures share them, and trials already in the catalog are not run again. A
replicating technique (single, ddp) is skipped at device counts where one with fewer
devices already ran out of memory; configurations the task or technique excludes are
skipped with the reason; an overall time budget stops new trials (``schedule``). Each
option is the fastest setting per technique and device count (``choice``); pipelines
get the schedule simulator's step time beside the measured one (``simulated``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dione.launch.local import LOCAL, Launcher, warm_up_free
from dione.profile.catalog import Catalog, TrialRecord
from dione.profile.choice import choose_options, repeats_due
from dione.profile.fingerprint import device_description
from dione.profile.options import TrialOptions
from dione.profile.results import (
    Profile,
    ProfiledOption,
    ProfileEvent,
    Skipped,
    TaskProfile,
    remembered_mistake,
)
from dione.profile.schedule import ProfilingSession, run_trials
from dione.profile.simulated import cross_check
from dione.profile.trial import measured_steps
from dione.profile.trials import PendingTrial, device_counts, wanted_trials
from dione.spec.cluster import Cluster
from dione.spec.task import Task

__all__ = [
    "Profile",
    "ProfileEvent",
    "ProfiledOption",
    "TaskProfile",
    "device_counts",
    "profile_workload",
]


def _under_the_cap(uncapped: TrialRecord | None, fingerprint: str,
                   cap: int | None) -> TrialRecord | None:
    """An uncapped trial's record that fits under ``cap`` (its peak measured below it),
    as the capped trial's: it would have measured the same."""
    if (uncapped is None or cap is None or uncapped.status != "ok"
            or uncapped.peak_memory_bytes is None or uncapped.peak_memory_bytes > cap):
        return None
    return dataclasses.replace(uncapped, fingerprint=fingerprint)


def _evaluations_untimed(tasks: Sequence[Task], profiles: Sequence[TaskProfile],
                         by_task: Mapping[str, list[str]], wanted: Mapping[str, PendingTrial],
                         results: Mapping[str, TrialRecord],
                         catalog: Catalog) -> list[PendingTrial]:
    """For each evaluation key (an evaluate function) no trial timed and the catalog does
    not know: a task's feasible trial on the fewest devices, run again as that task to
    time its evaluation. A trial times one evaluation: where the tasks sharing trials have
    more evaluate functions than trials, or every trial came from the catalog, the others
    were first checked at the task's first rung, and priced at another's cost. Once per
    key (partials of one function over objects made per task would each cost a run).
    Also where the catalog knows it, but the names it returned then lack the task's
    rule metric or keep_best (a typo, or an evaluate changed since): one run says which,
    before the task trains to its first rung on a guess."""
    named = {t.name: t for t in tasks}
    extra: list[PendingTrial] = []
    for profile in profiles:
        key = profile.evaluation_key
        doubted = remembered_mistake(named[profile.task], profile.cached_metrics) is not None
        if (key is None or profile.error is not None or profile.evaluated is not None
                or (not doubted and (profile.cached_metrics is not None
                                     or catalog.evaluation_seconds(key) is not None))
                or any(t.times(key) for t in extra)):
            continue
        feasible = [f for f in by_task.get(profile.task, ())
                    if f in results and results[f].feasible]
        if feasible:
            rerun = wanted[min(feasible, key=lambda f: wanted[f].spec.devices)]
            extra.append(dataclasses.replace(
                rerun, spec=dataclasses.replace(rerun.spec, task=named[profile.task]),
                evaluations=[(key, profile.evaluate)], lighter=[], stand_ins=[],
                for_evaluation=True))
    return extra


def profile_workload(
    tasks: Sequence[Task],
    cluster: Cluster,
    catalog: Catalog,
    *,
    options: TrialOptions | None = None,
    reprofile: bool = False,
    budget: float | None = None,
    parallel: bool = True,
    scratch: str | Path | None = None,
    on_event: Callable[[ProfileEvent], None] | None = None,
    launcher: Launcher = LOCAL,
    storage: str | Path | None = None,
) -> Profile:
    """Profile ``tasks`` for ``cluster``'s first node (nodes are assumed alike), reusing
    the catalog unless ``reprofile``; never raises for a failing trial or task (but
    DiskFull where the checkpoints' disk is full: every trial would fail so). Trials
    run side by side on every node of the same kind and threads per device (they share
    catalog entries), each where its devices are free. A cluster whose nodes name
    several accelerator models (``Node.model``: a Ray cluster of A100 and H100 nodes)
    is profiled on each model's nodes in turn, each option then of its model's kind
    (speed and memory differ by model: one was taken for all).
    ``storage``: where trials write their checkpoints, a folder every node can reach
    (default: a private folder on this machine)."""
    models = list(dict.fromkeys(n.model for n in cluster))
    if len(models) < 2 or None in models:  # one kind (a node of no model: all alike)
        return _profile_alike(tasks, cluster, catalog, options, reprofile, budget,
                              parallel, scratch, on_event, launcher, storage)
    parts: list[Profile] = []
    for model in models:
        nodes = Cluster([n for n in cluster if n.model == model])
        # One budget for the whole profiling: each model's trials get what is left.
        left = None if budget is None else max(0.0, budget - sum(p.seconds for p in parts))
        parts.append(_profile_alike(tasks, nodes, catalog, options, reprofile, left,
                                    parallel, scratch, on_event, launcher, storage))
    return _merged(cluster, parts)


def _merged(cluster: Cluster, parts: Sequence[Profile]) -> Profile:
    """Profiles of one workload on each model's nodes as one: each task's options of
    every model, each of its model's kind; its trials, skips and evaluation's time
    (the longest) of all."""
    merged = []
    for first in parts[0].tasks:
        each = [(p.cluster.nodes[0].model, t) for p in parts
                for t in p.tasks if t.task == first.task]
        options = [dataclasses.replace(o, kind=model) for model, t in each for o in t.options]
        found = functools.partial(_first_set, [t for _, t in each])
        merged.append(dataclasses.replace(
            first, options=options, trials=[r for _, t in each for r in t.trials],
            skipped=[s for _, t in each for s in t.skipped],
            not_applicable=[s for _, t in each for s in t.not_applicable],
            # (One evaluation time for the task: the slowest model's, so that no plan
            # counts on a fast one where it runs on a slow one.)
            evaluation_seconds=max(t.evaluation_seconds for _, t in each),
            diverged_trial=found("diverged_trial"), evaluated=found("evaluated"),
            cached_metrics=found("cached_metrics"),
            error=None if options else found("error")))
    return Profile(cluster, merged, sum(p.trials_run for p in parts),
                   sum(p.trials_cached for p in parts), sum(p.seconds for p in parts),
                   frozenset().union(*(p.from_catalog for p in parts)))


def _first_set(profiles: Sequence[TaskProfile], field: str) -> Any:
    """The first of ``profiles``' values of ``field`` that is set (a divergence, or an
    evaluation trial that failed, on one model's nodes alone is the task's too)."""
    return next((getattr(t, field) for t in profiles if getattr(t, field) is not None), None)


def _profile_alike(
    tasks: Sequence[Task], cluster: Cluster, catalog: Catalog,
    options: TrialOptions | None, reprofile: bool, budget: float | None, parallel: bool,
    scratch: str | Path | None, on_event: Callable[[ProfileEvent], None] | None,
    launcher: Launcher, storage: str | Path | None,
) -> Profile:
    """``profile_workload`` on nodes taken to be alike."""
    options = options or TrialOptions()
    began = time.monotonic()
    node = cluster.nodes[0]
    # The threads a slot gets where the trials run (a Ray node's cores, not this machine's).
    threads = launcher.placement(node, [0]).threads if node.kind == "cpu" else 1
    alike = [n for n in cluster if n.kind == node.kind and n.devices >= node.devices
             and n.model == node.model
             and (n.kind != "cpu" or launcher.placement(n, [0]).threads == threads)]
    device = device_description(node.kind, threads)
    if node.model:  # the node's own model (a driver without its GPU says only "cuda")
        device = f"{node.model}; {device}"
    emit = on_event or (lambda event: None)
    found = wanted_trials(tasks, node, threads, device, catalog, reprofile,
                          options.memory_cap_bytes)
    profiles, wanted, by_task = found.profiles, found.wanted, found.by_task
    results: dict[str, TrialRecord] = {}
    pending: list[PendingTrial] = []
    totals = {p.task: p.total_steps for p in profiles}  # (an epoch's needs its data set)
    for fingerprint, trial in wanted.items():
        cached = None if reprofile else catalog.get(fingerprint)
        if cached is None and not reprofile and trial.uncapped is not None:
            cached = _under_the_cap(catalog.get(trial.uncapped), fingerprint,
                                    options.memory_cap_bytes)
        if cached is not None and cached.status == "crash" and cached.extra.get(
                "code") != trial.code:
            cached = None  # it crashed under code that has changed since: try again
        if cached is not None and cached.status == "crash":  # said so where it fails a task
            cached = dataclasses.replace(cached, extra={**cached.extra, "from_catalog": True})
        if cached is not None and cached.status == "timeout" and float(cached.extra.get(
                "timeout", 0.0)) < options.timeout:
            cached = None  # it ran out of a shorter time than it has now: try again
        if cached is not None and cached.status == "ok" and (cached.measured_steps or 0) \
                < measured_steps(totals[trial.spec.task.name], options):
            # Timed over fewer steps than asked for now (--measure-steps raised): its
            # mean is the noisier one the user asked to replace.
            cached = None
        if cached is not None:
            results[fingerprint] = cached
            emit(ProfileEvent("cached", trial.spec.label, tuple(trial.tasks), cached))
        else:
            pending.append(trial)
    if pending:
        # A trial times a slice on warm workers, as the run will: none pays a start. A
        # node another job holds is left to the others (`dione profile --ray` failed).
        alike, _ = warm_up_free(launcher, alike)
    setting = ProfilingSession(
        nodes=alike, catalog=catalog, options=options, group_of=found.group_of(),
        profiles=profiles, emit=emit, began=began, budget=budget, parallel=parallel,
        scratch=scratch, launcher=launcher, storage=storage)
    trials_run, skips = run_trials(pending, results, setting)
    counted = trials_run + len(skips)
    untimed = _evaluations_untimed(tasks, profiles, by_task, wanted, results, catalog)
    if untimed:
        if not pending:
            alike, _ = warm_up_free(launcher, alike)
            setting = dataclasses.replace(setting, nodes=alike)
        # Runs again of trials there are: one skipped (over the budget) is no skip.
        ran, skipped = run_trials(untimed, results, setting, counted)
        trials_run += ran
        counted += ran + len(skipped)
    # Repeats: each option's chosen setting again, at a later moment (a whole pass of
    # other trials lies between), until it has ``options.repeats`` runs; a repeat can
    # change which setting is fastest, so a few more passes may follow.
    for _ in range(2 * (options.repeats - 1)):
        again = repeats_due(profiles, by_task, wanted, results, options.repeats)
        if not again:
            break
        # A repeat skipped (over the budget) leaves its record with fewer runs: no skip.
        ran, skipped = run_trials(again, results, setting, counted)
        trials_run += ran
        counted += ran + len(skipped)
    cross_check(results, setting.group_of, catalog)
    for profile in profiles:
        if profile.error is not None:
            continue
        own = by_task[profile.task]
        profile.trials = [results[f] for f in own if f in results]
        profile.skipped += [Skipped(wanted[f].spec.technique, wanted[f].spec.label, reason)
                            for f, reason in skips.items() if f in own]
        profile.options = choose_options(profile.trials, profile.total_steps)
    # Say once, per technique and reason, which techniques a task could not use and why.
    not_tried: dict[tuple[str, str], list[str]] = {}
    for profile in profiles:
        for name, why in profile.not_tried():
            not_tried.setdefault((name, why), []).append(profile.task)
    for (name, why), names in not_tried.items():
        emit(ProfileEvent("not_tried", name, tuple(names), reason=why))
    return Profile(cluster, profiles, trials_run, len(wanted) - len(pending),
                   time.monotonic() - began,
                   frozenset(wanted.keys() - {p.spec.fingerprint for p in pending}))
