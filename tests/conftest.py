"""The suite's one fixture for every test: no worker process left behind. What test
modules share lives in ``helpers.py``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from dione.launch.pool import shutdown_local_pool
from helpers import spawner_processes, worker_processes


@pytest.fixture(autouse=True)
def no_leftover_workers() -> Iterator[None]:
    """Every test must leave no worker process behind (its process's warm workers end
    with it: the next test starts from cold, as a new launcher would), nor a spawner of
    a launcher it started. This process's spawner is kept: it holds no slice's state,
    and sparing each test its imports saves minutes of the suite."""
    before = set(worker_processes()) | set(spawner_processes())
    yield
    shutdown_local_pool(keep_spawner=True)
    left = (set(worker_processes()) | set(spawner_processes())) - before
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"worker or spawner processes left behind: {sorted(left)}"
