"""`tidal bench multiturn` at toy size: the two runs do the same work, and the cached one's
prefill saving is exactly the tokens it served from the cache."""

from tidal.bench import multiturn_bench
from tidal.bench.config import THREADS_KEY, parse
from tidal.bench.multiturn_bench import run_multiturn_bench


def test_greedy_runs_are_identical_and_the_cache_accounts_for_every_prompt_token():
    # Greedy in deterministic (batch-invariant) numerics: the order requests reach the engine in
    # cannot change a token, so the cache may change nothing but how much is prefilled.
    bench, cfg, _ = parse(multiturn_bench, "multiturn", [
        "--bench.window", "320", "--bench.episodes", "2", "--bench.horizon", "1.5",
        "--engine.temperature", "0", "--engine.numerics", "deterministic", f"--{THREADS_KEY}", "1"])
    r = run_multiturn_bench(bench, cfg)
    off, on = r["no_prefix_cache"], r["prefix_cache"]
    assert r["same_episodes"]
    for key in ("episodes", "turns", "model_tokens", "resets"):
        assert off[key] == on[key], key
    assert off["episodes"] == 2 and off["turns"] > 2 * 2 and off["resets"] > 0  # contexts grew and reset
    assert off["cached_tokens"] == 0 and on["cached_tokens"] > 0
    assert off["prefill_tokens"] == on["prefill_tokens"] + on["cached_tokens"]
    assert r["prefill_reduction"] == off["prefill_tokens"] / on["prefill_tokens"]
