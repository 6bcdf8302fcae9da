"""A real Ray cluster on this machine (ray.cluster_utils.Cluster, two fake nodes): gangs
run on the node the plan chose, fail as local gangs do, survive the loss of a node, and
leave no actor or placement group behind."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from dione.launch.local import local_placement
from dione.launch.slice import SliceError, run_slice
from dione.orchestrate import RunEvent, RunOptions, run_workload
from dione.profile import Catalog, ProfileEvent, TrialOptions, profile_workload
from dione.spec.cluster import Cluster, ClusterError, Node
from dione.spec.workload import load_workload
from dione.state import RunStore, load_model_weights
from helpers import digits_task, workload_text

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'dione[ray]'")
from ray.cluster_utils import Cluster as RayTestCluster  # noqa: E402

from dione.launch import ray_launcher  # noqa: E402
from dione.launch.ray_launcher import (  # noqa: E402
    GANG_PREFIX,
    RayLauncher,
    remove_abandoned_gangs,
)
from dione.launch.worker import rendezvous_path  # noqa: E402

QUICK = TrialOptions(warmup_steps=1, measure_steps=2)



@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """One Ray cluster for the module: a head with no devices and two 2-CPU nodes."""
    test_cluster = RayTestCluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        test_cluster.add_node(num_cpus=2)
    ray.init(address=test_cluster.address, log_to_driver=False)
    test_cluster.wait_for_nodes()
    yield test_cluster
    ray.shutdown()
    test_cluster.shutdown()


def _left_behind() -> tuple[list[Any], list[Any]]:
    from ray.util.state import list_actors, list_placement_groups

    deadline = time.monotonic() + 30
    while True:
        actors = [a for a in list_actors() if a.state not in ("DEAD",)]
        groups = [g for g in list_placement_groups() if g.state not in ("REMOVED",)]
        if not (actors or groups) or time.monotonic() > deadline:
            return actors, groups
        time.sleep(0.5)


@pytest.fixture
def launcher(cluster: Any, request: pytest.FixtureRequest) -> Iterator[RayLauncher]:
    """A launcher for one test; afterwards no actor or placement group may be left."""
    env = getattr(request, "param", None) or {}
    ours = RayLauncher(env=env)
    yield ours
    ours.shutdown()
    actors, groups = _left_behind()
    assert not actors and not groups, (actors, groups)


def test_a_cluster_of_several_nodes_is_refused_without_ray(tmp_path: Path) -> None:
    cluster = Cluster([Node("gpu-node-a", 2, "cpu"), Node("gpu-node-b", 2, "cpu")])
    with pytest.raises(ClusterError, match="a cluster of 2 nodes needs Ray"):
        run_workload([digits_task()], cluster, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing started


def _final_weights(task: Any, checkpoint: str) -> dict[str, torch.Tensor]:
    model = task.model()
    load_model_weights(checkpoint, model)
    return model.state_dict()


def dione_node(nodes: list[Node], added: Any) -> Node:
    """The node dione names for a node ``cluster.add_node`` made (its name ends with a
    prefix of Ray's node id)."""
    return next(n for n in nodes if added.node_id.startswith(n.name.rsplit("-", 1)[1]))


def remove_node(cluster: Any, launcher: RayLauncher, added: Any) -> None:
    """Take a node ``cluster.add_node`` made out of the cluster, as an operator drains
    one: the launcher first lets go of its actors and devices there."""
    for node in launcher.nodes():
        if added.node_id.startswith(node.name.rsplit("-", 1)[1]):
            launcher.forget_node(node.name)
    cluster.remove_node(added)


class TestOnWarmActors:
    """Tests that need no environment of their own nor cold actors share one launcher,
    whose warm actors serve each in turn as a long run's do, nodes joining and leaving
    the cluster between and during them (an actor's start costs some 7 s of CPU here: a
    Ray worker, torch, dione). Afterwards no actor or placement group may be left."""

    @pytest.fixture(scope="class")
    @classmethod
    def launcher(cls, cluster: Any) -> Iterator[RayLauncher]:
        ours = RayLauncher()
        yield ours
        ours.shutdown()
        actors, groups = _left_behind()
        assert not actors and not groups, (actors, groups)

    def test_two_nodes_train_as_planned_and_match_a_local_run(
            self, launcher: RayLauncher, tmp_path: Path) -> None:
        tasks = [digits_task(f"d{i}", steps=24, batch_size=16,
                             optimizer=functools.partial(torch.optim.Adam, lr=1e-2 * (i + 1)),
                             techniques=("single", "ddp"))
                 for i in range(4)]
        nodes = launcher.nodes()
        shared = tmp_path / "shared"  # the storage every node reaches (here: one disk)
        result = run_workload(tasks, Cluster(nodes), tmp_path / "run",
                              RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                                         solver="greedy", time_limit=5.0, storage=str(shared)),
                              launcher=launcher)
        assert all(t.status == "done" for t in result.tasks), result.tasks
        # Checkpoints went to the storage, the run store stayed in the run directory; the
        # trials left nothing behind there.
        assert all(Path(str(t.checkpoint)).is_relative_to(shared) for t in result.tasks)
        assert not (tmp_path / "run" / "checkpoints").exists()
        assert [p.name for p in shared.iterdir()] == ["runs"]  # this run's folder, no other
        with RunStore(tmp_path / "run") as store:
            assert [p.name for p in (shared / "runs").iterdir()] == [store.run_id]
        with RunStore(tmp_path / "run") as store:
            slices = [s for s in store.slices() if s.status == "done"]
        assert {s.node for s in slices} == {n.name for n in nodes}  # both nodes trained
        # Exact techniques: the same final weights as the same (technique, devices) here.
        for task in tasks:
            ran = [s for s in slices if s.task == task.name]
            assert len(ran) == 1
            local = run_slice(task, ran[0].technique, tmp_path / "local",
                              local_placement(Node("here", 2, "cpu"), ran[0].device_ids))
            done = result.task(task.name)
            assert done.final_loss == local.losses[-1], task.name
            ours = _final_weights(task, str(done.checkpoint))
            theirs = _final_weights(task, str(local.checkpoint))
            assert all(torch.equal(ours[k], theirs[k]) for k in ours), task.name

    @pytest.mark.parametrize("reset", ["raises", "hangs"])
    def test_an_actor_whose_reset_fails_is_replaced_and_the_next_slice_not_blamed(
            self, launcher: RayLauncher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            reset: str) -> None:
        """As a local worker (``test_warm_workers``): an actor that cannot put its state back
        after a slice is ended before the next slice on its device, which gets a new one."""
        file = tmp_path / "stubborn.py"
        file.write_text(workload_text("stubborn"))
        tasks = {task.name: task for task in load_workload(file)}
        if reset == "hangs":  # the launcher waits this long for its word, then ends it
            monkeypatch.setattr(ray_launcher, "RESTORE_SECONDS", 2.0)
        placement = launcher.placement(launcher.nodes()[0], [0])
        run_slice(tasks[reset], "single", tmp_path, placement, launcher=launcher)
        started = launcher.actors_started
        innocent = run_slice(tasks["innocent"], "single", tmp_path, placement,
                             launcher=launcher, timeout=120)
        assert len(innocent.losses) == 2
        assert launcher.actors_started == started + 1

    def test_trials_run_side_by_side_on_every_node(self, launcher: RayLauncher,
                                                   tmp_path: Path) -> None:
        tasks = [digits_task("a", techniques=("single", "ddp")),
                 digits_task("b", batch_size=32, techniques=("single", "ddp"))]
        nodes = launcher.nodes()
        events: list[ProfileEvent] = []
        with Catalog(tmp_path / "catalog.sqlite") as catalog:
            first = profile_workload(tasks, Cluster(nodes), catalog, options=QUICK,
                                     on_event=events.append, launcher=launcher)
            # Nodes of the same kind share catalog entries: one node alone runs nothing anew.
            again = profile_workload(tasks, Cluster(nodes[1:]), catalog, options=QUICK,
                                     launcher=launcher)
        assert first.trials_run >= 4 and all(t.options for t in first.tasks)
        assert {e.node for e in events if e.kind == "started"} == {n.name for n in nodes}
        assert again.trials_run == 0 and again.trials_cached == first.trials_run

    def test_progress_comes_back_through_the_launcher(self, launcher: RayLauncher,
                                                      tmp_path: Path) -> None:
        task = digits_task("p", steps=6)
        heard: dict[str, list[tuple[int, int]]] = {"ray": [], "local": []}
        node = launcher.nodes()[0]
        began = time.time()
        swept: list[Path] = []
        running: list[Path] = []
        held: list[int] = []  # per running folder, its ranks' holds while the gang ran

        def on_ray_progress(rank: int, record: dict[str, Any]) -> None:
            heard["ray"].append((rank, record["step"]))
            if not running:  # the gang runs: its folder survives a sweep, whatever its age
                running.extend(f for f in Path(tempfile.gettempdir()).glob(f"{GANG_PREFIX}*")
                               if f.stat().st_mtime >= began)
                held.extend(len(list(f.glob("rank*.held"))) for f in running)
                an_hour_ago = time.time() - 3600
                for folder in running:  # aged by hand: only its holds keep it
                    os.utime(folder, (an_hour_ago, an_hour_ago))
                swept.extend(remove_abandoned_gangs())
                for folder in running:  # young again: no other session's sweep takes it
                    with contextlib.suppress(FileNotFoundError):  # once its holds end
                        os.utime(folder)

        run_slice(task, "ddp", tmp_path / "ray", launcher.placement(node, [0, 1]),
                  launcher=launcher, on_progress=on_ray_progress)
        # Counted while it ran: once it ends, the folder goes whenever its actor gets to it.
        assert running and held == [2] * len(running), (running, held)
        assert not set(running) & set(swept)
        run_slice(task, "ddp", tmp_path / "local", local_placement(Node("here", 2, "cpu"), [0, 1]),
                  on_progress=lambda rank, record: heard["local"].append((rank, record["step"])))
        for said in heard.values():  # every rank reports its first step at once
            assert {(0, 1), (1, 1)} <= set(said), heard
        assert not list(tmp_path.glob("**/progress-*.json"))  # no file carried it

    def test_a_node_lost_while_profiling_leaves_the_profile_not_the_catalog(
            self, launcher: RayLauncher, cluster: Any, tmp_path: Path) -> None:
        extra = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        nodes = launcher.nodes()
        doomed = dione_node(nodes, extra)
        tasks = [digits_task(f"p{i}", steps=400, batch_size=16 * (i + 1),
                             techniques=("single", "ddp")) for i in range(3)]
        events: list[ProfileEvent] = []
        removal: list[threading.Thread] = []

        def heard(event: ProfileEvent) -> None:
            events.append(event)
            if event.kind == "started" and event.node == doomed.name and not removal:
                removal.append(threading.Thread(target=cluster.remove_node, args=(extra,)))
                removal[0].start()

        try:
            with Catalog(tmp_path / "catalog.sqlite") as catalog:
                profile = profile_workload(
                    tasks, Cluster(nodes), catalog, launcher=launcher,
                    options=TrialOptions(warmup_steps=1, measure_steps=300), on_event=heard)
                records = [catalog.get(r.fingerprint) for t in profile.tasks for r in t.trials]
        finally:  # the node gone, whatever happened, before the class's next test
            if removal:
                removal[0].join(60)
            else:
                cluster.remove_node(extra)
            launcher.forget_node(doomed.name)
        assert removal, "no trial started on the node to lose"
        assert all(t.options for t in profile.tasks), [t.why_no_option() for t in profile.tasks]
        assert all(r is not None and r.status == "ok" for r in records), records
        print("started:", [(e.label, e.tasks, e.node == doomed.name) for e in events
                           if e.kind == "started"])

    def test_losing_a_node_mid_run_replans_onto_the_others(
            self, launcher: RayLauncher, cluster: Any, tmp_path: Path) -> None:
        began = time.time()
        extra = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        nodes = launcher.nodes()
        doomed = dione_node(nodes, extra)
        tasks = [digits_task(f"t{i}", steps=80, batch_size=16, techniques=("single",))
                 for i in range(6)]
        outcome: dict[str, Any] = {}

        def run() -> None:
            outcome["result"] = run_workload(
                tasks, Cluster(nodes), tmp_path / "run",
                RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                           solver="greedy", slice_steps=20, time_limit=5.0),
                launcher=launcher)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and thread.is_alive():
                if (tmp_path / "run" / "dione.sqlite").exists():
                    with RunStore(tmp_path / "run") as store:
                        if any(s.node == doomed.name and s.status == "running"
                               and s.start_step > 0 for s in store.slices()):
                            break
                time.sleep(0.05)  # a slice lasts well under a second: look often
        finally:  # the node gone, whatever happened, before the class's next test
            cluster.remove_node(extra, allow_graceful=False)  # as a preempted machine goes
            thread.join(600)
            launcher.forget_node(doomed.name)
        assert not thread.is_alive()
        result = outcome["result"]
        assert all(t.status == "done" for t in result.tasks), result.tasks
        with RunStore(tmp_path / "run") as store:
            # Cut by the loss: failed as "node lost" (never "was killed": Ray calls the
            # actor unreachable 10-15 s before it marks an abruptly lost node dead), or
            # interrupted where the run saw the node gone first.
            lost = [s for s in store.slices() if s.status in ("failed", "interrupted")]
            assert lost and all(s.node == doomed.name for s in lost)
            assert all("node lost" in (s.error or "") for s in lost if s.status == "failed")
            for task in tasks:
                # No step lost before the last checkpoint: every step trained, and every
                # slice started where a checkpoint was.
                assert [step for step, _ in store.losses(task.name)] == list(range(1, 81))
                done = [s for s in store.slices(task.name) if s.status == "done"]
                assert [s.start_step for s in done] == [0, 20, 40, 60]
        launcher.settle()  # the other gangs' folders gone from their (alive) nodes
        # The lost node's gang kept its folder (no launcher reaches a lost node); its ranks
        # held it, and their holds ended with their processes: the next actor on that
        # machine removes it (as here, aged by hand: it has not had the minute to age; not
        # swept with age 0, which could take another session's folder just made).
        left = [f for f in Path(tempfile.gettempdir()).glob(f"{GANG_PREFIX}*")
                if f.stat().st_mtime >= began]
        assert left and all(list(f.glob("rank*.held")) for f in left)
        an_hour_ago = time.time() - 3600
        for folder in left:
            os.utime(folder, (an_hour_ago, an_hour_ago))
        assert set(left) <= set(remove_abandoned_gangs())

    def test_nodes_of_different_sizes_each_run_slices_that_fit_them(
            self, launcher: RayLauncher, cluster: Any, tmp_path: Path) -> None:
        small = cluster.add_node(num_cpus=1)  # a node of one device beside the two of two
        cluster.wait_for_nodes()
        try:
            nodes = launcher.nodes()
            one = dione_node(nodes, small)
            assert one.devices == 1 and {n.devices for n in nodes} == {1, 2}
            # The widest first, whatever Ray's node ids: the profiler measures options on the
            # first node, up to its width.
            assert nodes[0].devices == 2 and nodes[-1] == one
            tasks = [digits_task(f"s{i}", steps=12, techniques=("single",)) for i in range(4)]
            result = run_workload(
                tasks, Cluster(nodes), tmp_path / "run",
                RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                           solver="greedy", time_limit=5.0),
                launcher=launcher)
            assert all(t.status == "done" for t in result.tasks), result.tasks
            with RunStore(tmp_path / "run") as store:
                ran = [s for s in store.slices() if s.status == "done"]
            devices = {n.name: n.devices for n in nodes}
            assert all(max(s.device_ids) < devices[s.node] for s in ran)
            # Greedy puts the first task on the smallest node where it ends as early: the
            # node of one device trains too.
            assert one.name in {s.node for s in ran}
        finally:
            remove_node(cluster, launcher, small)

    def test_a_cpu_head_beside_gpu_nodes_holds_no_device_of_the_run(
            self, launcher: RayLauncher, cluster: Any, tmp_path: Path) -> None:
        """A Ray head started on a CPU machine, GPU workers beside it: the run's devices are
        the GPUs only (Ray's GPU resource is declared here; nothing trains on it). A run
        already planned on CPU nodes keeps them when a GPU node joins (its slices failed as
        "node lost" on nodes alive, one by one, until none was left)."""
        gpu = None
        try:
            cpu = launcher.nodes()[0]
            gpu = cluster.add_node(num_cpus=1, num_gpus=2)
            cluster.wait_for_nodes()
            nodes = launcher.nodes()
            assert nodes == [dione_node(nodes, gpu)] and nodes[0].kind == "cuda" \
                and nodes[0].devices == 2, nodes
            assert cpu in (launcher.alive_nodes() or [])
            result = run_slice(digits_task("a", steps=2, techniques=("single",)), "single",
                               tmp_path / "run", launcher.placement(cpu, [0]), launcher=launcher)
            assert len(result.losses) == 2
        finally:
            if gpu is not None:
                remove_node(cluster, launcher, gpu)

    def test_a_node_that_joins_mid_run_is_planned_at_the_next_replan(
            self, launcher: RayLauncher, cluster: Any, tmp_path: Path) -> None:
        """A node of the run's kind that joins is planned; one of a GPU model the run's
        profile never measured is not (it was planned with the others' seconds and
        memory: a regression review)."""
        joined: Any = None
        other: Any = None
        try:
            tasks = [digits_task(f"j{i}", steps=100, batch_size=16, techniques=("single",))
                     for i in range(6)]
            events: list[RunEvent] = []

            def on_event(event: RunEvent) -> None:
                # The node joins while the run loop waits here, at its first slice's start:
                # the tasks queued behind the first four are still to start when the next
                # re-plan sees it (added from the test's thread instead, the node could come
                # up after they had started, leaving nothing worth moving).
                nonlocal joined, other
                events.append(event)
                if event.kind == "slice_started" and joined is None:
                    joined = cluster.add_node(num_cpus=2)
                    other = cluster.add_node(num_cpus=2,
                                             resources={"accelerator_type:Z": 1})
                    cluster.wait_for_nodes()

            result = run_workload(
                tasks, Cluster(launcher.nodes()), tmp_path / "run",
                RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                           solver="greedy", slice_steps=20, time_limit=5.0),
                launcher=launcher, on_event=on_event)
            assert all(t.status == "done" for t in result.tasks)
            new = next(n.name for n in launcher.nodes()
                       if joined.node_id.startswith(n.name.rsplit("-", 1)[1]))
            assert any(e.kind == "node_joined" and new in e.message for e in events)
            # Several nodes and no storage: said (checkpoints resume across nodes only in
            # a shared run directory; a review saw nothing said).
            assert any(e.kind == "storage_unset" for e in events)
            unmeasured = dione_node(launcher.nodes(), other).name
            assert any(e.kind == "node_unmeasured" and unmeasured in e.message
                       for e in events)
            with RunStore(tmp_path / "run") as store:
                assert any(s.node == new and s.status == "done" for s in store.slices())
                assert not any(s.node == unmeasured for s in store.slices())
        finally:
            for node in (joined, other):
                if node is not None:
                    remove_node(cluster, launcher, node)

    def test_nodes_of_two_models_are_profiled_and_planned_each_as_its_kind(
            self, launcher: RayLauncher, cluster: Any, tmp_path: Path) -> None:
        """Two nodes Ray names as of two GPU models (its accelerator_type resource): each
        model's nodes run trials of their own, the plans give each node its kind and
        each option a kind, and every task's final evaluation comes back (rank 0 sends
        its outcome ahead of evaluating, over Ray's stream too)."""
        from dione.orchestrate.plans import read_plans
        from dione.zoo.digits import digits_accuracy

        added: list[Any] = []
        try:
            for model in ("X", "Y"):
                added.append(cluster.add_node(num_cpus=2,
                                              resources={f"accelerator_type:{model}": 1}))
            cluster.wait_for_nodes()
            nodes = [dione_node(launcher.nodes(), a) for a in added]
            assert [n.model for n in nodes] == ["X", "Y"]
            tasks = [digits_task(f"k{i}", steps=8, techniques=("single",),
                                 evaluate=digits_accuracy) for i in range(3)]
            result = run_workload(
                tasks, Cluster(nodes), tmp_path / "run",
                RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                           solver="greedy", slice_steps=4, time_limit=5.0),
                launcher=launcher)
            assert all(t.status == "done" and "accuracy" in t.evaluation
                       for t in result.tasks), result.tasks
            problem = read_plans(tmp_path / "run")[0].problem
            assert problem is not None
            assert [n.kind for n in problem.nodes] == ["X", "Y"]
            assert {o.kind for t in problem.tasks for o in t.options} == {"X", "Y"}
            with RunStore(tmp_path / "run") as store:
                assert {s.node for s in store.slices()} <= {n.name for n in nodes}
        finally:
            for node in added:
                remove_node(cluster, launcher, node)


def test_ray_env_reaches_the_launcher_the_cli_makes(cluster: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`--ray-env` to the actors' environment (which test_a_failing_rank_reads_as_it_does
    _locally shows reaching the ranks: FAULT)."""
    from dione.cli.inputs import ray_launcher

    monkeypatch.setenv("DIONE_PROBE_SHELL", "from the shell")
    ours = ray_launcher(cluster.address, None, ["DIONE_PROBE=7", "DIONE_PROBE_SHELL"])
    try:
        assert ours.env == {"DIONE_PROBE": "7", "DIONE_PROBE_SHELL": "from the shell"}
    finally:
        ours.shutdown()


def test_connecting_keeps_the_handlers_that_stop_a_run_cleanly(cluster: Any) -> None:
    """ray.init put its own SIGTERM handler in place of dione's: a `dione run --ray`
    sent SIGTERM aborted (exit 134, Ray's C++ dump), no report written (review)."""
    import subprocess
    import sys

    probe = ("import signal\n"
             "from dione.launch.ray_launcher import RayLauncher\n"
             "def ours(*_): pass\n"
             "signal.signal(signal.SIGTERM, ours)\n"
             "signal.signal(signal.SIGINT, ours)\n"
             f"launcher = RayLauncher({cluster.address!r})\n"
             "kept = [signal.getsignal(s) is ours for s in (signal.SIGTERM, signal.SIGINT)]\n"
             "launcher.shutdown()\n"
             "print('kept', kept)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kept [True, True]" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("launcher", "expected"),
    [({"FAULT": "raise"}, "rank 1 (device 1) raised ValueError: injected failure on rank 1"),
     ({"FAULT": "kill"}, "rank 1 (device 1) was killed"),
     ({"FAULT": "hang"}, "ran past its timeout of 8 s")],
    indirect=["launcher"], ids=["raise", "kill", "hang"])
def test_a_failing_rank_reads_as_it_does_locally(
        launcher: RayLauncher, tmp_path: Path, expected: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "faulty.py"
    file.write_text(workload_text("faulty"))
    task = load_workload(file).task("faulty")
    node = launcher.nodes()[1]
    # Only the hang needs a time limit; on the others it could cut a cold start short on a
    # loaded machine and name the wrong cause. A hang ends at the limit however late its
    # gang started, so a short one names the same cause (it was 20 s, twice a test).
    limit = 8 if launcher.env["FAULT"] == "hang" else None
    with pytest.raises(SliceError) as on_ray:
        run_slice(task, "ddp", tmp_path / "ray", launcher.placement(node, [0, 1]),
                  launcher=launcher, timeout=limit)
    failed = [Path(rendezvous_path(s)) for s in launcher.failed_gangs]
    assert len(failed) == 1
    monkeypatch.setenv("FAULT", launcher.env["FAULT"])  # the local workers' environment
    with pytest.raises(SliceError) as here:
        run_slice(task, "ddp", tmp_path / "local",
                  local_placement(Node("here", 2, "cpu"), [0, 1]), timeout=limit)
    for err in (on_ray.value, here.value):
        assert expected in str(err)
    assert on_ray.value.reason == here.value.reason
    if launcher.env["FAULT"] == "raise":  # the rank's output came back from its node
        for root in (tmp_path / "ray", tmp_path / "local"):
            assert "injected failure" in next((root / "logs").glob("*/rank1.log")).read_text()
    # The failed gang's folder on its node (its rendezvous, its ranks' output) goes once
    # its ended ranks let go of it, with no other gang run there and no shutdown. A hang
    # limit only: a new Ray worker on a loaded machine takes seconds to start.
    deadline = time.monotonic() + 90
    while failed[0].exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not failed[0].exists()
    with RunStore(tmp_path / "ray") as store:
        assert [s.status for s in store.slices()] == ["failed"]


HOLDING = """
import functools, time, torch
from pathlib import Path
from dione import Task, Workload
from dione.zoo import digits_mlp, digits_train

HOLD = Path(%r)


def held_loss(output, target):
    if torch.is_grad_enabled():  # each training step waits while HOLD is there
        Path(str(HOLD) + ".held").touch()
        while HOLD.exists():
            time.sleep(0.05)
    return torch.nn.functional.cross_entropy(output, target)


workload = Workload([Task(name=name, model=functools.partial(digits_mlp, hidden=16, depth=1),
                          data=digits_train, loss=held_loss, batch_size=16, steps=2, seed=1,
                          optimizer=functools.partial(torch.optim.SGD, lr=0.1))
                     for name in ("first", "second")])
"""


def _hold_node(node: Node) -> Any:
    """Another job's placement group holding every device of ``node`` (granted)."""
    from ray.util import placement_group

    node_id = next(n["NodeID"] for n in ray.nodes()
                   if n["NodeID"].startswith(node.name.rsplit("-", 1)[1]))
    group = placement_group([{"CPU": 1.0}] * node.devices, strategy="STRICT_PACK",
                            bundle_label_selector=[{"ray.io/node-id": node_id}]
                            * node.devices)
    ray.get(group.ready(), timeout=60)
    return group


def test_a_node_another_job_holds_is_left_out_then_joins_once_free(
        launcher: RayLauncher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose devices another Ray job held failed the whole run at its start,
    free nodes beside it (review): the run now trains on the free ones, says which is
    held, and plans the held one once Ray grants it its devices."""
    from ray.util import remove_placement_group

    monkeypatch.setattr(ray_launcher, "GROUP_READY_SECONDS", 3.0)
    nodes = launcher.nodes()
    held = nodes[1]
    other_job: Any = _hold_node(held)
    events: list[RunEvent] = []

    def on_event(event: RunEvent) -> None:
        # The other job ends while the run loop waits at its first slice's start, and
        # Ray grants the run's request for the node before the loop goes on: tasks are
        # still queued behind the first ones when the next re-plan sees it.
        nonlocal other_job
        events.append(event)
        if event.kind == "slice_started" and other_job is not None:
            remove_placement_group(other_job)
            other_job = None
            deadline = time.monotonic() + 60
            while held.name not in {n.name for n in launcher.alive_nodes() or []}:
                assert time.monotonic() < deadline, "Ray never granted the freed node"
                time.sleep(0.2)

    try:
        tasks = [digits_task(f"b{i}", steps=100, batch_size=16, techniques=("single",))
                 for i in range(6)]
        # `dione profile` alike: its trials run on the free node (it failed at its start).
        with Catalog(str(tmp_path / "catalog.sqlite")) as catalog:
            profiled = profile_workload(tasks, Cluster(nodes), catalog, options=QUICK,
                                        launcher=launcher)
        assert profiled.trials_run > 0
        result = run_workload(
            tasks, Cluster(nodes), tmp_path / "run",
            RunOptions(catalog=str(tmp_path / "catalog.sqlite"), trial=QUICK,
                       solver="greedy", slice_steps=20, time_limit=5.0),
            launcher=launcher, on_event=on_event)
    finally:
        if other_job is not None:
            remove_placement_group(other_job)
    assert all(t.status == "done" for t in result.tasks)
    busy = [e.message for e in events if e.kind == "node_busy"]
    assert len(busy) == 1 and held.name in busy[0] and "other jobs may hold" in busy[0]
    assert any(e.kind == "node_joined" and held.name in e.message for e in events)
    with RunStore(tmp_path / "run") as store:
        ran_on = {s.node for s in store.slices() if s.status == "done"}
    assert ran_on == {nodes[0].name, held.name}
    # Trials ran on the free node only: nothing waited on the held one.
    assert not any(e.kind == "slice_failed" for e in events)


def test_waiting_for_a_held_nodes_devices_holds_up_no_other_node(
        launcher: RayLauncher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait for a node's devices held the launcher's lock (up to 120 s): the other
    nodes' warm-ups, gangs and hand-backs waited behind it (review). A slice now runs
    on a free node meanwhile, and the waiting node is used once Ray grants it."""
    from ray.util import remove_placement_group

    monkeypatch.setattr(ray_launcher, "GROUP_READY_SECONDS", 120.0)
    monkeypatch.setattr(ray_launcher, "GROUP_SAID_SECONDS", 1.0)
    free, held = launcher.nodes()
    other_job = _hold_node(held)
    waiting = threading.Thread(target=launcher.warm_up, args=(held,))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            waiting.start()
            deadline = time.monotonic() + 60
            while held.name in {n.name for n in launcher.alive_nodes() or []}:  # not asked
                assert time.monotonic() < deadline
                time.sleep(0.1)
            launcher.warm_up(free)
            result = run_slice(digits_task(steps=2), "single", tmp_path / "slice",
                               launcher.placement(free, [0]), launcher=launcher, timeout=120)
            assert len(result.losses) == 2
            assert waiting.is_alive()  # still waiting for the held node's devices
            # The wait is said, not silent for two minutes (a review).
            while not any(held.name in str(w.message) for w in said):
                assert time.monotonic() < deadline, [str(w.message) for w in said]
                time.sleep(0.1)
        finally:
            remove_placement_group(other_job)
            waiting.join(60)
    (wait,) = [str(w.message) for w in said if held.name in str(w.message)]
    assert wait.startswith("waiting up to 119 s more for Ray to grant the 2 devices of node "
                           f"{held.name}: none in 1 s; another job may hold them"), wait
    assert not waiting.is_alive()
    assert held.name in {n.name for n in launcher.alive_nodes() or []}


def test_a_device_a_gang_holds_is_waited_for_not_given_a_second_actor(
        launcher: RayLauncher, tmp_path: Path) -> None:
    """A task added to a live run profiles beside the run's gangs: its warm-up started
    an actor for every device, and one for a device a gang held waited 300 s for the
    device's bundle (a resumed Optuna search on Ray hung); a gang on a held device got
    a second actor, which the first's, back in the idle pool, kept from its bundle for
    ever. The warm-up now leaves held devices alone, and the gang waits for the actor."""
    hold = tmp_path / "hold"
    hold.touch()
    file = tmp_path / "holding.py"
    file.write_text(HOLDING % str(hold))
    first, second = load_workload(file)
    node = launcher.nodes()[0]
    placement = launcher.placement(node, [0])
    results: dict[str, Any] = {}

    def run(task: Any) -> None:
        results[task.name] = run_slice(task, "single", tmp_path / task.name, placement,
                                       launcher=launcher, timeout=120)

    gangs = [threading.Thread(target=run, args=(first,))]
    gangs[0].start()
    try:
        deadline = time.monotonic() + 120
        while not Path(f"{hold}.held").exists():  # the first gang holds device 0
            assert time.monotonic() < deadline and gangs[0].is_alive()
            time.sleep(0.1)
        started = launcher.actors_started
        launcher.warm_up(node)  # the node's other devices only
        gangs.append(threading.Thread(target=run, args=(second,)))
        gangs[1].start()
        time.sleep(1.0)
        assert "second" not in results  # it waits for the device
    finally:
        hold.unlink()
        for gang in gangs:
            gang.join(150)
    assert [len(results[n].losses) for n in ("first", "second")] == [2, 2]
    assert launcher.actors_started == started + node.devices - 1


def test_a_gang_folder_no_rank_holds_goes_with_the_next_actor_started(
        launcher: RayLauncher) -> None:
    # Gang folders as the actors' machine could hold them: one whose ranks all ended,
    # one a rank of a running gang still holds (here, this test's process), one just
    # made, and one no Ray rank made (no hold file); all but the new one an hour old.
    root, tag = Path(tempfile.gettempdir()), uuid.uuid4().hex
    folders = {kind: Path(rendezvous_path(f"{GANG_PREFIX}test-{kind}-{tag}"))
               for kind in ("abandoned", "held", "new", "unmarked")}
    # Another host's, sharing this temporary folder: its holds may not show here.
    folders["elsewhere"] = root / f"{GANG_PREFIX}test-elsewhere-{tag}.another-host"
    for kind, folder in folders.items():
        folder.mkdir(mode=0o700)
        (folder / "rank0.log").write_text("output\n")
        if kind not in ("unmarked", "elsewhere"):
            (folder / "rank0.held").touch()
    (folders["elsewhere"] / "rank0.held").touch()  # held there, as far as this host sees
    hold = os.open(folders["held"] / "rank0.held", os.O_RDONLY)
    fcntl.flock(hold, fcntl.LOCK_SH)
    try:
        an_hour_ago = time.time() - 3600
        for kind in ("abandoned", "held", "unmarked", "elsewhere"):
            os.utime(folders[kind], (an_hour_ago, an_hour_ago))
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            launcher.warm_up(launcher.nodes()[0])  # new actors, on (here) the same machine
        assert not [w for w in said if "Ray workers" in str(w.message)]  # dione's own
        assert not folders["abandoned"].exists()
        assert all(folders[kind].is_dir() for kind in ("held", "new", "unmarked", "elsewhere"))
    finally:
        os.close(hold)
        for folder in folders.values():
            shutil.rmtree(folder, ignore_errors=True)


def test_workers_running_another_dione_than_the_driver_are_said_once_per_node(
        launcher: RayLauncher) -> None:
    """The actors import the dione of their raylet's environment: a patched dione
    tried on Ray (PYTHONPATH in the driver's shell only) ran the installed one unsaid."""
    node = launcher.nodes()[0]
    launcher._warned_source.discard(node.name)
    with pytest.warns(UserWarning, match=f"the Ray workers on node {node.name} run dione "
                      "0.0.0 from /elsewhere/dione, this process dione"):
        launcher._same_source(node, [(1, "0.0.0", "/elsewhere/dione")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        launcher._same_source(node, [(1, "0.0.0", "/elsewhere/dione")])  # said already
