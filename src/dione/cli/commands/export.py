"""``dione export``: a trained task's weights as safetensors or ``save_pretrained`` output."""

from __future__ import annotations

import argparse

from dione.cli.console import console
from dione.cli.errors import BadInput
from dione.cli.inputs import load

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from dione.state.export import (
        PROVENANCE_FILE,
        ExportError,
        check_export_folder,
        export_model,
        kept_checkpoint,
        load_trained,
        trained_checkpoint,
        workload_of_task,
    )

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise BadInput(f"-o {out} is a file; give a folder to write the weights into")
    try:
        check_export_folder(out)  # before the model loads, not after
        kept = args.best or args.step is not None
        chosen = None
        if not kept:  # found before the workload loads: its mistakes are said sooner
            checkpoint = trained_checkpoint(args.run_dir, args.task, args.latest)
        workload = load(args.workload or workload_of_task(args.run_dir, args.task))
        task = workload.task(args.task)
        if kept:  # the task says which metric was best, and which way
            checkpoint, chosen = kept_checkpoint(args.run_dir, task, best=args.best,
                                                 step=args.step)
    except ExportError as err:
        raise BadInput(str(err)) from None
    except KeyError as err:
        raise BadInput(f"{err.args[0]}; give the workload the run was started with "
                       "(--workload)") from None
    from dione.state.checkpoint import CheckpointError

    try:
        model = load_trained(task, checkpoint)
    except CheckpointError as err:  # the workload's model is not the one trained
        raise BadInput(str(err)) from None
    try:
        folder = export_model(model, args.output, task, checkpoint, args.run_dir, chosen)
    except OSError as err:
        raise BadInput(f"cannot write {args.output}: {err.strerror or err}; give a folder "
                       "you can write (-o)") from None
    # What this export wrote (its dione.json lists them), not the folder's other files:
    # a tokenizer the user copied in read as written by the export (a review).
    written = json.loads((folder / PROVENANCE_FILE).read_text())["files"]
    files = ", ".join(sorted([*written, PROVENANCE_FILE]))
    console.print(f"task {task.name}: weights of {checkpoint} written to {folder} ({files})")
    return 0
