"""Decode throughput of tidal's Engine against transformers' ``generate`` on the same weights.

    python -m tidal.bench.engine_bench --preset tiny --batch-sizes 1,16,64 --json engine.json
    tidal bench engine --batch-sizes 1,16,64 --threads 1 --runs 3     # the same, from the CLI

One model is built from a preset with a fixed seed, saved with ``save_pretrained`` and loaded
back by ``AutoModelForCausalLM`` (fp32, eval), so both sides run identical weights. Per batch
size both decode the same random prompts greedily for exactly ``new_tokens`` tokens (eos
ignored: tidal ``ignore_eos``, transformers ``min_new_tokens``), prefill included in the time.
After a warm-up, runs alternate between the two (the machine is shared and noisy) and the
median of ``runs`` is reported. Only generated tokens count. ``greedy_match`` is the fraction
of sequences whose tokens agree exactly; it is informational (float order differs, so
near-ties may flip), not a pass/fail.

Threads: both sides run with the same torch intra-op thread count, 1 by default. The tiny
preset's matmuls take microseconds; with 2 OpenMP threads on this 2-core machine, shared with
other jobs, a thread waiting for a descheduled sibling spin-waits and makes every op several
times slower and the timings erratic, for both sides alike. ``--threads`` overrides it. The
table names the thread count and the torch and transformers versions measured.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

# Before torch loads (when run as a module): idle OpenMP threads sleep instead of spinning.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from tidal.bench.common import write_json  # noqa: E402
from tidal.engine.config import EngineConfig  # noqa: E402
from tidal.engine.engine import Engine  # noqa: E402
from tidal.engine.request import GenerationRequest  # noqa: E402
from tidal.model.checkpoint import save_pretrained  # noqa: E402
from tidal.model.presets import preset as model_preset  # noqa: E402
from tidal.model.qwen3 import build_model  # noqa: E402
from tidal.model.tokenizer import ByteTokenizer  # noqa: E402

DEFAULT_THREADS = 1
"""Torch threads for both sides unless told otherwise (see the module docstring for why)."""
DEFAULT_RUNS = 3
"""Timed runs per side and batch size; the median is reported."""


def run_engine_bench(
    preset: str = "tiny",
    batch_sizes: tuple[int, ...] = (1, 16, 64),
    new_tokens: int = 64,
    json_path: str | Path | None = None,
    prompt_len: int = 16,
    runs: int = DEFAULT_RUNS,
    seed: int = 0,
    threads: int | None = DEFAULT_THREADS,
    numerics: str | None = None,
) -> dict:
    """Measure decode tokens/s of both engines per batch size; print a table; return (and
    optionally write) ``{"preset", "new_tokens", "prompt_len", "runs", "threads", "torch",
    "transformers", "rows": [{batch, tidal_tok_s, hf_tok_s, ratio, greedy_match}]}``.

    runs: timed runs per side and batch size (alternating; the median counts), >= 1.
    threads: torch intra-op threads for both sides during the run (default 1, see the module
    docstring; None = leave torch's setting).
    numerics: the engine's ``numerics`` ("deterministic" | "fast"); None = the engine's default.
    """
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(preset, batch_sizes, new_tokens, json_path, prompt_len, runs, seed, numerics)
    finally:
        torch.set_num_threads(previous_threads)


def _run(preset, batch_sizes, new_tokens, json_path, prompt_len, runs, seed, numerics) -> dict:
    numerics = numerics or EngineConfig().numerics
    import transformers
    from transformers import AutoModelForCausalLM

    model = build_model(model_preset(preset), seed=seed).float().eval()
    tokenizer = ByteTokenizer()
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder)
        hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    rows = [_measure(model, hf_model, tokenizer, batch, prompt_len, new_tokens, runs, seed, numerics)
            for batch in batch_sizes]
    result = {
        "preset": preset, "numerics": numerics, "new_tokens": new_tokens, "prompt_len": prompt_len, "runs": runs,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "rows": rows,
    }
    _print_table(result)
    if json_path is not None:
        write_json(json_path, result)
    return result


def _measure(model, hf_model, tokenizer, batch, prompt_len, new_tokens, runs, seed, numerics) -> dict:
    """One batch size: both sides on the same random prompts, warmed up, then ``runs``
    alternating timed runs -> the table row."""
    prompts = torch.randint(0, 256, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))
    engine = Engine(model, tokenizer, EngineConfig(
        max_batch_size=batch, max_seq_len=prompt_len + new_tokens + 1,
        max_new_tokens=new_tokens, temperature=0.0, stop=[], seed=seed, numerics=numerics,
    ))
    requests = [GenerationRequest(p, ignore_eos=True) for p in prompts.tolist()]

    def tidal_run() -> list[list[int]]:
        return [r.token_ids for r in engine.generate(requests)]

    @torch.inference_mode()
    def hf_run() -> list[list[int]]:
        out = hf_model.generate(
            prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, do_sample=False, use_cache=True,
            pad_token_id=tokenizer.pad_id, eos_token_id=tokenizer.eos_id,
        )
        return out[:, prompt_len:].tolist()

    tidal_tokens, hf_tokens = tidal_run(), hf_run()  # warm-up
    tidal_s, hf_s = [], []
    for _ in range(runs):
        tidal_s.append(_seconds(tidal_run))
        hf_s.append(_seconds(hf_run))
    generated = batch * new_tokens
    tidal_rate = generated / statistics.median(tidal_s)
    hf_rate = generated / statistics.median(hf_s)
    return {
        "batch": batch,
        "tidal_tok_s": round(tidal_rate, 1),
        "hf_tok_s": round(hf_rate, 1),
        "ratio": round(tidal_rate / hf_rate, 2),
        "greedy_match": sum(a == b for a, b in zip(tidal_tokens, hf_tokens)) / batch,
    }


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=(
        f"engine decode ({result['numerics']} numerics), preset {result['preset']}, "
        f"{result['prompt_len']} prompt + "
        f"{result['new_tokens']} new tokens, greedy, median of {result['runs']} runs "
        f"(peer: transformers generate)"
    ), caption=(
        f"{result['threads']} torch thread(s), torch {result['torch']}, "
        f"transformers {result['transformers']}"
    ))
    for col in ("batch", "tidal tok/s", "HF tok/s", "ratio", "greedy match"):
        table.add_column(col, justify="right")
    for r in result["rows"]:
        table.add_row(
            str(r["batch"]), f"{r['tidal_tok_s']:.0f}", f"{r['hf_tok_s']:.0f}",
            f"{r['ratio']:.2f}x", f"{r['greedy_match']:.2f}",
        )
    Console().print(table)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``tidal bench engine`` (and ``python -m tidal.bench.engine_bench``)."""
    p.add_argument("--preset", default="tiny", help="model preset (tiny, tiny-moe, small)")
    p.add_argument("--batch-sizes", default="1,16,64", help="comma-separated batch sizes")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=DEFAULT_THREADS,
                   help="torch threads for both sides (default 1: see the module docstring)")
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS,
                   help="timed runs per side, median reported")
    p.add_argument("--numerics", choices=["deterministic", "fast"], default=None,
                   help="tidal engine numerics (default: the engine's default, deterministic)")
    p.add_argument("--json", default=None, help="write the results here")


def run_from_args(a: argparse.Namespace) -> int:
    sizes = tuple(int(b) for b in a.batch_sizes.split(","))
    run_engine_bench(a.preset, sizes, a.new_tokens, a.json, runs=a.runs, threads=a.threads,
                     numerics=a.numerics)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    raise SystemExit(run_from_args(parser.parse_args()))
