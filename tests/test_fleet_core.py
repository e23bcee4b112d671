"""The fleet's topology config, leases and the scheduler's elastic membership (pure state)."""

import pytest

from tidal.config import ConfigError, load_config
from tidal.orchestrator.topology import CapacityPoint, FleetConfig, PoolConfig, capacity_at
from tidal.fleet.lease import LeaseError, LeaseTable
from tidal.orchestrator.scheduler import Scheduler, split_step
from tidal.orchestrator.worker import RolloutResult


def _cfg(*overrides: str):
    return load_config(None, list(overrides))


def test_default_fleet_is_one_local_pool_of_num_workers():
    cfg = _cfg("--orchestrator.num_workers", "3")
    (pool,) = cfg.fleet.pools_or_default(cfg.orchestrator.num_workers)
    assert (pool.name, pool.region, pool.workers, pool.placement) == ("local", "local", 3, "backend")


@pytest.mark.parametrize("fleet, field", [
    ({"pools": [{"name": "p", "region": "mars"}]}, "fleet.pools.0.region"),
    ({"links": [{"a": "local", "b": "nowhere", "bandwidth_mbps": 1, "latency_ms": 1}]}, "fleet.links.0.b"),
    ({"pools": [{"name": "p", "schedule": [{"at_s": 0, "workers": -1}]}]}, "workers"),
    ({"trainer_region": "x"}, "fleet.trainer_region"),
    ({"heartbeat_s": 15, "lease_s": 20}, "fleet.heartbeat_s"),
    ({"pools": [{"name": "p"}, {"name": "p"}]}, "unique"),
])
def test_an_inconsistent_topology_is_one_error_naming_the_field(tmp_path, fleet, field):
    path = tmp_path / "r.toml"
    lines = ["[fleet]"] + [f"{k} = {_toml(v)}" for k, v in fleet.items()]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, [])
    assert field in str(e.value), str(e.value)


def _toml(v):
    import json
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


def test_capacity_follows_the_schedule_and_repeats_with_its_period():
    pool = PoolConfig(name="borrowed", workers=1, schedule=[CapacityPoint(at_s=0, workers=4),
                                                            CapacityPoint(at_s=100, workers=0)])
    assert [capacity_at(pool, t) for t in (0, 50, 100, 1e6)] == [4, 4, 0, 0]
    daily = pool.model_copy(update={"period_s": 200.0})
    assert [capacity_at(daily, t) for t in (50, 150, 250, 350)] == [4, 0, 4, 0]
    assert capacity_at(PoolConfig(name="fixed", workers=3), 123) == 3


def test_a_lease_lives_by_heartbeats_and_says_why_it_ended():
    table = LeaseTable(lease_s=10)
    a, b = table.grant("p", now=0), table.grant("p", now=0)
    assert a.worker != b.worker and a.secret != b.secret
    table.renew(a.lease_id, now=8)
    assert [x.lease_id for x in table.expire(now=12)] == [b.lease_id]
    with pytest.raises(LeaseError) as e:
        table.renew(b.lease_id, now=13)
    assert e.value.reason == "expired"
    table.release(a.lease_id, now=13)
    with pytest.raises(LeaseError) as e:
        table.check(a.lease_id, now=13)
    assert e.value.reason == "released"
    with pytest.raises(LeaseError) as e:
        table.check("forged", now=13)
    assert e.value.reason == "unknown"


def _planner(per_step):
    def plan(step, first_id):
        return split_step(list(range(per_step)), step, first_id, per_step, 1)
    return plan


def _result(a, worker):
    return RolloutResult(a.assignment_id, a.step, worker, [], 0, 0.0, 0.0)


def test_a_worker_that_leaves_gives_its_assignment_back_first_in_line():
    s = Scheduler(_planner(2), ["p/0", "p/1"], steps=3, max_staleness=0)
    s.plan(0)
    held = {d.worker: d.assignment for d in s.dispatch(0)}
    again = s.remove_worker("p/0", 1)
    assert again is held["p/0"] and s.queue[0] is again and s.requeued == 1
    assert s.failures[again.assignment_id] == 0  # leaving is not the task's failure
    s.add_worker("q/0", 2)
    (d,) = s.dispatch(2)
    assert (d.worker, d.assignment) == ("q/0", again)


def test_results_are_idempotent_by_assignment_id():
    s = Scheduler(_planner(1), ["p/0"], steps=2, max_staleness=0)
    s.plan(0)
    (d,) = s.dispatch(0)
    s.remove_worker("p/0", 1)  # its lease expired, but it delivers late, first
    s.add_worker("p/1", 1)
    (d2,) = s.dispatch(1)
    assert d2.assignment is d.assignment
    assert s.complete("p/0", _result(d.assignment, "p/0"), 2) is True
    assert s.complete("p/1", _result(d2.assignment, "p/1"), 3) is False
    assert s.duplicates == 1 and s.ready(0)
    assert len(s.take(0)) == 1
    assert s.accept(_result(d.assignment, "p/0")) is False and s.duplicates == 2


def test_a_late_result_of_a_requeued_assignment_takes_it_out_of_the_queue():
    s = Scheduler(_planner(1), ["p/0"], steps=1, max_staleness=0)
    s.plan(0)
    (d,) = s.dispatch(0)
    s.remove_worker("p/0", 1)
    assert list(s.queue) == [d.assignment]
    assert s.complete("p/0", _result(d.assignment, "p/0"), 2)
    assert not s.queue and s.ready(0)
