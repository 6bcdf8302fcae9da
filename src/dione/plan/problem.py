"""The planning problem: a cluster and, per task, its options (technique, devices, seconds).

Read from the JSON of DESIGN.md and checked strictly: every problem in the file is
reported at once, each naming its task, so a hand-written problem is easy to fix.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dione.words import some

__all__ = [
    "BUILT_IN_KNOBS",
    "BUILT_IN_TECHNIQUES",
    "Busy",
    "NodeSpec",
    "Option",
    "PlanningProblem",
    "ProblemError",
    "TaskOptions",
    "load_problem",
]

# dione's own techniques, by name, for the light commands that read problems without
# torch (the registry imports it); tests/test_layers.py keeps it equal to the registry's.
BUILT_IN_TECHNIQUES = ("single", "ddp", "fsdp", "gpipe", "1f1b", "xpipe")
# ... and the knobs each takes, likewise.
BUILT_IN_KNOBS = {
    "single": ("accumulation",), "ddp": ("accumulation",),
    "fsdp": ("reshard_after_forward", "activation_checkpointing", "cpu_offload",
             "accumulation"),
    "gpipe": ("micro_batches", "activation_checkpointing", "balance"),
    "1f1b": ("micro_batches", "activation_checkpointing", "balance"),
    "xpipe": ("micro_batches", "prediction", "stashing", "balance", "log_prediction"),
}


class ProblemError(ValueError):
    """A problem file with mistakes; ``reasons`` lists every one."""

    def __init__(self, reasons: Iterable[str]) -> None:
        self.reasons = list(reasons)
        lines = "\n".join(f"  - {r}" for r in self.reasons)
        super().__init__(f"the problem has {len(self.reasons)} mistake(s):\n{lines}")


@dataclass(frozen=True)
class NodeSpec:
    """A node of the cluster: its name, device count and (if known) device kind."""

    name: str
    devices: int
    # Its devices' kind ("H100"): an option measured on one kind fits only its nodes
    # (``Option.kind``); an option of no kind fits every node.
    kind: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "devices": self.devices,
                **({"kind": self.kind} if self.kind is not None else {})}


@dataclass(frozen=True)
class Option:
    """One way to train a task: a technique with knobs on ``devices`` devices of one node
    (of ``kind``, where its seconds were measured on one kind of several)."""

    technique: str
    devices: int
    seconds: float
    knobs: Mapping[str, Any] = field(default_factory=dict)
    # The node kind its seconds hold on ("A100"): a cluster of several kinds gives each
    # kind its own options (times and memory differ); None: every node alike.
    kind: str | None = None

    @property
    def device_seconds(self) -> float:
        return self.devices * self.seconds

    def key(self) -> tuple[str, str, int, str | None]:
        return (self.technique, json.dumps(dict(self.knobs), sort_keys=True), self.devices,
                self.kind)

    def fits(self, node: NodeSpec) -> bool:
        """Whether a plan may run it on ``node``: enough devices, of its kind."""
        return self.devices <= node.devices and self.kind in (None, node.kind)

    def on_kind_of(self, other: Option) -> bool:
        """Whether it fits every node of ``other``'s kind (same kind, or no kind)."""
        return self.kind is None or self.kind == other.kind

    def to_json(self) -> dict[str, Any]:
        return {"technique": self.technique, "knobs": dict(self.knobs),
                "devices": self.devices, "seconds": self.seconds,
                **({"kind": self.kind} if self.kind is not None else {})}


@dataclass(frozen=True)
class TaskOptions:
    """A task to place and the options it may take."""

    name: str
    options: tuple[Option, ...]
    # Seconds from now before which it may not start: a running task's steps after its
    # slice, planned free to move but not before that slice ends.
    release: float = 0.0
    # Below 0: a task the plan favours, lower first (``plan.favour``: a pausing stopping
    # rule's promoted tasks, the highest rung and the best there first); 0: none.
    priority: float = 0.0
    # Nodes it may not be placed on: one where it failed twice alike (the node may be at
    # fault; the runner retries it elsewhere while another node holds it).
    avoid: frozenset[str] = frozenset()

    def fitting(self, node: NodeSpec) -> list[Option]:
        return [o for o in self.options if self.may_run(o, node)]

    def may_run(self, option: Option, node: NodeSpec) -> bool:
        """Whether a plan may run ``option`` of this task on ``node``."""
        return option.fits(node) and node.name not in self.avoid


@dataclass(frozen=True)
class Busy:
    """Devices a task already running holds until ``until`` seconds from now (re-planning)."""

    task: str
    node: str
    device_ids: tuple[int, ...]
    until: float


@dataclass(frozen=True)
class PlanningProblem:
    """Nodes, tasks with options, and devices already busy; times in seconds from now."""

    nodes: tuple[NodeSpec, ...]
    tasks: tuple[TaskOptions, ...]
    busy: tuple[Busy, ...] = ()

    def __iter__(self) -> Iterator[TaskOptions]:
        return iter(self.tasks)

    def node(self, name: str) -> NodeSpec:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def task(self, name: str) -> TaskOptions:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)

    def fitting_any_node(self, task: TaskOptions) -> list[Option]:
        """``task``'s options that some node can hold (wide enough, of their kind)."""
        if task.avoid:
            return [o for o in task.options if any(task.may_run(o, n) for n in self.nodes)]
        widest = self._widest_by_kind
        return [o for o in task.options if o.devices <= widest.get(o.kind, 0)]

    @functools.cached_property
    def _widest_by_kind(self) -> dict[str | None, int]:
        """The widest node of each kind, and of all (None): asked per option of every
        task at each bound (1,000 tasks on 64 nodes), so kept, not looked up per node."""
        widest: dict[str | None, int] = {}
        for n in self.nodes:
            for kind in (None, n.kind):
                widest[kind] = max(widest.get(kind, 0), n.devices)
        return widest

    @property
    def total_devices(self) -> int:
        return sum(n.devices for n in self.nodes)

    def releases(self) -> dict[str, float]:
        """Per task, the seconds from now before which it may not start (0: none)."""
        return {t.name: t.release for t in self.tasks}

    def free_at(self) -> dict[str, list[float]]:
        """Per node, when each device is free of the tasks already running (0: now)."""
        times = {n.name: [0.0] * n.devices for n in self.nodes}
        for b in self.busy:
            for device in b.device_ids:
                times[b.node][device] = max(times[b.node][device], b.until)
        return times

    def mistakes(self) -> list[str]:
        """Every rule of a problem file this problem breaks (empty: none), in the words
        the file's checker uses: a problem built in code is held to the same rules."""
        reasons = []
        if not self.nodes:
            reasons.append('cluster: must be {"nodes": [{"name": "n0", "devices": 8}, ...]}')
        reasons += [wrong for n in self.nodes
                    if (wrong := _devices_mistake(f"cluster node {n.name!r}", n.devices))]
        reasons += _used_twice("cluster: node name", [n.name for n in self.nodes])
        if not self.tasks:
            reasons.append("tasks: must be a non-empty list")
        for task in self.tasks:
            where = f"task {task.name!r}"
            if not task.options:
                reasons.append(f"{where}: options must be a non-empty list")
                continue
            bad = [reason for j, o in enumerate(task.options)
                   for reason in _option_mistakes(f"{where}, option {j}", o.technique,
                                                  o.devices, o.seconds)]
            reasons += bad
            if not bad:
                reasons += _same_option_twice(where, task.options)
            if not bad and self.nodes:
                reasons += _fits_no_node(where, task.options, self.nodes, task.avoid)
            reasons += _avoid_mistakes(where, task.avoid, self.nodes)
            reasons += _release_mistakes(where, task.release)
            reasons += _priority_mistakes(where, task.priority)
        reasons += [f"task {n!r}: the name is used twice"
                    for n in _twice([t.name for t in self.tasks])]
        sizes = {n.name: n.devices for n in self.nodes}
        for i, b in enumerate(self.busy):
            reasons += _busy_mistakes(f"busy {i}", b.node, list(b.device_ids), b.until, sizes)
        reasons += _held_twice(list(enumerate(self.busy)))
        return reasons

    def check(self) -> PlanningProblem:
        """This problem, if it breaks no rule of a problem file; else ProblemError."""
        reasons = self.mistakes()
        if reasons:
            raise ProblemError(reasons)
        return self

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "cluster": {"nodes": [n.to_json() for n in self.nodes]},
            "tasks": [{"name": t.name, "options": [o.to_json() for o in t.options],
                       **({"release": t.release} if t.release else {}),
                       **({"priority": t.priority} if t.priority else {}),
                       **({"avoid": sorted(t.avoid)} if t.avoid else {})}
                      for t in self.tasks],
        }
        if self.busy:
            data["busy"] = [{"task": b.task, "node": b.node, "device_ids": list(b.device_ids),
                             "until": b.until} for b in self.busy]
        return data

    @staticmethod
    def from_json(data: Any) -> PlanningProblem:
        return _parse(data)

    def unknown_knobs(self) -> list[str]:
        """Each knob an option of one of dione's techniques sets that the technique does
        not take (a misspelling: a run would refuse it), once per technique and knob."""
        found: dict[tuple[str, str], list[str]] = {}
        for t in self.tasks:
            for o in t.options:
                for knob in set(o.knobs) - set(BUILT_IN_KNOBS.get(o.technique, o.knobs)):
                    names = found.setdefault((o.technique, knob), [])
                    if t.name not in names:  # a task's options of several widths: once
                        names.append(t.name)
        return [f"{technique} takes no knob {knob!r} (its knobs: "
                f"{', '.join(BUILT_IN_KNOBS[technique])}); set by the options of "
                f"{', '.join(names[:3])}{' and more' if len(names) > 3 else ''}"
                for (technique, knob), names in sorted(found.items())]

    def caveats(self) -> list[str]:
        """What a planner (or a simulation) of this problem does not see: options of no
        kind on nodes of several kinds (their seconds hold on every node alike), options
        of a kind no node has (never used), and nodes wider than every option (several
        tasks share a node, none takes all of it)."""
        said = []
        kinds = sorted({n.kind for n in self.nodes if n.kind})
        alike = [t.name for t in self.tasks if any(o.kind is None for o in t.options)]
        if len(kinds) > 1 and alike:
            said.append(f"nodes of kinds {', '.join(kinds)}, and options of no kind (of "
                        f"{some(alike)}): each such option takes the same seconds on every "
                        "kind; give the options of each kind apart (\"kind\": the node kind "
                        "it was measured on)")
        unused = sorted({o.kind for t in self.tasks for o in t.options if o.kind}
                        - set(kinds))
        if unused:
            # Kinds are names compared as written: a node of "h100" holds no "H100" option.
            near = [f"{u!r} is not {k!r}" for u in unused for k in kinds
                    if u.casefold() == k.casefold()]
            said.append(f"options of kind {', '.join(unused)} are never used: no node is of "
                        f"that kind (the nodes' kinds: {', '.join(kinds) or 'none given'})"
                        + (f"; kinds are compared as written: {', '.join(near)}"
                           if near else ""))
        idle = [n for n in self.nodes
                if not any(o.fits(n) for t in self.tasks for o in t.options)]
        if idle and len(idle) < len(self.nodes):  # (none used: every task is left out)
            shown = ", ".join(f"{n.name} ({n.kind + ', ' if n.kind else ''}{n.devices})"
                              for n in idle[:5]) + (", ..." if len(idle) > 5 else "")
            said.append(f"{len(idle)} node(s) can run no task, and stay idle: {shown}; no "
                        "option is of their kind, or narrow enough (give the tasks options "
                        "for them: profile on such a node)")
        usable = [n for n in self.nodes if n not in idle]
        widest = max((o.devices for t in self.tasks for o in t.options), default=0)
        nodes = max((n.devices for n in usable), default=0)
        if widest and nodes > widest:
            said.append(f"the widest option planned takes {widest} device(s), the nodes up to "
                        f"{nodes}: tasks share nodes, and none is planned wider than its "
                        "options (a profile from smaller machines knows no wider option: "
                        "profile on the cluster's nodes for those)")
        return said

    def left_out(self) -> tuple[PlanningProblem, list[str]]:
        """The problem without its tasks that no option lets any node hold, and why each
        was left out (a task too wide for the cluster must not keep the others from
        being planned, as in a run)."""
        said = {t.name: _fits_no_node(f"task {t.name!r}", t.options, self.nodes, t.avoid)
                for t in self.tasks}
        kept = tuple(t for t in self.tasks if not said[t.name])
        return (replace(self, tasks=kept),
                [f"{reason[0]}: left out" for reason in said.values() if reason])


def _unknown(where: str, item: Mapping[str, Any], allowed: set[str]) -> list[str]:
    extra = sorted(set(item) - allowed)
    return [f"{where}: unknown field(s) {', '.join(map(repr, extra))} "
            f"(allowed: {', '.join(sorted(allowed))})"] if extra else []


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _twice(names: list[str]) -> list[str]:
    # Counted once (list.count per name took 20 s of a 20,000-node simulation).
    return sorted(n for n, times in Counter(names).items() if times > 1)


def _used_twice(what: str, names: list[str]) -> list[str]:
    return [f"{what} {n!r} is used twice" for n in _twice(names)]


# Beyond any cluster or training (a pod slice of 65,536 chips; 31,700 years): a larger
# number is a unit or a typo, and overflowed the solvers' arithmetic (a bound of inf, a
# traceback from a node of 10**30 devices).
MOST_DEVICES = 65_536
MOST_SECONDS = 1e12


def _devices_mistake(where: str, devices: Any) -> str | None:
    if devices is None:
        return f"{where}: devices is missing (a positive integer: devices of one node)"
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        return f"{where}: devices must be a positive integer, not {devices!r}"
    if devices > MOST_DEVICES:
        return (f"{where}: devices must be at most {MOST_DEVICES:,}, not {devices:,}: give "
                "the devices of one node (a cluster is a list of nodes)")
    return None


def _option_mistakes(where: str, technique: Any, devices: Any, seconds: Any) -> list[str]:
    bad = []
    if not isinstance(technique, str) or not technique:
        bad.append(f"{where}: technique must be a name")
    wrong = _devices_mistake(where, devices)
    if wrong:
        bad.append(wrong)
    if seconds is None:
        bad.append(f"{where}: seconds is missing (the option's predicted seconds, a "
                   "number >= 0)")
    elif not _number(seconds) or seconds < 0:
        bad.append(f"{where}: seconds must be a finite number >= 0, not {seconds!r}")
    elif seconds > MOST_SECONDS:
        bad.append(f"{where}: seconds must be at most {MOST_SECONDS:g} (31,700 years), not "
                   f"{seconds!r}: give the option's predicted seconds")
    return bad


def _same_option_twice(where: str, options: Sequence[Option]) -> list[str]:
    """Options a plan could not tell apart (a plan names an option by technique, knobs
    and devices, and its node's kind): each must be there once, with one length."""
    first: dict[tuple[str, str, int], list[tuple[int, Option]]] = {}
    reasons = []
    for j, option in enumerate(options):
        alike = first.setdefault(option.key()[:3], [])
        k, other = next(((k, o) for k, o in alike
                         if o.on_kind_of(option) or option.on_kind_of(o)), (None, None))
        alike.append((j, option))
        if k is not None and other is not None:
            kinds = ("" if option.kind == other.kind else
                     f"; of kind {other.kind or 'none'} and {option.kind or 'none'}: one of "
                     "no kind fits the other's nodes too")
            kind = f" of kind {option.kind}" if option.kind and not kinds else ""
            reasons.append(f"{where}, option {j}: the same as option {k} ({option.technique} "
                           f"{dict(option.knobs)} on {option.devices} devices{kind}{kinds}); "
                           "a plan names an option by these and its node's kind, so keep "
                           "one of them (or give each kind its own)")
    return reasons


def _avoid_mistakes(where: str, avoid: frozenset[str], nodes: Sequence[NodeSpec]
                    ) -> list[str]:
    """A task's ``avoid`` naming a node the cluster lacks (a typo would avoid nothing)."""
    unknown = sorted(avoid - {n.name for n in nodes})
    return [f"{where}: avoid names {', '.join(map(repr, unknown))}, not a node of the "
            f"cluster (its nodes: {', '.join(n.name for n in nodes)})"] if unknown else []


def _fits_no_node(where: str, options: Iterable[Option], nodes: Sequence[NodeSpec],
                  avoid: frozenset[str] = frozenset()) -> list[str]:
    options = list(options)
    if any(o.fits(n) for o in options for n in nodes if n.name not in avoid):
        return []
    if any(o.fits(n) for o in options for n in nodes):
        return [f"{where}: its options fit only nodes it avoids "
                f"({', '.join(sorted(avoid))}); take those out of its avoid list"]
    # Options whose kind some node has are too wide for those nodes; else no kind fits.
    kinded = [(o, [n for n in nodes if o.kind in (None, n.kind)]) for o in options]
    sized = [(o, of_kind) for o, of_kind in kinded if of_kind]
    if sized:
        narrowest = min(o.devices for o, _ in sized)
        widest = max(n.devices for _, of_kind in sized for n in of_kind)
        kinds = {o.kind for o, _ in sized}
        if None in kinds:
            return [f"{where}: no option fits any node (the widest has {widest} "
                    f"device{'s' * (widest != 1)}, the narrowest option needs {narrowest})"]
        named = ", ".join(sorted(k for k in kinds if k))
        return [f"{where}: no option fits any node (the widest node of kind {named} has "
                f"{widest} device{'s' * (widest != 1)}, the narrowest option of that kind "
                f"needs {narrowest})"]
    wanted = sorted({o.kind for o in options if o.kind})
    have = sorted({n.kind or "none" for n in nodes})
    near = [f"{k!r} is not {w!r}" for w in wanted for k in have if k.casefold() == w.casefold()]
    return [f"{where}: no option fits any node: its options are for nodes of kind "
            f"{', '.join(wanted)}, the cluster's nodes are "
            f"{'of kind ' + ', '.join(have) if have != ['none'] else 'of no kind'}"
            + (f" (kinds are compared as written: {', '.join(near)})" if near else "")
            + " (give each node "
            "its kind: in the problem's cluster, or `--cluster H100:2x8,A100:2x8`; or "
            "the task options of the cluster's kinds)"]


def _priority_mistakes(where: str, priority: Any) -> list[str]:
    if not _number(priority):
        return [f"{where}: priority must be a finite number (below 0: favoured, lower "
                f"first), not {priority!r}"]
    return []


def _release_mistakes(where: str, release: Any) -> list[str]:
    if not _number(release) or release < 0:
        return [f"{where}: release must be a finite number >= 0 (seconds before which it "
                f"may not start), not {release!r}"]
    return []


def _busy_mistakes(where: str, node: Any, ids: Any, until: Any,
                   sizes: Mapping[str, int]) -> list[str]:
    if node not in sizes:
        return [f"{where}: unknown node {node!r}"]
    if not isinstance(ids, list) or not ids or any(
            not isinstance(d, int) or isinstance(d, bool) or not 0 <= d < sizes[node]
            for d in ids):
        return [f"{where}: device_ids must list devices of node {node!r} (integers 0 to "
                f"{sizes[node] - 1}), not {ids!r}"]
    if len(set(ids)) < len(ids):
        return [f"{where}: device_ids must not repeat a device, not {ids}"]
    if not _number(until) or until < 0:
        return [f"{where}: until must be a finite number >= 0, not {until!r}"]
    return []


def _held_twice(busy: Sequence[tuple[int, Busy]]) -> list[str]:
    """Devices that two running tasks hold at once (``busy``: each with its index); a
    device runs one task, and the bounds and solvers count each held device once."""
    holder: dict[tuple[str, int], int] = {}
    reasons = []
    for i, b in busy:
        for device in b.device_ids:
            first = holder.setdefault((b.node, device), i)
            if first != i:
                reasons.append(f"busy {i}: device {device} of node {b.node!r} is held by "
                               f"busy {first} already (a device runs one task at a time)")
    return reasons


def _parse_nodes(data: Any, reasons: list[str]) -> list[NodeSpec]:
    cluster = data.get("cluster")
    if not isinstance(cluster, Mapping) or not isinstance(cluster.get("nodes"), list) \
            or not cluster["nodes"]:
        reasons.append('cluster: must be {"nodes": [{"name": "n0", "devices": 8}, ...]}')
        return []
    reasons += _unknown("cluster", cluster, {"nodes"})
    nodes = []
    for i, node in enumerate(cluster["nodes"]):
        if not isinstance(node, Mapping):
            reasons.append(f"cluster node {i}: must be an object")
            continue
        reasons += _unknown(f"cluster node {i}", node, {"name", "devices", "kind"})
        name, devices = node.get("name"), node.get("devices")
        if not isinstance(name, str) or not name:
            reasons.append(f"cluster node {i}: needs a name")
        elif (wrong := _devices_mistake(f"cluster node {name!r}", devices)) is not None:
            reasons.append(wrong)
        elif isinstance(devices, int):
            kind = node.get("kind")
            if kind is not None and (not isinstance(kind, str) or not kind.strip()
                                     or kind != kind.strip()):
                reasons.append(f"cluster node {name!r}: kind must be a name (\"H100\", no "
                               f"spaces around it), not {kind!r}")
            nodes.append(NodeSpec(name, devices, kind if isinstance(kind, str) else None))
    reasons += _used_twice("cluster: node name", [n.name for n in nodes])
    return nodes


def _parse_option(where: str, item: Any, reasons: list[str]) -> Option | None:
    if not isinstance(item, Mapping):
        reasons.append(f"{where}: must be an object")
        return None
    # "source": where the option's seconds come from (a profile, a paper); read by people,
    # ignored by the planner.
    bad = _unknown(where, item, {"technique", "knobs", "devices", "seconds", "source",
                                 "kind"})
    if not isinstance(item.get("source", ""), str):
        bad.append(f"{where}: source must be text (where the seconds come from)")
    technique: Any = item.get("technique")
    devices: Any = item.get("devices")
    seconds: Any = item.get("seconds")
    knobs: Any = item.get("knobs", {})
    kind: Any = item.get("kind")
    bad += _option_mistakes(where, technique, devices, seconds)
    if not isinstance(knobs, Mapping):
        bad.append(f"{where}: knobs must be an object")
    if kind is not None and (not isinstance(kind, str) or not kind.strip()
                             or kind != kind.strip()):
        bad.append(f"{where}: kind must be the name of a node kind (\"H100\", no spaces "
                   f"around it) its seconds hold on, not {kind!r}")
    reasons += bad
    if bad:
        return None
    return Option(technique, devices, float(seconds), dict(knobs), kind)


def _parse(data: Any, nodes_instead: Sequence[NodeSpec] | None = None,
           fitting: bool = True, techniques: Collection[str] | None = None) -> PlanningProblem:
    """``nodes_instead``: the cluster to plan on in place of the file's (which may then
    be left out; its tasks' ``avoid`` lists name the file's nodes: kept, unchecked);
    ``fitting=False``: a task that fits no node is kept (``left_out``
    takes it out with its reason); ``techniques``: the names an option may have (None:
    any, as a plan needs none to run)."""
    reasons: list[str] = []
    if not isinstance(data, Mapping):
        raise ProblemError(["the problem must be a JSON object with cluster and tasks"])
    reasons += _unknown("problem", data, {"cluster", "tasks", "busy", "sources"})
    reasons += _sources_mistakes(data.get("sources", {}))
    nodes = list(nodes_instead) if nodes_instead else _parse_nodes(data, reasons)
    tasks: list[TaskOptions] = []
    raw_tasks = data.get("tasks")
    if not isinstance(raw_tasks, list) or not raw_tasks:
        reasons.append("tasks: must be a non-empty list")
        raw_tasks = []
    for i, raw in enumerate(raw_tasks):
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) \
                or not raw["name"]:
            reasons.append(f"task {i}: must be an object with a name and options")
            continue
        name = raw["name"]
        where = f"task {name!r}"
        reasons += _unknown(where, raw, {"name", "options", "release", "priority", "avoid"})
        release = raw.get("release", 0.0)
        priority = raw.get("priority", 0.0)
        avoid = raw.get("avoid", [])
        bad = _release_mistakes(where, release) + _priority_mistakes(where, priority)
        if not isinstance(avoid, list) or not all(isinstance(n, str) for n in avoid):
            bad.append(f'{where}: avoid must be a list of node names (["n1"]), not {avoid!r}')
        elif nodes and not nodes_instead:  # (it names the file's nodes, not those)
            bad += _avoid_mistakes(where, frozenset(avoid), nodes)
        if bad:
            reasons += bad
            continue
        raw_options = raw.get("options")
        if not isinstance(raw_options, list) or not raw_options:
            reasons.append(f"{where}: options must be a non-empty list")
            continue
        options = [_parse_option(f"{where}, option {j}", o, reasons)
                   for j, o in enumerate(raw_options)]
        valid = tuple(o for o in options if o is not None)
        if len(valid) == len(options):
            reasons += _same_option_twice(where, valid)
            if nodes and fitting:
                reasons += _fits_no_node(where, valid, nodes, frozenset(avoid))
            tasks.append(TaskOptions(name, valid, float(release), float(priority),
                                     frozenset(avoid)))
    # Of every named task, those with mistakes too (a name used twice was said only once
    # the other mistakes were fixed).
    reasons += [f"task {n!r}: the name is used twice" for n in _twice(
        [raw["name"] for raw in raw_tasks if isinstance(raw, Mapping)
         and isinstance(raw.get("name"), str) and raw["name"]])]
    if techniques is not None:  # with the other mistakes, not in a later round
        unknown = sorted({o.technique for t in tasks for o in t.options} - set(techniques))
        if unknown:
            reasons.append(f"technique(s) {', '.join(unknown)} are not registered "
                           f"(registered: {', '.join(sorted(techniques))}): rename them "
                           "to the technique each stands for")
    busy = _parse_busy(data.get("busy", []), nodes, reasons)
    if reasons:
        raise ProblemError(reasons)
    return PlanningProblem(tuple(nodes), tuple(tasks), tuple(busy))


def _sources_mistakes(sources: Any) -> list[str]:
    """``"sources"``: the references the options' ``"source"`` fields cite, by key."""
    if isinstance(sources, Mapping) and all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in sources.items()):
        return []
    return ['sources: must be an object of texts ({"key": "where a figure comes from"})']


def _parse_busy(raw: Any, nodes: list[NodeSpec], reasons: list[str]) -> list[Busy]:
    if not isinstance(raw, list):
        reasons.append("busy: must be a list")
        return []
    sizes = {n.name: n.devices for n in nodes}
    busy: list[tuple[int, Busy]] = []
    for i, item in enumerate(raw):
        where = f"busy {i}"
        if not isinstance(item, Mapping):
            reasons.append(f"{where}: must be an object")
            continue
        reasons += _unknown(where, item, {"task", "node", "device_ids", "until"})
        node: Any = item.get("node")
        ids: Any = item.get("device_ids")
        until: Any = item.get("until")
        bad = _busy_mistakes(where, node, ids, until, sizes)
        reasons += bad
        if not bad:
            busy.append((i, Busy(str(item.get("task", "")), node, tuple(ids), float(until))))
    reasons += _held_twice(busy)
    return [b for _, b in busy]


def load_problem(path: str | Path, nodes: Sequence[NodeSpec] | None = None,
                 fitting: bool = True,
                 techniques: Collection[str] | None = None) -> PlanningProblem:
    """Read and check a problem JSON file (``.json.gz``: gzip-compressed JSON).
    ``nodes``: the cluster to plan on instead of the file's (which may then be left
    out); ``fitting=False``: tasks that fit no node are kept (``left_out``);
    ``techniques``: the registered names an option's technique must be one of."""
    file = Path(path)
    try:
        raw = gzip.decompress(file.read_bytes()) if file.suffix == ".gz" else file.read_bytes()
        data = json.loads(raw)
    except OSError as err:  # gzip's BadGzipFile too, which has no strerror
        raise ProblemError([f"cannot read {path}: {err.strerror or err}"]) from None
    except json.JSONDecodeError as err:
        raise ProblemError([f"{path}:{err.lineno}:{err.colno}: not JSON: {err.msg}"]) from None
    except UnicodeDecodeError as err:
        raise ProblemError([f"{path}: not JSON text (byte {err.start} is not UTF-8); give "
                            "the problem JSON file"]) from None
    return _parse(data, nodes, fitting, techniques)
