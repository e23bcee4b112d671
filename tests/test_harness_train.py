"""The harness on a real (tiny) model: multi-segment trajectories from self-summarization are
trained by Trainer.step with the episode's advantage on every segment, summaries included."""

import copy
from dataclasses import dataclass

import pytest
import torch

from tidal.engine.config import EngineConfig
from tidal.engine.engine import Engine
from tidal.env import EnvironmentSpec, Rubric, StepResult, ToolEnvironment
from tidal.harness import SUMMARY_OPEN, HarnessConfig, run_episodes
from tidal.model import ByteTokenizer, build_model, preset
from tidal.trainer.config import TrainerConfig
from tidal.trainer.grpo import collate
from tidal.trainer.trainer import Trainer
from tidal.trajectory import Batch


@dataclass(frozen=True)
class Task:
    task_id: str
    prompt: str


class Echo(ToolEnvironment):
    """A random model never calls the tool right; the reward on running out of turns depends
    on what it wrote, so samples of one task differ (a learning signal for GRPO)."""

    system_prompt = "Say."
    tool_style = "signature"

    def __init__(self):
        super().__init__(Rubric([(said, 1.0)]))
        self.written = 0

    async def setup(self, task):
        return task.prompt

    def tools(self):
        return [self.say]

    def say(self, word: str) -> str:
        """Say a word."""
        self.finish()
        return word

    async def step(self, action):
        self.written += sum(action.encode()) % 7
        return await super().step(action)

    async def end(self, reason):
        return StepResult("", (self.written % 5) / 4, True, {"reason": reason})


def said(task, env) -> float:
    return 1.0


def spec():
    return EnvironmentSpec("echo", Echo, lambda n, seed, heldout: [])


@pytest.mark.parametrize("model_preset", ["tiny", "tiny-moe"])
def test_summarized_episodes_train_every_segment_with_the_episode_advantage(model_preset):
    torch.manual_seed(0)
    model = build_model(preset(model_preset), seed=0)
    engine = Engine(copy.deepcopy(model), ByteTokenizer(),
                    EngineConfig(max_seq_len=256, max_new_tokens=24, temperature=1.0, seed=1))
    cfg = HarnessConfig(context_mode="summarize", summary_trigger=0.6, summary_max_tokens=16,
                        max_turns=6, max_tokens=400, max_observation_tokens=48)
    tasks = [Task("a", "Say hi."), Task("b", "Say yo.")]
    trajs, stats = run_episodes(engine, spec(), tasks, cfg, samples_per_task=3)

    assert [t.group_id for t in trajs] == [0, 0, 0, 1, 1, 1]
    assert stats.generated_tokens == sum(t.num_generated_tokens for t in trajs) > 0
    multi = [t for t in trajs if len(t.segments) >= 2]
    assert multi, "no episode outgrew its window; the test needs summaries"
    for t in trajs:
        assert t.episode.resets == len(t.segments) - 1 == t.episode.summary_count
        for seg in t.segments:
            assert len(seg.prompt_ids) + len(seg.completion_ids) <= 256
            for v, m in zip(seg.versions, seg.loss_mask):
                assert v == (0 if m else -1)
            if model_preset == "tiny-moe":
                k, layers = 2, preset("tiny-moe").num_hidden_layers
                assert len(seg.experts) == len(seg.completion_ids)
                for e, m in zip(seg.experts, seg.loss_mask):
                    assert len(e) == layers and all(len(x) == k for x in e)
                    assert all(i == -1 for x in e for i in x) == (m == 0)
    closing = multi[0].segments[0]
    summary_at = ByteTokenizer().decode(closing.completion_ids).rfind(SUMMARY_OPEN)
    assert closing.loss_mask[-1] == 1 and summary_at > 0  # the summary is trained

    tb = collate(trajs, pad_id=0)
    rows = [(i, s) for i, t in enumerate(trajs) for s in t.segments]
    assert tb.num_rows == len(rows)
    rewards = torch.tensor([t.reward for t in trajs])
    assert rewards.std() > 0
    for b, (i, _) in enumerate(rows):  # every segment carries its own episode's advantage
        assert tb.advantages[b] == tb.advantages[[r for r, (j, _) in enumerate(rows) if j == i][0]]
    assert tb.loss_mask.sum() == sum(t.num_generated_tokens for t in trajs) - len(
        [s for t in trajs for s in t.segments if not s.prompt_ids])

    trainer = Trainer(model, TrainerConfig(lr=1e-3, warmup_steps=0), temperature=1.0,
                      pad_id=ByteTokenizer().pad_id)
    before = [p.detach().clone() for p in model.parameters()]
    metrics = trainer.step(Batch(trajs, trainer_version=0))
    assert metrics.tokens == sum(t.num_generated_tokens for t in trajs)
    assert metrics.sequences == len(rows)
    # The trainer's logprobs of every trained token, env tokens interleaved, match the sampler's.
    assert abs(metrics.ratio_mean - 1) < 1e-3 and metrics.kl < 1e-4
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert trainer.version == 1
