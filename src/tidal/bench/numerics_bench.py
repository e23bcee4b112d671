"""Engine-vs-trainer numerics: deterministic mode against the fast mode, side by side.

    tidal bench numerics --json numerics.json           # ~10k generated tokens per model and mode
    python -m tidal.bench.numerics_bench --bench.rounds 1,2,4 --bench.new_tokens 16   # a quick look

For the tiny dense and tiny MoE presets (the run's seed; model keys given, such as
``--model.num_hidden_layers 2``, apply to both), each mode (``engine.numerics`` fast |
deterministic: both run, whatever the run config says) samples the same prompts at
``engine.temperature`` (1 by default) in rounds of mixed batch sizes (1..64
sequences submitted together), then the real ``Trainer`` recomputes every sampled token's
logprob in its training forward (``accumulate_gradients``, same weights, version 0) and reports
the mismatch (tidal.numerics.metrics): bitwise-equal fraction, mean/max |Δ logprob|, k3 KL, and
for MoE routing flips, with router replay (``required``) and without (``off``).

Throughput: engine generated tokens/s per mode, timed over the same rounds; the modes alternate
run by run (the machine is shared and noisy) and the median of ``runs`` is kept.
``throughput_ratio`` = deterministic tokens/s / fast tokens/s. torch threads:
``run.worker_threads`` (1 by default; see engine_bench.py for why).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from pydantic import Field, field_validator  # noqa: E402

from tidal.bench.common import write_json  # noqa: E402
from tidal.bench.config import (  # noqa: E402
    SEED_KEY,
    THREADS_KEY,
    IntList,
    config_record,
    main,
    run_seed,
    torch_threads,
    with_preset,
)
from tidal.config import TidalConfig  # noqa: E402
from tidal.engine.config import EngineConfig  # noqa: E402
from tidal.engine.engine import Engine  # noqa: E402
from tidal.engine.request import GenerationRequest, GenerationResult  # noqa: E402
from tidal.model.qwen3 import build_model  # noqa: E402
from tidal.model.tokenizer import ByteTokenizer  # noqa: E402
from tidal.config_section import Section  # noqa: E402
from tidal.trainer.config import TrainerConfig  # noqa: E402
from tidal.trainer.grpo import collate  # noqa: E402
from tidal.trainer.trainer import Trainer  # noqa: E402
from tidal.trajectory import Segment, Trajectory  # noqa: E402

MODES = ("fast", "deterministic")
MODELS = {"dense": "tiny", "moe": "tiny-moe"}
MAX_BATCH = 64
"""The engine's batch slots: the largest round."""
MISMATCH_KEYS = ("bitwise_equal_fraction", "mean_abs_logprob_diff", "max_abs_logprob_diff", "kl_k3")
READS = ("model", "engine.temperature", "engine.top_p", "engine.seed", "engine.max_prefill_tokens",
         "engine.prefix_cache", "trainer.dtype", SEED_KEY, THREADS_KEY)
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""


class BenchSection(Section):
    """Both engine.numerics modes run (that is the comparison); the engine takes the run config's
    temperature, top_p, sampler seed, prefill limit and prefix cache, with 64 batch slots and
    exactly new_tokens per sequence; the trainer computes in trainer.dtype (micro-batches of 32,
    router replay required and off). Models: the tiny and tiny-moe presets with the [model] keys
    given on top, initialised with the run's seed (run.seed), which also draws the
    prompts; torch threads: run.worker_threads."""

    rounds: IntList = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])
    """Batch sizes, one round each (each 1..64): by default 127 sequences; x 80 new tokens =
    10,160 generated tokens per model and mode."""
    new_tokens: int = Field(80, ge=1)
    """Tokens generated per sequence (eos ignored)."""
    runs: int = Field(3, ge=1)
    """Timed runs per mode, the modes alternating; the median is kept."""

    @field_validator("rounds")
    @classmethod
    def _check_rounds(cls, rounds: list[int]) -> list[int]:
        if not rounds or not all(1 <= r <= MAX_BATCH for r in rounds):
            raise ValueError(f"every batch size must be in 1..{MAX_BATCH}, got {rounds}")
        return rounds


def _requests(rounds, new_tokens: int, seed: int, temperature: float) -> list[list[GenerationRequest]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for size in rounds:
        lengths = torch.randint(4, 33, (size,), generator=g).tolist()
        out.append([
            GenerationRequest(prompt_ids=torch.randint(0, 256, (n,), generator=g).tolist(),
                              max_new_tokens=new_tokens, ignore_eos=True, stop=[], temperature=temperature)
            for n in lengths
        ])
    return out


def _generate(model, mode: str, rounds_requests, cfg: TidalConfig) -> tuple[list[GenerationResult], float]:
    """All rounds on a fresh engine; returns the results and the generation seconds."""
    longest = max(len(r.prompt_ids) for rs in rounds_requests for r in rs)
    new = rounds_requests[0][0].max_new_tokens
    e = cfg.engine
    engine_cfg = EngineConfig(numerics=mode, max_batch_size=MAX_BATCH, max_new_tokens=new,
                              max_seq_len=longest + new + 1, temperature=e.temperature, top_p=e.top_p,
                              seed=e.seed, max_prefill_tokens=e.max_prefill_tokens,
                              prefix_cache=e.prefix_cache)
    engine = Engine(model, ByteTokenizer(), engine_cfg)
    results, seconds = [], 0.0
    for requests in rounds_requests:
        start = time.perf_counter()
        results += engine.generate(requests)
        seconds += time.perf_counter() - start
    return results, seconds


def _trainer_mismatch(model, results, mode: str, replay: str, cfg: TidalConfig) -> dict:
    """The trainer's recomputation of every sampled token (one accumulate_gradients pass)."""
    trajectories = [
        Trajectory(task_id=str(i), group_id=i, reward=float(i % 2), segments=[Segment(
            prompt_ids=r.prompt_ids, completion_ids=r.token_ids, logprobs=r.logprobs,
            versions=r.versions, loss_mask=[1] * len(r.token_ids), experts=r.experts,
            prompt_experts=r.prompt_experts)])
        for i, r in enumerate(results)
    ]
    trainer_cfg = TrainerConfig(router_replay=replay, micro_batch_size=32, dtype=cfg.trainer.dtype)
    trainer = Trainer(model, trainer_cfg, temperature=cfg.engine.temperature, numerics=mode)
    totals = trainer.accumulate_gradients(collate(trajectories, pad_id=0, normalize_std=True))
    for p in model.parameters():
        p.grad = None
    out = {k: getattr(totals.mismatch, k) for k in MISMATCH_KEYS}
    out["tokens"] = int(totals.mismatch.tokens)
    if totals.routing is not None:
        out["router_flip_rate"] = totals.routing.flip_rate
        out["router_flip_rate_per_layer"] = totals.routing.flip_rate_per_layer
        out["tokens_with_flip_fraction"] = totals.routing.tokens_with_flip_fraction
        out["trained_flip_rate"] = totals.routing.trained_flip_rate
    return out


def _bench_model(kind: str, bench: BenchSection, cfg: TidalConfig) -> dict:
    seed = run_seed(cfg)
    model = build_model(cfg.model, seed=seed)
    requests = _requests(bench.rounds, bench.new_tokens, seed, cfg.engine.temperature)
    tokens_per_s: dict[str, list[float]] = {m: [] for m in MODES}
    results: dict[str, list[GenerationResult]] = {}
    _generate(model, "deterministic", [requests[0]], cfg)  # warm-up: builds both weight copies
    _generate(model, "fast", [requests[0]], cfg)
    for _ in range(bench.runs):
        for mode in MODES:
            res, seconds = _generate(model, mode, requests, cfg)
            tokens_per_s[mode].append(sum(len(r.token_ids) for r in res) / seconds)
            results[mode] = res
    out: dict[str, dict] = {}
    for mode in MODES:
        row = {"engine_tokens_per_s": statistics.median(tokens_per_s[mode]),
               "generated_tokens": sum(len(r.token_ids) for r in results[mode])}
        if kind == "moe":
            replayed = _trainer_mismatch(model, results[mode], mode, "required", cfg)
            own = _trainer_mismatch(model, results[mode], mode, "off", cfg)
            row |= {k: replayed[k] for k in MISMATCH_KEYS}
            row |= {"replay_flip_rate": replayed["trained_flip_rate"],
                    "no_replay_flip_rate": own["trained_flip_rate"],
                    "no_replay_flip_rate_per_layer": own["router_flip_rate_per_layer"],
                    "no_replay_tokens_with_flip_fraction": own["tokens_with_flip_fraction"],
                    "no_replay_kl_k3": own["kl_k3"],
                    "no_replay_bitwise_equal_fraction": own["bitwise_equal_fraction"],
                    "no_replay_max_abs_logprob_diff": own["max_abs_logprob_diff"]}
        else:
            row |= {k: v for k, v in _trainer_mismatch(model, results[mode], mode, "off", cfg).items()
                    if k in MISMATCH_KEYS}
        out[mode] = row
    out["deterministic"]["throughput_ratio"] = (
        out["deterministic"]["engine_tokens_per_s"] / out["fast"]["engine_tokens_per_s"])
    return out


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    run_numerics_bench(bench, cfg, json_path)
    return 0


def run_numerics_bench(bench: BenchSection, cfg: TidalConfig, json_path: str | None = None) -> dict:
    """Both models, both modes; print the table; return (and optionally write) the result.
    torch's thread count is restored afterwards."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads(cfg) or previous_threads)
    try:
        configs = {kind: with_preset(cfg, name) for kind, name in MODELS.items()}
        per_model = {kind: _bench_model(kind, bench, configs[kind]) for kind in MODELS}
        threads = torch.get_num_threads()
    finally:
        torch.set_num_threads(previous_threads)
    result = {kind: per_model[kind]["deterministic"] for kind in MODELS}
    result["fast"] = {kind: per_model[kind]["fast"] for kind in MODELS}
    result["setup"] = {"batch_sizes": list(bench.rounds), "new_tokens": bench.new_tokens,
                       "runs": bench.runs, "threads": threads, "torch": torch.__version__,
                       "presets": MODELS, "peer": "engine.numerics = fast (the fused serving path)",
                       "models": {kind: c.model.model_dump(mode="json") for kind, c in configs.items()}}
    result["config"] = config_record(bench, cfg, READS)
    _print_table(result)
    if json_path:
        write_json(json_path, result)
    return result


def _print_table(result: dict) -> None:
    print(f"{'model':<6} {'mode':<14} {'tok/s':>8} {'bitwise':>8} {'max|Δ|':>10} {'KL k3':>10}"
          f" {'flips replay':>13} {'flips own':>10}")
    for kind in MODELS:
        for mode, row in (("fast", result["fast"][kind]), ("deterministic", result[kind])):
            print(f"{kind:<6} {mode:<14} {row['engine_tokens_per_s']:8.0f} "
                  f"{row['bitwise_equal_fraction']:8.4f} {row['max_abs_logprob_diff']:10.2e} "
                  f"{row['kl_k3']:10.2e} {row.get('replay_flip_rate', float('nan')):13.4f} "
                  f"{row.get('no_replay_flip_rate', float('nan')):10.4f}")
        print(f"{kind:<6} throughput ratio (deterministic / fast): {result[kind]['throughput_ratio']:.3f}")


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "numerics"))
