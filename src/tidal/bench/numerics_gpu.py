"""Engine-vs-trainer numerics of a random-initialised Qwen3-MoE, fast mode vs deterministic mode.

    python -m tidal.bench.numerics_gpu --size 1b --json numerics_gpu.json     # on a GPU (~2.1B params)
    tidal bench numerics-gpu --device cpu --size tiny                        # the same path on a CPU
    python -m tidal.bench.numerics_gpu --smoke --size smoke                  # kernel checks first

Per mode (ops.py: "fast" = cuBLAS/SDPA/flash, "deterministic" = batch-invariant kernels):

1. engine: waves of sequences (batch sizes from the workload, e.g. 64 .. 1). Each wave prefills
   its prompts in one forward, then decodes with a KV cache; sequences stop at their own lengths,
   so a decode step's batch shrinks as they finish (mixed batch sizes 1..64). Every sampled token
   records its logprob and, for every processed token, the top-k expert ids of each layer.
   Timed (prefill + decode, synchronised at wave edges) -> engine tokens/s.
2. trainer: each wave's full sequences in one full-sequence forward (flash attention in fast
   mode), without and with router replay (the engine's expert ids; gates from the trainer's own
   router probabilities over them); its logprob of every generated token and its expert ids.
3. metrics (tidal.numerics.metrics): bitwise-equal fraction, mean/max |Δ logprob|, k3 KL,
   routing flip rate per layer and tokens with any flip, with and without replay.

The JSON holds both modes, ``throughput_ratio`` (deterministic / fast engine tokens/s) and the
targets. Sections are guarded: this runs as one prepared script on a lent GPU, so a failure in one
is printed (traceback) and recorded, and the others still run; the JSON is rewritten after each.
Imports only torch (and Triton on CUDA): the GPU machine has no pydantic.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from dataclasses import asdict, dataclass

import torch

from tidal.bench.common import write_json
from tidal.kernels.moe_model import SIZES, MoEModel
from tidal.kernels.ops import MODES, make_ops
from tidal.numerics.metrics import mismatch_metrics, routing_flip_metrics


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


def flat_layout(lens: list[int], device):
    """Sequences of ``lens`` laid end to end -> (slot [N], pos [N])."""
    slot = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
    pos = torch.cat([torch.arange(n) for n in lens])
    return slot.to(device), pos.to(device)


def generate_wave(model: MoEModel, ops, prompts, gen_lens, gen, sync) -> tuple[Wave, float, float]:
    """Prefill + KV-cache decode of one wave -> (rollouts, prefill seconds, decode seconds)."""
    device = model.embed.device
    s = model.shape
    b = len(prompts)
    plens = [len(p) for p in prompts]
    totals = [p + g for p, g in zip(plens, gen_lens)]
    width = max(totals)
    seqs = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        seqs[i, : len(p)] = torch.tensor(p)
    seqs = seqs.to(device)
    lps = torch.zeros((b, width), dtype=torch.float32, device=device)
    experts = torch.zeros((b, width, s.num_hidden_layers, s.num_experts_per_tok), dtype=torch.long,
                          device=device)
    cache = model.new_cache(b, width)
    rows = torch.arange(b, device=device)
    plens_dev = torch.tensor(plens, device=device)
    sync()
    t0 = time.perf_counter()
    slot, pos = flat_layout(plens, device)
    hidden, ids = model.forward(ops, seqs[slot, pos], slot, pos, cache, max(plens), seg_lens=plens)
    experts[slot, pos] = ids
    last = torch.tensor(plens, device=device).cumsum(0) - 1
    _record(model, ops, hidden[last], rows, plens_dev, seqs, lps, gen)
    sync()
    t1 = time.perf_counter()
    for step in range(1, max(gen_lens)):
        n = sum(g > step for g in gen_lens)  # longest first: the active sequences are 0..n-1
        slot = rows[:n]
        pos = plens_dev[:n] + (step - 1)
        hidden, ids = model.forward(ops, seqs[slot, pos], slot, pos, cache, max(plens[:n]) + step)
        experts[slot, pos] = ids
        _record(model, ops, hidden, slot, pos + 1, seqs, lps, gen)
    sync()
    return Wave(seqs, lps, experts, plens, totals), t1 - t0, time.perf_counter() - t1


def _record(model, ops, hidden, slot, pos, seqs, lps, gen) -> None:
    """Sample the next token of each row and store it and its logprob at (slot, pos)."""
    logprobs = model.logprobs(ops, hidden)
    token = sample(logprobs, gen)
    seqs[slot, pos] = token
    lps[slot, pos] = logprobs.gather(-1, token[:, None])[:, 0]


def trainer_pass(model: MoEModel, ops, wave: Wave, replay: bool):
    """Full-sequence forward of a wave's sequences -> (engine lp, trainer lp [G] over generated
    tokens; engine, trainer experts [P, layers, k] over processed tokens)."""
    device = model.embed.device
    processed = [t - 1 for t in wave.total_lens]  # the last token is never fed
    slot, pos = flat_layout(processed, device)
    engine_experts = wave.experts[slot, pos]
    cache = model.new_cache(len(processed), max(processed))
    hidden, ids = model.forward(ops, wave.seqs[slot, pos], slot, pos, cache, max(processed),
                                seg_lens=processed, replay=engine_experts if replay else None)
    starts = [0]
    for n in processed[:-1]:
        starts.append(starts[-1] + n)
    # the row at position p predicts token p + 1: generated tokens sit at plen .. total - 1
    rows = torch.cat([torch.arange(st + p - 1, st + n) for st, p, n in
                      zip(starts, wave.prompt_lens, processed)]).to(device)
    gslot, gpos = slot[rows], pos[rows] + 1
    targets = wave.seqs[gslot, gpos]
    trainer_lp = model.logprobs(ops, hidden[rows]).gather(-1, targets[:, None])[:, 0]
    return wave.logprobs[gslot, gpos], trainer_lp, engine_experts, ids


def run_mode(model: MoEModel, ops, waves_spec, seed: int, sync, result: dict) -> None:
    """Engine rollouts, then trainer passes without/with replay, for one op set -> result[ops.name]."""
    mode = ops.name
    out = result.setdefault(mode, {})
    gen = torch.Generator(device=model.embed.device).manual_seed(seed)
    _warm_up(model, ops, waves_spec, gen, sync)
    waves, prefill_s, decode_s = [], 0.0, 0.0
    for prompts, gen_lens in waves_spec:
        wave, p, d = generate_wave(model, ops, prompts, gen_lens, gen, sync)
        waves.append(wave)
        prefill_s, decode_s = prefill_s + p, decode_s + d
    generated = sum(t - p for w in waves for t, p in zip(w.total_lens, w.prompt_lens))
    decoded = generated - sum(len(w.total_lens) for w in waves)  # the first token comes from prefill
    out.update(generated_tokens=generated, prefill_s=prefill_s, decode_s=decode_s,
               engine_tokens_per_s=generated / (prefill_s + decode_s),
               decode_tokens_per_s=decoded / decode_s if decode_s else 0.0)
    print(f"[{mode}] engine: {generated} tokens in {prefill_s + decode_s:.2f} s "
          f"({out['engine_tokens_per_s']:.0f} tok/s; decode {out['decode_tokens_per_s']:.0f} tok/s)")
    for replay in (False, True):
        t = time.perf_counter()
        parts = [trainer_pass(model, ops, w, replay) for w in waves]
        sync()
        engine_lp, trainer_lp, engine_ex, trainer_ex = (torch.cat(x).cpu() for x in zip(*parts))
        key = "replay" if replay else "no_replay"
        out[key] = {**mismatch_metrics(engine_lp, trainer_lp),
                    **routing_flip_metrics(engine_ex, trainer_ex),
                    "trainer_s": time.perf_counter() - t}
        m = out[key]
        print(f"[{mode}] trainer ({key}): bitwise {m['bitwise_equal_fraction']:.4f}  "
              f"max|Δ| {m['max_abs_logprob_diff']:.3g}  KL {m['kl_k3']:.3g}  flips {m['flip_rate']:.4f}")


def _warm_up(model, ops, waves_spec, gen, sync) -> None:
    """One small wave (compiles kernels, warms cuBLAS) and its trainer pass, untimed."""
    spare = [p[:] for p in waves_spec[0][0][:3]]
    wave, _, _ = generate_wave(model, ops, spare, sorted([4, 3, 2], reverse=True), gen, sync)
    trainer_pass(model, ops, wave, replay=True)
    sync()


def run_numerics(size: str, device: str, seed: int = 0, json_path: str | None = None,
                 smoke: bool = False, modes: tuple[str, ...] = MODES) -> dict:
    """Build the model, optionally run the kernel checks, run each mode; print and return."""
    device = torch.device(device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # reference.py's SIMD-uniform calls assume one thread
    shape = SIZES[size]
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    result: dict = {"size": size, "device": _device_name(device), "torch": torch.__version__,
                    "triton": _triton_version(), "shape": shape.as_dict(),
                    "params": shape.param_count(), "workload": asdict(WORKLOADS[size]),
                    "errors": {}}
    print(f"numerics-gpu: {size} MoE, {shape.param_count() / 1e9:.3f}B params, on {result['device']}")

    def save() -> None:
        if json_path:
            write_json(json_path, result)

    if smoke:
        from tidal.kernels.checks import run_kernel_checks

        _guarded("kernel_checks", lambda: result.update(kernel_checks=run_kernel_checks(device)),
                 result)
        save()
    model = MoEModel.random(shape, device, torch.bfloat16, seed)
    spec = make_prompts(WORKLOADS[size], shape.vocab_size, seed)
    for mode in modes:
        _guarded(mode, lambda mode=mode: run_mode(model, make_ops(mode, device), spec, seed, sync,
                                                  result), result)
        save()
    summarise(result)
    save()
    print_table(result)
    return result


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
            "zero_flips_with_replay": det["replay"]["flip_rate"] == 0.0
            and fast.get("replay", {}).get("flip_rate", 0.0) == 0.0,
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
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of fast,deterministic")
    parser.add_argument("--smoke", action="store_true", help="first check each kernel against torch")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the result here")


def run_from_args(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"--modes: unknown {sorted(unknown)}; choose from {MODES}")
    result = run_numerics(args.size, device, args.seed, args.json, args.smoke, modes)
    return 1 if result["errors"] else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidal.bench.numerics_gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
