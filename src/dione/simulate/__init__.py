"""A virtual cluster: the real orchestrator on a simulated clock (``dione simulate``)."""

from dione.simulate.run import SimulationResult, current_practice, simulate, simulate_profile
from dione.simulate.scenario import Scenario, ScenarioError, load_scenario
from dione.simulate.virtual_clock import VirtualClock
from dione.simulate.workload import parse_cluster, problem_workload

__all__ = ["Scenario", "ScenarioError", "SimulationResult", "VirtualClock",
           "current_practice", "load_scenario", "parse_cluster", "problem_workload", "simulate",
           "simulate_profile"]
