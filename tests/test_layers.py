"""The code's layering, read from its imports: each part of the flow imports only parts
before it, and the pure parts import no torch."""

from __future__ import annotations

import ast
from pathlib import Path

import dione

SOURCE = Path(dione.__file__).parent
# The flow (DESIGN.md): a part may import the parts before it, never one after it.
FLOW = ["spec", "state", "schedules", "techniques", "launch", "profile", "plan",
        "orchestrate", "report", "simulate", "cli"]
# Under every part: any part may import these, and they import no part of the flow.
GROUND = {"_lazy", "_version", "clock", "frames", "words"}
# Pure: data and arithmetic that run where torch is not installed or not wanted (the
# planner on a head node, the schedule simulator in a notebook).
NO_TORCH = {"schedules", "plan"}


def imports(path: Path) -> set[str]:
    """The modules ``path`` imports, at its top or inside a function (absolute imports:
    the project writes no relative ones), each as the dotted name it names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: a relative import"
            found.add(node.module)
            if node.module == "dione":
                found |= {f"dione.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def part_of(path: Path) -> str:
    relative = path.relative_to(SOURCE).parts
    return relative[0] if len(relative) > 1 else relative[0].removesuffix(".py")


def sources() -> list[Path]:
    return sorted(SOURCE.rglob("*.py"))


def test_every_part_imports_only_parts_before_it_in_the_flow() -> None:
    wrong = []
    for path in sources():
        part = part_of(path)
        if part not in FLOW and part not in GROUND:
            continue  # dione/__init__.py (the public API) and the zoo sit above the flow
        for module in imports(path):
            names = module.split(".")
            if names[0] != "dione" or len(names) < 2 or names[1] == part:
                continue
            target = names[1]
            if part in GROUND:
                allowed = target in GROUND
            else:
                allowed = target in GROUND or (
                    target in FLOW and FLOW.index(target) < FLOW.index(part))
            if not allowed:
                wrong.append(f"{path.relative_to(SOURCE)} ({part}) imports {module}")
    assert not wrong, "imports against the flow:\n" + "\n".join(wrong)


def test_the_schedules_and_the_planner_import_no_torch() -> None:
    heavy = [f"{path.relative_to(SOURCE)} imports {module}" for path in sources()
             if part_of(path) in NO_TORCH for module in imports(path)
             if module.split(".")[0] == "torch"]
    assert not heavy, "\n".join(heavy)


def test_the_zoo_and_the_ground_stand_apart_from_the_flow() -> None:
    """The zoo (example models and data) is used by the flow's tests and the demo, not by
    the flow; nothing of the flow imports it, so a workload never depends on it."""
    users = [f"{path.relative_to(SOURCE)} imports {module}" for path in sources()
             if part_of(path) in FLOW for module in imports(path)
             if module == "dione.zoo" or module.startswith("dione.zoo.")]
    assert not users, "\n".join(users)


def test_the_planner_s_list_of_built_in_techniques_is_the_registry_s() -> None:
    """`dione plan` names a problem's techniques that are none of dione's, and knobs they
    do not take, from lists of its own (the registry imports torch): they must agree."""
    from dione.plan.problem import BUILT_IN_KNOBS, BUILT_IN_TECHNIQUES
    from dione.techniques import techniques

    ours = [t for t in techniques()  # not those other tests register
            if type(t).__module__.startswith("dione.techniques.")]
    assert list(BUILT_IN_TECHNIQUES) == [t.name for t in ours]
    assert {t.name: tuple(t.knobs) for t in ours} == BUILT_IN_KNOBS


def test_every_kind_of_run_event_is_in_its_docstring() -> None:
    """RunEvent's docstring named 8 of some 30 kinds an on_event callback gets."""
    import re

    from dione.orchestrate import RunEvent

    source = "".join(path.read_text() for path in SOURCE.rglob("*.py"))
    kinds = set(re.findall(r'RunEvent\(\s*"([a-z_]+)"', source))
    assert len(kinds) > 25 and {"replanned"} <= set(re.findall(r"``([a-z_]+)``",
                                                                RunEvent.__doc__ or ""))
    assert kinds <= set(re.findall(r"``([a-z_]+)``", RunEvent.__doc__ or "")), kinds
