"""The fleet's wire form: result batches round-trip exactly (every field, floats bit for bit),
the bytes are canonical, assignments travel by task reference, and bad input is one WireError
naming the field."""

import copy
import dataclasses
import json
import math
import struct

import pytest
import torch

from tidal.config import load_config
from tidal.engine.engine import Engine
from tidal.env import from_config
from tidal.fleet.wire import (
    StepTasks,
    WireError,
    decode_assignment,
    decode_results,
    encode_assignment,
    encode_results,
)
from tidal.harness import run_episodes
from tidal.evidence.records import Finding, IntegrityResult
from tidal.model import ByteTokenizer, build_model, preset
from tidal.orchestrator.planning import plan_step
from tidal.orchestrator.worker import RolloutResult, Span
from tidal.sandbox import Sandbox
from tidal.trajectory import EpisodeStats, Segment, Trajectory

TRICKY_FLOATS = [0.1 + 0.2, -0.0, 5e-324, 1.7976931348623157e308, 1 / 3, -2.5e-17,
                 struct.unpack("f", struct.pack("f", -0.7))[0]]  # a float32 logprob, widened


def hand_made() -> RolloutResult:
    """A result with a non-default value in every field of every wire type."""
    seg = Segment(prompt_ids=[1, 2, 3], completion_ids=[4, 5, 6], logprobs=[-0.25, 0.0, -1e-9],
                  versions=[3, -1, 4], loss_mask=[1, 0, 1],
                  experts=[[[0, 1], [2, 3]], [[-1, -1], [-1, -1]], [[1, 2], [0, 3]]],
                  prompt_experts=[[[3, 1], [0, 2]], [[2, 2], [1, 0]]], reward=-0.375)
    finding = Finding("test_edit", "tests/test_f.py", (3, 9), "assert True  # é", 0.8125)
    traj = Trajectory(
        task_id="funcs-ü-1", group_id=5, segments=[seg, copy.deepcopy(seg)], reward=0.1 + 0.2,
        reason="pass", info={"reward/tests_pass": 1 / 3, "passed": 6.0}, solved=True, level=2,
        episode=EpisodeStats(turns=3, resets=1, effective_horizon=1.25, transcript_tokens=99,
                             summary_count=1, summary_tokens_mean=12.5, summary_tokens_max=13,
                             tool_errors=2, model_tokens=4, env_tokens=7),
        integrity=IntegrityResult(findings=[finding], visible_pass=True, hidden_pass=False,
                                  canary=True))
    return RolloutResult(assignment_id=11, step=7, worker=2, trajectories=[traj],
                         generated_tokens=4, generate_s=0.123456789, grade_s=2.5e-3,
                         spans=[Span(2, "wait_weights", 1700000000.125, 1700000001.5),
                                Span(2, "busy", 1700000001.5, 1700000009.75)])


def test_every_field_of_a_hand_made_result_round_trips():
    result = hand_made()
    unset = list(_default_fields(result, "result"))
    assert unset == [], "the sample must exercise every field (add a value for the new ones)"

    batch = decode_results(encode_results([result, result], lease_id="lease-1", batch_id="b-9"))
    assert (batch.lease_id, batch.batch_id) == ("lease-1", "b-9")
    assert batch.results == [result, result]
    finding = batch.results[0].trajectories[0].integrity.findings[0]
    assert finding.lines == (3, 9) and isinstance(finding.lines, tuple)


def test_a_batch_from_a_sender_before_segment_rewards_still_decodes():
    """Segment.reward was added after format 1: a batch without it decodes, reward None; any
    other missing field is still an error."""
    d = _doc()
    for seg in _traj(d)["segments"]:
        del seg["reward"]
    [result] = decode_results(json.dumps(d).encode()).results
    assert [s.reward for s in result.trajectories[0].segments] == [None, None]
    del _traj(d)["segments"][0]["loss_mask"]
    with pytest.raises(WireError) as e:
        decode_results(json.dumps(d).encode())
    assert e.value.field == "results[0].trajectories[0].segments[0].loss_mask"


def _default_fields(obj, path):
    """Paths of dataclass fields that still hold their default (or an empty/None value)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if value == default or (isinstance(value, (list, dict, tuple)) and not value):
            yield f"{path}.{f.name}"
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if dataclasses.is_dataclass(item):
                yield from _default_fields(item, f"{path}.{f.name}[{i}]")


@pytest.mark.parametrize("x", TRICKY_FLOATS + [math.inf, -math.inf])
def test_floats_round_trip_bit_for_bit(x):
    result = hand_made()
    result.trajectories[0].reward = x
    result.trajectories[0].segments[0].logprobs[0] = x
    back = decode_results(encode_results([result], lease_id="l", batch_id="b")).results[0]
    for y in (back.trajectories[0].reward, back.trajectories[0].segments[0].logprobs[0]):
        assert struct.pack("d", y) == struct.pack("d", x)


def test_nan_travels_as_nan():
    result = hand_made()
    result.trajectories[0].info["odd"] = math.nan
    back = decode_results(encode_results([result], lease_id="l", batch_id="b")).results[0]
    assert math.isnan(back.trajectories[0].info["odd"])


def test_the_bytes_are_canonical():
    body = encode_results([hand_made()], lease_id="l", batch_id="b")
    again = encode_results(decode_results(body).results, lease_id="l", batch_id="b")
    assert again == body
    doc = json.loads(body)
    assert body.isascii() and b'"format":1,"lease_id":"l","results":[{"assignment_id":11,' in body
    assert json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() == body


@pytest.fixture(scope="module")
def run():
    cfg = load_config(None, ["--engine.max_new_tokens", "12", "--orchestrator.tasks_per_step", "3",
                             "--orchestrator.group_size", "2", "--orchestrator.num_workers", "2"])
    return cfg, from_config(cfg.env, Sandbox(cfg.env.sandbox))


def test_a_real_rollout_round_trips(run):
    cfg, env = run
    a = plan_step(cfg, env, step=4, first_id=0)[0]
    model = build_model(preset("tiny").model_copy(update={"initializer_range": 0.1}), seed=0)
    engine = Engine(model.eval(), ByteTokenizer(), cfg.engine, version=3)
    torch.manual_seed(0)
    trajs, stats = run_episodes(engine, env, a.tasks, cfg.harness, cfg.orchestrator.group_size,
                                a.group_ids, seed=1)
    result = RolloutResult(a.assignment_id, a.step, 0, trajs, stats.generated_tokens,
                           stats.generate_s, stats.grade_s, [Span(0, "busy", 1.0, 2.0)])
    assert stats.generated_tokens > 0 and all(t.segments for t in trajs)

    back = decode_results(encode_results([result], lease_id="l", batch_id="b")).results
    assert back == [result]
    assert back[0].trajectories[0].segments[0].logprobs == trajs[0].segments[0].logprobs


def test_an_assignment_travels_by_task_reference_and_is_rebuilt_by_the_worker(run):
    cfg, env = run
    assignments = plan_step(cfg, env, step=5, first_id=20)
    assert len(assignments) == 2
    worker_side = StepTasks(cfg, from_config(cfg.env))  # the worker's own environment
    for a in assignments:
        d = json.loads(json.dumps(encode_assignment(a)))
        assert d == {"assignment_id": a.assignment_id, "step": 5, "group_ids": a.group_ids,
                     "task_ids": [t.task_id for t in a.tasks], "min_version": a.min_version}
        assert decode_assignment(d, worker_side) == a


def test_a_worker_with_another_config_is_told_so(run):
    cfg, env = run
    a = plan_step(cfg, env, step=5, first_id=0)[0]
    other = load_config(None, ["--run.seed", str(cfg.run.seed + 1)])
    with pytest.raises(WireError, match=r"^task_ids\[0\]: .*run\.seed") as e:
        decode_assignment(encode_assignment(a), StepTasks(other, env))
    assert e.value.field == "task_ids[0]"
    few = load_config(None, ["--orchestrator.tasks_per_step", "1"])
    d = encode_assignment(plan_step(cfg, env, step=5, first_id=0)[1])  # group ids 1
    with pytest.raises(WireError, match=r"^group_ids\[0\]: task 1 of step 5, which has 1 tasks"):
        decode_assignment(d, StepTasks(few, env))


def test_step_tasks_keeps_only_recent_steps(run):
    cfg, env = run
    tasks = StepTasks(cfg, env, keep=2)
    first = tasks(1)
    assert tasks(1) is first
    tasks(2), tasks(3)
    assert tasks(1) is not first and tasks(1) == first


@pytest.mark.parametrize("change, field", [
    (lambda d: d.pop("step"), "step"),
    (lambda d: d.update(step=-1), "step"),
    (lambda d: d.update(step=True), "step"),
    (lambda d: d.update(extra=1), "body"),
    (lambda d: d.update(group_ids="0"), "group_ids"),
    (lambda d: d.update(group_ids=[0, 1.5]), "group_ids[1]"),
    (lambda d: d.update(task_ids=["x"]), "task_ids"),
])
def test_a_malformed_assignment_names_its_field(change, field):
    d = {"assignment_id": 1, "step": 2, "group_ids": [0, 1], "task_ids": ["a", "b"],
         "min_version": 0}
    change(d)
    with pytest.raises(WireError) as e:
        decode_assignment(d, lambda step: pytest.fail("tasks rebuilt from a bad assignment"))
    assert e.value.field == field


def _doc() -> dict:
    return json.loads(encode_results([hand_made()], lease_id="l", batch_id="b"))


def _traj(d):
    return d["results"][0]["trajectories"][0]


BAD_BATCHES = [
    (lambda d: d.pop("lease_id"), "lease_id"),
    (lambda d: d.update(format=2), "format"),
    (lambda d: d.update(format=True), "format"),
    (lambda d: d.update(results={}), "results"),
    (lambda d: d.update(batch_id=7), "batch_id"),
    (lambda d: d.update(surprise=1), "body"),
    (lambda d: d["results"][0].pop("spans"), "results[0].spans"),
    (lambda d: d["results"][0].update(step="7"), "results[0].step"),
    (lambda d: d["results"][0].update(generated_tokens=4.0), "results[0].generated_tokens"),
    (lambda d: d["results"][0]["spans"][1].update(start=None), "results[0].spans[1].start"),
    (lambda d: _traj(d).update(solved=1), "results[0].trajectories[0].solved"),
    (lambda d: _traj(d).update(level="2"), "results[0].trajectories[0].level"),
    (lambda d: _traj(d)["info"].update(x="1"), "results[0].trajectories[0].info['x']"),
    (lambda d: _traj(d)["segments"][0]["completion_ids"].__setitem__(1, "5"),
     "results[0].trajectories[0].segments[0].completion_ids[1]"),
    (lambda d: _traj(d)["segments"][1]["logprobs"].__setitem__(2, [0.0]),
     "results[0].trajectories[0].segments[1].logprobs[2]"),
    (lambda d: _traj(d)["segments"][0]["logprobs"].pop(), "results[0].trajectories[0].segments[0]"),
    (lambda d: _traj(d)["segments"][0]["experts"][0].__setitem__(0, 3),
     "results[0].trajectories[0].segments[0].experts[0][0]"),
    (lambda d: _traj(d)["episode"].update(turns=None), "results[0].trajectories[0].episode.turns"),
    (lambda d: _traj(d)["integrity"]["findings"][0].update(lines=[1, 2, 3]),
     "results[0].trajectories[0].integrity.findings[0].lines"),
    (lambda d: _traj(d)["integrity"]["findings"][0].update(type="nope"),
     "results[0].trajectories[0].integrity.findings[0]"),
]


@pytest.mark.parametrize("change, field", BAD_BATCHES)
def test_a_malformed_batch_is_one_wire_error_naming_the_field(change, field):
    d = _doc()
    change(d)
    with pytest.raises(WireError) as e:
        decode_results(json.dumps(d).encode())
    assert e.value.field == field
    assert str(e.value).startswith(f"{field}: ")


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe\x00", b"[1, 2]", b"null", b"[" * 100000])
def test_a_body_that_is_not_a_batch_is_a_wire_error(body):
    with pytest.raises(WireError) as e:
        decode_results(body)
    assert e.value.field == "body" and len(str(e.value)) < 300
