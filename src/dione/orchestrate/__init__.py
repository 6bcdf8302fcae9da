"""The run loop: for now the current-practice baseline (each task in turn)."""

from dione.orchestrate.sequential import TaskOutcome, choose_technique, run_sequential

__all__ = ["TaskOutcome", "choose_technique", "run_sequential"]
