"""The orchestrator's checks of uploaded rollouts: honest ones from tidal's own engine pass; a
batch for a task never assigned, wrong groups, impossible versions, bad logprobs and counts
are named; recomputing the logprobs catches tampered logprobs and swapped tokens, per version."""

import copy
import math
import random

import pytest

from tidal.config import load_config
from tidal.engine.engine import Engine
from tidal.env import from_config
from tidal.fleet.auth import ReplayGuard, new_lease_secret, open_batch, sign
from tidal.fleet.verify import MAX_PROBLEMS, check_result, recompute_logprobs_check
from tidal.fleet.wire import encode_results
from tidal.harness import run_episodes
from tidal.model import ByteTokenizer, build_model, preset
from tidal.orchestrator.planning import training_tasks
from tidal.orchestrator.scheduler import split_step
from tidal.orchestrator.worker import RolloutResult
from tidal.sandbox import Sandbox

STEP, MAX_STALENESS, GROUP = 3, 1, 2
VERSION = STEP - MAX_STALENESS  # what the worker holds: the oldest version it may use
MAX_VERSION = STEP  # the newest published when the result arrives
ATOL = 1e-4


def make_model(name: str, seed: int):
    """A tiny model with a wide init, so its distributions are far from uniform."""
    return build_model(preset(name).model_copy(update={"initializer_range": 0.1}), seed=seed).eval()


@pytest.fixture(scope="module")
def setup():
    cfg = load_config(None, ["--engine.max_new_tokens", "12", "--orchestrator.tasks_per_step", "2",
                             "--orchestrator.group_size", str(GROUP)])
    env = from_config(cfg.env, Sandbox(cfg.env.sandbox))
    (assignment,) = split_step(training_tasks(cfg, env, STEP), STEP, 5, 1, MAX_STALENESS)
    return cfg, env, assignment


def rollout(setup, model, version=VERSION, before_step=None) -> RolloutResult:
    cfg, env, a = setup
    engine = Engine(copy.deepcopy(model), ByteTokenizer(), cfg.engine, version=version)
    reload = None if before_step is None else (lambda: before_step(engine))
    trajs, stats = run_episodes(engine, env, a.tasks, cfg.harness, GROUP, a.group_ids, reload,
                                seed=7)
    return RolloutResult(a.assignment_id, a.step, 0, trajs, stats.generated_tokens,
                         stats.generate_s, stats.grade_s)


@pytest.fixture(scope="module")
def dense():
    return make_model("tiny", 0)


@pytest.fixture(scope="module")
def honest(setup, dense):
    return rollout(setup, dense)


def fresh(result: RolloutResult) -> RolloutResult:
    return copy.deepcopy(result)


def check(setup, result, max_version=MAX_VERSION):
    return check_result(setup[2], result, GROUP, max_version)


# ------------------------------------------------------------------ check_result


def test_an_honest_rollout_passes(setup, honest):
    assert len(honest.trajectories) == 2 * GROUP and honest.generated_tokens > 0
    assert check(setup, honest) == []


def test_a_batch_for_a_task_never_assigned_is_caught(setup, honest):
    r = fresh(honest)
    r.trajectories[0].task_id = "funcs-never-assigned"
    problems = check(setup, r)
    assert "task 'funcs-never-assigned' (group 0) was never assigned: 1 trajectories" in problems
    assert any("expected 2" in p and "1 trajectories" in p for p in problems)  # one sample short


def test_a_result_for_another_assignment_or_step_is_caught(setup, honest):
    r = fresh(honest)
    r.assignment_id, r.step = 99, STEP + 1
    problems = check(setup, r)
    assert problems[:2] == [f"the result answers assignment 99, not {setup[2].assignment_id}",
                            f"the result is for step {STEP + 1}, the assignment for step {STEP}"]


def test_wrong_groups_and_sample_counts_are_caught(setup, honest):
    a = setup[2]
    r = fresh(honest)
    r.trajectories[0].group_id = a.group_ids[1]  # task 0's sample under task 1's group
    problems = check(setup, r)
    assert any("came back in group 1; it was assigned group [0]" in p for p in problems)

    r = fresh(honest)
    r.trajectories.append(copy.deepcopy(r.trajectories[-1]))
    r.generated_tokens += r.trajectories[-1].num_generated_tokens
    assert check(setup, r) == [f"task {a.tasks[1].task_id!r} (group 1): 3 trajectories, expected 2"]

    r = fresh(honest)
    r.generated_tokens -= sum(t.num_generated_tokens for t in r.trajectories[:GROUP])
    del r.trajectories[:GROUP]
    assert check(setup, r) == [f"task {a.tasks[0].task_id!r} (group 0): no trajectories, expected 2"]


@pytest.mark.parametrize("version, ok", [(VERSION - 1, False), (VERSION, True),
                                         (MAX_VERSION, True), (MAX_VERSION + 1, False)])
def test_a_token_from_a_version_the_worker_could_not_hold_is_caught(setup, honest, version, ok):
    r = fresh(honest)
    r.trajectories[1].segments[0].versions[3] = version
    problems = check(setup, r)
    assert (problems == []) == ok
    if not ok:
        assert problems == [(f"trajectory 1 (task {r.trajectories[1].task_id!r}): 1 generated "
                             f"tokens with a version outside [{VERSION}, {MAX_VERSION}] (first: "
                             f"segment 0 token 3, version {version})")]


@pytest.mark.parametrize("logprob", [math.nan, -math.inf, math.inf, 0.25])
def test_impossible_logprobs_are_caught(setup, honest, logprob):
    r = fresh(honest)
    r.trajectories[2].segments[0].logprobs[0] = logprob
    (problem,) = check(setup, r)
    assert "1 generated tokens whose logprob is not finite and <= 0 (first: segment 0 token 0" in problem


def test_per_token_lists_that_do_not_line_up_are_caught(setup, honest):
    r = fresh(honest)
    r.trajectories[0].segments[0].logprobs.append(-1.0)  # changed after construction
    n = len(r.trajectories[0].segments[0].completion_ids)
    assert check(setup, r) == [(f"trajectory 0 (task {r.trajectories[0].task_id!r}), segment 0: "
                                f"{n} completion tokens, {n + 1} logprobs, {n} versions, {n} "
                                "loss-mask entries")]


def test_token_counts_environment_tokens_and_rewards_are_checked(setup, honest):
    r = fresh(honest)
    r.generated_tokens += 1
    assert check(setup, r) == [(f"the result counts {honest.generated_tokens + 1} generated "
                                f"tokens, its trajectories hold {honest.generated_tokens}")]
    r = fresh(honest)
    seg = r.trajectories[0].segments[0]
    seg.loss_mask[0] = 0  # a generated token passed off as the environment's
    r.generated_tokens -= 1
    assert any("environment tokens (loss mask 0) with a version other than -1" in p
               for p in check(setup, r))
    r = fresh(honest)
    r.trajectories[0].reward = math.nan
    assert check(setup, r) == [(f"trajectory 0 (task {r.trajectories[0].task_id!r}): reward nan "
                                "is not finite")]
    r = fresh(honest)
    r.trajectories[0].segments[0].reward = math.inf
    assert check(setup, r) == [(f"trajectory 0 (task {r.trajectories[0].task_id!r}), segment 0: "
                                "reward inf is not finite")]


def test_a_flood_of_problems_is_capped(setup, honest):
    r = fresh(honest)
    for i in range(200):
        r.trajectories.append(copy.deepcopy(r.trajectories[0]))
        r.trajectories[-1].task_id = f"bogus-{i}"
    problems = check(setup, r)
    assert len(problems) == MAX_PROBLEMS and problems[-1].startswith("... and ")


# ------------------------------------------------------------------ recompute_logprobs_check


def recompute(model_for, trajs, fraction=1.0, seed=0):
    return recompute_logprobs_check(model_for, trajs, 1.0, random.Random(seed), fraction, ATOL)


def test_honest_rollouts_recompute_exactly(honest, dense):
    report = recompute(lambda v: dense, honest.trajectories)
    assert (report.checked, report.mismatched, report.max_abs_diff) == (4, 0, 0.0)
    assert report.compared_tokens == honest.generated_tokens and report.unchecked_tokens == 0


def test_tampered_logprobs_are_caught(setup, honest, dense):
    r = fresh(honest)
    lps = r.trajectories[2].segments[0].logprobs
    j = next(j for j, lp in enumerate(lps) if lp < -1.0)
    lps[j] += 0.5
    assert check(setup, r) == []  # a plausible logprob: the cheap checks cannot tell
    report = recompute(lambda v: dense, r.trajectories)
    assert report.mismatched == 1 and report.mismatched_indices == [2]
    assert report.max_abs_diff == pytest.approx(0.5, abs=1e-6)


def test_swapped_tokens_are_caught(honest, dense):
    r = fresh(honest)
    seg = r.trajectories[1].segments[0]
    seg.completion_ids[2] = (seg.completion_ids[2] + 7) % dense.config.vocab_size
    report = recompute(lambda v: dense, r.trajectories)
    assert report.mismatched_indices == [1] and report.max_abs_diff > 10 * ATOL


def test_rollouts_of_another_model_are_caught(honest):
    other = make_model("tiny", 1)
    report = recompute(lambda v: other, honest.trajectories)
    assert report.mismatched == report.checked == 4


def test_token_ids_no_model_has_are_a_mismatch_not_a_crash(honest, dense):
    r = fresh(honest)
    r.trajectories[3].segments[0].completion_ids[0] = dense.config.vocab_size + 5
    report = recompute(lambda v: dense, r.trajectories)
    assert report.mismatched_indices == [3] and report.max_abs_diff == math.inf


def test_a_fraction_is_sampled_from_the_given_rng(honest, dense):
    assert recompute(lambda v: dense, honest.trajectories, fraction=0.0).checked == 0
    picks = {tuple(recompute(lambda v: dense, honest.trajectories, 0.5, seed).checked
                   for seed in range(3)) for _ in range(2)}
    assert len(picks) == 1  # the same seed samples the same trajectories
    counts = [recompute(lambda v: dense, honest.trajectories, 0.5, s).checked for s in range(20)]
    assert 0 < sum(counts) < 20 * 4
    with pytest.raises(ValueError, match="fraction"):
        recompute(lambda v: dense, honest.trajectories, fraction=1.5)


def test_each_version_is_scored_by_its_own_model(setup, dense):
    newer = make_model("tiny", 1)
    steps = [0]

    def update_mid_rollout(engine):  # an in-flight weight update after a few decode steps
        steps[0] += 1
        if steps[0] == 4:
            engine.load_weights(copy.deepcopy(newer), VERSION + 1)

    r = rollout(setup, dense, before_step=update_mid_rollout)
    versions = [v for t in r.trajectories for v in t.versions]
    assert set(versions) == {VERSION, VERSION + 1}
    assert check(setup, r) == []

    models = {VERSION: dense, VERSION + 1: newer}
    report = recompute(models.get, r.trajectories)
    assert (report.mismatched, report.max_abs_diff, report.checked) == (0, 0.0, 4)
    assert recompute(lambda v: dense, r.trajectories).mismatched > 0  # one model for both: caught

    report = recompute({VERSION: dense}.get, r.trajectories)  # the newer one is not kept
    assert report.mismatched == 0
    assert report.unchecked_tokens == versions.count(VERSION + 1) > 0
    assert report.compared_tokens == versions.count(VERSION)


def test_moe_rollouts_recompute_exactly_with_their_routing_replayed(setup):
    moe = make_model("tiny-moe", 0)
    r = rollout(setup, moe)
    assert r.trajectories[0].segments[0].experts is not None
    report = recompute(lambda v: moe, r.trajectories)
    assert (report.checked, report.mismatched, report.max_abs_diff) == (4, 0, 0.0)
    r.trajectories[0].segments[0].logprobs[1] -= 0.5
    assert recompute(lambda v: moe, r.trajectories).mismatched_indices == [0]


def test_a_pool_that_fabricates_logprobs_passes_the_signature_but_not_the_recompute(setup, honest,
                                                                                     dense):
    """The malicious pool holds a valid lease and signs what it sends: only the orchestrator's
    own checks of the content can catch it."""
    r = fresh(honest)
    for t in r.trajectories:
        for seg in t.segments:
            seg.logprobs = [-0.01 if m else 0.0 for m in seg.loss_mask]  # "very confident"
    secret = new_lease_secret()
    body = encode_results([r], lease_id="lease-7", batch_id="b-1")
    (got,) = open_batch(body, sign(secret, body), "lease-7", secret, ReplayGuard()).results
    assert check(setup, got) == []
    assert recompute(lambda v: dense, got.trajectories).mismatched == 4

