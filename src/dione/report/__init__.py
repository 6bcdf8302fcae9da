"""The report of a run: timeline, metrics, summary, leaderboard and a Gantt chart."""

from dione.report.files import lower_is_better, report_after_run, write_report
from dione.report.gantt import draw_gantt

__all__ = ["draw_gantt", "lower_is_better", "report_after_run", "write_report"]
