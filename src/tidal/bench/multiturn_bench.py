"""Multi-turn rollout speed: the engine's prefix cache vs prefilling every turn's whole context.

    tidal bench multiturn --json multiturn.json                       # random tiny model, ~1-2 min
    tidal bench multiturn --init-model .cache/tidal/horizon/KEY/model  # a mid-trained ledger model

The same ledger episodes (``episodes`` at once on one engine, summarize mode, the horizon
benchmark's tasks and harness: episodes at least 10.5 windows long) are rolled out twice on the same weights and seed: ``engine.prefix_cache``
off (every turn prefills its whole context again, as an engine without a prefix cache does) and
on. Printed: rollout wall time, tokens prefilled and served from the cache, and the speedup.
The cache changes no logprob in deterministic numerics, but tools run in threads, so requests
may reach the engine in another order and sample differently: the printed turns and model
tokens say how alike the two runs' work was.

A random model writes no valid tool call: its turns run to the turn limit and each observation is
an error message, which still makes contexts grow turn by turn and reset at the window, the
workload the cache is for. A mid-trained model (``--init-model``) plays real episodes.
"""

from __future__ import annotations

import argparse
import time

import torch

from tidal.bench.common import write_json


def rollout(model, window: int, episodes: int, prefix_cache: bool, numerics: str) -> dict:
    """One rollout of ``episodes`` ledger episodes; its wall time and the engine's prefill counts."""
    from tidal.bench.horizon_bench import HorizonBenchConfig, WindowSetup
    from tidal.engine.config import EngineConfig
    from tidal.engine.engine import Engine
    from tidal.envs.ledger.environment import load_environment
    from tidal.harness import run_episodes
    from tidal.model.tokenizer import ByteTokenizer
    from tidal.sandbox import Sandbox
    from tidal.sandbox.config import SandboxConfig

    cfg = EngineConfig(max_seq_len=window, max_batch_size=2 * episodes, max_new_tokens=96,
                       temperature=1.0, seed=0, prefix_cache=prefix_cache, numerics=numerics)
    engine = Engine(model, ByteTokenizer(), cfg)
    setup = WindowSetup(window, HorizonBenchConfig(windows=[window]))  # episodes >= 10.5 windows
    spec = load_environment(Sandbox(SandboxConfig()), setup.ledger)
    tasks = spec.sample_tasks(episodes, 0, False)
    harness = setup.harness("summarize")
    start = time.perf_counter()
    trajs, _ = run_episodes(engine, spec, tasks, harness)
    return {"rollout_s": time.perf_counter() - start,
            "prefill_tokens": engine.prefill_tokens, "cached_tokens": engine.cached_tokens,
            "model_tokens": sum(t.episode.model_tokens for t in trajs),
            "turns": sum(t.episode.turns for t in trajs)}


def run_multiturn_bench(window: int, episodes: int, init_model: str | None, numerics: str,
                        threads: int) -> dict:
    from tidal.model import from_pretrained
    from tidal.model.presets import preset
    from tidal.model.qwen3 import build_model
    from tidal.pretrain.loop import torch_threads

    with torch_threads(threads):
        if init_model:
            model = from_pretrained(init_model, dtype=torch.float32).eval()
        else:
            cfg = preset("tiny").model_copy(update={"max_position_embeddings": window})
            model = build_model(cfg, seed=0).eval()
        off = rollout(model, window, episodes, False, numerics)
        on = rollout(model, window, episodes, True, numerics)
    result = {"window": window, "episodes": episodes, "model": init_model or "random tiny",
              "numerics": numerics, "no_prefix_cache": off, "prefix_cache": on,
              "speedup": off["rollout_s"] / on["rollout_s"],
              "prefill_reduction": off["prefill_tokens"] / max(on["prefill_tokens"], 1)}
    print(f"{episodes} ledger episodes at window {window} ({result['model']}, {numerics} numerics):")
    for name, r in (("no prefix cache", off), ("prefix cache", on)):
        print(f"  {name:>15}: {r['rollout_s']:6.1f} s, {r['prefill_tokens']:>8,} tokens prefilled, "
              f"{r['cached_tokens']:>8,} from the cache, {r['turns']} turns")
    print(f"  speedup {result['speedup']:.2f}x, prefill {result['prefill_reduction']:.1f}x smaller")
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--window", type=int, default=384, help="context window, tokens")
    parser.add_argument("--episodes", type=int, default=16, help="episodes rolled out at once")
    parser.add_argument("--init-model", help="a model folder (default: a random tiny model)")
    parser.add_argument("--numerics", choices=["deterministic", "fast"], default="deterministic")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")


def run_from_args(args) -> int:
    result = run_multiturn_bench(args.window, args.episodes, args.init_model, args.numerics,
                                 args.threads)
    if args.json:
        write_json(args.json, result)
    return 0
