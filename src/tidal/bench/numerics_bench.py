"""Engine-vs-trainer numerics: deterministic mode against the fast mode, side by side.

    tidal bench numerics --json numerics.json           # ~10k generated tokens per model and mode
    python -m tidal.bench.numerics_bench --rounds 1,2,4 --new-tokens 16   # a quick look

For the tiny dense and tiny MoE presets (fp32, fixed seed), each mode (``engine.numerics`` fast |
deterministic) samples the same prompts at temperature 1 in rounds of mixed batch sizes (1..64
sequences submitted together), then the real ``Trainer`` recomputes every sampled token's
logprob in its training forward (``accumulate_gradients``, same weights, version 0) and reports
the mismatch (tidal.numerics.metrics): bitwise-equal fraction, mean/max |Δ logprob|, k3 KL, and
for MoE routing flips, with router replay (``required``) and without (``off``).

Throughput: engine generated tokens/s per mode, timed over the same rounds; the modes alternate
run by run (the machine is shared and noisy) and the median of ``--runs`` is kept.
``throughput_ratio`` = deterministic tokens/s / fast tokens/s. One torch thread (see
engine_bench.py for why).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from tidal.bench.common import write_json  # noqa: E402
from tidal.engine.config import EngineConfig  # noqa: E402
from tidal.engine.engine import Engine  # noqa: E402
from tidal.engine.request import GenerationRequest, GenerationResult  # noqa: E402
from tidal.model.presets import preset as model_preset  # noqa: E402
from tidal.model.qwen3 import build_model  # noqa: E402
from tidal.model.tokenizer import ByteTokenizer  # noqa: E402
from tidal.trainer.config import TrainerConfig  # noqa: E402
from tidal.trainer.grpo import collate  # noqa: E402
from tidal.trainer.trainer import Trainer  # noqa: E402
from tidal.types import Segment, Trajectory  # noqa: E402

MODES = ("fast", "deterministic")
MODELS = {"dense": "tiny", "moe": "tiny-moe"}
DEFAULT_ROUNDS = (1, 2, 4, 8, 16, 32, 64)
"""Batch sizes, one round each: 127 sequences; x 80 new tokens = 10,160 generated tokens."""
MISMATCH_KEYS = ("bitwise_equal_fraction", "mean_abs_logprob_diff", "max_abs_logprob_diff", "kl_k3")


def _requests(rounds, new_tokens: int, seed: int) -> list[list[GenerationRequest]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for size in rounds:
        lengths = torch.randint(4, 33, (size,), generator=g).tolist()
        out.append([
            GenerationRequest(prompt_ids=torch.randint(0, 256, (n,), generator=g).tolist(),
                              max_new_tokens=new_tokens, ignore_eos=True, stop=[], temperature=1.0)
            for n in lengths
        ])
    return out


def _generate(model, mode: str, rounds_requests, seed: int) -> tuple[list[GenerationResult], float]:
    """All rounds on a fresh engine; returns the results and the generation seconds."""
    longest = max(len(r.prompt_ids) for rs in rounds_requests for r in rs)
    new = rounds_requests[0][0].max_new_tokens
    cfg = EngineConfig(numerics=mode, max_batch_size=64, max_new_tokens=new,
                       max_seq_len=longest + new + 1, seed=seed)
    engine = Engine(model, ByteTokenizer(), cfg)
    results, seconds = [], 0.0
    for requests in rounds_requests:
        start = time.perf_counter()
        results += engine.generate(requests)
        seconds += time.perf_counter() - start
    return results, seconds


def _trainer_mismatch(model, results, mode: str, replay: str) -> dict:
    """The trainer's recomputation of every sampled token (one accumulate_gradients pass)."""
    trajectories = [
        Trajectory(task_id=str(i), group_id=i, reward=float(i % 2), segments=[Segment(
            prompt_ids=r.prompt_ids, completion_ids=r.token_ids, logprobs=r.logprobs,
            versions=r.versions, loss_mask=[1] * len(r.token_ids), experts=r.experts,
            prompt_experts=r.prompt_experts)])
        for i, r in enumerate(results)
    ]
    trainer = Trainer(model, TrainerConfig(router_replay=replay, micro_batch_size=32),
                      temperature=1.0, numerics=mode)
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


def _bench_model(kind: str, rounds, new_tokens: int, runs: int, seed: int) -> dict:
    model = build_model(model_preset(MODELS[kind]), seed=seed)
    requests = _requests(rounds, new_tokens, seed)
    tokens_per_s: dict[str, list[float]] = {m: [] for m in MODES}
    results: dict[str, list[GenerationResult]] = {}
    _generate(model, "deterministic", [requests[0]], seed)  # warm-up: builds both weight copies
    _generate(model, "fast", [requests[0]], seed)
    for _ in range(runs):
        for mode in MODES:
            res, seconds = _generate(model, mode, requests, seed)
            tokens_per_s[mode].append(sum(len(r.token_ids) for r in res) / seconds)
            results[mode] = res
    out: dict[str, dict] = {}
    for mode in MODES:
        row = {"engine_tokens_per_s": statistics.median(tokens_per_s[mode]),
               "generated_tokens": sum(len(r.token_ids) for r in results[mode])}
        if kind == "moe":
            replayed = _trainer_mismatch(model, results[mode], mode, "required")
            own = _trainer_mismatch(model, results[mode], mode, "off")
            row |= {k: replayed[k] for k in MISMATCH_KEYS}
            row |= {"replay_flip_rate": replayed["trained_flip_rate"],
                    "no_replay_flip_rate": own["trained_flip_rate"],
                    "no_replay_flip_rate_per_layer": own["router_flip_rate_per_layer"],
                    "no_replay_tokens_with_flip_fraction": own["tokens_with_flip_fraction"],
                    "no_replay_kl_k3": own["kl_k3"],
                    "no_replay_bitwise_equal_fraction": own["bitwise_equal_fraction"],
                    "no_replay_max_abs_logprob_diff": own["max_abs_logprob_diff"]}
        else:
            row |= {k: v for k, v in _trainer_mismatch(model, results[mode], mode, "off").items()
                    if k in MISMATCH_KEYS}
        out[mode] = row
    out["deterministic"]["throughput_ratio"] = (
        out["deterministic"]["engine_tokens_per_s"] / out["fast"]["engine_tokens_per_s"])
    return out


def run_numerics_bench(rounds=DEFAULT_ROUNDS, new_tokens: int = 80, runs: int = 3, seed: int = 0,
                       json_path=None) -> dict:
    torch.set_num_threads(1)
    per_model = {kind: _bench_model(kind, rounds, new_tokens, runs, seed) for kind in MODELS}
    result = {kind: per_model[kind]["deterministic"] for kind in MODELS}
    result["fast"] = {kind: per_model[kind]["fast"] for kind in MODELS}
    result["setup"] = {"batch_sizes": list(rounds), "new_tokens": new_tokens, "runs": runs,
                       "threads": 1, "torch": torch.__version__, "presets": MODELS,
                       "peer": "engine.numerics = fast (the fused serving path)"}
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", default=",".join(map(str, DEFAULT_ROUNDS)),
                        help="batch sizes, one round each (comma-separated, each 1..64)")
    parser.add_argument("--new-tokens", type=int, default=80, help="tokens generated per sequence")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per mode (median kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_path", default=None, help="write the result here")


def run_from_args(args) -> int:
    rounds = tuple(int(x) for x in args.rounds.split(","))
    if not all(1 <= r <= 64 for r in rounds):
        raise SystemExit(f"--rounds: every batch size must be in 1..64, got {args.rounds}")
    run_numerics_bench(rounds, args.new_tokens, args.runs, args.seed, args.json_path)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    add_arguments(p)
    raise SystemExit(run_from_args(p.parse_args()))
