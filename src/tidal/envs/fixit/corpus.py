"""fixit's mid-training corpus: a scripted expert's episodes, rendered by the harness itself.

The expert plays each training task through the harness's own ``Episode`` loop in place of the
engine, so a document is exactly the context the model will see in RL — system prompt, tool
listing, task, ``<call>{...}</call>`` turns and ``<obs>...</obs>`` observations — with no second
copy of the format to drift out of step:

    read calc.py ──> write the fix ──> run_tests ──> submit

The expert's fix is itself wrong with probability ``fix_slip_rate`` (a typical slip: an
off-by-one constant or a confused operator on the line it fixes). It sees the failing tests;
half the time it then writes the right fix and runs the tests again, else it submits anyway.
So the mid-trained model knows the tool loop and sometimes ships a wrong fix: RL on the hidden
tests has something to learn. The tests are scored without the sandbox: the expert writes only
code in the funcs family's own form, which ``funcs.parse_solution`` reads back.
"""

from __future__ import annotations

import asyncio
import random

from tidal.env import OBS_OPEN, format_call
from tidal.envs import funcs
from tidal.envs.fixit.environment import RUBRIC, Fixit, FixitConfig, FixitTask, sample_tasks, source_of
from tidal.envs.funcs import Grade
from tidal.harness import Episode, GenerationRequest, GenerationResult, HarnessConfig
from tidal.model import ByteTokenizer

CORPUS_VERSION = 1
"""Bump whenever the expert, its slips or the rendering change (pretrain cache key)."""

RETRY_RATE = 0.5
"""After its wrong fix fails the tests, the chance the expert fixes the line right and retries."""

DEMO_HARNESS = HarnessConfig(context_window=4096, max_turns=8, max_tokens=4096,
                             max_turn_tokens=512, max_observation_tokens=512)
"""Room that never cuts the expert short (its episodes are ~600 tokens)."""


def grade_written(task: FixitTask, source: str) -> Grade:
    """The hidden tests' verdict on code the expert wrote, computed without running it."""
    total = len(task.tests.tests)
    spec = funcs.parse_solution(source)
    if spec is None:
        return Grade(0.0, "syntax_error", 0, total, 0.0)
    passed = sum(funcs.evaluate(spec, x) == y for x, y in task.tests.tests)
    return Grade(float(passed == total), "pass" if passed == total else "wrong_answer", passed,
                 total, 0.0)


def expert_plan(task: FixitTask, rng: random.Random, slip_rate: float) -> list[str]:
    """The expert's turns on ``task``: read, fix (maybe wrongly), test, (retry,) submit."""
    spec = task.tests.spec
    read = format_call("read", {"path": "calc.py"})
    test, submit = format_call("run_tests", {}), format_call("submit", {})
    right = format_call("write", {"path": "calc.py", "content": source_of(spec)})
    if rng.random() >= slip_rate:
        return [read, right, test, submit]
    line = rng.randrange(len(spec))
    wrong = list(spec)
    while wrong[line] == spec[line]:  # an off-by-one at the range's end can give the same step
        wrong[line] = funcs.slip(rng, *spec[line])
    slipped = format_call("write", {"path": "calc.py", "content": source_of(wrong)})
    retry = [right, test] if rng.random() < RETRY_RATE else []
    return [read, slipped, test, *retry, submit]


class ExpertClient:
    """Stands in for the engine in one episode: answers turn k with the plan's k-th call."""

    def __init__(self, plan: list[str]):
        self.plan = plan
        self.tok = ByteTokenizer()

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        turn = self.tok.decode(request.prompt_ids).count(OBS_OPEN)
        ids = self.tok.encode(self.plan[turn])[: request.max_new_tokens]
        return GenerationResult(request_id=0, prompt_ids=request.prompt_ids, token_ids=ids,
                                logprobs=[0.0] * len(ids), versions=[0] * len(ids),
                                experts=None, finish_reason="stop", text=self.tok.decode(ids),
                                tag=request.tag)


def play_expert(tasks: list[FixitTask], slip_rate: float, seed: int) -> list:
    """The expert's episode (an ``EpisodeResult``) on each task, through the harness."""
    cfg = DEMO_HARNESS
    tok = ByteTokenizer()

    async def one(i: int, task: FixitTask):
        plan = expert_plan(task, random.Random(f"fixit-expert-{seed}-{i}"), slip_rate)
        episode = Episode(Fixit(grade_written, RUBRIC), ExpertClient(plan), tok, cfg,
                          cfg.context_window, cfg.max_turn_tokens)
        return await episode.run(task)

    async def all_of_them():
        return await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))

    return asyncio.run(all_of_them())


def build_corpus(cfg: FixitConfig, n_docs: int, seed: int) -> list[str]:
    """One document per expert episode on a training-split task (never a held-out one): its
    context as the model sees it (without the bos token)."""
    tasks = sample_tasks(cfg, n_docs, seed + 1_000_003, heldout=False)
    tok = ByteTokenizer()
    docs = []
    for result in play_expert(tasks, cfg.fix_slip_rate, seed):
        (segment,) = result.segments
        docs.append(tok.decode(segment.prompt_ids + segment.completion_ids))
    return docs
