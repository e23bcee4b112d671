"""The FSDP2-sharded trainer at 1, 2 and 4 processes on CPU (gloo): memory, time, equality.

    tidal bench trainer --json trainer.json                  # ~27M-parameter model, a few minutes
    tidal bench trainer --bench.processes 1,2 --bench.steps 1

The same global batch (``rows`` rows of ``tokens`` tokens, behaviour logprobs the model's own
plus noise, so the PPO ratios and the loss are not trivially 1 and 0) is trained for ``steps``
steps from the same initial weights by the in-process Trainer (1 process) and by the sharded
trainer at each N > 1 (rank 0 in this process, N - 1 spawned ranks). Reported per N:

- ``state_mb``: parameter + optimizer (AdamW moments) bytes each rank stores, summed exactly
  over its local shards (rank 0 and the largest rank); ``state_ratio_N`` = the largest
  rank's over one process's (FSDP pads dim 0 of each parameter to a multiple of N, so slightly
  above 1/N): arithmetic, not a peak;
- ``peak_rss_mb`` per rank: each process's own peak resident memory (VmHWM, read by the rank
  itself; rank 0 is this process, its peak reset before each process count's run: it also holds
  the full mirror model the publisher reads); ``rank_peak_rss_ratio_N`` = the largest rank's
  peak at N over one process's: the measured figure;
- ``step_time_s``: median of the steps after the first (the first also warms up);
- ``loss`` of every step and ``max_abs_loss_diff`` / ``max_rel_grad_norm_diff`` against one
  process (float reduction order only).

Processes share the machine's cores (``run.worker_threads`` torch threads each, default 1), so
on 2 cores N = 4 is slower per step than N = 2: the step times say what sharding costs here,
not what N machines would gain.
"""

from __future__ import annotations

import copy
import statistics
import sys

import torch
from pydantic import Field

from tidal.bench.common import write_json
from tidal.bench.config import (
    SEED_KEY,
    THREADS_KEY,
    IntList,
    config_record,
    main,
    run_seed,
    torch_threads,
    with_keys,
)
from tidal.config import TidalConfig
from tidal.config_section import Section

READS = ("model", "trainer", "engine.numerics", SEED_KEY, THREADS_KEY)
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""
DEFAULTS = {
    "model.hidden_size": 512, "model.intermediate_size": 1536, "model.num_hidden_layers": 8,
    "model.num_attention_heads": 8, "model.num_key_value_heads": 4, "model.head_dim": 64,
    "model.dtype": "float32", "trainer.dtype": "float32", "trainer.warmup_steps": 0,
    "trainer.micro_batch_size": 4, "engine.numerics": "fast", THREADS_KEY: 1,
}
"""A ~27M-parameter fp32 model (big enough that shards dominate memory, small enough for 2 cores),
the module forward (one FSDP unit per layer), one torch thread per process."""
MB = 2**20


class BenchSection(Section):
    """The process counts, the batch and the steps; the model is [model], the trainer [trainer]
    (its sharding section is set per process count), numerics engine.numerics."""

    processes: IntList = [1, 2, 4]
    """Process counts to measure, each >= 1; 1 (the in-process Trainer) is always the baseline."""
    rows: int = Field(8, ge=1)
    """Rows in the global batch (a multiple of every process count)."""
    tokens: int = Field(48, ge=4)
    """Tokens per row (prompt 8, the rest trained completion)."""
    steps: int = Field(3, ge=1)
    """Optimizer steps per process count (the first warms up and is not timed, when > 1)."""
    noise: float = Field(0.1, ge=0)
    """Std of the noise added to the model's own logprobs as behaviour logprobs (nats)."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    result = run_trainer_bench(bench, with_keys(cfg, {}))
    result["config"] = config_record(bench, cfg, READS)
    if json_path:
        write_json(json_path, result)
    return 0


def make_batch(model, rows: int, tokens: int, noise: float, seed: int):
    """``rows`` single-segment trajectories in groups of 4 with random tokens and rewards."""
    from tidal.trainer.grpo import token_logprobs
    from tidal.trajectory import Batch, Segment, Trajectory

    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (rows, tokens), generator=g)
    prompt = 8
    with torch.no_grad():
        lp = token_logprobs(model(ids[:, :-1]), ids[:, 1:], 1.0)[:, prompt - 1:]
    lp = lp + noise * torch.randn(lp.shape, generator=g)
    trajs = []
    for r in range(rows):
        completion = ids[r, prompt:].tolist()
        seg = Segment(ids[r, :prompt].tolist(), completion, lp[r].tolist(), [0] * len(completion),
                      [1] * len(completion))
        trajs.append(Trajectory(f"task{r // 4}", r // 4, [seg], reward=float(torch.rand(1, generator=g) > 0.5)))
    return Batch(trajs, trainer_version=0)


def train(model, cfg: TidalConfig, processes: int, batch, steps: int) -> dict:
    """``steps`` steps at ``processes``; losses, norms, step times, memory per rank."""
    from tidal.trainer.sharded.launch import (
        ShardedTrainerHandle,
        local_state_bytes,
        peak_rss_bytes,
        reset_peak_rss,
    )
    from tidal.trainer.trainer import Trainer

    reset_peak_rss()  # rank 0's peak is this run's, not an earlier one's (spawned ranks start fresh)
    sharding = cfg.sharding.model_copy(update={"processes": processes})
    numerics = cfg.engine.numerics
    trainer = (Trainer(model, cfg.trainer, numerics=numerics) if processes == 1
               else ShardedTrainerHandle(model, cfg.trainer, sharding, numerics=numerics))
    try:
        stats = [trainer.step(batch) for _ in range(steps)]
        memory = (trainer.memory() if processes > 1 else
                  [{"state_bytes": local_state_bytes(trainer), "peak_rss_bytes": peak_rss_bytes()}])
    finally:
        if processes > 1:
            trainer.close()
    times = [s.step_time_s for s in stats]
    return {"loss": [s.loss for s in stats], "grad_norm": [s.grad_norm for s in stats],
            "step_time_s": statistics.median(times[1:] or times),
            "state_mb": [m["state_bytes"] / MB for m in memory],
            "peak_rss_mb": [m["peak_rss_bytes"] / MB for m in memory]}


def run_trainer_bench(bench: BenchSection, cfg: TidalConfig) -> dict:
    """Every process count from the same weights and batch; print; the result dict."""
    from tidal.model import build_model

    if torch_threads(cfg):
        torch.set_num_threads(torch_threads(cfg))
    base = build_model(cfg.model, seed=run_seed(cfg))
    params = sum(p.numel() for p in base.parameters())
    batch = make_batch(base, bench.rows, bench.tokens, bench.noise, run_seed(cfg))
    runs = {}
    for n in sorted({1, *bench.processes}):
        runs[n] = train(copy.deepcopy(base), cfg, n, batch, bench.steps)
        r = runs[n]
        print(f"N={n}: step {r['step_time_s']:.3f} s, state/rank {max(r['state_mb']):.1f} MiB, "
              f"peak RSS {', '.join(f'{x:.0f}' for x in r['peak_rss_mb'])} MiB, loss {r['loss']}",
              flush=True)
    one = runs[1]
    fsdp: dict = {"parameters": params, "runs": {str(n): r for n, r in runs.items()}}
    diffs = [abs(a - b) for n, r in runs.items() for a, b in zip(r["loss"], one["loss"])]
    norms = [abs(a - b) / b for r in runs.values() for a, b in zip(r["grad_norm"], one["grad_norm"])]
    fsdp["max_abs_loss_diff"] = max(diffs)
    fsdp["max_rel_grad_norm_diff"] = max(norms)
    for n, r in runs.items():
        if n > 1:
            fsdp[f"state_ratio_{n}"] = max(r["state_mb"]) / one["state_mb"][0]
            fsdp[f"rank_peak_rss_ratio_{n}"] = max(r["peak_rss_mb"]) / one["peak_rss_mb"][0]
            fsdp[f"step_time_ratio_{n}"] = r["step_time_s"] / one["step_time_s"]
    print({k: v for k, v in fsdp.items() if k not in ("runs",)})
    return {"fsdp": fsdp}


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "trainer"))
