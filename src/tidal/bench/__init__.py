"""Benchmarks: each compares tidal side by side with a named peer in one run and prints ratios.

Each benchmark is a module here configured through ``tidal.bench.config`` (its own ``BenchSection``
of ``--bench.*`` fields, the run config from tidal's loader, and ``run``; see that module), or,
until they move to it, through its own ``add_arguments(parser)`` and ``run_from_args(args)``.
``BENCHMARKS`` maps the name used in ``tidal bench NAME`` to that module and a one-line summary.
Modules are imported only when their benchmark runs (most import torch).
"""

BENCHMARKS = {
    "engine": ("tidal.bench.engine_bench", "decode tokens/s of tidal's engine vs transformers generate"),
    "sandbox": ("tidal.bench.sandbox_bench",
                "sandbox start-to-result latency and concurrency per backend vs a plain subprocess"),
    "numerics-gpu": ("tidal.bench.numerics_gpu",
                     "MoE engine-vs-trainer mismatch and tokens/s, fast vs batch-invariant kernels"),
    "numerics": ("tidal.bench.numerics_bench",
                 "engine-vs-trainer logprob mismatch and tokens/s: deterministic vs fast numerics"),
    "horizon": ("tidal.bench.horizon_bench", "long-horizon success: RL with self-summarization vs a sliding window"),
    "sync": ("tidal.bench.sync_bench", "weight sync: delta codec vs XOR+zstd and the entropy bound; WAN vs rsync"),
    "online": ("tidal.bench.online_bench",
               "real-time RL: serving vs generate(), feedback ingest and kill -9, the online cycle, bad candidates"),
    "integrity": ("tidal.bench.integrity_bench",
                  "reward hacking: planted-suite recall / false positives, trace cost, RL with detection off vs on"),
    "async": ("tidal.bench.async_bench",
              "async vs sync RL on pinned cores: time to a held-out pass@1 target, utilisation, elastic pools, simulator error"),
    "trainer": ("tidal.bench.trainer_bench",
                "FSDP2-sharded trainer at 1, 2, 4 processes: per-process memory, step time, loss vs one process"),
    "rl": ("tidal.bench.rl_speed_bench",
           "RL steps per minute of the default recipe, now vs before the speed work (shared prompts, in-flight updates)"),
    "controls": ("tidal.bench.controls_bench",
                 "the loss controls (KL, entropy bonus, dual-clip, constant lr) as arms of the default recipe on two families"),
    "peer": ("tidal.bench.peer_bench",
             "RL of a pretrained model (a recipe's) through tidal vs TRL's GRPOTrainer: speed, gain, memory"),
    "harness": ("tidal.bench.harness_bench",
                "an agent harness over the rollout gateway vs the same agent as a native environment: speed, gain, history match"),
    "profile": ("tidal.bench.profile_bench",
                "where the main job's time goes (mid-training, prefill, decode, RL trainer step) per op: deterministic vs fast"),
    "multiturn": ("tidal.bench.multiturn_bench",
                  "multi-turn rollout time with the engine's prefix cache vs prefilling every turn"),
}
