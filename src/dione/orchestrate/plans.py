"""The plans a run adopted, as ``RUN_DIR/plans/plan-NNN.json`` holds them: written by the
orchestrator, read back by the report and ``dione status``."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dione.plan.plan import Assignment, Plan, assignment_from_json
from dione.plan.problem import PlanningProblem
from dione.state.private import private_dir, write_private

__all__ = ["AdoptedPlan", "next_plan_file", "plan_files", "read_plans", "write_plan"]


@dataclass(frozen=True)
class AdoptedPlan:
    """A plan a run adopted: the solver's plan (times from ``at``), the same assignments on
    the run clock, and the problem it solved."""

    plan: Plan
    at: float  # run-clock time of the plan's time 0
    clock_zero: float  # time.time() of run-clock 0 in the session that adopted it
    run_clock: tuple[Assignment, ...]
    problem: PlanningProblem
    # How far its tasks were planned: "full" (to their ends), "rung" (to each one's next
    # rung, where a stopping rule decides) or "expected" (the steps a rule leaves
    # expected): its makespan is the sweep's end only under "full".
    horizon: str = "full"

    def to_json(self) -> dict[str, Any]:
        return {**self.plan.to_json(), "at": self.at, "clock_zero": self.clock_zero,
                "assignments_run_clock": [_run_clock_json(a) for a in self.run_clock],
                "problem": self.problem.to_json(), "horizon": self.horizon}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> AdoptedPlan:
        plan = Plan.from_json(data)
        try:
            return AdoptedPlan(plan, float(data["at"]), float(data["clock_zero"]),
                               tuple(assignment_from_json(a)
                                     for a in data["assignments_run_clock"]),
                               PlanningProblem.from_json(data["problem"]),
                               str(data.get("horizon", "full")))  # older files: full
        except (KeyError, TypeError) as err:
            raise ValueError(f"not an adopted plan: {type(err).__name__}: {err}") from None


def _run_clock_json(a: Assignment) -> dict[str, Any]:
    # The device count beside the ids, as the file has always had it.
    return {"task": a.task, "technique": a.technique, "knobs": dict(a.knobs),
            "devices": a.devices, "node": a.node, "device_ids": list(a.device_ids),
            "start": a.start, "end": a.end}


# What a plan's makespan covers, said after it where it is not the sweep's end.
HORIZON_WORDS = {"rung": "to each task's next rung, where its stopping rule decides",
                 "expected": "the steps each task's stopping rule leaves expected"}


def horizon_said(horizon: str, pattern: str = " ({})") -> str:
    """``pattern`` holding what a plan of ``horizon`` covers (``HORIZON_WORDS``), said
    after its makespan; empty for one planned to the sweep's end."""
    words = HORIZON_WORDS.get(horizon)
    return pattern.format(words) if words else ""


def write_plan(path: Path, adopted: AdoptedPlan) -> None:
    """Write ``adopted`` to ``path`` whole or not at all (a launcher killed mid-write
    leaves no half a plan for ``report``, ``status`` and ``resume`` to trip on)."""
    private_dir(path.parent)
    write_private(path, json.dumps(adopted.to_json(), indent=1) + "\n")


def plan_files(run_dir: Path) -> list[Path]:
    """The adopted plans' files, in the order they were adopted (by number: plan-1000
    comes after plan-999)."""
    found = []
    for path in (run_dir / "plans").glob("plan-*.json"):
        number = path.name.removeprefix("plan-").removesuffix(".json")
        if number.isdigit():
            found.append((int(number), path))
    return [path for _, path in sorted(found)]


def next_plan_file(run_dir: Path) -> Path:
    """Where the next plan adopted goes: after the highest number, so that a plan file
    gone missing never makes the next one overwrite a later one."""
    files = plan_files(run_dir)
    number = int(files[-1].name.removeprefix("plan-").removesuffix(".json")) + 1 if files else 0
    return run_dir / "plans" / f"plan-{number:03d}.json"


def read_plans(run_dir: Path) -> list[AdoptedPlan]:
    """Every plan adopted, in order; one that cannot be read (damaged, or from another
    dione) is left out with a warning that names it, so the others still report."""
    plans = []
    for path in plan_files(run_dir):
        try:
            plans.append(AdoptedPlan.from_json(json.loads(path.read_text())))
        except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError too
            warnings.warn(f"{path} cannot be read ({type(err).__name__}: {err}); the report "
                          "and status leave that plan out", stacklevel=2)
    return plans
