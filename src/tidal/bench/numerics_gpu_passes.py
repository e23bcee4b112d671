"""The measurements of the numerics-gpu benchmark (numerics_gpu.py runs them as guarded
sections and reports): the workloads, the engine's waves (prefill + KV-cache decode, timed), the
trainer's passes over them without and with router replay, and their mismatch metrics.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from dataclasses import dataclass

import torch

from tidal.model import CausalLM, KVCache, ModelConfig, build_model
from tidal.numerics.metrics import mismatch_metrics, routing_flip_metrics

SIZES = {"tiny": "numerics-gpu-tiny", "smoke": "numerics-gpu-smoke", "1b": "numerics-gpu-1b"}
"""bench.size -> the model preset (tidal.model.presets) the run config's [model] starts from."""


@dataclass(frozen=True)
class Workload:
    """Which sequences the engine generates: one wave per batch size."""

    wave_sizes: tuple[int, ...]
    prompt_len: tuple[int, int]
    """Inclusive range of prompt lengths (tokens), drawn uniformly per sequence."""
    gen_len: tuple[int, int]
    """Inclusive range of generated tokens per sequence."""


WORKLOADS = {
    "tiny": Workload((8, 5, 3, 1), (3, 12), (6, 20)),
    "smoke": Workload((9, 4, 1), (5, 70), (5, 70)),
    # ~15,000 generated tokens; decode batches shrink from 64 to 1 inside the first wave.
    "1b": Workload((64, 48, 24, 12, 6, 3, 1), (16, 128), (64, 128)),
    # The Triton op set in Triton's interpreter (~1-4 s per decode step of the tiny model).
    "interpreted": Workload((2, 1), (3, 6), (3, 6)),
}


@dataclass
class Wave:
    """One wave's rollouts (device tensors) and host-side lengths."""

    seqs: torch.Tensor          # [B, L] token ids (prompt then generated)
    logprobs: torch.Tensor      # [B, L] engine logprob of the token at that index (generated only)
    experts: torch.Tensor       # [B, L, layers, k] experts chosen when that token was processed
    prompt_lens: list[int]
    total_lens: list[int]


def make_prompts(workload: Workload, vocab: int, seed: int) -> list[tuple[list[list[int]], list[int]]]:
    """Per wave: prompts and generation lengths (sorted longest first), same for every mode."""
    rng = random.Random(seed)
    waves = []
    for size in workload.wave_sizes:
        prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*workload.prompt_len))]
                   for _ in range(size)]
        gen = sorted((rng.randint(*workload.gen_len) for _ in range(size)), reverse=True)
        waves.append((prompts, gen))
    return waves


def sample(logprobs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Gumbel-max sampling at temperature 1: argmax(logp - log E), E ~ Exp(1)."""
    noise = torch.empty_like(logprobs).exponential_(generator=gen).log()
    return (logprobs - noise).argmax(-1)


def log_softmax_of(model: CausalLM, mode: str):
    """The sampling logprob that goes with ``mode``'s op set, the same for engine and trainer:
    the op set's own where it has one (TritonOps: one program per row), else torch's."""
    ops = model.fused_weights(mode, model.model.embed_tokens.weight.dtype).ops
    return getattr(ops, "log_softmax", None) or (lambda x: torch.log_softmax(x.float(), -1))


def generate_wave(model: CausalLM, mode: str, prompts, gen_lens, gen, sync) -> tuple[Wave, float, float]:
    """Prefill + KV-cache decode of one wave -> (rollouts, prefill seconds, decode seconds)."""
    cfg = model.config
    device = model.lm_head.weight.device
    det = mode == "deterministic"
    log_softmax = log_softmax_of(model, mode)
    b = len(prompts)
    plens = [len(p) for p in prompts]
    totals = [p + g for p, g in zip(plens, gen_lens)]
    width = max(totals)
    seqs = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        seqs[i, : len(p)] = torch.tensor(p)
    seqs = seqs.to(device)
    lps = torch.zeros((b, width), dtype=torch.float32, device=device)
    experts = torch.zeros((b, width, cfg.num_hidden_layers, cfg.num_experts_per_tok),
                          dtype=torch.long, device=device)
    cache = KVCache.for_model(cfg, b, width, device=device)
    rows = torch.arange(b, device=device)
    plens_dev = torch.tensor(plens, device=device)
    longest = max(plens)
    columns = torch.arange(longest, device=device)
    positions = torch.where(columns < plens_dev[:, None], columns, -1)  # right padding: -1
    sync()
    t0 = time.perf_counter()
    logits, ids = model(seqs[:, :longest], positions=positions, cache=cache, slots=range(b),
                        logits_at=plens_dev - 1, deterministic=det, return_experts=True)
    experts[:, :longest] = ids  # padding columns: overwritten by decode before they are read
    _record(log_softmax(logits), rows, plens_dev, seqs, lps, gen)
    sync()
    t1 = time.perf_counter()
    for step in range(1, max(gen_lens)):
        n = sum(g > step for g in gen_lens)  # longest first: the active sequences are 0..n-1
        slot = rows[:n]
        pos = plens_dev[:n] + (step - 1)
        logits, ids = model(seqs[slot, pos][:, None], positions=pos[:, None], cache=cache,
                            slots=range(n), deterministic=det, return_experts=True)
        experts[slot, pos] = ids[:, 0]
        _record(log_softmax(logits[:, 0]), slot, pos + 1, seqs, lps, gen)
    sync()
    return Wave(seqs, lps, experts, plens, totals), t1 - t0, time.perf_counter() - t1


def _record(logprobs, slot, pos, seqs, lps, gen) -> None:
    """Sample the next token of each row and store it and its logprob at (slot, pos)."""
    token = sample(logprobs, gen)
    seqs[slot, pos] = token
    lps[slot, pos] = logprobs.gather(-1, token[:, None])[:, 0]


def trainer_pass(model: CausalLM, mode: str, wave: Wave, replay: bool):
    """Full-sequence forward of a wave's sequences (right-padded, no cache) -> (engine lp,
    trainer lp [G] over generated tokens; engine, trainer experts [P, layers, k] over processed
    tokens)."""
    device = wave.seqs.device
    processed = [t - 1 for t in wave.total_lens]  # the last token is never fed
    width = max(processed)
    with _fast_attention(mode, device):
        logits, ids = model(wave.seqs[:, :width], deterministic=mode == "deterministic",
                            replay_experts=wave.experts[:, :width] if replay else None,
                            return_experts=True)
    # processed tokens (p < processed) and the rows predicting generated ones (plen-1 .. n-1)
    tok_row, tok_col = _cells([(i, 0, n) for i, n in enumerate(processed)], device)
    gen_row, gen_col = _cells([(i, p - 1, n) for i, (p, n) in
                               enumerate(zip(wave.prompt_lens, processed))], device)
    targets = wave.seqs[gen_row, gen_col + 1]
    trainer_lp = log_softmax_of(model, mode)(logits[gen_row, gen_col])
    trainer_lp = trainer_lp.gather(-1, targets[:, None])[:, 0]
    return (wave.logprobs[gen_row, gen_col + 1], trainer_lp, wave.experts[tok_row, tok_col],
            ids[tok_row, tok_col])


def _cells(spans, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, start, stop) spans -> row and column indices of every cell in them."""
    rows = torch.cat([torch.full((stop - start,), row) for row, start, stop in spans])
    cols = torch.cat([torch.arange(start, stop) for _, start, stop in spans])
    return rows.to(device), cols.to(device)


def _fast_attention(mode: str, device: torch.device):
    """The fast trainer (the module forward) on the fast op set's SDPA backends (no cuDNN)."""
    if mode != "fast" or device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    from tidal.kernels.fast_ops import FAST_BACKENDS

    return sdpa_kernel(FAST_BACKENDS)


def engine_round(model: CausalLM, mode: str, waves_spec, seed: int, sync) -> tuple[list[Wave], dict]:
    """Every wave of the workload, timed (the sampler seeded afresh, so every round and mode
    samples from the same noise) -> (rollouts, {prefill_s, decode_s})."""
    gen = torch.Generator(device=model.lm_head.weight.device).manual_seed(seed)
    waves, prefill_s, decode_s = [], 0.0, 0.0
    for prompts, gen_lens in waves_spec:
        wave, p, d = generate_wave(model, mode, prompts, gen_lens, gen, sync)
        waves.append(wave)
        prefill_s, decode_s = prefill_s + p, decode_s + d
    return waves, {"prefill_s": prefill_s, "decode_s": decode_s}


def record_engine(out: dict, waves: list[Wave], rounds: list[dict], mode: str) -> None:
    """Tokens/s from the median round (of engine time; its decode time is its own median)."""
    generated = sum(t - p for w in waves for t, p in zip(w.total_lens, w.prompt_lens))
    decoded = generated - sum(len(w.total_lens) for w in waves)  # the first token comes from prefill
    engine_s = statistics.median(r["prefill_s"] + r["decode_s"] for r in rounds)
    decode_s = statistics.median(r["decode_s"] for r in rounds)
    out.update(generated_tokens=generated, rounds=rounds, prefill_s=engine_s - decode_s,
               decode_s=decode_s, engine_tokens_per_s=generated / engine_s,
               decode_tokens_per_s=decoded / decode_s if decode_s else 0.0)
    each = ", ".join(f"{generated / (r['prefill_s'] + r['decode_s']):.0f}" for r in rounds)
    print(f"[{mode}] engine: {generated} tokens, median {engine_s:.2f} s of {len(rounds)} rounds "
          f"({out['engine_tokens_per_s']:.0f} tok/s; decode {out['decode_tokens_per_s']:.0f} tok/s; "
          f"per round {each} tok/s)")


def trainer_metrics(model: CausalLM, mode: str, waves: list[Wave], sync, out: dict) -> None:
    """Trainer passes without/with replay over the engine's rollouts -> out[no_replay|replay]."""
    for replay in (False, True):
        t = time.perf_counter()
        parts = [trainer_pass(model, mode, w, replay) for w in waves]
        sync()
        engine_lp, trainer_lp, engine_ex, trainer_ex = (torch.cat(x).cpu() for x in zip(*parts))
        key = "replay" if replay else "no_replay"
        out[key] = {**mismatch_metrics(engine_lp, trainer_lp),
                    **routing_flip_metrics(engine_ex, trainer_ex),
                    "trainer_s": time.perf_counter() - t}
        m = out[key]
        print(f"[{mode}] trainer ({key}): bitwise {m['bitwise_equal_fraction']:.4f}  "
              f"max|Δ| {m['max_abs_logprob_diff']:.3g}  KL {m['kl_k3']:.3g}  flips {m['flip_rate']:.4f}")


def warm_up(model: CausalLM, mode: str, waves_spec, seed: int, sync) -> None:
    """Untimed: a small wave (compiles kernels, warms cuBLAS and the allocator), one decode step
    at the largest batch, and a trainer pass."""
    gen = torch.Generator(device=model.lm_head.weight.device).manual_seed(seed + 1)
    prompts = waves_spec[0][0]
    spare = [p[:] for p in prompts[:3]]
    wave, _, _ = generate_wave(model, mode, spare, sorted([4, 3, 2][: len(spare)], reverse=True),
                               gen, sync)
    trainer_pass(model, mode, wave, replay=True)
    generate_wave(model, mode, [p[:] for p in prompts], [2] * len(prompts), gen, sync)
    sync()


@torch.inference_mode(False)
def make_bench_model(model_cfg: ModelConfig, device: torch.device, seed: int) -> CausalLM:
    """The model (a size's preset: bf16), random-initialised on ``device`` (as ordinary tensors,
    whose version counters the fused weights watch, also when called in inference mode)."""
    return build_model(model_cfg, seed=seed, device=device).eval()


def cross_mode_check(model: CausalLM, det_waves: list[Wave], sync, result: dict) -> None:
    """Sanity check of the deterministic kernels against plain torch: the fast trainer forward
    (the module forward, with replay) over the deterministic engine's tokens. Engine and trainer
    share the deterministic kernels, so their bitwise agreement alone cannot reveal a wrong
    kernel; this can: the gap must be of the size of fast mode's own engine-vs-trainer mismatch,
    not larger."""
    parts = [trainer_pass(model, "fast", w, replay=True) for w in det_waves]
    sync()
    det_lp, fast_lp = (torch.cat(x).cpu() for x in list(zip(*parts))[:2])
    m = mismatch_metrics(det_lp, fast_lp)
    result["cross_mode"] = m
    print(f"[cross-mode] deterministic engine vs fast trainer: mean|Δ| "
          f"{m['mean_abs_logprob_diff']:.3g}  max|Δ| {m['max_abs_logprob_diff']:.3g}  "
          f"KL {m['kl_k3']:.3g}")

