"""What the user writes: tasks, workloads, grids and clusters, and their validation."""

from typing import TYPE_CHECKING

from dione._lazy import lazy_exports
from dione.spec.cluster import Cluster, ClusterError, Node, local_cluster, parse_devices

if TYPE_CHECKING:
    from dione.spec.batch import samples, shifted_tokens, tokens
    from dione.spec.task import Task
    from dione.spec.validate import Problem, WorkloadError, split_valid, validate_workload
    from dione.spec.workload import Workload, WorkloadFileError, grid, load_workload

# Tasks and workloads need torch; clusters and devices do not (the planner reads them).
__getattr__ = lazy_exports(__name__, {
    "Task": "dione.spec.task",
    **dict.fromkeys(("samples", "shifted_tokens", "tokens"), "dione.spec.batch"),
    **dict.fromkeys(("Problem", "WorkloadError", "split_valid", "validate_workload"),
                    "dione.spec.validate"),
    **dict.fromkeys(("Workload", "WorkloadFileError", "grid", "load_workload"),
                    "dione.spec.workload"),
})

__all__ = [
    "Cluster",
    "ClusterError",
    "Node",
    "Problem",
    "Task",
    "Workload",
    "WorkloadError",
    "WorkloadFileError",
    "grid",
    "load_workload",
    "local_cluster",
    "parse_devices",
    "samples",
    "shifted_tokens",
    "split_valid",
    "tokens",
    "validate_workload",
]
