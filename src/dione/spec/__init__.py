"""What the user writes: tasks, workloads, grids and clusters, and their validation."""

from dione.spec.cluster import Cluster, ClusterError, Node, local_cluster, parse_devices
from dione.spec.task import Task
from dione.spec.validate import Problem, WorkloadError, split_valid, validate_workload
from dione.spec.workload import Workload, WorkloadFileError, grid, load_workload

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
    "split_valid",
    "validate_workload",
]
