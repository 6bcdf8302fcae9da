"""The report of a run: timeline, metrics, summary, leaderboard and a Gantt chart."""

from dione.report.files import TaskSummary, lower_is_better, summaries, write_report
from dione.report.gantt import draw_gantt
from dione.report.plans import AdoptedPlan, read_plans, write_plan

__all__ = ["AdoptedPlan", "TaskSummary", "draw_gantt", "lower_is_better", "read_plans",
           "summaries", "write_plan", "write_report"]
