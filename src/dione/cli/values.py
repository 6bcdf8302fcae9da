"""Command-line text turned into values: knob settings, sizes, counts."""

from __future__ import annotations

import argparse
import math
from typing import Any

from dione.cli.errors import BadInput

__all__ = ["non_negative_float", "non_negative_int", "parse_bytes", "parse_knob",
           "positive_float", "positive_int"]


def parse_knob(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as a knob: true/false, a whole number, a number, else the text."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise BadInput(f"--knob {text!r}: write KEY=VALUE, "
                       "e.g. --knob activation_checkpointing=true")
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return key, lowered == "true"
    for kind in (int, float):
        try:
            return key, kind(raw)
        except ValueError:
            pass
    return key, raw


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (argparse names the option)."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1: use 1 or more")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative: use 0 or more")
    return value


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (seconds, mostly)."""
    value = _finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0: use a positive number")
    return value


def at_least_one(text: str) -> float:
    """An argparse type: a finite multiple of at least 1 (a bound a slice's prediction
    is multiplied by: below 1, slices running as predicted would pass it)."""
    value = _finite_float(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is below 1: a slice running as "
                                         "predicted would pass it; give a multiple such "
                                         "as 10 (the default)")
    return value


def share(text: str) -> float:
    """An argparse type: a share of a whole, above 0 and at most 1 (0.002: 0.2%)."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text} is more than the whole: give a share "
                                         "between 0 and 1 (0.002 for 0.2%)")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number of at least 0."""
    value = _finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: use 0 or more")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def parse_bytes(text: str) -> int:
    """``--memory-cap`` as bytes: 2GiB, 512MiB, 1000000000 (binary units)."""
    units = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = raw[-1] if raw and raw[-1] in units else ""
    try:
        value = float(raw[: len(raw) - len(unit)] if unit else raw)
    except ValueError:
        raise BadInput(f"--memory-cap {text!r}: write a size such as 2GiB, 512MiB or "
                       "1000000000") from None
    if not math.isfinite(value) or value * units[unit] < 1:
        raise BadInput(f"--memory-cap {text!r}: give a finite size of at least one byte, "
                       "such as 2GiB")
    return int(value * units[unit])
