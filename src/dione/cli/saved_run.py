"""What ``dione run`` records in ``RUN_DIR/run.json``, and ``dione resume`` reads back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from shlex import quote
from typing import TYPE_CHECKING, Any

from dione.cli.console import complain
from dione.cli.errors import BadInput
from dione.cli.parser import run_options

if TYPE_CHECKING:
    from dione.orchestrate.options import RunOptions

__all__ = ["SavedRun", "load_saved_run", "same_workload"]

RUN_FILE = "run.json"


@dataclasses.dataclass(frozen=True)
class SavedRun:
    """How a run was started: its workload file (absolute), its options, the cluster it
    was given (``--devices``, ``--ray``) and the dashboards it writes to (a TensorBoard
    folder, absolute; an MLflow tracking URI), which a resume goes on writing."""

    workload: str
    options: RunOptions
    devices: str | None = None
    ray: str | None = None
    tensorboard: str | None = None
    mlflow: str | None = None
    # `--ray-env` as given (NAME=VALUE, or NAME: read from the shell at each start).
    ray_env: tuple[str, ...] = ()
    # `dione run --current-practice` (each task in turn on all devices; the technique
    # it forced, "" for each task's best): `dione run` continues it, not `resume`.
    current_practice: str | None = None

    def to_json(self) -> dict[str, Any]:
        # `workload` stays at the top: `dione export` and `dione.load` read it there.
        return {"workload": self.workload, "devices": self.devices, "ray": self.ray,
                "options": dataclasses.asdict(self.options),
                "tensorboard": self.tensorboard, "mlflow": self.mlflow,
                **({"ray_env": list(self.ray_env)} if self.ray_env else {}),
                **({"current_practice": self.current_practice}
                   if self.current_practice is not None else {})}

    def write(self, run_dir: Path) -> None:
        """Write ``run_dir/run.json``; BadInput if it cannot be written."""
        from dione.state.private import write_private

        path = run_dir / RUN_FILE
        try:
            write_private(path, json.dumps(self.to_json(), indent=1) + "\n")
        except OSError as err:
            raise BadInput(f"cannot write {path}: {err.strerror}; give a run directory you "
                           "can write (--out)") from None


def load_saved_run(run_dir: Path) -> SavedRun:
    """The run ``run_dir/run.json`` records; BadInput when there is none or it is damaged."""
    path = run_dir / RUN_FILE
    if not run_dir.is_dir():
        what = "does not exist" if not run_dir.exists() else "is a file, not a folder"
        raise BadInput(f"{run_dir} {what}: give the run directory that `dione run --out` "
                       "wrote" + ("; a `dione run` stopped before it recorded anything "
                                  "(while profiling) left none: run it again"
                                  if not run_dir.exists() else ""))
    if not path.is_file():
        from dione.state.store import SIMULATED_FILE, STORE_FILE

        if (run_dir / SIMULATED_FILE).is_file():
            raise BadInput(f"{run_dir} is a simulated run (`dione simulate`): nothing "
                           "trained there to resume or export; `dione simulate` again "
                           "redoes it")
        from dione.state.store import TRAIN_FOLDER, trained_by_train

        how = (TRAIN_FOLDER.format(run=quote(str(run_dir))) if trained_by_train(run_dir) else
               "it was trained from Python with task objects (dione.run(tasks), "
               "dione.optuna): call that again to go on; or, started by `dione run` and "
               "its run.json lost: `dione run WORKLOAD --out "
               f"{quote(str(run_dir))}` goes on from its checkpoints"
               if (run_dir / STORE_FILE).is_file()
               else "it was not started by `dione run`")
        raise BadInput(f"{run_dir} has no run.json: {how} (give the run directory that "
                       "`dione run --out` wrote)")
    try:
        saved = json.loads(path.read_text())
        options = saved.get("options")
        return SavedRun(workload=str(saved["workload"]),
                        options=_flags_of_old_run(saved) if options is None
                        else _options(options),
                        devices=saved.get("devices"), ray=saved.get("ray"),
                        tensorboard=saved.get("tensorboard"), mlflow=saved.get("mlflow"),
                        current_practice=saved.get("current_practice"),
                        ray_env=tuple(str(item) for item in saved.get("ray_env") or ()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise BadInput(f"{path} is unreadable or damaged ({type(err).__name__}: {err}); "
                       "start the run again with `dione run WORKLOAD --out "
                       f"{quote(str(run_dir))}`, which keeps every checkpoint") from None


def _options(saved: dict[str, Any]) -> RunOptions:
    """RunOptions from their ``asdict`` form; a field this dione no longer has is named
    and left out (the run goes on with the others)."""
    from dione.orchestrate.options import RunOptions
    from dione.profile.options import TrialOptions

    def known(cls: type, values: dict[str, Any], where: str) -> dict[str, Any]:
        names = {f.name for f in dataclasses.fields(cls)}
        for name in sorted(set(values) - names):
            complain("warning", f"run.json: {where}{name} is not an option of this dione "
                     "version; ignored")
        return {k: v for k, v in values.items() if k in names}

    fields = known(RunOptions, saved, "")
    if "trial" in fields:
        fields["trial"] = TrialOptions(**known(TrialOptions, fields["trial"], "trial."))
    return RunOptions(**fields)


def _flags_of_old_run(saved: dict[str, Any]) -> RunOptions:
    """RunOptions from a run.json of a dione that saved its parsed flags by name."""
    flags = dict(saved)
    if "no_replan" in flags:  # then a store_true flag; now --replan/--no-replan
        flags["replan"] = not flags.pop("no_replan")
    if flags.get("replan") is False:  # saved beside it whatever was given
        flags.pop("replan_interval", None)
    return run_options(flags)


def dashboard_places(tensorboard: str | None, mlflow: str | bool | None
                     ) -> tuple[str | None, str | None]:
    """The flags' TensorBoard folder and MLflow tracking URI, made independent of the
    directory a later ``dione resume`` runs in (MLflow's default resolved here)."""
    import os

    folder = str(Path(tensorboard).resolve()) if tensorboard else None
    if mlflow is True:
        mlflow = (os.environ.get("MLFLOW_TRACKING_URI")
                  or f"sqlite:///{Path('mlflow.db').resolve()}")
    return folder, mlflow or None


def same_workload(run_dir: Path, workload: str) -> None:
    """Refuse a run directory another workload started: its run.json would be
    overwritten (``resume`` and ``export`` would read the wrong workload) and the two
    workloads' tasks mixed in one store and report."""
    if not (run_dir / RUN_FILE).is_file():
        return
    try:
        before = load_saved_run(run_dir).workload
    except BadInput as err:  # damaged: this run writes it anew (the way out it names)
        complain("warning", f"{err}; it is written anew for {workload}")
        return
    if before != workload:
        raise BadInput(f"{run_dir} holds a run of {before}, not {workload}: give a new run "
                       f"directory (--out), or continue that run with `dione resume "
                       f"{quote(str(run_dir))}` "
                       f"(adding `--workload {quote(str(workload))}` if its workload moved there)")
