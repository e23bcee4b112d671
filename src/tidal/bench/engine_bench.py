"""Decode throughput of tidal's Engine against transformers' ``generate`` on the same weights.

    tidal bench engine --bench.batch_sizes 1,16,64 --json engine.json
    tidal bench engine --bench.preset tiny-moe --engine.numerics fast --bench.runs 5
    python -m tidal.bench.engine_bench --bench.batch_sizes 1,4 --bench.new_tokens 8   # the same

One model is built from the run config's ``[model]`` (``--bench.preset`` names a size, the
model keys given still apply) with the run's seed, saved with ``save_pretrained`` and loaded
back by ``AutoModelForCausalLM`` (fp32, eval), so both sides run identical weights. Per batch
size both decode the same random prompts greedily for exactly ``new_tokens`` tokens (eos
ignored: tidal ``ignore_eos``, transformers ``min_new_tokens``), prefill included in the time.
After a warm-up, runs alternate between the two (the machine is shared and noisy) and the
median of ``runs`` is reported. Only generated tokens count. ``greedy_match`` is the fraction
of sequences whose tokens agree exactly; it is informational (float order differs, so
near-ties may flip), not a pass/fail.

Threads: both sides run with the same torch intra-op thread count, ``run.worker_threads``
(1 by default, as a rollout worker runs the engine). The tiny preset's matmuls take
microseconds; with 2 OpenMP threads on this 2-core machine, shared with other jobs, a thread
waiting for a descheduled sibling spin-waits and makes every op several times slower and the
timings erratic, for both sides alike. The table names the thread count and the torch and
transformers versions measured.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from typing import Literal

# Before torch loads (when run as a module): idle OpenMP threads sleep instead of spinning.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from pydantic import Field  # noqa: E402

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
from tidal.engine.request import GenerationRequest  # noqa: E402
from tidal.model.checkpoint import save_pretrained  # noqa: E402
from tidal.model.presets import PRESETS  # noqa: E402
from tidal.model.qwen3 import build_model  # noqa: E402
from tidal.model.tokenizer import ByteTokenizer  # noqa: E402
from tidal.config_section import Section  # noqa: E402

READS = ("model", "engine.numerics", "engine.seed", "engine.max_prefill_tokens",
         "engine.prefix_cache", SEED_KEY, THREADS_KEY)
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""


class BenchSection(Section):
    """The engine takes the run config's engine.numerics, seed, max_prefill_tokens and
    prefix_cache; the rest is what a side-by-side greedy comparison needs: temperature 0, no stop
    strings, exactly new_tokens per sequence, one batch of each size. The model is [model] with
    the run's seed (run.seed), in fp32 on both sides; torch threads for both:
    run.worker_threads."""

    preset: Literal[tuple(PRESETS)] = "tiny"
    """Named model size (tidal.model.presets) the [model] section starts from; model keys of the
    recipe or command line apply on top. tiny is the default recipe's model."""
    batch_sizes: IntList = [1, 16, 64]
    """Batch sizes measured, one table row each (sequences decoded together)."""
    new_tokens: int = Field(64, ge=1)
    """Tokens each sequence decodes (eos ignored), per run."""
    prompt_len: int = Field(16, ge=1)
    """Random prompt tokens per sequence."""
    runs: int = Field(3, ge=1)
    """Timed runs per side and batch size, alternating; the median counts."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    run_engine_bench(bench, cfg, json_path)
    return 0


def run_engine_bench(bench: BenchSection, cfg: TidalConfig, json_path: str | None = None) -> dict:
    """Measure decode tokens/s of both engines per batch size; print a table; return (and
    optionally write) ``{"preset", "numerics", "new_tokens", "prompt_len", "runs", "threads",
    "torch", "transformers", "rows": [{batch, tidal_tok_s, hf_tok_s, ratio, greedy_match}],
    "config"}``. torch's thread count is restored afterwards."""
    cfg = with_preset(cfg, bench.preset)
    previous_threads = torch.get_num_threads()
    threads = torch_threads(cfg)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(bench, cfg, json_path)
    finally:
        torch.set_num_threads(previous_threads)


def _run(bench: BenchSection, cfg: TidalConfig, json_path) -> dict:
    import transformers
    from transformers import AutoModelForCausalLM

    seed = run_seed(cfg)
    model = build_model(cfg.model, seed=seed).float().eval()
    tokenizer = ByteTokenizer()
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder)
        hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    rows = [_measure(model, hf_model, tokenizer, bench, _engine_config(bench, cfg, batch), seed)
            for batch in bench.batch_sizes]
    result = {
        "preset": bench.preset, "numerics": cfg.engine.numerics, "new_tokens": bench.new_tokens,
        "prompt_len": bench.prompt_len, "runs": bench.runs,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "rows": rows,
        "config": config_record(bench, cfg, READS),
    }
    _print_table(result)
    if json_path is not None:
        write_json(json_path, result)
    return result


def _engine_config(bench: BenchSection, cfg: TidalConfig, batch: int) -> EngineConfig:
    """The run config's engine settings this benchmark reads, with its fixed ones."""
    e = cfg.engine
    return EngineConfig(numerics=e.numerics, seed=e.seed, max_prefill_tokens=e.max_prefill_tokens,
                        prefix_cache=e.prefix_cache, max_batch_size=batch, temperature=0.0, stop=[],
                        max_new_tokens=bench.new_tokens,
                        max_seq_len=bench.prompt_len + bench.new_tokens + 1)


def _measure(model, hf_model, tokenizer, bench: BenchSection, engine_cfg: EngineConfig,
             seed: int) -> dict:
    """One batch size: both sides on the same random prompts, warmed up, then ``runs``
    alternating timed runs -> the table row."""
    batch, prompt_len = engine_cfg.max_batch_size, bench.prompt_len
    new_tokens, runs = bench.new_tokens, bench.runs
    prompts = torch.randint(0, 256, (batch, prompt_len), generator=torch.Generator().manual_seed(seed))
    engine = Engine(model, tokenizer, engine_cfg)
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


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "engine"))
