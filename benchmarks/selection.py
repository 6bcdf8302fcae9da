"""A real sweep on this machine, five ways (issue 40): the full grid; ASHA with each task
keeping the devices the first plan gave it; ASHA with freed devices re-planned at once;
Ray Tune's own AsyncHyperBandScheduler; an Optuna study with its SuccessiveHalvingPruner
through ``dione.optuna``; and (``--ways ...,paused``) ``dione.PausingAsha`` re-planned: ASHA
as Li et al. define it, a task paused at a rung until it ranks among the best there.

    pip install -e '.[tune]'   # Ray Tune's dependencies (not in `make setup`)
    python benchmarks/selection.py [--steps 729] [--devices cpu:2] [--save-curves FILE]

The sweep: the character GPT (2 blocks, context 32, batch 16, AdamW) over widths 32, 64,
96, 128 and learning rates 3e-4, 1e-3, 3e-3, 1e-2 (16 configurations), ``--steps`` steps
each. The rule: successive halving on the training loss (the mean of the last 5 steps)
with rungs at 27, 81, 243 steps and eta 3, as ``dione.Asha(min_steps=27, eta=3)``, Ray's
``AsyncHyperBandScheduler(grace_period=27, reduction_factor=3, brackets=1)`` and Optuna's
``SuccessiveHalvingPruner(min_resource=27, reduction_factor=3)`` define it. Each
configuration that trains to its end is evaluated on held-out text (``val_loss``); a
way's pick is the lowest ``val_loss`` among those, and the pick's full-length metric is
the grid's ``val_loss`` for it.

The catalog is warmed first (one profile of the four widths, timed apart), so each dione
way pays no trials; each way's wall time runs from the call to its return (for Ray Tune,
``Tuner.fit()`` on a Ray started beforehand with 2 CPUs, one per trial; its trials load
the data and build the model as dione's do, but draw batches from their own seeded
shuffle). dione's makespan is its run clock (from the first plan to the last slice).
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import dione
from dione import Asha, PausingAsha, Task
from dione.zoo import CharGPT, sequence_cross_entropy, text_train, text_validation_loss

WIDTHS = (32, 64, 96, 128)
RATES = (3e-4, 1e-3, 3e-3, 1e-2)
CONTEXT, LAYERS, HEADS, BATCH, SEED = 32, 2, 2, 16, 7
MIN_STEPS, ETA, WINDOW = 27, 3, 5
VALIDATION = functools.partial(text_validation_loss, context=CONTEXT, limit=256)


def name(width: int, lr: float) -> str:
    return f"w{width}-lr{lr:g}"


def task(width: int, lr: float, steps: int, stopping: Any = None) -> Task:
    return Task(name=name(width, lr),
                model=functools.partial(CharGPT, context=CONTEXT, width=width, layers=LAYERS,
                                        heads=HEADS),
                data=functools.partial(text_train, CONTEXT), loss=sequence_cross_entropy,
                optimizer=functools.partial(torch.optim.AdamW, lr=lr), batch_size=BATCH,
                steps=steps, seed=SEED, evaluate=VALIDATION,
                hyperparameters={"width": width, "lr": lr}, stopping=stopping)


def sweep(steps: int, stopping: Any = None) -> list[Task]:
    return [task(w, lr, steps, stopping) for w in WIDTHS for lr in RATES]


def dione_way(tasks: list[Task], run_dir: Path, devices: str, catalog: str,
              **options: Any) -> dict[str, Any]:
    began = time.perf_counter()
    result = dione.run(tasks, devices=devices, run_dir=str(run_dir), quiet=True,
                       catalog=catalog, **options)
    wall = time.perf_counter() - began
    finished = {t.task: t.evaluation["val_loss"] for t in result.tasks
                if t.status == "done" and "val_loss" in t.evaluation}
    return {"wall": wall, "makespan": result.makespan, "finished": finished,
            "stopped": sum(t.status == "stopped" for t in result.tasks)}


def print_order(run_dir: Path) -> None:
    """A dione way's rung decisions in the order they came, and its slices in the order
    they started (who reached a rung first decides ASHA's promotions)."""
    from dione.state.store import RunStore

    with RunStore(run_dir) as store:
        for task, rung, value, stopped, reason in store.decisions():
            print(f"  rung {rung:4d} {task:14s} {value:.3f} {'stopped' if stopped else 'on'}: "
                  f"{reason}")
        slices = sorted(store.slices(), key=lambda s: s.started_at)
        zero = slices[0].started_at if slices else 0.0
        for s in slices:
            print(f"    {s.task:14s} steps {s.start_step:4d}-{s.end_step:4d} device "
                  f"{s.device_ids} {s.started_at - zero:6.1f}-"
                  f"{(s.ended_at or s.started_at) - zero:6.1f} s {s.status}")


def ray_trainable(config: dict[str, Any]) -> None:
    """One configuration as a Ray Tune function trainable: the same model, loss,
    optimizer, batch and seed as dione's task; the loss reported at each rung."""
    from ray import tune

    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = CharGPT(context=CONTEXT, width=config["width"], layers=LAYERS, heads=HEADS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    data = text_train(CONTEXT)
    order = torch.Generator().manual_seed(SEED)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True,
                                         generator=order, drop_last=True)
    steps, rungs = config["steps"], set(rung_steps(config["steps"]))
    losses: list[float] = []
    step = 0
    while step < steps:
        for inputs, target in loader:
            optimizer.zero_grad()
            loss = sequence_cross_entropy(model(inputs), target)
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
            step += 1
            if step in rungs or step == steps:
                report = {"step": step, "loss": sum(losses[-WINDOW:]) / len(losses[-WINDOW:])}
                if step == steps:
                    model.eval()
                    with torch.no_grad():
                        report.update(VALIDATION(model))
                tune.report(report)
            if step == steps:
                return


def rung_steps(steps: int) -> list[int]:
    rungs, rung = [], MIN_STEPS
    while rung < steps:
        rungs.append(rung)
        rung *= ETA
    return rungs


def ray_way(steps: int, storage: Path, widest_first: bool = False) -> dict[str, Any]:
    """Ray Tune's ASHA over the sweep, its trials started in grid order (narrowest
    first) or, ``widest_first``, in the reverse (as dione's plan tends to start them:
    ASHA's decisions depend on who reaches a rung first)."""
    from ray import tune
    from ray.tune.schedulers import AsyncHyperBandScheduler

    scheduler = AsyncHyperBandScheduler(time_attr="step", metric="loss", mode="min",
                                        max_t=steps, grace_period=MIN_STEPS,
                                        reduction_factor=ETA, brackets=1)
    tuner = tune.Tuner(
        tune.with_resources(ray_trainable, {"cpu": 1}),
        param_space={"width": tune.grid_search(order(WIDTHS, widest_first)),
                     "lr": tune.grid_search(order(RATES, widest_first)), "steps": steps},
        tune_config=tune.TuneConfig(scheduler=scheduler),
        run_config=tune.RunConfig(storage_path=str(storage), name="selection", verbose=0))
    began = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - began
    finished = {}
    for result in results:
        metrics = result.metrics or {}
        if metrics.get("step") == steps and "val_loss" in metrics:
            finished[name(result.config["width"], result.config["lr"])] = metrics["val_loss"]
    return {"wall": wall, "makespan": None, "finished": finished,
            "stopped": len(results) - len(finished)}


def order(values: tuple[Any, ...], reverse: bool) -> list[Any]:
    return list(reversed(values)) if reverse else list(values)


def optuna_way(steps: int, run_dir: Path, devices: str, catalog: str) -> dict[str, Any]:
    import optuna

    import dione.optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        sampler=optuna.samplers.GridSampler({"width": list(WIDTHS), "lr": list(RATES)},
                                            seed=SEED),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=MIN_STEPS,
                                                      reduction_factor=ETA,
                                                      min_early_stopping_rate=0))

    def make(trial: Any) -> Task:
        return task(trial.suggest_categorical("width", list(WIDTHS)),
                    trial.suggest_categorical("lr", list(RATES)), steps)

    began = time.perf_counter()
    result = dione.optuna.optimize(study, make, n_trials=len(WIDTHS) * len(RATES),
                                   report_every=MIN_STEPS, run_dir=str(run_dir),
                                   devices=devices, quiet=True, catalog=catalog)
    wall = time.perf_counter() - began
    finished = {}
    for outcome in result.tasks:
        params = study.trials[int(outcome.task.split("-")[1])].params
        if outcome.status == "done" and "val_loss" in outcome.evaluation:
            finished[name(params["width"], params["lr"])] = outcome.evaluation["val_loss"]
    return {"wall": wall, "makespan": result.makespan, "finished": finished,
            "stopped": sum(t.status == "stopped" for t in result.tasks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=729)
    parser.add_argument("--devices", default="cpu:2")
    parser.add_argument("--ways", default="grid,kept,replanned,ray,optuna",
                        help="of grid, kept, replanned, paused, expected, ray, ray-widest, "
                        "optuna")
    parser.add_argument("--show-order", action="store_true",
                        help="print each dione way's rung decisions and slices in order")
    parser.add_argument("--save-curves", metavar="FILE",
                        help="write the grid's training loss per step of each task (JSON, "
                             "a simulation scenario's `curves`)")
    args = parser.parse_args()
    ways = args.ways.split(",")
    rule = Asha(min_steps=MIN_STEPS, eta=ETA, loss_window=WINDOW)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        catalog = str(folder / "catalog.sqlite")
        from dione.profile import Catalog
        from dione.profile.profiler import profile_workload
        from dione.spec import local_cluster

        began = time.perf_counter()
        with Catalog(catalog) as opened:
            profile = profile_workload(sweep(args.steps), local_cluster(args.devices), opened)
        print(f"catalog warmed: {profile.trials_run} trials in "
              f"{time.perf_counter() - began:.0f} s (not counted below)", flush=True)
        found: dict[str, dict[str, Any]] = {}
        for i, way in enumerate(ways):
            run_dir = folder / f"{i}-{way}"  # a way may be asked more than once
            # ... and each run of it is a row of its own (a dict keyed by the way kept
            # the last run alone, and a figure quoted from the first was in no output).
            label = way if way not in found else f"{way} #{ways[:i + 1].count(way)}"
            if way == "grid":
                found[label] = dione_way(sweep(args.steps), run_dir, args.devices, catalog)
                if args.save_curves:
                    save_curves(run_dir, Path(args.save_curves))
            elif way == "kept":
                found[label] = dione_way(sweep(args.steps, rule), run_dir, args.devices,
                                       catalog, replan=False)
            elif way == "replanned":
                found[label] = dione_way(sweep(args.steps, rule), run_dir, args.devices,
                                       catalog)
            elif way == "paused":  # Li et al.'s ASHA: paused at rungs, promoted
                found[label] = dione_way(sweep(args.steps, PausingAsha(
                    min_steps=MIN_STEPS, eta=ETA, loss_window=WINDOW)), run_dir,
                    args.devices, catalog)
            elif way == "expected":  # re-planned, each task at its expected length
                found[label] = dione_way(sweep(args.steps, rule), run_dir, args.devices,
                                       catalog, stopping_horizon="expected")
            elif way in ("ray", "ray-widest"):
                import ray

                os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
                ray.init(num_cpus=int(args.devices.split(":")[1]), include_dashboard=False,
                         log_to_driver=False)
                try:
                    found[label] = ray_way(args.steps, folder / way,
                                         widest_first=way == "ray-widest")
                finally:
                    ray.shutdown()
            elif way == "optuna":
                found[label] = optuna_way(args.steps, run_dir, args.devices, catalog)
            print(f"{label}: {found[label]}", flush=True)
            if args.show_order and way in ("grid", "kept", "replanned", "paused",
                                                   "expected"):
                print_order(run_dir)
    report(found, args.steps)


def save_curves(run_dir: Path, path: Path) -> None:
    """Each task's training loss per step (5 significant digits) as JSON."""
    import json

    from dione.state.store import RunStore

    with RunStore(run_dir) as store:
        curves = {t.name: [float(f"{loss:.5g}") for _, loss, _ in store.metrics(t.name)]
                  for t in store.tasks()}
    path.write_text(json.dumps(curves, separators=(",", ":")) + "\n")
    print(f"curves of {len(curves)} tasks written to {path}", flush=True)


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a is not None and b else "-"


def report(found: dict[str, dict[str, Any]], steps: int) -> None:
    grid = found.get("grid")
    ray_wall = found["ray"]["wall"] if "ray" in found else None
    print(f"\n16 configurations x {steps} steps; rungs {rung_steps(steps)}, eta {ETA}\n")
    print("| way | wall s | wall / grid | makespan s | makespan / grid | wall / Ray Tune "
          "| stopped | pick (its val_loss at full length, from the grid) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for way, got in found.items():
        pick = min(got["finished"], key=got["finished"].get) if got["finished"] else None
        full = (grid["finished"].get(pick) if grid and pick else None)
        print(f"| {way} | {got['wall']:.1f} | {ratio(got['wall'], grid and grid['wall'])} | "
              + (f"{got['makespan']:.1f}" if got["makespan"] is not None else "-")
              + f" | {ratio(got['makespan'], grid and grid['makespan'])} | "
              f"{ratio(got['wall'], ray_wall)} | {got['stopped']} | {pick} "
              f"({'-' if full is None else f'{full:.4f}'}) |")
    if grid:
        ranked = sorted(grid["finished"].items(), key=lambda kv: kv[1])
        print("\nthe grid's best five: " + ", ".join(f"{n} {v:.4f}" for n, v in ranked[:5]))


if __name__ == "__main__":
    main()
