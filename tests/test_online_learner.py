"""The online learner on a tiny model: rewards move logprobs the right way, stale events are
dropped and counted, and the first step recomputes the engine's logprobs bit for bit."""

import copy

import pytest
import torch

from tidal.engine import Engine, EngineConfig, GenerationRequest
from tidal.model import ByteTokenizer, ModelConfig, build_model
from tidal.online.config import LearnerConfig, RewardConfig
from tidal.online.learner import OnlineLearner
from tidal.online.records import FeedbackEvent, LearnEvent, ServedResponse
from tidal.online.reward import RewardFunction
from tidal.trainer.config import TrainerConfig
from tidal.trainer.grpo import token_logprobs
from tidal.trainer.trainer import Trainer

TINY = {"vocab_size": 260, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "max_position_embeddings": 64}
TOK = ByteTokenizer()
PROMPTS = ["def f(x):\n", "# add 3\n", "x = ", "# Task: negate it.\n"]


def served(model, version=0, temperature=1.0, seed=0):
    """One sampled response per prompt from an Engine on a copy of ``model``."""
    engine = Engine(copy.deepcopy(model), TOK, EngineConfig(
        max_seq_len=64, max_new_tokens=8, temperature=temperature, stop=[]))
    reqs = [GenerationRequest(TOK.encode(p, add_bos=True), seed=seed + i, ignore_eos=True)
            for i, p in enumerate(PROMPTS)]
    out = []
    for i, r in enumerate(engine.generate(reqs)):
        out.append(ServedResponse(
            id=f"cmpl-{seed}-{i}", index=0, created=0.0, version=version, manifest_sha256="x",
            endpoint="completions", prompt_ids=r.prompt_ids, token_ids=r.token_ids,
            logprobs=r.logprobs, text=r.text, finish_reason=r.finish_reason,
            temperature=temperature, latency_ms=1.0, behaviour="action"))
    return out


def events(responses, signals, seq=0):
    return [LearnEvent(seq + i, FeedbackEvent(r.id, s), r)
            for i, (r, s) in enumerate(zip(responses, signals))]


def seq_logprob(model, r: ServedResponse) -> float:
    ids = torch.tensor([r.prompt_ids + r.token_ids])
    with torch.no_grad():
        logits = model(ids[:, :-1])
    lp = token_logprobs(logits, ids[:, 1:], 1.0)[0, len(r.prompt_ids) - 1:]
    return float(lp.sum())


def learner_for(model, **cfg):
    trainer = Trainer(model, TrainerConfig(lr=3e-3, warmup_steps=0), temperature=1.0)
    lcfg = LearnerConfig(**{"events_per_step": 4, **cfg})
    return OnlineLearner(trainer, RewardFunction(RewardConfig()), lcfg)


@pytest.fixture
def model():
    return build_model(ModelConfig(**TINY), seed=0)


def test_rewards_move_logprobs_up_and_down(model):
    responses = served(model)
    signals = ["accepted", "rejected", "accepted", "rejected"]
    before = [seq_logprob(model, r) for r in responses]
    learner = learner_for(model, max_staleness=10)
    for _ in range(4):
        learner.add(events(responses, signals))
        assert learner.ready()
        stats = learner.step()
        assert stats.events == 4 and stats.train is not None
    after = [seq_logprob(model, r) for r in responses]
    for s, b, a in zip(signals, before, after):
        assert (a > b) if s == "accepted" else (a < b), (s, b, a)
    assert stats.reward_mean == pytest.approx((0.75 - 0.25) / 2)
    assert stats.reward_by_behaviour == {"action": pytest.approx(0.25)}
    assert not learner.ready()


def test_stale_events_are_dropped_and_counted(model):
    learner = learner_for(model, max_staleness=1)
    learner.trainer.version = 3
    old = served(model, version=1)[:2]  # 2 versions behind: dropped
    fresh = served(model, version=2, seed=9)[2:]  # 1 behind: kept
    learner.add(events(old + fresh, ["accepted", "rejected", "accepted", "rejected"]))
    stats = learner.step()
    assert (stats.events, stats.dropped_stale) == (2, 2)
    assert learner.dropped_stale_total == 2 and stats.train.staleness_max == 1.0


def test_first_step_recomputes_the_recorded_logprobs_bit_for_bit(model):
    responses = served(model, temperature=0.8)
    trainer = Trainer(model, TrainerConfig(lr=1e-3, warmup_steps=0), temperature=0.8,
                      numerics="deterministic")
    learner = OnlineLearner(trainer, RewardFunction(RewardConfig()), LearnerConfig(events_per_step=4))
    learner.add(events(responses, ["accepted", "rejected", "edited", "dissatisfied"]))
    train = learner.step().train.to_json()
    assert train["mismatch_tokens"] == sum(len(r.token_ids) for r in responses)
    assert train["mismatch_bitwise_equal_fraction"] == 1.0
    assert train["mismatch_max_abs_logprob_diff"] == 0.0


def test_empty_responses_are_rewarded_but_not_trained(model):
    responses = served(model)
    empty = copy.deepcopy(responses[0])
    empty.token_ids, empty.logprobs, empty.text, empty.behaviour = [], [], "", "empty"
    learner = learner_for(model)
    learner.add(events([empty, responses[1]], ["accepted", "accepted"]))
    stats = learner.step()
    assert stats.empty_responses == 1 and stats.events == 2
    # The empty one got its penalty (not the accept), and counted in the baseline.
    assert stats.reward_by_behaviour == {"empty": -0.5, "action": 0.75}
    assert stats.train is not None and stats.train.sequences == 1.0
    # Only empty responses: nothing to train, no step taken, no crash.
    learner.add(events([empty, empty], ["rejected", "accepted"]))
    version = learner.trainer.version
    stats = learner.step()
    assert stats.train is None and learner.trainer.version == version


def test_a_response_whose_logprobs_do_not_match_its_tokens_is_refused(model):
    bad = served(model)[0]
    bad.logprobs = bad.logprobs[:-1]
    learner = learner_for(model)
    learner.add(events([bad, bad], ["accepted", "rejected"]))
    with pytest.raises(ValueError, match="recorded logprobs"):
        learner.step()


def test_prompt_baseline_compares_a_reward_with_its_prompts_history():
    from tidal.online.learner import PromptBaseline

    b = PromptBaseline(window=2)
    a, c = (1, 2), (3,)
    # First sight of a prompt: the step's own mean (0.25) is its baseline.
    assert b.centre([a, c], [0.75, -0.25]) == pytest.approx([0.5, -0.5])
    assert b.centre([a], [0.75]) == pytest.approx([0.0])  # a's mean so far: 0.75
    assert b.centre([a], [-0.25]) == pytest.approx([-1.0])
    # window 2: an exponential mean (weight 1/2) from the second reward on
    assert b.means[a][0] == pytest.approx(0.25)
    assert b.centre([c, c], [0.75, 0.75]) == pytest.approx([1.0, 1.0])  # both against c's -0.25
