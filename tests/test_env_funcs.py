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
from tidal.families import funcs as family
from tidal.families.funcs import grade_many


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


# --- prompt_style = "instruct": the family asked in plain English, for a chat model -------------

from tidal.families.funcs.grader import extract_code  # noqa: E402


def test_instruct_prompt_states_the_task_in_plain_english():
    cfg = family.FuncsConfig(min_level=2, max_level=2, prompt_style="instruct")
    [task] = family.sample_tasks(cfg, 1, seed=3, heldout=False)
    assert task.instruction.startswith("Write a Python function f(x)")
    assert family.describe(task.spec)[1:-1] in task.instruction  # the steps, in words
    assert task.instruction.endswith("Reply with only the code.")
    assert "def f" not in task.instruction and task.prompt.endswith("def f(x):\n")


@pytest.mark.parametrize("answer, code", [
    ("```python\ndef f(x):\n    return x\n```\nThis returns x.", "def f(x):\n    return x\n"),
    ("Here:\n```\ndef f(x):\n    return x\n```", "def f(x):\n    return x\n"),
    ("```py\ndef f(x):\n    return x", "def f(x):\n    return x"),  # cut before the fence closed
    ("def f(x):\n    return x", "def f(x):\n    return x"),  # no fence: the whole answer
    ("def f(x):\n    return x\n```\n\nThis returns x.", "def f(x):\n    return x\n"),  # no opening fence
])
def test_extract_code_takes_the_first_fenced_block(answer, code):
    assert extract_code(answer) == code


def test_instruct_answers_are_graded_from_their_code_block(setup):
    sandbox = setup[1]
    cfg = family.FuncsConfig(min_level=1, max_level=2, prompt_style="instruct")
    tasks = family.sample_tasks(cfg, 4, seed=0, heldout=False)
    good = [f"```python\ndef f(x):\n{t.reference_solution.rstrip()}\n```\nExplained." for t in tasks]
    wrong = ["```python\ndef f(x):\n    return x + 1000\n```" for _ in tasks]
    grades = grade_many(sandbox, tasks + tasks, good + wrong, style="instruct")
    assert [g.reward for g in grades] == [1.0] * 4 + [0.0] * 4
    # the same answers graded in the completion style are not programs after "def f(x):"
    assert grade_many(sandbox, tasks[:1], good[:1])[0].reward == 0.0


def test_partial_credit_rewards_the_fraction_passed_and_never_solves():
    from tidal.families.funcs import Grade, reward_of

    half = Grade(0.0, "wrong_answer", 3, 6, 0.0)
    assert reward_of(half) == 0.0 and reward_of(half, 0.5) == pytest.approx(0.25)
    assert reward_of(Grade(1.0, "pass", 6, 6, 0.0), 0.5) == 1.0
    assert reward_of(Grade(0.0, "syntax_error", 0, 6, 0.0), 0.5) == 0.0
