"""Benchmarks: each compares tidal side by side with a named peer in one run and prints ratios.

Each benchmark is a module here exposing ``add_arguments(parser)`` and ``run_from_args(args)``;
``BENCHMARKS`` maps the name used in ``tidal bench NAME`` to that module and a one-line summary.
Modules are imported only when their benchmark runs (most import torch).
"""

BENCHMARKS = {
    "engine": ("tidal.bench.engine_bench", "decode tokens/s of tidal's engine vs transformers generate"),
    "sync": ("tidal.bench.sync_bench", "weight sync: delta codec vs XOR+zstd and the entropy bound; WAN vs rsync"),
}
