"""The ``dione`` argument parser, and the one step from parsed flags to ``RunOptions``.

Flags that set a field of ``RunOptions`` (or of its ``TrialOptions``) are declared once,
in ``OPTION_FLAGS``, by the field they set; the parser gives them no default of its own,
so an absent flag leaves the dataclass's default, or on ``dione resume`` the value the run
was started with. Help shows those defaults, read from the dataclasses when help is asked
for (their modules import no torch).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dione.cli.errors import BadInput
from dione.cli.values import (
    at_least_one,
    non_negative_float,
    non_negative_int,
    parse_bytes,
    positive_float,
    positive_int,
    share,
)
from dione.plan.solve import SOLVERS, solve

if TYPE_CHECKING:
    from dione.orchestrate.options import RunOptions

__all__ = ["OPTION_FLAGS", "OptionFlag", "build_parser", "given_options", "run_options"]

DESCRIPTION = ("Train many deep-learning models at once: profile, plan and run every task "
               "of a workload, finishing the whole batch early.")


_FIELD = "dione_field"  # the attribute of an option flag's argparse action


def _absolute(path: str) -> str:
    # Workers on other nodes, and a resume from another folder, need the same place.
    if not path.strip():
        raise BadInput("an empty path (it named the current folder): give a file or folder")
    return str(Path(path).expanduser().resolve())


def _given(path: str) -> str:
    """A path as given, refused where empty (``Path("")`` is the current folder: a run,
    a simulation or an export would write there)."""
    if not path.strip():  # said by argparse, naming the flag, with exit status 2
        raise argparse.ArgumentTypeError("an empty path (it named the current folder): "
                                         "give a folder")
    return path


def _file(path: str) -> str:
    """``_absolute``, refused where a folder is there or a file above it (the catalog:
    found only once profiling opened it, after run.json recorded it)."""
    absolute = Path(_absolute(path))
    if absolute.is_dir():
        raise BadInput(f"{absolute} is a folder; give a file (made where missing)")
    _folder(str(absolute.parent))
    return str(absolute)


def _folder(path: str) -> str:
    """``_absolute``, refused where a file (not a folder) is there or above it."""
    absolute = Path(_absolute(path))
    blocking = next((p for p in (absolute, *absolute.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        raise BadInput(f"{blocking} is a file, not a folder; give a folder (it is made "
                       "where missing)")
    return str(absolute)


@dataclasses.dataclass(frozen=True)
class OptionFlag:
    """A flag that sets ``field`` of ``RunOptions`` (``trial.NAME``: of its TrialOptions)."""

    name: str  # --time-limit
    field: str
    help: str
    type: Callable[[str], Any] | None = None  # what argparse parses the text with
    convert: Callable[[Any], Any] | None = None  # parsed value -> field value (BadInput)
    switch: bool = False  # --name / --no-name
    choices: Sequence[str] | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add this flag to ``parser``, without a default."""
        if self.switch:
            action = parser.add_argument(self.name, dest=self.dest, help=self.help,
                                         action=argparse.BooleanOptionalAction, default=None)
        else:
            action = parser.add_argument(self.name, dest=self.dest, help=self.help,
                                         type=self.type or str, choices=self.choices,
                                         metavar=self.metavar, default=None)
        # Read by the help formatter, which shows the dataclass's default.
        setattr(action, _FIELD, self.field)


# What `run` plans, slices and retries with; `resume` may change each.
_RUN = (
    OptionFlag("--solver", "solver", "the planner", choices=tuple(SOLVERS)),
    OptionFlag("--time-limit", "time_limit", "seconds for the first plan",
               type=positive_float),
    OptionFlag("--replan", "replan", "re-plan as real speeds come in; --no-replan keeps "
               "the first plan", switch=True),
    OptionFlag("--replan-interval", "replan_interval",
               "re-plan at least this often, in seconds", type=positive_float),
    OptionFlag("--stopping-horizon", "stopping_horizon", "how a task under a stopping "
               "rule is planned: its whole length (full), the length its rule leaves "
               "expected (a halving rule's 1/eta per rung), up to its next rung (rung), "
               "or rung under a rule that pauses at rungs and full otherwise (auto, the "
               "default)", choices=("auto", "full", "expected", "rung")),
    OptionFlag("--slice-steps", "slice_steps", "checkpoint every this many steps",
               type=positive_int),
    OptionFlag("--slice-seconds", "slice_seconds", "aim for slices of this many seconds "
               "(default: at least 300, and 20 times the slice start-up each option "
               "measured)", type=positive_float),
    OptionFlag("--max-failures", "max_failures",
               "a task whose slices failed this often is failed", type=positive_int),
    OptionFlag("--timeout", "timeout", "seconds after which a slice is stopped",
               type=positive_float),
    OptionFlag("--stall-factor", "stall_factor", "a slice running past this many times its "
               "prediction (and --stall-grace seconds) is cancelled and retried",
               type=at_least_one),
    OptionFlag("--stall-grace", "stall_grace", "seconds a slice may run past its "
               "prediction's multiple before it is said slow or cancelled",
               type=non_negative_float),
)
# How trials measure and what the catalog keeps: `run`, `resume` and `profile`.
_PROFILE = (
    OptionFlag("--catalog", "catalog", "trial catalog SQLite file (default: $DIONE_CATALOG "
               "or ~/.cache/dione/catalog.sqlite)", convert=_file),
    OptionFlag("--reprofile", "reprofile", "run every trial again, ignoring the catalog",
               switch=True),
    OptionFlag("--budget", "profile_budget", "seconds of profiling (its start-up, the "
               "workers' warm-up, included) after which no new trial starts",
               type=non_negative_float),
    OptionFlag("--memory-cap", "trial.memory_cap_bytes", "memory per device, e.g. 2GiB: a "
               "trial above it counts as out of memory (default: the device's own limit; "
               "on CPU slots a rank's resident memory, some 300 MiB of Python and torch "
               "included)", convert=parse_bytes),
    OptionFlag("--warmup-steps", "trial.warmup_steps", "steps not timed",
               type=non_negative_int),
    OptionFlag("--measure-steps", "trial.measure_steps", "steps timed", type=positive_int),
    OptionFlag("--trial-repeats", "trial.repeats", "times each option's fastest setting is "
               "measured, at different moments; the median is kept (3 outvotes one slow "
               "spell of a shared machine)", type=positive_int),
    OptionFlag("--trial-timeout", "trial.timeout",
               "seconds after which a trial counts as timed out", type=positive_float),
)
_STORAGE = OptionFlag("--storage", "storage", "where checkpoints go (default: the run "
                      "directory; for profile, a scratch folder); with more than one node, "
                      "a folder every node reaches at this same path", convert=_folder,
                      metavar="PATH")
OPTION_FLAGS: tuple[OptionFlag, ...] = (*_RUN, *_PROFILE, _STORAGE)


def given_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """Field path -> value for every option flag given in ``values`` (parsed flags by
    dest, as ``vars(args)``); absent flags (None) are left out."""
    given = {}
    for flag in OPTION_FLAGS:
        value = values.get(flag.dest)
        if value is not None:
            try:
                given[flag.field] = flag.convert(value) if flag.convert else value
            except BadInput as err:
                said = str(err)
                raise BadInput(said if said.startswith(flag.name) else
                               f"{flag.name} {value!r}: {said}") from None
    return given


def run_options(values: Mapping[str, Any], base: RunOptions | None = None) -> RunOptions:
    """``base`` (default: ``RunOptions()``) with every option flag given in ``values``
    applied on top; the trial fields go to its ``TrialOptions``."""
    from dione.orchestrate.options import RunOptions

    base = base or RunOptions()
    given = given_options(values)
    trial = {k.removeprefix("trial."): v for k, v in given.items() if k.startswith("trial.")}
    top = {k: v for k, v in given.items() if not k.startswith("trial.")}
    # A slice's length is one or the other (RunOptions takes slice_steps where both are
    # set): both flags refused; the one given replaces the base's other.
    lengths = {"slice_steps", "slice_seconds"}
    if lengths <= set(top):
        from dione.cli.errors import BadInput

        raise BadInput(f"--slice-steps {top['slice_steps']} and --slice-seconds "
                       f"{top['slice_seconds']}: a slice's length is one or the other; "
                       "give one")
    if lengths & set(top):
        top = {**{k: None for k in lengths}, **top}
    if top.get("replan") is False and "replan_interval" in top:  # it did nothing, unsaid
        from dione.cli.errors import BadInput

        raise BadInput(f"--no-replan and --replan-interval {top['replan_interval']}: a run "
                       "that keeps its first plan re-plans at no interval; give one")
    try:
        return dataclasses.replace(base, **top, trial=dataclasses.replace(base.trial, **trial))
    except ValueError as err:  # flags that do not go together
        from dione.cli.errors import BadInput

        raise BadInput(str(err)) from None


def _field_default(path: str) -> Any:
    from dione.orchestrate.options import RunOptions

    value: Any = RunOptions()
    for name in path.split("."):
        value = getattr(value, name)
    return value


class _Help(argparse.HelpFormatter):
    """Help that ends each option with its default: the dataclass field's for option
    flags, the parser's for the others."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "(default" in text:  # the text says what leaving it out means
            return text
        field = getattr(action, _FIELD, None)
        default = _field_default(field) if field else action.default
        # None, off and empty: nothing to show (a switch's --no- form says it).
        if default is None or default is False or default == [] \
                or default is argparse.SUPPRESS:
            return text
        # argparse %-formats help text: a default's own % must stay literal.
        return f"{text} (default: {str(default).replace('%', '%%')})"


def _solve_default(name: str) -> Any:
    # The planner's own defaults, so `dione plan` and `solve()` cannot drift apart.
    return inspect.signature(solve).parameters[name].default


def build_parser() -> argparse.ArgumentParser:
    """The ``dione`` parser; each command's parse sets ``command`` to its name."""
    from importlib.metadata import PackageNotFoundError, version

    parser = argparse.ArgumentParser(prog="dione", description=DESCRIPTION)
    try:
        installed = version("dione")
    except PackageNotFoundError:
        installed = "unknown (not installed)"
    parser.add_argument("--version", action="version", version=f"dione {installed}")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, formatter: type[argparse.HelpFormatter] = _Help
                ) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help, description=help,
                                   formatter_class=formatter)

    run = command("run", "profile, plan and train every task of a workload to the end, "
                  "re-planning as real speeds come in")
    run.add_argument("workload", help="a Python file that defines `workload`")
    run.add_argument("--devices", help="e.g. cpu:4 or cuda:8 (default: every GPU, else one "
                     "CPU slot per core)")
    run.add_argument("--out", type=_given, help="run directory (default: runs/<workload name>)")
    _add_ray(run)
    for flag in _RUN:
        flag.add_to(run)
    run.add_argument("--current-practice", action="store_true",
                     help="no profiling or planning: each task in turn on all devices, to "
                          "its end (stopping rules not applied)")
    run.add_argument("--technique", help="with --current-practice: force this technique")
    _add_dashboards(run)
    _add_profiling(run)

    # No defaults in resume's help: an absent flag keeps what the run was started with.
    resume = command("resume", "finish a run that was stopped or killed, with the options "
                     "it was started with (a flag given here overrides the saved value "
                     "for this resume only)",
                     argparse.HelpFormatter)
    resume.add_argument("run_dir")
    resume.add_argument("--workload", type=_absolute,
                        help="where the run's workload file is now, if it moved since "
                        "the run started (run.json then records the new place)")
    for flag in _RUN:
        flag.add_to(resume)
    for flag in _PROFILE:
        flag.add_to(resume)
    resume.add_argument("--ray", metavar="ADDRESS",
                        help="for a Ray run: its cluster's address now, if it moved (a head "
                        "started again elsewhere; run.json then records it)")
    resume.add_argument("--ray-env", action="append", metavar="NAME[=VALUE]",
                        help="for a Ray run: the variables its Ray workers get, in place of "
                        "those it was started with (repeat for more)")
    _add_dashboards(resume, "; default: where the run wrote before")

    report = command("report", "(re)write a run's report (summary, Gantt chart, learning "
                     "curves, index.html) and print its summary (each table's first "
                     "20 rows)")
    report.add_argument("run_dir")
    report.add_argument("--out", metavar="DIR", type=_folder,
                        help="write the report here (default: RUN_DIR/report); for a run "
                        "directory you cannot write")
    report.add_argument("--tensorboard", metavar="DIR",
                        help="also write the run for TensorBoard: one run per task")
    report.add_argument("--mlflow", nargs="?", const=True, metavar="TRACKING_URI",
                        help="also write the run to MLflow (default: MLflow's own, "
                        "sqlite:///mlflow.db here): a parent run, a nested run per task; "
                        "a run written before is continued, not repeated")
    command("status", "show a running or finished run").add_argument("run_dir")

    add = command("add", "add tasks of a workload file to a run: a live run profiles them "
                  "beside its gangs and plans them at its next re-plan; a stopped one "
                  "trains them when resumed")
    add.add_argument("run_dir")
    add.add_argument("workload", help="a Python file that defines `workload` (the run's own, "
                     "grown, or another)")
    add.add_argument("--task", action="append", default=[], metavar="NAME",
                     help="a task of it to add (repeat for more; default: every task whose "
                     "name the run does not have)")
    add.add_argument("--wait", type=positive_float, default=60.0, metavar="SECONDS",
                     help="how long to wait for a live run to take them")

    profile = command("profile", "time each task's configurations with short real trials; "
                      "write the planner's problem")
    profile.add_argument("workload")
    profile.add_argument("--devices", help="e.g. cpu:4 or cuda:8 (default: the local machine)")
    profile.add_argument("-o", "--output", help="write the problem JSON here")
    _add_ray(profile)
    _add_profiling(profile)
    # Only here: a run profiles side by side where its devices allow (the flag was
    # accepted by `run` too, and ignored there).
    profile.add_argument("--serial", action="store_true",
                         help="one trial at a time, even where devices allow more")

    train = command("train", "train one slice of one task")
    train.add_argument("workload")
    train.add_argument("--task", required=True)
    train.add_argument("--technique", required=True)
    train.add_argument("--devices", default="1",
                       help="e.g. cpu:2 or cuda:2, or 2 of this machine's kind")
    train.add_argument("--steps", type=positive_int,
                       help="steps in this slice (default: to the end)")
    train.add_argument("--knob", action="append", default=[], metavar="KEY=VALUE")
    train.add_argument("--out", type=_given, help="run directory (default: runs/<workload name>)")
    train.add_argument("--timeout", type=positive_float,
                       help="seconds after which the gang is stopped")

    validate = command("validate", "report every problem of a workload")
    validate.add_argument("workload")
    validate.add_argument("--devices", help="check batch sizes against this device count")

    plan = command("plan", "solve a problem JSON into a plan JSON, or --check a plan")
    plan.add_argument("files", nargs="+", metavar="FILE",
                      help="PROBLEM.json, or with --check: PLAN.json PROBLEM.json")
    plan.add_argument("--check", action="store_true", help="check that a plan is valid")
    plan.add_argument("--solver", default=_solve_default("solver"), choices=tuple(SOLVERS),
                      help="the planner")
    plan.add_argument("--time-limit", type=positive_float, default=_solve_default("time_limit"),
                      help="seconds")
    plan.add_argument("--threads", type=positive_int, help="solver threads (default: every "
                      "core; one with --deterministic-time)")
    plan.add_argument("--deterministic-time", type=positive_float, metavar="UNITS",
                      help="cpsat only: bound the search by CP-SAT's deterministic time "
                      "instead of the clock, on one thread unless --threads says more, so "
                      "the same problem gives the same plan on any machine, busy or not, "
                      "and the first plan `dione simulate --time-limit UNITS` adopts (the "
                      "time limit then stops nothing; measured here: a unit took about 5 s "
                      "on one thread, and 20-45 s on two interleaved threads)")
    plan.add_argument("--cluster", help="plan on this cluster instead of the problem's: "
                      "NODESxDEVICES (4x8) or devices per node (8,8,4), each part with its "
                      "nodes' kind first where options have kinds (H100:2x8,A100:2x8)")
    plan.add_argument("-o", "--output", help="write the plan JSON here (default: stdout)")

    from dione.orchestrate.options import SIMULATION_OPTIONS

    simulate = command("simulate", "run a problem's tasks on a virtual cluster through the "
                       "real orchestrator (plans, re-plans, slices, failures, report), on a "
                       "simulated clock: nothing trains")
    simulate.add_argument("problem", help="a problem JSON (dione profile -o writes one)")
    simulate.add_argument("--cluster", help="NODESxDEVICES (4x8) or devices per node (8,8,4), "
                          "each part with its nodes' kind first where options have kinds "
                          "(H100:2x8,A100:2x8); default: the problem's nodes")
    simulate.add_argument("--scenario", help="a JSON file: task_slowdown, node_slowdown, "
                          "spread, seed, failures, node_losses, node_joins, faulty_nodes, "
                          "curve, curves (see dione.simulate.Scenario)")
    simulate.add_argument("--steps", type=positive_int, default=100,
                          help="steps per task (each option's seconds spread over them)")
    simulate.add_argument("--out", type=_given,
                          help="run directory (default: runs/simulate-<problem>, and "
                          "-<cluster> with --cluster)")
    simulate.add_argument("--solver", default=_solve_default("solver"), choices=tuple(SOLVERS),
                          help="the planner for the first plan and every re-plan")
    simulate.add_argument("--time-limit", type=positive_float,
                          default=SIMULATION_OPTIONS.time_limit,
                          help="the first plan's cpsat deterministic time (a unit takes "
                          "about 5 s of one thread for tens of tasks, 45 s for 200 on 16 "
                          "nodes): the same inputs give the same plans; the other solvers' "
                          "wall seconds (saturn-milp: give it 10 or more)")
    simulate.add_argument("--replan-time-limit", type=positive_float,
                          default=SIMULATION_OPTIONS.replan_time_limit,
                          help="each re-plan's cpsat deterministic time (the other solvers' "
                          "wall seconds)")
    simulate.add_argument("--replan-interval", type=positive_float,
                          default=SIMULATION_OPTIONS.replan_interval,
                          help="virtual seconds between re-plans without a slice end")
    simulate.add_argument("--replan-share", type=share,
                          default=SIMULATION_OPTIONS.replan_share,
                          help="re-plans wait while their solves (each counted at 5 s per "
                          "unit of deterministic time it spent) would pass this share of "
                          "the virtual run; each takes real seconds to simulate")
    simulate.add_argument("--slice-seconds", type=positive_float,
                          help="aim for slices of this many virtual seconds (default: 5 min)")
    simulate.add_argument("--no-replan", action="store_true", help="keep the first plan: "
                          "a node that joins later stays unused; a lost node's work is still "
                          "planned again on the others")
    simulate.add_argument("--max-failures", type=positive_int,
                          default=SIMULATION_OPTIONS.max_failures,
                          help="a task whose slices failed this often is failed (the "
                          "scenario's failures beyond it fail the task, as in a run)")
    simulate.add_argument("--stall-factor", type=at_least_one,
                          default=SIMULATION_OPTIONS.stall_factor,
                          help="a slice running past this many times its prediction (and "
                          "--stall-grace seconds) is cancelled and retried, as in a run (a "
                          "task the scenario slows that much fails after --max-failures "
                          "tries)")
    simulate.add_argument("--stall-grace", type=non_negative_float,
                          default=SIMULATION_OPTIONS.stall_grace,
                          help="virtual seconds a slice may run past its prediction's "
                          "multiple before it is said slow or cancelled")

    export = command("export", "write a finished task's trained weights as safetensors "
                     "(Hugging Face models: save_pretrained output)")
    export.add_argument("run_dir")
    export.add_argument("task")
    export.add_argument("-o", "--output", required=True, type=_given,
                        help="folder to write")
    export.add_argument("--workload", help="the workload file (default: the one the run "
                        "was started with, from its run.json)")
    which = export.add_mutually_exclusive_group()
    which.add_argument("--latest", action="store_true",
                       help="take the newest checkpoint of a task that is not done")
    which.add_argument("--best", action="store_true",
                       help="take the checkpoint where the task's keep_best metric was best")
    which.add_argument("--step", type=positive_int,
                       help="take the task's checkpoint at this step (one it keeps)")

    evaluate = command("evaluate", "evaluate a finished run's done tasks again on their "
                       "final weights: those whose final evaluation failed or never ran "
                       "(fix evaluate first), or the tasks named")
    evaluate.add_argument("run_dir")
    evaluate.add_argument("task", nargs="*", help="tasks to evaluate (again), done ones")
    evaluate.add_argument("--workload", help="the workload file with the fixed evaluate "
                          "(default: the one each task was started or added with)")
    evaluate.add_argument("--device", default="cpu",
                          help="the device to evaluate on: cpu (default), cuda, cuda:1")

    techniques = command("techniques", "list registered techniques and knobs")
    techniques.add_argument("workload", nargs="?",
                            help="a workload file: its own registered techniques listed too")
    return parser


def _add_dashboards(parser: argparse.ArgumentParser, default: str = "") -> None:
    parser.add_argument("--tensorboard", metavar="DIR",
                        help="write each task's losses, step times, evaluations and slices "
                        "for TensorBoard as it trains (one run per task; hyperparameters "
                        f"at the end){default}")
    parser.add_argument("--mlflow", nargs="?", const=True, metavar="TRACKING_URI",
                        help="write the run to MLflow as it trains: a parent run, a nested "
                        "run per task (params, metrics by step, the exported model once "
                        "done); default TRACKING_URI: MLflow's own (MLFLOW_TRACKING_URI, "
                        f"else sqlite:///mlflow.db here); needs dione[mlflow]{default}")


def _add_ray(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                        help="run on a Ray cluster (ADDRESS as ray.init takes it; default "
                        "auto): its alive nodes and their GPUs (else CPUs) are the cluster; "
                        "a task stays within one node; needs `pip install 'dione[ray]'`")
    parser.add_argument("--ray-env", action="append", default=[], metavar="NAME[=VALUE]",
                        help="with --ray: set this variable in the Ray workers (they start "
                        "with their node's environment, not this shell's); NAME alone "
                        "passes this shell's value, read again at each resume (repeat "
                        "for more)")
    _STORAGE.add_to(parser)


def _add_profiling(parser: argparse.ArgumentParser) -> None:
    for flag in _PROFILE:
        flag.add_to(parser)

