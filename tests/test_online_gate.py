"""The gate's verdicts and the canary's decisions on hand-made inputs, and both bad candidates
(a noisy copy, a policy that learned the hackers' rewards) blocked against the original."""

from dataclasses import dataclass
from typing import ClassVar

import pytest

from tidal.engine import Engine, EngineConfig
from tidal.env.base import Environment, StepResult
from tidal.env.spec import EnvironmentSpec
from tidal.errors import UserError
from tidal.harness import HarnessConfig, run_episodes
from tidal.model import ByteTokenizer, build_model, preset
from tidal.online.behaviour import classify
from tidal.online.canary import canary_decision
from tidal.online.candidates import hack_fraction, hacking_candidate, worse_candidate
from tidal.online.config import CanaryConfig, GateConfig, RewardConfig
from tidal.online.gate import GateInputs, gate_verdict, measure
from tidal.online.reward import RewardFunction
from tidal.trainer.config import TrainerConfig

TOK = ByteTokenizer()
GATE = GateConfig()


def inputs(solved, behaviours, latency=10.0):
    return GateInputs([f"t{i}" for i in range(len(solved))], list(solved), list(behaviours),
                      [latency] * len(behaviours))


# ---------------------------------------------------------------- gate_verdict


def test_the_same_results_pass_every_test():
    x = inputs([True] * 10 + [False] * 6, ["action"] * 14 + ["question", "empty"])
    result = gate_verdict(x, x, GATE)
    assert result.passed and result.failed == []
    assert set(result.tests) == {"heldout_pass1", "invalid_tool_call", "empty", "question",
                                 "action_rate", "latency"}
    t = result.tests["heldout_pass1"]
    assert t["p_value"] == 1.0 and t["threshold"] == 0.05 and t["statistic"] == 0.0


@pytest.mark.parametrize("bad,failed", [
    ("heldout", {"heldout_pass1"}),
    ("invalid_tool_call", {"invalid_tool_call", "action_rate"}),
    ("empty", {"empty", "action_rate"}),
    ("question", {"question", "action_rate"}),
    ("other", {"action_rate"}),
    ("latency", {"latency"}),
])
def test_each_regression_blocks_by_its_own_test(bad, failed):
    inc = inputs([True] * 16, ["action"] * 16)
    solved = [False] * 6 + [True] * 10 if bad == "heldout" else [True] * 16
    behaviours = ["action"] * 16
    if bad in ("invalid_tool_call", "empty", "question", "other"):
        behaviours = [bad] * 6 + ["action"] * 10
    cand = inputs(solved, behaviours, latency=20.0 if bad == "latency" else 10.0)
    result = gate_verdict(cand, inc, GATE)
    assert not result.passed and set(result.failed) == failed


def test_a_small_difference_is_not_significant():
    inc = inputs([True] * 16, ["action"] * 16)
    cand = inputs([False] + [True] * 15, ["question"] + ["action"] * 15, latency=14.0)
    assert gate_verdict(cand, inc, GATE).passed  # 1 lost task: p = 0.5; latency 1.4x < 1.5x


def test_unpaired_inputs_are_refused():
    a = inputs([True] * 4, ["action"] * 4)
    b = GateInputs(["x0", "x1", "x2", "x3"], [True] * 4, ["action"] * 4, [1.0] * 4)
    with pytest.raises(ValueError, match="different held-out tasks"):
        gate_verdict(a, b, GATE)
    with pytest.raises(ValueError, match="same, non-zero number of guard"):
        gate_verdict(a, inputs([True] * 4, ["action"] * 3), GATE)


# ---------------------------------------------------------------- canary_decision

REWARD = RewardFunction(RewardConfig())
CANARY = CanaryConfig(min_events=40, max_events=200)


def outcomes(accepted, rejected, behaviour="action", other=0, other_behaviour="question"):
    return ([("accepted", None, behaviour)] * accepted + [("rejected", None, behaviour)] * rejected
            + [("rejected", None, other_behaviour)] * other)


def test_a_lower_accept_rate_is_rolled_back_as_soon_as_it_is_significant():
    inc = outcomes(150, 50)
    early = canary_decision(outcomes(3, 2), inc, CANARY, REWARD)
    assert early.action == "continue"
    late = canary_decision(outcomes(12, 28), inc, CANARY, REWARD)
    assert late.action == "rollback" and "accept_rate" in late.reason
    assert late.stats["tests"]["accept_rate"]["lambda"] >= 20


def test_a_rising_hack_rate_is_rolled_back_even_when_users_accept_it():
    inc = outcomes(100, 100)
    cand = outcomes(20, 0, behaviour="question") + outcomes(10, 10)
    d = canary_decision(cand, inc, CANARY, REWARD)
    assert d.action == "rollback" and "question" in d.reason


def test_promote_at_min_events_when_not_worse_and_at_once_when_better():
    inc = outcomes(100, 100)
    assert canary_decision(outcomes(20, 19), inc, CANARY, REWARD).action == "continue"
    assert canary_decision(outcomes(21, 19), inc, CANARY, REWARD).action == "promote"
    # Significantly better, but before min_events: wait (a handful of events proves nothing).
    assert canary_decision(outcomes(28, 2), inc, CANARY, REWARD).action == "continue"
    better = canary_decision(outcomes(39, 1), inc, CANARY, REWARD)
    assert better.action == "promote" and "significantly higher" in better.reason
    # Point estimate worse but not significant: keep collecting until max_events.
    assert canary_decision(outcomes(19, 21), inc, CANARY, REWARD).action == "continue"
    assert canary_decision(outcomes(98, 102), inc, CANARY, REWARD).action == "rollback"
    assert canary_decision(outcomes(100, 100), inc, CANARY, REWARD).action == "promote"


def test_no_decision_before_min_test_events_on_each_side():
    """A canary whose first few events were all accepts once read as significantly better than
    0.71 (the plug-in variance of the mSPRT is meaningless on a handful); nothing is decided
    below min_test_events, in either direction."""
    inc = outcomes(71, 29)
    early = canary_decision(outcomes(8, 0), inc, CANARY, REWARD)
    assert early.action == "continue" and "fewer than" in early.reason
    assert canary_decision(outcomes(0, 8), inc, CANARY, REWARD).action == "continue"
    assert canary_decision(outcomes(0, 20), inc, CANARY, REWARD).action == "rollback"
    assert canary_decision(outcomes(30, 0), outcomes(5, 5), CANARY, REWARD).action == "continue"


def test_scalar_and_edited_count_as_accepts_and_bad_signals_raise():
    inc = outcomes(100, 100)
    cand = [("scalar", 0.5, "action")] * 21 + [("edited", None, "action")] * 10 + \
        [("scalar", -0.2, "action")] * 19
    d = canary_decision(cand, inc, CANARY, REWARD)
    assert d.stats["tests"]["accept_rate"]["candidate"] == pytest.approx(31 / 50)
    with pytest.raises(UserError):
        canary_decision([("liked", None, "action")], inc, CANARY, REWARD)


# ---------------------------------------------------------------- the two bad candidates


@dataclass
class EchoTask:
    task_id: str
    prompt: str


class Reference(Environment):
    """Solved iff the completion is what the reference model wrote (``answers``)."""

    answers: ClassVar[dict] = {}

    async def reset(self, task):
        self.task = task
        return task.prompt

    async def step(self, action):
        ok = self.answers.setdefault(self.task.task_id, action) == action
        return StepResult("", 1.0 if ok else 0.0, True, {"reason": "pass" if ok else "wrong"})


PROMPTS = [f"# Task: add {i}, then negate it.\ndef f(x):\n" for i in range(8)]
TASKS = [EchoTask(f"t{i}", f"# Task: {w} {i}.\ndef f(x):\n")
         for i in range(1, 9) for w in ("add", "square it and add")]
SPEC = EnvironmentSpec("reference", Reference, lambda n, seed, heldout: TASKS[:n])
HARNESS = HarnessConfig()


def engine(model):
    return Engine(model, TOK, EngineConfig(temperature=0.0, max_new_tokens=40, max_seq_len=96))


@pytest.fixture(scope="module")
def original():
    model = build_model(preset("tiny").model_copy(update={"num_hidden_layers": 2}), seed=0)
    Reference.answers = {}
    run_episodes(engine(model), SPEC, TASKS, HARNESS, seed=1)  # records the answers
    return model, measure(engine(model), SPEC, TASKS, PROMPTS, HARNESS, seed=1)


def test_the_original_passes_against_itself(original):
    model, inc = original
    assert inc.pass1 == 1.0 and len(inc.behaviours) == len(PROMPTS)
    again = measure(engine(model), SPEC, TASKS, PROMPTS, HARNESS, seed=1)
    assert again.solved == inc.solved and again.texts == inc.texts  # same seeds, same numbers
    assert gate_verdict(again, inc, GATE).tests["heldout_pass1"]["passed"]


def test_the_worse_candidate_is_blocked_on_heldout_pass1(original):
    model, inc = original
    before = [p.detach().clone() for p in model.parameters()]
    worse = worse_candidate(model, seed=5, scale=0.5)
    assert all((a == p).all() for a, p in zip(before, model.parameters()))  # input untouched
    cand = measure(engine(worse), SPEC, TASKS, PROMPTS, HARNESS, seed=1)
    result = gate_verdict(cand, inc, GATE)
    assert not result.passed and "heldout_pass1" in result.failed
    assert cand.pass1 < inc.pass1


@pytest.mark.parametrize("kind,behaviour", [("question", "question"),
                                            ("broken_tool_call", "invalid_tool_call")])
def test_the_hacking_candidate_is_blocked_on_its_behaviour(original, kind, behaviour):
    model, inc = original
    hacker = hacking_candidate(model, TOK, PROMPTS, TrainerConfig(lr=3e-3, warmup_steps=0),
                               steps=150, kind=kind)
    assert hack_fraction(hacker, TOK, PROMPTS, kind) >= 0.8
    assert hack_fraction(model, TOK, PROMPTS, kind) == 0.0  # the original is untouched
    cand = measure(engine(hacker), SPEC, TASKS, PROMPTS, HARNESS, seed=1)
    assert sum(classify(t) == behaviour for t in cand.texts) >= 0.8 * len(PROMPTS)
    result = gate_verdict(cand, inc, GATE)
    assert not result.passed and behaviour in result.failed
