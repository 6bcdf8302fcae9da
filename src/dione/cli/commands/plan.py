"""``dione plan``: solve a problem JSON into a plan JSON, or check a plan against one."""

from __future__ import annotations

import argparse
import dataclasses
import json

from dione.cli.console import complain, console, errors
from dione.cli.errors import EXIT_FAILED, BadInput
from dione.cli.inputs import (
    output_file,
    problem_refused,
    say_kinds_replaced,
    say_problem_notes,
    write_output,
)

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    from dione.plan import ProblemError, check_plan, load_plan, load_problem, solve
    from dione.plan.cluster_text import parse_nodes
    from dione.plan.problem import BUILT_IN_TECHNIQUES

    if args.check and args.output:
        raise BadInput("--check writes no plan: drop -o (it would be left unwritten)")
    output = output_file(args.output) if not args.check else None
    if args.check:
        if len(args.files) != 2:
            raise BadInput("--check takes PLAN.json PROBLEM.json")
        plan_file, problem_file = args.files
    else:
        if len(args.files) != 1:
            raise BadInput("give one PROBLEM.json (or --check PLAN.json PROBLEM.json)")
        problem_file, plan_file = args.files[0], None
    try:
        nodes = parse_nodes(args.cluster) if args.cluster is not None else None
    except ValueError as err:
        raise BadInput(str(err)) from None
    try:
        # The tasks no node can hold are left out, said, and the others planned (or a
        # plan of them checked: a plan `dione plan` wrote of the same file passes);
        # --cluster stands in for the file's cluster, which may then be left out.
        problem = load_problem(problem_file, nodes, fitting=False)
    except ProblemError as err:
        if args.check and _is_plan(problem_file):
            raise BadInput(f"{problem_file} is a plan, not a problem: --check takes the plan "
                           "first, then the problem it plans (dione plan --check PLAN.json "
                           "PROBLEM.json)") from None
        raise problem_refused(problem_file, err, nodes is not None) from None
    problem, left_out = problem.left_out()
    say_problem_notes(problem, left_out)
    if nodes is not None:
        say_kinds_replaced(problem_file, problem)
    unknown = sorted({o.technique for t in problem.tasks for o in t.options}
                     - set(BUILT_IN_TECHNIQUES))
    if unknown:  # planned (a user's own registered technique may bear the name), said
        complain("warning", f"technique(s) {', '.join(unknown)} in {problem_file} are none of "
                 f"dione's ({', '.join(BUILT_IN_TECHNIQUES)}): planned, but only a technique "
                 "the workload registers under that name can train them, and `dione "
                 "simulate` refuses them; a misspelt name: correct it in the file")
    if not problem.tasks:
        raise BadInput(f"{problem_file}: no task fits any node of its cluster; give wider "
                       "nodes")
    if plan_file is not None:
        try:
            plan = load_plan(plan_file)
        except (OSError, ValueError) as err:
            raise BadInput(f"{plan_file}: {err}") from None
        reasons = check_plan(plan, problem)
        if reasons:
            for reason in reasons:
                complain("invalid", reason)
            if nodes is None and any("unknown node" in r or "has no device" in r
                                     for r in reasons):
                complain("hint", "a plan made with --cluster is checked with the same "
                         "--cluster (its nodes are n0, n1, ...)")
            return EXIT_FAILED
        console.print(f"{plan_file}: a valid plan of {problem_file}, makespan "
                      f"{plan.makespan:.1f} s" + (
                          f", without the {len(left_out)} task(s) no node holds (above; "
                          "exit status 1)" if left_out else ""))
        return EXIT_FAILED if left_out else 0
    try:
        # Deterministic time on every core gave a plan that depends on the machine's
        # cores (and not simulate's first plan, solved on one thread: review).
        threads = args.threads or (1 if args.deterministic_time is not None else None)
        plan = solve(problem, args.solver, args.time_limit, threads,
                     args.deterministic_time)
    except ValueError as err:
        raise BadInput(str(err)) from None
    if not plan.assignments:  # no plan to write: a file of one could not be loaded
        reason = plan.notes.get("reason") or "it found no plan within the time limit"
        complain("no plan", f"{plan.solver} ({plan.status}): {reason}; try another "
                 "--solver (greedy always finds one) or a longer --time-limit")
        return EXIT_FAILED
    if left_out:  # the plan file says what it does not hold, and why
        plan = dataclasses.replace(plan, notes={**plan.notes, "left_out": list(left_out)})
    text = json.dumps(plan.to_json(), indent=1)
    summary = (f"{plan.solver}: {plan.status}, makespan {plan.makespan:.1f} s, lower bound "
               f"{plan.lower_bound:.1f} s (gap {max(plan.gap, 0.0):.2%}), solved in "
               f"{plan.solve_seconds:.2f} s" + (
                   f"; {len(left_out)} task(s) no node holds are not in it (above: exit "
                   "status 1, as a run fails them)" if left_out else ""))
    if output is not None:
        write_output(output, text + "\n")
        console.print(summary)
    else:
        print(text, flush=True)  # plain: the JSON must reach a pipe unstyled, unfolded
        errors.print(summary)
    return EXIT_FAILED if left_out else 0


def _is_plan(path: str) -> bool:
    """Whether ``path`` holds a plan's JSON (its assignments), as `dione plan -o` writes."""
    try:
        with open(path) as file:
            data = json.load(file)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "assignments" in data and "tasks" not in data
