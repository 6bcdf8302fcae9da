"""``dione techniques``: the registered techniques, whether each is exact, their knobs."""

from __future__ import annotations

import argparse
import json

from dione.cli.console import console

__all__ = ["command"]


def command(args: argparse.Namespace) -> int:
    from dione.techniques import techniques

    rows = [{"name": t.name, "exact": t.exact, "knobs": dict(t.knobs)} for t in techniques()]
    console.print_json(json.dumps(rows))
    return 0
