"""Serving throughput: `tidal serve` at 1, 8 and 32 concurrent clients beside the same requests
run one at a time through transformers' ``generate()`` on the same weights.

Every request is the same work on both sides: a held-out-style task prompt, sampling at the
engine's temperature, exactly ``new_tokens`` tokens (``ignore_eos`` on the server, as vLLM
offers it; ``min_new_tokens`` for transformers), no stop string. Requests/s counts whole
requests, from the first sent to the last answered; latency is per request.
"""

from __future__ import annotations

import asyncio
import statistics
import time

import aiohttp


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def _completions(url: str, model: str, prompts: list[str], concurrency: int,
                       new_tokens: int, seed: int, headers: dict | None) -> dict:
    latencies: list[float] = []
    queue = list(enumerate(prompts))
    timeout = aiohttp.ClientTimeout(total=None)

    async def client(session: aiohttp.ClientSession) -> None:
        while queue:
            i, prompt = queue.pop(0)
            body = {"model": model, "prompt": prompt, "max_tokens": new_tokens,
                    "ignore_eos": True, "stop": [], "seed": seed + i}
            t = time.perf_counter()
            async with session.post(f"{url}/v1/completions", json=body) as r:
                data = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"/v1/completions answered {r.status}: {data}")
            latencies.append(time.perf_counter() - t)

    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        wall = time.perf_counter() - start
    return {"concurrency": concurrency, "requests": len(prompts), "wall_s": wall,
            "requests_per_s": len(prompts) / wall,
            "latency_p50_ms": 1000 * percentile(latencies, 50),
            "latency_p99_ms": 1000 * percentile(latencies, 99)}


def serve_throughput(url: str, model: str, prompts: list[str], levels: list[int],
                     new_tokens: int, seed: int, headers: dict | None = None) -> list[dict]:
    """One row per concurrency level (a short warm-up first); ``headers``: the API key's."""
    asyncio.run(_completions(url, model, prompts[:2], 1, new_tokens, seed, headers))
    return [asyncio.run(_completions(url, model, prompts, c, new_tokens, seed, headers))
            for c in levels]


def generate_throughput(checkpoint, tokenizer, prompts: list[str], new_tokens: int,
                        temperature: float, top_p: float, threads: int) -> dict:
    """The same requests through transformers' generate(), one at a time."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    latencies = []
    with torch.inference_mode():
        for i, prompt in enumerate(prompts[:1] + prompts):
            ids = torch.tensor([tokenizer.encode(prompt)])
            torch.manual_seed(i)
            t = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=temperature > 0,
                           temperature=temperature or None, top_p=top_p,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           pad_token_id=tokenizer.pad_id)
            if i > 0:  # the first is a warm-up
                latencies.append(time.perf_counter() - t)
    wall = sum(latencies)
    return {"concurrency": 1, "requests": len(prompts), "wall_s": wall,
            "requests_per_s": len(prompts) / wall,
            "latency_p50_ms": 1000 * statistics.median(latencies),
            "latency_p99_ms": 1000 * percentile(latencies, 99)}
