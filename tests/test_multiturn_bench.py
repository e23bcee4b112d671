"""`tidal bench multiturn` at toy size: both runs happen, only the cached one reuses prefixes."""

from tidal.bench.multiturn_bench import run_multiturn_bench


def test_prefix_cache_run_prefills_less_of_the_same_kind_of_work():
    r = run_multiturn_bench(window=320, episodes=2, init_model=None, numerics="deterministic",
                            threads=1)
    off, on = r["no_prefix_cache"], r["prefix_cache"]
    assert off["cached_tokens"] == 0 and on["cached_tokens"] > 0
    assert off["turns"] > 2 and on["turns"] > 2  # multi-turn: contexts grew turn by turn
    assert on["prefill_tokens"] < off["prefill_tokens"]
    assert r["speedup"] > 0 and r["prefill_reduction"] > 1
