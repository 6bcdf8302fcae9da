"""Which way a metric is better, guessed from its name: for the leaderboards of a metric
no stopping rule judges, and to warn of a rule that judges one the other way."""

from __future__ import annotations

import re

__all__ = ["direction_by_name", "doubtful_direction"]

# Parts of a name (between non-alphanumerics) that say lower is better, or higher.
_LOWER_PARTS = ("loss", "error", "perplexity")
_LOWER_WORDS = {"err", "nll", "wer", "cer", "mse", "mae", "rmse", "ppl"}
_HIGHER_PARTS = ("accuracy", "precision", "recall")
_HIGHER_WORDS = {"acc", "f1", "auc", "auroc", "bleu", "rouge", "iou", "dice", "map", "r2",
                 "reward"}


def direction_by_name(metric: str) -> str | None:
    """"min" where the name says lower is better (a loss, an error, nll, mse, wer...),
    "max" where it says higher (accuracy, f1, auc, bleu...), None where it says
    neither (or both)."""
    words = [w for w in re.split(r"[^a-z0-9]+", metric.lower()) if w]
    lower = any(p in w for p in _LOWER_PARTS for w in words) or bool(_LOWER_WORDS & set(words))
    higher = any(p in w for p in _HIGHER_PARTS for w in words) or bool(
        _HIGHER_WORDS & set(words))
    return None if lower == higher else "min" if lower else "max"


def doubtful_direction(metric: str, mode: str, fix: str = "set mode={mode!r} on the rule"
                       ) -> str | None:
    """Why a rule judging ``metric`` with ``mode`` likely stops the best tasks (its name
    says the other way), with the fix (``fix``, formatted with the other ``mode``: what
    the rule's maker sets); None where the name agrees or says nothing."""
    by_name = direction_by_name(metric)
    if by_name is None or by_name == mode:
        return None
    better = "higher" if by_name == "max" else "lower"
    return (f"its stopping rule judges {metric!r} with mode={mode!r} ("
            f"{'lower' if mode == 'min' else 'higher'} is better), but a {better} "
            f"{metric} is usually better: the rule would stop the best tasks. "
            f"{_capitalised(fix.format(mode=by_name))} if {better} is better")


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]
