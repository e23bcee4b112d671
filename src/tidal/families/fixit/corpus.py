"""fixit's mid-training corpus: a scripted expert's episodes, rendered by the harness itself.

The expert plays each training task through the harness's own ``Episode`` loop in place of the
engine, under the default recipe's room (a 256-token window, 96 tokens kept free for a turn), so
a document is exactly the context the model will see in RL — calc.py numbered,
``<call>{...}</call>`` turns and ``<obs>...</obs>`` answers — with no second copy of the format
to drift out of step:

    fix the wrong line ──> 6/6 pass (the episode ends)

The expert's first fix is itself wrong with probability ``fix_slip_rate``: a typical slip (an
off-by-one constant or a confused operator) on the line it fixes, or the right code on a line
that was not wrong. It sees the tests fail and fixes the line right, if the window has room for
another turn (short heads); else the episode ends there, unsolved. So the mid-trained model knows
the tool and sometimes ships a wrong fix: RL on the hidden tests has something to learn. The
tests are scored without the sandbox: the expert writes only code in the funcs family's own
form, which ``grade_written`` reads back.
"""

from __future__ import annotations

import asyncio
import random

from tidal.env import OBS_OPEN, format_call
from tidal.families import funcs
from tidal.families.fixit.environment import (RUBRIC, Fixit, FixitConfig, FixitTask, code_of,
                                          sample_tasks)
from tidal.families.funcs import Grade
from tidal.harness import Episode, GenerationRequest, GenerationResult, HarnessConfig
from tidal.model import ByteTokenizer

CORPUS_VERSION = 5
"""Bump whenever the expert, its slips or the rendering change (pretrain cache key)."""

WRONG_LINE_RATE = 0.3
"""Of the expert's wrong fixes, the share that rewrites a line that was right (with the wrong
line's correct code) instead of slipping on the wrong line itself."""

DEMO_HARNESS = HarnessConfig(context_window=256, max_turns=4, max_tokens=4096,
                             max_turn_tokens=96, max_observation_tokens=128)
"""The default recipe's room (engine.max_seq_len 256, engine.max_new_tokens 96)."""

STEP_OF_CODE = {code_of(op[0], c): (op[0], c if op[3] else 0)
                for op in funcs.OPS for c in range(0, funcs.CONST_RANGE[1] + 2)}
"""Every step's code the expert can write (constants 0..10: a slip can push one out of range)."""


def steps_of(source: str) -> list:
    """The steps calc.py's body lines run (None for a line that is not a step's code)."""
    return [STEP_OF_CODE.get(line.partition(" #")[0].removeprefix(" "))
            for line in source.rstrip("\n").split("\n")[1:-1]]


def grade_written(task: FixitTask, source: str) -> Grade:
    """The hidden tests' verdict on calc.py as the expert left it, computed without running it."""
    total = len(task.tests.tests)
    lines = source.rstrip("\n").split("\n")
    steps = steps_of(source)
    if lines[0] != "def f(x):" or lines[-1] != " return x" or None in steps:
        return Grade(0.0, "syntax_error", 0, total, 0.0)
    passed = sum(funcs.evaluate(steps, x) == y for x, y in task.tests.tests)
    return Grade(float(passed == total), "pass" if passed == total else "wrong_answer", passed,
                 total, 0.0)


def fix_call(line: int, step) -> str:
    return format_call("fix", {"line": line, "code": code_of(*step)})


def expert_plan(task: FixitTask, rng: random.Random, slip_rate: float) -> list[str]:
    """The expert's turns on ``task``: the right fix, or a wrong one and then the right one."""
    spec = task.tests.spec
    written = steps_of(task.files["calc.py"])
    broken = next(i for i, (w, s) in enumerate(zip(written, spec)) if w != s)
    right = fix_call(broken + 2, spec[broken])  # line 1 is ``def f(x):``
    if rng.random() >= slip_rate:
        return [right]
    others = [i for i in range(len(spec)) if i != broken]
    if others and rng.random() < WRONG_LINE_RATE:
        wrong = fix_call(rng.choice(others) + 2, spec[broken])
    else:
        step = spec[broken]
        while step == spec[broken]:  # an off-by-one at the range's end can give the same step
            step = funcs.slip(rng, *spec[broken])
        wrong = fix_call(broken + 2, step)
    return [wrong, right]


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
