"""dione: train many deep-learning models at once, finishing the whole batch early."""

from dione.spec import Cluster, Node, Task, Workload, grid, load_workload, local_cluster
from dione.techniques import SliceContext, SliceOutcome, Technique, get_technique, register

__version__ = "0.1.0"

__all__ = [
    "Cluster",
    "Node",
    "SliceContext",
    "SliceOutcome",
    "Task",
    "Technique",
    "Workload",
    "__version__",
    "get_technique",
    "grid",
    "load_workload",
    "local_cluster",
    "register",
]
