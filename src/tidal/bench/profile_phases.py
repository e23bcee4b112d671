"""The four phases `tidal bench profile` measures, each built as the main job builds it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from tidal.bench.config import with_keys
from tidal.config import TidalConfig

if TYPE_CHECKING:
    from tidal.bench.profile_bench import BenchSection


def profiled(fn, calls: int, top: int) -> dict:
    """``fn()`` run ``calls`` times under the profiler: wall ms per call, ms in ops per call,
    the rest, and the top ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        wall = time.perf_counter() - start
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    in_ops_us = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return {
        "calls": calls,
        "wall_ms": 1e3 * wall / calls,
        "in_ops_ms": in_ops_us / 1e3 / calls,
        "outside_ops_ms": max(0.0, 1e3 * wall - in_ops_us / 1e3) / calls,
        "op_calls": sum(e.count for e in events) // calls,
        "top_ops": [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3 / calls,
                     "share": e.self_cpu_time_total / in_ops_us, "calls": e.count // calls,
                     "mean_us": e.self_cpu_time_total / e.count} for e in events[:top]],
    }


def _model(cfg: TidalConfig):
    """The model mid-training starts from (model.init_from, or fresh weights seeded by run.seed), in fp32."""
    from tidal.pretrain.loop import initial_model

    return initial_model(cfg)


def midtraining_phase(cfg: TidalConfig, steps: int, top: int) -> dict:
    """One mid-training optimizer step (pretrain.loop.train_step) on a batch of random ids
    (engine.numerics does not apply: mid-training has its own forward)."""
    from tidal.pretrain.loop import make_optimizer, train_step

    pc = cfg.pretrain
    model = _model(cfg)
    optimizer = make_optimizer(model, pc)
    g = torch.Generator().manual_seed(cfg.run.seed)
    batch = torch.randint(0, cfg.model.vocab_size, (pc.batch_size, pc.seq_len), generator=g)

    def step():
        train_step(model, optimizer, batch, pc.lr, pc.grad_clip, pc.dtype)

    step()  # warm-up
    return profiled(step, steps, top)


def _engine(cfg: TidalConfig, numerics: str):
    from tidal.engine.engine import Engine
    from tidal.model import load_tokenizer

    engine_cfg = with_keys(cfg, {"engine.numerics": numerics}).engine
    model = _model(cfg).to(getattr(torch, cfg.model.dtype))
    return Engine(model, load_tokenizer(cfg.model.init_from), engine_cfg)


def _random_ids(cfg: TidalConfig, count: int, length: int, g: torch.Generator) -> list[list[int]]:
    return torch.randint(1, cfg.model.vocab_size, (count, length), generator=g).tolist()


def _requests(cfg: TidalConfig, bench: BenchSection, new_tokens: int) -> list:
    """tasks_per_step prompts of prompt_tokens random ids, each group_size times (as GRPO asks)."""
    from tidal.engine.request import GenerationRequest

    oc = cfg.orchestrator
    prompts = _random_ids(cfg, oc.tasks_per_step, bench.prompt_tokens, torch.Generator().manual_seed(cfg.run.seed))
    return [GenerationRequest(prompt_ids=p, max_new_tokens=new_tokens, ignore_eos=True, seed=i)
            for i, p in enumerate(p for p in prompts for _ in range(oc.group_size))]


def prefill_phase(cfg: TidalConfig, bench: BenchSection, numerics: str) -> dict:
    """The engine admitting every request of an RL step: prefill and its first token."""
    engine = _engine(cfg, numerics)
    engine.generate(_requests(cfg, bench, 1))  # warm-up
    return profiled(lambda: engine.generate(_requests(cfg, bench, 1)), bench.steps, bench.top)


def decode_phase(cfg: TidalConfig, bench: BenchSection, numerics: str) -> dict:
    """One engine step of every request of an RL step once all are running: one token each."""
    engine = _engine(cfg, numerics)
    for request in _requests(cfg, bench, bench.decode_steps + 3):
        engine.submit(request)
    engine.step()  # prefill
    engine.step()  # warm-up decode
    return profiled(engine.step, bench.decode_steps, bench.top)


def _batch(cfg: TidalConfig, bench: BenchSection):
    """An RL step's batch: tasks_per_step groups of group_size rows, random tokens and rewards."""
    from tidal.trajectory import Batch, Segment, Trajectory

    oc = cfg.orchestrator
    g = torch.Generator().manual_seed(cfg.run.seed)
    prompts = _random_ids(cfg, oc.tasks_per_step, bench.prompt_tokens, g)
    completions = _random_ids(cfg, oc.tasks_per_step * oc.group_size, bench.completion_tokens, g)
    rewards = (torch.rand(len(completions), generator=g) > 0.5).tolist()
    n = bench.completion_tokens
    trajectories = [
        Trajectory(f"task{i // oc.group_size}", i // oc.group_size,
                   [Segment(prompts[i // oc.group_size], completion, [-5.0] * n, [0] * n, [1] * n, None)],
                   reward=float(reward))
        for i, (completion, reward) in enumerate(zip(completions, rewards))]
    return Batch(trajectories, trainer_version=0)


def trainer_phase(cfg: TidalConfig, bench: BenchSection, numerics: str) -> dict:
    """One RL trainer step (GRPO, the recipe's [trainer]) on an RL step's rows."""
    from tidal.model import load_tokenizer
    from tidal.trainer.trainer import Trainer

    tokenizer = load_tokenizer(cfg.model.init_from)
    trainer = Trainer(_model(cfg), cfg.trainer, temperature=cfg.engine.temperature,
                      pad_id=tokenizer.pad_id, numerics=numerics)
    batch = _batch(cfg, bench)
    trainer.step(batch)  # warm-up
    return profiled(lambda: trainer.step(batch), bench.steps, bench.top)
