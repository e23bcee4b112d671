"""Rollouts: sample G completions per task with the engine, grade them, build Trajectories.

Every generated token keeps the sampling logprob and the policy version the engine recorded, so
a batch can be checked for staleness and an asynchronous pipeline needs no change here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tidal.engine.request import GenerationRequest, GenerationResult
from tidal.tasks import Grade, Task, grade_many
from tidal.types import Segment, Trajectory


@dataclass
class RolloutStats:
    generated_tokens: int
    generate_s: float
    grade_s: float


def requests_for(tasks: list[Task], tokenizer, samples_per_task: int) -> list[GenerationRequest]:
    reqs = []
    for ti, task in enumerate(tasks):
        ids = tokenizer.encode(task.prompt, add_bos=True)
        reqs.extend(GenerationRequest(prompt_ids=ids, tag=ti) for _ in range(samples_per_task))
    return reqs


def to_trajectory(task: Task, group_id: int, result: GenerationResult, grade: Grade) -> Trajectory:
    n = len(result.token_ids)
    segment = Segment(
        prompt_ids=list(result.prompt_ids),
        completion_ids=list(result.token_ids),
        logprobs=list(result.logprobs),
        versions=list(result.versions),
        loss_mask=[1] * n,
        experts=result.experts,
        prompt_experts=result.prompt_experts,
    )
    return Trajectory(task_id=task.task_id, group_id=group_id, segments=[segment],
                      reward=grade.reward, reason=grade.reason,
                      info={"passed": grade.passed, "total": grade.total, "level": task.level})


def sample_and_grade(engine, sandbox, tasks: list[Task], samples_per_task: int,
                     group_ids: list[int] | None = None,
                     before_step=None) -> tuple[list[Trajectory], RolloutStats]:
    """``samples_per_task`` trajectories per task; task i's samples form group ``group_ids[i]``
    (default: i). ``before_step`` is passed to ``Engine.generate``."""
    group_ids = group_ids if group_ids is not None else list(range(len(tasks)))
    t0 = time.perf_counter()
    results = engine.generate(requests_for(tasks, engine.tokenizer, samples_per_task), before_step)
    t1 = time.perf_counter()
    grades = grade_many(sandbox, [tasks[r.tag] for r in results], [r.text for r in results])
    t2 = time.perf_counter()
    trajs = [to_trajectory(tasks[r.tag], group_ids[r.tag], r, g) for r, g in zip(results, grades)]
    tokens = sum(len(r.token_ids) for r in results)
    return trajs, RolloutStats(tokens, t1 - t0, t2 - t1)
