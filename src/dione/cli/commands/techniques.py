"""``dione techniques``: the registered techniques, whether each is exact, their knobs."""

from __future__ import annotations

import argparse
import json

from dione.cli.console import console

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    from dione.cli.inputs import load
    from dione.techniques import techniques

    if args.workload:  # it registers its own techniques as it loads
        load(args.workload)
    rows = [{"name": t.name, "exact": t.exact, "knobs": dict(t.knobs)} for t in techniques()]
    console.print_json(json.dumps(rows))
    return 0
