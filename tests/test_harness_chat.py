"""Environments speak messages, models speak tokens (tidal.harness.chat_format): an episode on a
BPE tokenizer with a chat template renders its head and observations as the template does, and
the segment keeps exactly the ids the model sampled, even where decoding them and encoding the
text again gives other ids (a BPE tokenizer's decode then encode is not the identity)."""

from __future__ import annotations

import asyncio

import pytest

from tidal.engine.request import GenerationResult
from tidal.env.base import Environment, StepResult
from tidal.harness import HarnessConfig
from tidal.harness.chat_format import RawFormat, TemplateFormat, chat_format
from tidal.harness.episode import Episode
from tidal.model.tokenizer import ByteTokenizer, HFTokenizer

from chat_tokenizer import chatml_config, tiny_tokenizer


@pytest.fixture
def tok(tmp_path) -> HFTokenizer:
    return HFTokenizer(tiny_tokenizer(tmp_path / "tok", chatml_config()))


class TwoTurns(Environment):
    """Asks, answers the first turn with an observation, ends on the second."""

    async def reset(self, task) -> list[dict]:
        return [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2+2?"}]

    async def step(self, action: str) -> StepResult:
        self.turns = getattr(self, "turns", 0) + 1
        if self.turns == 1:
            return StepResult("4")
        return StepResult("", 1.0, True, {"reason": "pass"})


class Sampler:
    """A client that 'samples' fixed ids per turn (the last of each: the end of turn, or not)."""

    def __init__(self, turns: list[list[int]]):
        self.turns, self.requests = list(turns), []

    async def generate(self, request) -> GenerationResult:
        self.requests.append(request)
        ids = self.turns.pop(0)
        return GenerationResult(len(self.requests), list(request.prompt_ids), ids,
                                [-0.25] * len(ids), [0] * len(ids), None, "eos", "", request.tag)


def _non_canonical(tok: HFTokenizer, text: str) -> list[int]:
    """``text`` as one id per byte-level character: ids a model may sample, which BPE merges
    when the text is encoded again."""
    ids = [i for ch in text for i in tok.encode(ch)]
    assert ids != tok.encode(text), "the test needs a text BPE encodes differently"
    return ids


def test_episode_keeps_the_sampled_ids_and_renders_the_template(tok):
    eot = tok.end_of_turn_id
    first = _non_canonical(tok, "Let me compute it.") + [eot]
    second = tok.encode("4") + [eot]
    client = Sampler([first, second])
    result = asyncio.run(Episode(TwoTurns(), client, tok, HarnessConfig(), window=256,
                                 max_turn_tokens=32).run(None))
    [seg] = result.segments
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2+2?"}]
    assert seg.prompt_ids == tok.encode_chat(messages)  # the head: the template's rendering
    model_ids = [i for i, m in zip(seg.completion_ids, seg.loss_mask) if m]
    assert model_ids == first + second  # exactly what was sampled, never re-encoded
    # between the turns: what ChatML writes after the end of turn, around the observation
    env_ids = seg.completion_ids[len(first): len(seg.completion_ids) - len(second)]
    assert env_ids == tok.encode("\n<|im_start|>user\n4<|im_end|>\n<|im_start|>assistant\n")
    assert set(seg.loss_mask[len(first): len(first) + len(env_ids)]) == {0}
    # the second request's prompt is the context: head, sampled ids, the frame
    assert client.requests[1].prompt_ids == seg.prompt_ids + first + env_ids
    assert result.reward == 1.0


def test_a_turn_cut_before_its_end_of_turn_is_closed_by_the_harness(tok):
    eot = tok.end_of_turn_id
    first = tok.encode("Let me")  # the length limit cut it: no end-of-turn token
    client = Sampler([first, tok.encode("4") + [eot]])
    result = asyncio.run(Episode(TwoTurns(), client, tok, HarnessConfig(), window=256,
                                 max_turn_tokens=32).run(None))
    [seg] = result.segments
    after = seg.completion_ids[len(first)]
    assert after == eot and seg.loss_mask[len(first)] == 0  # written by the harness, not trained


def test_observation_frame_is_the_templates(tok):
    fmt = chat_format(tok)
    assert isinstance(fmt, TemplateFormat)
    before, after = fmt.frame
    assert tok.encode("\n<|im_start|>user\n") == before
    assert tok.encode("<|im_end|>\n<|im_start|>assistant\n") == after


def test_byte_tokenizer_keeps_its_raw_format():
    fmt = chat_format(ByteTokenizer())
    assert isinstance(fmt, RawFormat) and fmt.end_of_turn == []
    assert fmt.head("# Task") == ByteTokenizer().encode("# Task", add_bos=True)
    assert fmt.head([{"role": "user", "content": "# Task"}]) == fmt.head("# Task")


def test_reset_must_return_text_or_messages(tok):
    with pytest.raises(TypeError, match="string or a non-empty list"):
        chat_format(tok).head([{"content": "no role"}])


def test_fixit_with_self_summarization_runs_through_a_chat_template(tmp_path, tok):
    """The multi-turn harness with tools and self-summarization on a (random) Llama with a BPE
    tokenizer and ChatML: episodes run to an end, contexts are summarised into new segments, and
    every segment's model tokens are what the engine sampled, its other tokens loss-masked."""
    from tidal.config import load_config
    from tidal.engine.engine import Engine
    from tidal.env import from_config
    from tidal.harness import run_episodes
    from tidal.model import build_model, preset
    from tidal.sandbox import Sandbox

    cfg = load_config(None, ["--env.name", "fixit", "--engine.max_seq_len", "512",
                             "--harness.context_mode", "summarize", "--harness.context_window", "400",
                             "--harness.max_turn_tokens", "24", "--harness.summary_max_tokens", "16",
                             "--harness.max_turns", "8", "--engine.temperature", "1.0"])
    model = build_model(preset("tiny-llama").model_copy(update={"vocab_size": tok.vocab_size}), seed=0)
    engine = Engine(model, tok, cfg.engine.model_copy(update={"stop": []}))
    with Sandbox(cfg.env.sandbox) as sandbox:
        spec = from_config(cfg.env, sandbox)
        trajs, _ = run_episodes(engine, spec, spec.sample_tasks(3, 0, False), cfg.harness,
                                samples_per_task=2, seed=0)
    assert len(trajs) == 6 and all(t.reason for t in trajs)
    assert any(len(t.segments) > 1 for t in trajs), "no context was summarised"
    frame = tok.encode("\n<|im_start|>user\n")
    for t in trajs:
        head = t.segments[0].prompt_ids if t.segments else []
        for seg in t.segments:
            assert seg.prompt_ids[: len(head)] == head  # the head is kept across summaries
            assert len(seg.completion_ids) == len(seg.loss_mask) == len(seg.logprobs)
        for seg in t.segments[1:]:  # a new context: head, then the summary request's user frame
            rest = seg.prompt_ids[len(head):]
            assert any(rest[k:k + len(frame)] == frame for k in range(len(rest)))
