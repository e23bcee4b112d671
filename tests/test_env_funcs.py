"""The funcs family as a registered single-turn environment: through the harness it produces
exactly what the former single-turn rollout did (same prompts, completions, grades)."""

import pytest

from tidal.config import load_config
from tidal.engine.engine import Engine
from tidal.engine.request import GenerationRequest
from tidal.env import from_config
from tidal.harness import run_episodes
from tidal.model import ByteTokenizer, build_model, preset
from tidal.sandbox import Sandbox
from tidal.envs import funcs as family
from tidal.envs.funcs import grade_many


@pytest.fixture(scope="module")
def setup():
    cfg = load_config(None, ["--engine.temperature", "0", "--engine.max_new_tokens", "24"])
    sandbox = Sandbox(cfg.env.sandbox)
    return cfg, sandbox, from_config(cfg.env, sandbox)


def engine(cfg):
    return Engine(build_model(preset("tiny"), seed=3), ByteTokenizer(), cfg.engine)


def test_funcs_is_the_default_environment_and_samples_the_family(setup):
    cfg, _, env = setup
    assert cfg.env.name == "funcs" and env.name == "funcs"
    assert env.sample_tasks(5, 7, True) == family.sample_tasks(family.FuncsConfig(), 5, 7, True)
    assert env.corpus_version == family.GENERATOR_VERSION


def test_single_turn_rollouts_match_generate_then_grade(setup):
    cfg, sandbox, env = setup
    tasks = env.sample_tasks(6, 11, False)
    tok = ByteTokenizer()
    reference = engine(cfg).generate([GenerationRequest(tok.encode(t.prompt, add_bos=True)) for t in tasks])
    grades = grade_many(sandbox, tasks, [r.text for r in reference])
    # A solved task too, so a reward of 1 is compared as well.
    solved = family.solution_text(tasks[0].spec)
    assert grade_many(sandbox, tasks[:1], [solved])[0].reward == 1.0

    trajs, stats = run_episodes(engine(cfg), env, tasks, cfg.harness, samples_per_task=1)
    for t, r, g, task in zip(trajs, reference, grades, tasks):
        (seg,) = t.segments
        assert seg.prompt_ids == tok.encode(task.prompt, add_bos=True)
        assert seg.completion_ids == r.token_ids and seg.loss_mask == [1] * len(r.token_ids)
        assert seg.logprobs == pytest.approx(r.logprobs, abs=1e-5)
        assert (t.reward, t.reason) == (g.reward, g.reason)
        assert t.info["passed"] == g.passed and t.level == task.level and t.episode.turns == 1
        assert t.solved == (g.reward == 1.0)
    assert stats.generated_tokens == sum(len(r.token_ids) for r in reference)
