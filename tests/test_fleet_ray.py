"""Ray placement inside a region, on a real multi-node Ray cluster on this machine
(ray.cluster_utils.Cluster: a head and two worker nodes, one declaring "device:gpu-a", the other
"device:gpu-b"): pools placed by device kind, a kind no node has, a pool whose resource leaves
the cluster and comes back, a worker that cannot be placed, and a node removed mid-run."""

import json
import threading
import time

import pytest
from test_orchestrator import TINY

from tidal.config import load_config
from tidal.orchestrator.topology import PoolConfig
from tidal.model import build_model, save_pretrained
from tidal.orchestrator.loop import run_rl
from tidal.orchestrator.pool import OrchestratorError, worker_ids
from tidal.orchestrator.ray_pool import RayPool

pytest.importorskip("ray")

STORE = 100 * 1024**2
"""Object store bytes per node: the tests move small objects, the machine has little memory."""

RUN_BUDGET = ["--orchestrator.time_budget_s", "3600"]
"""A run here ends by its steps, not by the clock: Ray's worker processes run niced, and on a
loaded machine one took minutes to import torch (measured: 0 steps within the default 360 s)."""

UNITS = 2
"""Units of its device resource each worker node declares (so 2 workers of that kind fit)."""


def add_device_node(cluster, kind: str, gpus: int = UNITS):
    """A node declaring UNITS of "device:<kind>" and ``gpus`` GPUs (Ray takes the count on trust)."""
    return cluster.add_node(num_cpus=1, num_gpus=gpus, resources={f"device:{kind}": UNITS},
                            object_store_memory=STORE)


@pytest.fixture
def cluster(monkeypatch):
    """A head (1 CPU, no devices) and nodes {"gpu-a": node, "gpu-b": node}, joined through
    RAY_ADDRESS as a user's run would; everything shut down after the test."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": STORE,
                                                      "include_dashboard": False})
    try:
        nodes = {kind: add_device_node(c, kind) for kind in ("gpu-a", "gpu-b")}
        c.wait_for_nodes()
        monkeypatch.setenv("RAY_ADDRESS", c.address)
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("init") / "model"
    save_pretrained(build_model(load_config(None, TINY).model, seed=0), path)
    return path


def fleet_cfg(tmp_path, pools, *extra):
    """TINY with Ray pools [(name, device, workers)] in [fleet]."""
    path = tmp_path / "fleet.toml"
    path.write_text("".join(f'[[fleet.pools]]\nname = "{name}"\ndevice = "{device}"\nworkers = {n}\n'
                            'placement = "ray"\n\n' for name, device, n in pools))
    return load_config(path, [*TINY, *RUN_BUDGET, *extra])


def records(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def pool_of(cfg, ckpt, tmp_path, device, workers, **kwargs):
    """A Ray pool "p" alone (no run): its workers read weights from a folder."""
    return RayPool((cfg, str(ckpt), str(tmp_path / "weights")), PoolConfig(name="p", device=device,
                   workers=workers, placement="ray"), worker_ids(), 1, 0.5, time.time(), **kwargs)


def poll(pool, until, what: str, deadline_s: float = 600.0):
    """Call pool.members until ``until(joined, left)`` holds; all joined / left meanwhile. The
    deadline catches a hang, not slowness (see RUN_BUDGET)."""
    joined, left = [], []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        j, lft = pool.members(time.time())
        joined, left = joined + j, left + lft
        if until(joined, left):
            return joined, left
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {deadline_s} s (joined {joined}, left {left}, "
                         f"events {pool.events})")


def test_each_pool_runs_on_the_node_with_its_device(cluster, tmp_path, ckpt):
    _, nodes = cluster
    cfg = fleet_cfg(tmp_path, [("a", "gpu-a", 2), ("b", "gpu-b", 2)], "--orchestrator.steps", "2")
    summary = run_rl(cfg, tmp_path, ckpt, progress=False)
    assert summary.steps == 2 and summary.trajectories == 2 * 4 * 2
    assert [s["trajectories"] for s in records(tmp_path, "step")] == [4 * 2, 4 * 2]
    placed = summary.fleet["ray"]
    for name, kind in (("a", "gpu-a"), ("b", "gpu-b")):
        assert placed[name]["resource"] == f"device:{kind}"
        assert len(placed[name]["nodes"]) == 2
        assert {n["node_id"] for n in placed[name]["nodes"].values()} == {nodes[kind].node_id}
    pools = {r["worker"]: r["pool"] for r in records(tmp_path, "membership") if r["event"] == "joined"}
    busy = {pools[s["worker"]] for s in records(tmp_path, "worker") if s["state"] == "busy"}
    assert busy == {"a", "b"}  # both pools did work
    assert summary.fleet["duplicates"] == 0 and summary.worker_failures == 0


def test_a_device_kind_no_node_has_or_workers_that_cannot_start_are_one_clear_error(cluster, tmp_path, ckpt):
    cfg = load_config(None, [*TINY, "--sync.transport", "filesystem"])
    with pytest.raises(OrchestratorError) as e:
        pool_of(cfg, ckpt, tmp_path, "tpu-v9", 1)
    msg = str(e.value)
    for part in ("fleet pool 'p'", "'tpu-v9'", "'device:tpu-v9'", "RAY_ADDRESS=", "device:gpu-a 2",
                 "device:gpu-b 2", "ray start --resources"):
        assert part in msg, msg
    # a kind whose nodes have no GPUs: the pool asks for one per worker, so one clear error...
    c, _ = cluster
    add_device_node(c, "no-gpu", gpus=0)
    c.wait_for_nodes()
    with pytest.raises(OrchestratorError, match=r"fleet pool 'p' \(device 'no-gpu'\) asks for 1 GPU per worker, "
                                                r"and the nodes .* that declare 'device:no-gpu' have no GPU"):
        pool_of(cfg, ckpt, tmp_path, "no-gpu", 1)
    # ...unless the kind is not a GPU (gpus_per_worker = 0): then the pool is placed there
    pool = RayPool((cfg, str(ckpt), str(tmp_path / "weights")),
                   PoolConfig(name="p", device="no-gpu", workers=1, placement="ray", gpus_per_worker=0),
                   worker_ids(), 1, 0.5, time.time())
    try:
        assert pool.report()["slots"] == UNITS
    finally:
        pool.close()
    # workers that cannot start (no checkpoint there): a bounded number of tries, then one error
    pool = pool_of(cfg, tmp_path / "no-such-checkpoint", tmp_path, "gpu-a", 1)
    try:
        with pytest.raises(OrchestratorError, match="fleet pool 'p': 3 Ray workers in a row failed to start"):
            poll(pool, lambda j, lft: False, "the error")
        assert not pool.workers
    finally:
        pool.close()


def test_a_pool_whose_resource_leaves_has_no_workers_and_grows_when_it_is_back(cluster, tmp_path, ckpt):
    c, nodes = cluster
    cfg = load_config(None, [*TINY, "--sync.transport", "filesystem"])
    pool = pool_of(cfg, ckpt, tmp_path, "gpu-a", 2)
    try:
        first, _ = poll(pool, lambda j, lft: len(j) == 2, "the first workers join")
        assert {pool.node_of(w)["node_id"] for w in first} == {nodes["gpu-a"].node_id}
        c.remove_node(nodes["gpu-a"])
        poll(pool, lambda j, lft: set(lft) == set(first), "the workers leave with their node")
        assert pool.capacity(time.time()) == 0 and not pool.workers and not pool.starting
        assert "lost" in [e["event"] for e in pool.events]
        back = add_device_node(c, "gpu-a")
        again, _ = poll(pool, lambda j, lft: len(j) == 2, "the pool grows again")
        assert not set(again) & set(first)  # new workers, new ids
        assert {pool.node_of(w)["node_id"] for w in again} == {back.node_id}
        assert [e["event"] for e in pool.events if e["event"] in ("lost", "back")] == ["lost", "back"]
    finally:
        pool.close()


def test_a_worker_that_cannot_be_placed_is_dropped_not_waited_for(cluster, tmp_path, ckpt):
    import ray

    cfg = load_config(None, [*TINY, "--sync.transport", "filesystem"])

    @ray.remote(num_cpus=0, resources={"device:gpu-b": UNITS})
    class Squatter:
        def ping(self):
            return True

    squatter = Squatter.remote()
    assert ray.get(squatter.ping.remote())  # holds every gpu-b unit
    pool = pool_of(cfg, ckpt, tmp_path, "gpu-b", 1, place_timeout_s=2.0)
    try:
        poll(pool, lambda j, lft: "unplaced" in [e["event"] for e in pool.events], "given up on")
        assert not pool.workers  # it never joined, so nothing was dispatched to it
        pool.place_timeout_s = 300.0  # from now on, wait for it: the unit is about to be free
        ray.kill(squatter)
        joined, _ = poll(pool, lambda j, lft: len(j) == 1, "placed once the unit is free")
        assert pool.node_of(joined[0])["node_id"] == cluster[1]["gpu-b"].node_id
    finally:
        pool.close()


@pytest.mark.slow
def test_a_node_removed_mid_run_loses_nothing(cluster, tmp_path, ckpt):
    c, nodes = cluster
    steps = 5
    cfg = fleet_cfg(tmp_path, [("a", "gpu-a", 2), ("b", "gpu-b", 2)], "--orchestrator.steps", str(steps))

    def remove_after_first_step():
        while not (tmp_path / "metrics.jsonl").is_file() or not records(tmp_path, "step"):
            time.sleep(0.05)
        c.remove_node(nodes["gpu-a"])

    remover = threading.Thread(target=remove_after_first_step, daemon=True)
    remover.start()
    summary = run_rl(cfg, tmp_path, ckpt, progress=False)
    remover.join(timeout=10)
    assert summary.steps == steps and summary.trajectories == steps * 4 * 2
    assert [s["trajectories"] for s in records(tmp_path, "step")] == [4 * 2] * steps
    assert summary.fleet["duplicates"] == 0
    lost = summary.fleet["ray"]["a"]
    assert "lost" in [e["event"] for e in lost["events"]]  # the node went while the run ran
    members = records(tmp_path, "membership")
    left = {r["worker"] for r in members if r["event"] == "left"}
    joined_a = {r["worker"] for r in members if r["event"] == "joined" and r["pool"] == "a"}
    # every pool-a worker that had joined left (one still starting when the node went never
    # joined, so has nothing to leave), and none of b's did
    assert joined_a and left == joined_a and left <= {int(w) for w in lost["nodes"]}
    for failure in records(tmp_path, "worker_failure"):  # what pool a ran when its node went
        assert int(failure["worker"]) in left
