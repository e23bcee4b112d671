"""Multi-turn rollout speed: the engine's prefix cache vs prefilling every turn's whole context.

    tidal bench multiturn --json multiturn.json                               # random model, ~1-2 min
    tidal bench multiturn --model.init_from .cache/tidal/pretrained/horizon-KEY/model  # mid-trained
    tidal bench multiturn --engine.temperature 0 --bench.episodes 4          # greedy: identical runs

The same ledger episodes (``episodes`` at once on one engine, summarize mode, tasks sized by
tidal.families.ledger.sizing as the horizon benchmark sizes them: the expert's episodes at least
``horizon`` windows long, with the family's harness and budgets) are rolled out twice on the same
weights: ``engine.prefix_cache`` off (every turn prefills its whole context again, as an engine
without a prefix cache does) and on. Printed: rollout wall time, tokens prefilled and served from
the cache, and the speedup.

The engine is the run config's ``[engine]`` (numerics, sampling, batch slots...) with
``max_seq_len`` = the window; the model is ``[model]`` initialised with the run's seed, or the
checkpoint ``model.init_from`` names. The cache changes no logprob in deterministic numerics, but
tools run in threads, so requests may reach the engine in another order and, sampled, draw other
tokens: ``same_episodes`` says whether both runs generated exactly the same tokens, and the
printed turns and model tokens how alike their work was. Greedy (``engine.temperature 0``) in
deterministic numerics makes the two runs identical, so then ``prefill_tokens`` without the cache
is exactly ``prefill_tokens + cached_tokens`` with it.

A random model writes no valid tool call: its turns run to the turn limit and each observation is
an error message, which still makes contexts grow turn by turn and reset at the window, the
workload the cache is for. A mid-trained model plays real episodes.
"""

from __future__ import annotations

import sys
import time

import torch
from pydantic import Field

from tidal.bench.common import write_json
from tidal.bench.config import (
    SEED_KEY,
    THREADS_KEY,
    config_record,
    main,
    run_seed,
    torch_threads,
    with_keys,
)
from tidal.config import TidalConfig
from tidal.families.ledger.sizing import HORIZON
from tidal.config_section import Section

READS = ("model", "engine", "env.sandbox", SEED_KEY, THREADS_KEY)
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""
DEFAULTS = {THREADS_KEY: 2}
"""Two torch threads for the engine (the rollout's only compute), as measured in docs/results."""


class BenchSection(Section):
    """The ledger tasks at one window and how many episodes run at once. The engine is the run
    config's [engine] with max_seq_len = window and prefix_cache off, then on; the model [model]
    (model.init_from: a checkpoint instead of a random model); torch threads THREADS_KEY."""

    window: int = Field(384, ge=320)
    """Context window, tokens (the harness's and the engine's max_seq_len)."""
    episodes: int = Field(16, ge=1)
    """Episodes rolled out at once (training-split tasks drawn with the run's seed)."""
    horizon: float = Field(HORIZON, gt=1.0)
    """The expert's episode is at least this many windows long (sets the files per task)."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    result = run_multiturn_bench(bench, cfg)
    if json_path:
        write_json(json_path, result)
    return 0


def load_model(cfg: TidalConfig):
    """``model.init_from``'s checkpoint, else a fresh ``[model]`` with the run's seed; in
    model.dtype, eval mode."""
    from tidal.model import build_model, from_pretrained

    dtype = getattr(torch, cfg.model.dtype)
    if cfg.model.init_from:
        return from_pretrained(cfg.model.init_from, dtype=dtype).eval()
    return build_model(cfg.model, seed=run_seed(cfg)).to(dtype).eval()


def rollout(model, tokenizer, cfg: TidalConfig, lw, episodes: int, prefix_cache: bool) -> dict:
    """One rollout of ``episodes`` ledger episodes; its wall time, the engine's prefill counts
    and what the episodes generated."""
    from tidal.engine.engine import Engine
    from tidal.families.ledger import load_environment
    from tidal.harness import run_episodes
    from tidal.sandbox import Sandbox

    # the peer prefills every prompt in full: no parked caches and no prompt shared in a wave
    engine_cfg = with_keys(cfg, {"engine.prefix_cache": prefix_cache,
                                 "engine.share_prompts": prefix_cache}).engine
    engine = Engine(model, tokenizer, engine_cfg)
    spec = load_environment(Sandbox(cfg.env.sandbox), lw.ledger)
    tasks = spec.sample_tasks(episodes, run_seed(cfg), False)
    start = time.perf_counter()
    trajs, _ = run_episodes(engine, spec, tasks, lw.harness("summarize"))
    return {"rollout_s": time.perf_counter() - start,
            "prefill_tokens": engine.prefill_tokens, "cached_tokens": engine.cached_tokens,
            "episodes": len(trajs),
            "model_tokens": sum(t.episode.model_tokens for t in trajs),
            "turns": sum(t.episode.turns for t in trajs),
            "resets": sum(t.episode.resets for t in trajs),
            "_tokens": [[s.completion_ids for s in t.segments] for t in trajs]}


def run_multiturn_bench(bench: BenchSection, cfg: TidalConfig) -> dict:
    """Both rollouts; print them; the result dict."""
    from tidal.families.ledger.sizing import ledger_window
    from tidal.model import load_tokenizer

    keys = {"engine.max_seq_len": bench.window}
    if "max_position_embeddings" not in cfg.model.model_fields_set and not cfg.model.init_from:
        keys["model.max_position_embeddings"] = bench.window
    cfg = with_keys(cfg, keys)
    lw = ledger_window(bench.window, bench.horizon)
    tokenizer = load_tokenizer(cfg.model.init_from)
    before = torch.get_num_threads()
    if torch_threads(cfg):
        torch.set_num_threads(torch_threads(cfg))
    try:
        model = load_model(cfg)
        off = rollout(model, tokenizer, cfg, lw, bench.episodes, False)
        on = rollout(model, tokenizer, cfg, lw, bench.episodes, True)
    finally:
        torch.set_num_threads(before)
    same = off.pop("_tokens") == on.pop("_tokens")
    result = {"window": bench.window, "episodes": bench.episodes, "num_files": lw.ledger.num_files,
              "model": cfg.model.init_from or "random", "numerics": cfg.engine.numerics,
              "no_prefix_cache": off, "prefix_cache": on, "same_episodes": same,
              "speedup": off["rollout_s"] / on["rollout_s"],
              "prefill_reduction": off["prefill_tokens"] / max(on["prefill_tokens"], 1),
              "config": config_record(bench, cfg, READS)}
    print_result(result)
    return result


def print_result(r: dict) -> None:
    print(f"{r['episodes']} ledger episodes at window {r['window']} ({r['model']} model, "
          f"{r['numerics']} numerics):")
    for name, x in (("no prefix cache", r["no_prefix_cache"]), ("prefix cache", r["prefix_cache"])):
        print(f"  {name:>15}: {x['rollout_s']:6.1f} s, {x['prefill_tokens']:>8,} tokens prefilled, "
              f"{x['cached_tokens']:>8,} from the cache, {x['turns']} turns, {x['model_tokens']:,} "
              "model tokens")
    print(f"  speedup {r['speedup']:.2f}x, prefill {r['prefill_reduction']:.1f}x smaller; "
          f"{'the same' if r['same_episodes'] else 'not the same'} tokens generated in both runs")


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "multiturn"))
