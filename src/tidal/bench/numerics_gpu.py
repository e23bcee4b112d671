"""Engine-vs-trainer numerics of a random-initialised Qwen3-MoE, fast mode vs deterministic mode.

    python -m tidal.bench.numerics_gpu --size 1b --json numerics_gpu.json     # on a GPU (~2.1B params)
    tidal bench numerics-gpu --device cpu --size tiny                        # the CPU op sets
    python -m tidal.bench.numerics_gpu --smoke --size smoke                  # kernel checks first

The model is tidal's own (``build_model`` on a ``numerics-gpu-*`` preset, bf16) and every call
is the one the engine and the trainer make: ``model(ids, positions, cache, slots,
deterministic=..., return_experts=True)`` to generate, ``model(ids, deterministic=...,
replay_experts=...)`` to recompute. On CUDA tensors the fused forward runs the GPU op sets
(tidal.numerics.make_ops): "fast" = kernels/fast_ops.py (cuBLAS, flash / memory-efficient SDPA,
grouped-GEMM experts: a tuned plain-torch peer; its trainer is the module forward),
"deterministic" = kernels/triton_ops.py (the batch-invariant Triton kernels). On the CPU the CPU
op sets run, or with ``TIDAL_OPS=gpu TRITON_INTERPRET=1`` the GPU ones in Triton's interpreter
(slow: ``--workload interpreted``).

1. engine: waves of sequences (batch sizes from the workload, e.g. 64 .. 1). Each wave prefills
   its right-padded prompts in one forward, then decodes with a KV cache; sequences stop at their
   own lengths, so a decode step's batch shrinks as they finish (mixed batch sizes 1..64). Every
   sampled token records its logprob and, for every processed token, the top-k expert ids of
   each layer. Timed (prefill + decode, synchronised at wave edges) -> engine tokens/s. Every
   mode is warmed up first (untimed: kernel compilation, cuBLAS, the allocator); then
   ``--repeats`` rounds with the modes interleaved (fast, det, fast, det); each mode's median
   round counts.
2. trainer: each wave's full sequences in one forward without a cache, without and with router
   replay (the engine's expert ids; gates from the trainer's own router probabilities over them);
   its logprob of every generated token and its expert ids.
3. metrics (tidal.numerics.metrics): bitwise-equal fraction, mean/max |Δ logprob|, k3 KL,
   routing flip rate per layer and tokens with any flip, with and without replay. Flips compare
   the engine's experts with the trainer router's own top-k (``return_experts``), which under
   replay is what the replay overrides: the experts used are the engine's by construction.

The JSON holds both modes, ``throughput_ratio`` (deterministic / fast engine tokens/s) and the
targets. Sections are guarded: this runs as one prepared script on a lent GPU, so a failure in one
is printed (traceback) and recorded, and the others still run; the JSON is rewritten after each.
The GPU machine has no pydantic (tidal.model needs it): scripts/gpu_numerics.sh installs it from
wheels carried with the checkout (scripts/gpu_wheels.sh).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass

import torch

from tidal.bench.common import write_json
from tidal.model import CausalLM, KVCache, build_model, preset
from tidal.numerics import MODES
from tidal.numerics.metrics import mismatch_metrics, routing_flip_metrics

SIZES = {"tiny": "numerics-gpu-tiny", "smoke": "numerics-gpu-smoke", "1b": "numerics-gpu-1b"}
"""--size -> the model preset (tidal.model.presets)."""


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


@torch.inference_mode()
def run_mode(model: CausalLM, mode: str, waves_spec, seed: int, sync, result: dict) -> None:
    """One mode on its own: warm-up, one timed round, trainer passes -> result[mode]."""
    warm_up(model, mode, waves_spec, seed, sync)
    waves, timing = engine_round(model, mode, waves_spec, seed, sync)
    out = result.setdefault(mode, {})
    record_engine(out, waves, [timing], mode)
    trainer_metrics(model, mode, waves, sync, out)


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
def make_bench_model(size: str, device: torch.device, seed: int) -> CausalLM:
    """The size's preset (bf16), random-initialised on ``device`` (as ordinary tensors, whose
    version counters the fused weights watch, also when called in inference mode)."""
    return build_model(preset(SIZES[size]), seed=seed, device=device).eval()


@torch.inference_mode()
def run_numerics(size: str, device: str, seed: int = 0, json_path: str | None = None,
                 smoke: bool = False, modes: tuple[str, ...] = MODES, repeats: int = 2,
                 fast_experts: str = "grouped_mm", workload: str | None = None) -> dict:
    """Build the model, optionally run the kernel checks; warm every mode up, then ``repeats``
    timed rounds with the modes interleaved (fast, det, fast, det: drift in clocks or heat hits
    both), the median per mode; then the trainer passes. Print and return.
    fast_experts: "grouped_mm" (torch._grouped_mm where it works, else the padded bmm) or
    "padded_bmm" (never try it: the GPU script's choice when the smoke run did not confirm it).
    workload: a WORKLOADS key (default: the size's own)."""
    from tidal.numerics import ops_backend

    device = torch.device(device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # one thread: the CPU probe's paths and the interpreter
    workload = workload or size
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    model = make_bench_model(size, device, seed)
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    backend = ops_backend(device)
    result: dict = {"size": size, "device": _device_name(device), "torch": torch.__version__,
                    "triton": _triton_version(), "ops": backend,
                    "interpreted": os.environ.get("TRITON_INTERPRET") == "1",
                    "model": cfg.model_dump(), "params": params,
                    "workload": {"name": workload, **asdict(WORKLOADS[workload])},
                    "repeats": repeats, "errors": {}}
    print(f"numerics-gpu: {size} MoE, {params / 1e9:.3f}B params, on {result['device']} "
          f"({backend} op sets{', Triton interpreter' if result['interpreted'] else ''}), "
          f"workload {workload}")

    def save() -> None:
        if json_path:
            write_json(json_path, result)

    if smoke:
        from tidal.kernels.checks import run_kernel_checks

        _guarded("kernel_checks", lambda: result.update(
            kernel_checks=run_kernel_checks(device, small=device.type == "cpu")), result)
        save()
    spec = make_prompts(WORKLOADS[workload], cfg.vocab_size, seed)
    fast_ops = model.fused_weights("fast", model.lm_head.weight.dtype).ops if "fast" in modes else None
    if fast_experts == "padded_bmm" and hasattr(fast_ops, "grouped_mm"):
        fast_ops.grouped_mm = False
    waves: dict[str, list[Wave]] = {}
    rounds: dict[str, list[dict]] = {mode: [] for mode in modes}
    for mode in modes:
        _guarded(f"{mode}_warm_up", lambda mode=mode: warm_up(model, mode, spec, seed, sync), result)
    if fast_ops is not None:
        result["fast_experts"] = getattr(fast_ops, "experts_path", "per_expert")
        print(f"[fast] experts: {result['fast_experts']}")
    save()
    for _ in range(repeats):
        for mode in modes:
            if f"{mode}_engine" in result["errors"]:
                continue

            def timed_round(mode=mode) -> None:
                got, timing = engine_round(model, mode, spec, seed, sync)
                waves.setdefault(mode, got)  # the first round's rollouts feed the trainer
                rounds[mode].append(timing)
                record_engine(result.setdefault(mode, {}), got, rounds[mode], mode)

            _guarded(f"{mode}_engine", timed_round, result)
            save()
    for mode, rollouts in waves.items():
        _guarded(f"{mode}_trainer",
                 lambda mode=mode, rollouts=rollouts: trainer_metrics(model, mode, rollouts, sync,
                                                                      result[mode]),
                 result)
        save()
    if "fast" in modes and "deterministic" in waves:
        _guarded("cross_mode", lambda: cross_mode_check(model, waves["deterministic"], sync, result),
                 result)
    summarise(result)
    save()
    print_table(result)
    return result


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


def _guarded(name: str, fn, result: dict) -> None:
    """Run one section; on failure print the traceback and record it (see module docstring)."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - one prepared device run must report every section
        traceback.print_exc()
        result["errors"][name] = f"{type(exc).__name__}: {exc}"
        print(f"SECTION FAILED: {name}: {exc}", file=sys.stderr)


def summarise(result: dict) -> None:
    """Ratios and targets from the two modes (whatever of them ran)."""
    fast, det = result.get("fast", {}), result.get("deterministic", {})
    if "engine_tokens_per_s" in fast and "engine_tokens_per_s" in det:
        result["throughput_ratio"] = det["engine_tokens_per_s"] / fast["engine_tokens_per_s"]
        result["decode_throughput_ratio"] = det["decode_tokens_per_s"] / fast["decode_tokens_per_s"]
    if "no_replay" in det and "replay" in det:
        result["targets"] = {
            "deterministic_bitwise_equal_100pct": det["no_replay"]["bitwise_equal_fraction"] == 1.0
            and det["replay"]["bitwise_equal_fraction"] == 1.0,
            "deterministic_kl_zero": det["no_replay"]["kl_k3"] == 0.0,
            # the trainer router's own top-k (returned under replay too, which overrides it)
            "deterministic_zero_flips": det["no_replay"]["flip_rate"] == 0.0
            and det["replay"]["flip_rate"] == 0.0,
        }
        if "throughput_ratio" in result:
            result["targets"]["throughput_ratio_at_least_0.90"] = result["throughput_ratio"] >= 0.90


def print_table(result: dict) -> None:
    rows = [("engine tokens/s", "engine_tokens_per_s", None, "{:.0f}"),
            ("decode tokens/s", "decode_tokens_per_s", None, "{:.0f}"),
            ("generated tokens", "generated_tokens", None, "{}")]
    for key in ("no_replay", "replay"):
        rows += [(f"bitwise equal ({key})", "bitwise_equal_fraction", key, "{:.6f}"),
                 (f"mean |Δ logprob| ({key})", "mean_abs_logprob_diff", key, "{:.3g}"),
                 (f"max |Δ logprob| ({key})", "max_abs_logprob_diff", key, "{:.3g}"),
                 (f"k3 KL ({key})", "kl_k3", key, "{:.3g}"),
                 (f"routing flip rate ({key})", "flip_rate", key, "{:.6f}"),
                 (f"tokens with a flip ({key})", "tokens_with_flip_fraction", key, "{:.6f}"),
                 (f"trainer seconds ({key})", "trainer_s", key, "{:.2f}")]
    print(f"\n{'metric':<34}{'fast':>16}{'deterministic':>16}")
    for label, field, key, fmt in rows:
        cells = []
        for mode in MODES:
            section = result.get(mode, {})
            section = section.get(key, {}) if key else section
            cells.append(fmt.format(section[field]) if field in section else "-")
        print(f"{label:<34}{cells[0]:>16}{cells[1]:>16}")
    for name in ("throughput_ratio", "decode_throughput_ratio"):
        if name in result:
            print(f"{name + ' (det/fast)':<34}{result[name]:>32.3f}")
    for name, ok in result.get("targets", {}).items():
        print(f"target {name:<40} {'MET' if ok else 'NOT MET'}")
    for name, err in result["errors"].items():
        print(f"section {name} FAILED: {err}")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny",
                        help="model and workload size (tiny: CPU; smoke: GPU check; 1b: ~2.1B params)")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default=None,
                        help="which sequences to generate (default: the size's own; interpreted: "
                             "a few, for the Triton op set in Triton's interpreter)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of fast,deterministic")
    parser.add_argument("--smoke", action="store_true", help="first check each kernel against torch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2,
                        help="timed engine rounds per mode, interleaved across modes; median reported")
    parser.add_argument("--fast-experts", choices=("grouped_mm", "padded_bmm"), default="grouped_mm",
                        help="fast mode's expert compute (grouped_mm falls back to padded_bmm if it fails)")
    parser.add_argument("--json", default=None, help="write the result here")


def run_from_args(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"--modes: unknown {sorted(unknown)}; choose from {MODES}")
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    result = run_numerics(args.size, device, args.seed, args.json, args.smoke, modes, args.repeats,
                          args.fast_experts, args.workload)
    return 1 if result["errors"] else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidal.bench.numerics_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
