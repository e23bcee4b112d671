"""Where the default recipe's time goes, per phase, per op and outside ops: deterministic vs fast.

    tidal bench profile --json profile.json
    tidal bench profile --bench.steps 5 --env.name fixit

Four phases of the main job, each on the recipe's model at the recipe's sizes (fresh weights:
the speed of an op does not depend on its values), profiled with the torch profiler after one
unprofiled warm-up:

- mid-training: one optimizer step on ``pretrain.batch_size`` x ``pretrain.seq_len`` rows;
- prefill: the engine admitting ``tasks_per_step x group_size`` prompts of ``prompt_tokens``;
- decode: one engine step of those requests after their prefill (``decode_steps`` of them);
- RL trainer: one GRPO step on the same rows with ``completion_tokens`` each.

Each phase runs under both engine.numerics modes, side by side (the peer is tidal's own fast
path, what a user gives up determinism for); its wall time per step, the time inside torch ops
(self CPU, summed), the rest (Python, dispatch and the profiler's own cost: an upper bound of
the interpreter's share) and the top ops by self time are printed and written to the JSON.
"""

from __future__ import annotations

import torch
from pydantic import Field

from tidal.bench.common import write_json
from tidal.bench.config import config_record, main
from tidal.bench.profile_phases import decode_phase, midtraining_phase, prefill_phase, trainer_phase
from tidal.config import TidalConfig
from tidal.config_section import Section

READS = ("model", "engine", "trainer", "pretrain", "orchestrator.tasks_per_step",
         "orchestrator.group_size", "run")
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""
PHASES = ("mid-training step", "prefill", "decode step", "RL trainer step")


class BenchSection(Section):
    """The sizes the recipe does not fix, and how much is profiled."""

    prompt_tokens: int = Field(96, ge=2)
    """Tokens of each RL prompt (the default family's first-turn prompts are ~80-120)."""
    completion_tokens: int = Field(64, ge=1)
    """Tokens of each completion the RL trainer step trains on."""
    decode_steps: int = Field(16, ge=1)
    """Engine decode steps profiled (each generates one token of every request)."""
    steps: int = Field(2, ge=1)
    """Profiled steps of the mid-training and RL trainer phases (after one warm-up)."""
    top: int = Field(10, ge=1)
    """Ops listed per phase, by self CPU time."""
    numerics: list[str] = ["deterministic", "fast"]
    """engine.numerics modes profiled, side by side."""


QUICK = {"bench.decode_steps": 2, "bench.steps": 1, "bench.prompt_tokens": 16,
         "bench.completion_tokens": 8, "pretrain.batch_size": 2, "orchestrator.tasks_per_step": 1,
         "orchestrator.group_size": 2}


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    torch.manual_seed(cfg.run.seed)
    if cfg.run.trainer_threads:
        torch.set_num_threads(cfg.run.trainer_threads)
    midtraining = midtraining_phase(cfg, bench.steps, bench.top)  # the same in every arm: once
    arms = {mode: profile_phases(bench, cfg, mode, midtraining) for mode in bench.numerics}
    result = {"threads": torch.get_num_threads(), "dtype": cfg.model.dtype, "arms": arms,
              "config": config_record(bench, cfg, READS)}
    _print(result)
    if json_path:
        write_json(json_path, result)
    return 0


def profile_phases(bench: BenchSection, cfg: TidalConfig, numerics: str, midtraining: dict) -> dict:
    """Every phase's profile under ``numerics`` (mid-training's, which it does not change, given)."""
    return {
        "mid-training step": midtraining,
        "prefill": prefill_phase(cfg, bench, numerics),
        "decode step": decode_phase(cfg, bench, numerics),
        "RL trainer step": trainer_phase(cfg, bench, numerics),
    }


def _print(result: dict) -> None:
    arms = result["arms"]
    print(f"tidal bench profile: {result['threads']} threads, model dtype {result['dtype']}")
    print(f"{'phase':<20}" + "".join(f"{m + ' ms':>22}{'in ops':>9}{'op calls':>10}" for m in arms))
    for phase in PHASES:
        row = f"{phase:<20}"
        for mode in arms:
            p = arms[mode][phase]
            row += f"{p['wall_ms']:>22.1f}{p['in_ops_ms'] / p['wall_ms']:>9.0%}{p['op_calls']:>10}"
        print(row)
    modes = list(arms)
    if len(modes) == 2:
        a, b = modes
        print("ratio " + f"{b} / {a} wall time per phase: " + ", ".join(
            f"{ph} {arms[b][ph]['wall_ms'] / arms[a][ph]['wall_ms']:.2f}" for ph in PHASES))
    for mode in modes:
        for phase in PHASES:
            p = arms[mode][phase]
            print(f"\n{mode}, {phase}: {p['wall_ms']:.1f} ms a step, {p['in_ops_ms']:.1f} in ops, "
                  f"{p['outside_ops_ms']:.1f} outside (Python, dispatch, profiler)")
            for op in p["top_ops"]:
                print(f"  {op['op']:<44}{op['self_ms']:>9.2f} ms {op['share']:>5.0%} "
                      f"{op['calls']:>7} calls {op['mean_us']:>9.1f} us")


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.modules[__name__], "profile"))
