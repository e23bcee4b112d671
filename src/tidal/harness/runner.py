"""Run many episodes at once on one engine and turn them into Trajectories.

    trajs, stats = run_episodes(engine, spec, tasks, cfg, samples_per_task=G)

Every (task, sample) pair is one episode with a fresh environment; all of them run concurrently
on one asyncio loop (at most ``max_concurrent_episodes`` at a time) and share the engine through
an EngineClient, so their turns batch together in the engine's continuous batching.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tidal.env.spec import EnvironmentSpec, reward_reaches_one
from tidal.errors import UserError
from tidal.harness.config import HarnessConfig
from tidal.harness.engine_client import EngineClient
from tidal.harness.episode import PROMPT_TOO_LONG, Episode, EpisodeResult
from tidal.harness.seeds import derive_seed
from tidal.harness.tool_episode import ToolEpisode
from tidal.trajectory import Trajectory


@dataclass
class RolloutStats:
    generated_tokens: int
    generate_s: float
    """Seconds inside engine steps."""
    grade_s: float
    """The rest of the rollout's wall time: environment steps, tools and grading not hidden
    behind generation."""


def run_episodes(engine, spec: EnvironmentSpec, tasks: list[Any], cfg: HarnessConfig,
                 samples_per_task: int = 1, group_ids: list[int] | None = None,
                 before_step=None, client=None,
                 seed: int | None = None) -> tuple[list[Trajectory], RolloutStats]:
    """``samples_per_task`` episodes per task; task i's episodes form GRPO group
    ``group_ids[i]`` (default i). ``before_step()`` runs before every engine step (in-flight
    weight updates). Trajectories come back task by task, sample by sample: episode
    ``i * samples_per_task + j`` is sample j of task i (its requests are tagged with that index).
    ``seed``: sample j of group g samples from seeds derived from (seed, g, j) (harness.seeds),
    so it does not matter which tasks share the call; None = the engine's own generator.

    client: None = generate with ``engine``; else anything with ``async generate(request)``
    (a scripted policy), and ``engine`` only supplies tokenizer, cfg and is_moe."""
    return asyncio.run(run_episodes_async(engine, spec, tasks, cfg, samples_per_task, group_ids,
                                          before_step, client, seed))


async def run_episodes_async(engine, spec, tasks, cfg, samples_per_task=1, group_ids=None,
                             before_step=None, client=None,
                             seed=None) -> tuple[list[Trajectory], RolloutStats]:
    group_ids = group_ids if group_ids is not None else list(range(len(tasks)))
    window = context_window(cfg, engine.cfg)
    max_turn = cfg.max_turn_tokens or engine.cfg.max_new_tokens
    no_experts = _no_experts(engine)
    engine_client = EngineClient(engine, before_step) if client is None else None
    limit = asyncio.Semaphore(cfg.max_concurrent_episodes or len(tasks) * samples_per_task or 1)

    outside = served = None  # served: what ``outside`` yields, once it is open (below)
    if spec.outside is not None:  # an outside program runs each episode (env.spec.OutsideEpisodes)
        outside = spec.outside.serve(client or engine_client, engine.tokenizer, engine.cfg, window,
                                     no_experts)

    async def one(index: int, task) -> EpisodeResult:
        group, sample = group_ids[index // samples_per_task], index % samples_per_task
        episode_seed = None if seed is None else derive_seed(seed, group, sample)
        async with limit:
            if served is not None:
                episode = served(spec.make(), index, episode_seed)
            elif spec.tools is not None:  # the environment speaks messages and tool calls
                episode = ToolEpisode(spec.make(), spec.tools, client or engine_client,
                                      engine.tokenizer, cfg, window, max_turn, no_experts, index,
                                      episode_seed)
            else:
                episode = Episode(spec.make(), client or engine_client, engine.tokenizer, cfg,
                                  window, max_turn, no_experts, index, episode_seed)
            return await episode.run(task)

    start = time.perf_counter()
    async with outside or contextlib.nullcontext() as served:
        episodes = asyncio.gather(*(one(i * samples_per_task + j, t) for i, t in enumerate(tasks)
                                    for j in range(samples_per_task)))
        results = await _run_with_driver(engine_client, episodes)
    wall = time.perf_counter() - start
    trajs = [to_trajectory(tasks[i // samples_per_task], group_ids[i // samples_per_task], r,
                           spec.success) for i, r in enumerate(results)]
    gen_s = engine_client.engine_s if engine_client else 0.0
    tokens = sum(t.episode.model_tokens for t in trajs)
    return trajs, RolloutStats(tokens, gen_s, wall - gen_s)


async def _run_with_driver(engine_client: EngineClient | None, episodes: asyncio.Future) -> list:
    """Await the episodes while the engine driver runs; an engine failure cancels them and
    raises."""
    if engine_client is None:
        return await episodes
    driver = asyncio.create_task(engine_client.drive())
    try:
        await asyncio.wait({driver, episodes}, return_when=asyncio.FIRST_COMPLETED)
        if driver.done():
            episodes.cancel()
            driver.result()
        return await episodes
    finally:
        driver.cancel()


def to_trajectory(task: Any, group_id: int, result: EpisodeResult,
                  success: Callable[[float, dict], bool] = reward_reaches_one) -> Trajectory:
    """The episode as a Trajectory; ``success`` (the EnvironmentSpec's rule) decides ``solved``
    here, once; ``level`` is what the environment reported as ``info["level"]``. ``info`` keeps
    the environment's other numeric reports (see Trajectory); the harness's own statistics go
    to ``episode``."""
    level = result.info.get("level")
    info = {k: float(v) for k, v in result.info.items()
            if isinstance(v, (int, float)) and k not in ("reason", "level")}
    solved = result.reason != PROMPT_TOO_LONG and bool(success(result.reward, result.info))
    return Trajectory(task_id=task.task_id, group_id=group_id, segments=result.segments,
                      reward=result.reward, reason=result.reason, info=info, solved=solved,
                      level=None if level is None else int(level), episode=result.stats(),
                      integrity=result.integrity)


def context_window(cfg: HarnessConfig, engine_cfg) -> int:
    window = cfg.context_window or engine_cfg.max_seq_len
    if window > engine_cfg.max_seq_len:
        raise UserError(f"harness.context_window ({window}) exceeds engine.max_seq_len "
                        f"({engine_cfg.max_seq_len}); lower it or raise engine.max_seq_len")
    return window


def _no_experts(engine) -> list[list[int]] | None:
    """An environment token's expert entry for MoE models ("no recorded routing"), else None."""
    if not engine.is_moe:
        return None
    mcfg = engine.model.config
    return [[-1] * mcfg.num_experts_per_tok for _ in range(mcfg.num_hidden_layers)]
