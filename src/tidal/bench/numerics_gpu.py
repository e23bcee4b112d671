"""Engine-vs-trainer numerics of a random-initialised Qwen3-MoE, fast mode vs deterministic mode.

    python -m tidal.bench.numerics_gpu --bench.size 1b --json numerics_gpu.json   # on a GPU (~2.1B params)
    tidal bench numerics-gpu --bench.device cpu                                  # tiny: the CPU op sets
    python -m tidal.bench.numerics_gpu --bench.smoke true --bench.size smoke       # kernel checks first

The model is tidal's own (``build_model`` on the size's ``numerics-gpu-*`` preset, bf16, with the
run config's [model] keys given on top, e.g. ``--model.num_hidden_layers 4``; the run's seed
``run.seed``) and every call
is the one the engine and the trainer make: ``model(ids, positions, cache, slots,
deterministic=..., return_experts=True)`` to generate, ``model(ids, deterministic=...,
replay_experts=...)`` to recompute. On CUDA tensors the fused forward runs the GPU op sets
(tidal.numerics.make_ops): "fast" = kernels/fast_ops.py (cuBLAS, flash / memory-efficient SDPA,
grouped-GEMM experts: a tuned plain-torch peer; its trainer is the module forward),
"deterministic" = kernels/triton_ops.py (the batch-invariant Triton kernels). On the CPU the CPU
op sets run, or with ``TIDAL_OPS=gpu TRITON_INTERPRET=1`` the GPU ones in Triton's interpreter
(slow: ``--bench.workload interpreted``).

1. engine: waves of sequences (batch sizes from the workload, e.g. 64 .. 1). Each wave prefills
   its right-padded prompts in one forward, then decodes with a KV cache; sequences stop at their
   own lengths, so a decode step's batch shrinks as they finish (mixed batch sizes 1..64). Every
   sampled token records its logprob and, for every processed token, the top-k expert ids of
   each layer. Timed (prefill + decode, synchronised at wave edges) -> engine tokens/s. Every
   mode is warmed up first (untimed: kernel compilation, cuBLAS, the allocator); then
   ``repeats`` rounds with the modes interleaved (fast, det, fast, det); each mode's median
   round counts.
2. trainer: each wave's full sequences in one forward without a cache, without and with router
   replay (the engine's expert ids; gates from the trainer's own router probabilities over them);
   its logprob of every generated token and its expert ids.
3. metrics (tidal.numerics.metrics): bitwise-equal fraction, mean/max |Δ logprob|, k3 KL,
   routing flip rate per layer and tokens with any flip, with and without replay. Flips compare
   the engine's experts with the trainer router's own top-k (``return_experts``), which under
   replay is what the replay overrides: the experts used are the engine's by construction.

The JSON holds both modes, ``throughput_ratio`` (deterministic / fast engine tokens/s) and the
targets. Sections are guarded: this runs as one prepared script on a lent GPU, so a failure in one
is printed (traceback) and recorded, and the others still run; the JSON is rewritten after each.
The GPU machine has no pydantic (tidal.model needs it): scripts/gpu_numerics.sh installs it from
wheels carried with the checkout (scripts/gpu_wheels.sh).
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import asdict
from typing import Literal

import torch
from pydantic import Field, field_validator

from tidal.bench.common import write_json
from tidal.bench.config import (
    SEED_KEY,
    StrList,
    config_record,
    main,
    run_seed,
    with_preset,
)
from tidal.bench.numerics_gpu_passes import (
    SIZES,
    WORKLOADS,
    Wave,
    cross_mode_check,
    engine_round,
    make_bench_model,
    make_prompts,
    record_engine,
    trainer_metrics,
    warm_up,
)
from tidal.config import TidalConfig
from tidal.numerics import MODES
from tidal.config_section import Section

READS = ("model", SEED_KEY)
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""


class BenchSection(Section):
    """The model is the size's numerics-gpu preset with the run config's [model] keys given on
    top, initialised with the run's seed (run.seed), which also draws the prompts and
    seeds the sampler; no other run-config section is read (the passes are the engine's and the
    trainer's model calls, made here directly). On the CPU, one torch thread."""

    size: Literal[tuple(SIZES)] = "tiny"
    """Model and workload size: tiny (CPU), smoke (GPU kernel check, seconds), 1b (~2.1B params)."""
    workload: Literal[tuple(WORKLOADS)] | None = None
    """Which sequences to generate; unset = the size's own (interpreted: a few, for the Triton
    op set in Triton's interpreter)."""
    device: str = ""
    """torch device: cuda or cpu; "" = cuda where available, else cpu."""
    modes: StrList = Field(default_factory=lambda: list(MODES))
    """Which of fast, deterministic to run."""
    smoke: bool = False
    """First check each kernel against torch (tidal.kernels.checks)."""
    repeats: int = Field(2, ge=1)
    """Timed engine rounds per mode, interleaved across modes; the median is reported."""
    fast_experts: Literal["grouped_mm", "padded_bmm"] = "grouped_mm"
    """Fast mode's expert compute: grouped_mm (torch._grouped_mm where it works, else the padded
    bmm) or padded_bmm (never try it: the GPU script's choice when the smoke run did not confirm it)."""

    @field_validator("modes")
    @classmethod
    def _check_modes(cls, modes: list[str]) -> list[str]:
        unknown = sorted(set(modes) - set(MODES))
        if unknown or not modes:
            raise ValueError(f"unknown modes {unknown}; choose a subset of {list(MODES)}")
        return modes


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    return 1 if run_numerics(bench, cfg, json_path)["errors"] else 0


@torch.inference_mode()
def run_numerics(bench: BenchSection, cfg: TidalConfig, json_path: str | None = None) -> dict:
    """Build the model, optionally run the kernel checks; warm every mode up, then ``repeats``
    timed rounds with the modes interleaved (fast, det, fast, det: drift in clocks or heat hits
    both), the median per mode; then the trainer passes. Print and return."""
    device = torch.device(bench.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)  # one thread: the CPU probe's paths and the interpreter
    cfg = with_preset(cfg, SIZES[bench.size])
    workload, modes, seed = bench.workload or bench.size, tuple(bench.modes), run_seed(cfg)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    model = make_bench_model(cfg.model, device, seed)
    result = _header(model, bench.size, device, workload, bench.repeats)
    result["config"] = config_record(bench, cfg, READS)

    def save() -> None:
        if json_path:
            write_json(json_path, result)

    if bench.smoke:
        from tidal.kernels.checks import run_kernel_checks

        _guarded("kernel_checks", lambda: result.update(
            kernel_checks=run_kernel_checks(device, small=device.type == "cpu")), result)
        save()
    spec = make_prompts(WORKLOADS[workload], model.config.vocab_size, seed)
    _warm_up_modes(model, modes, spec, seed, sync, bench.fast_experts, result)
    save()
    waves = _timed_rounds(model, modes, spec, seed, sync, bench.repeats, result, save)
    _trainer_sections(model, modes, waves, sync, result, save)
    summarise(result)
    save()
    print_table(result)
    return result


def _header(model, size: str, device: torch.device, workload: str, repeats: int) -> dict:
    """The result's description of the run (model, machine, versions, workload); printed."""
    from tidal.numerics import ops_backend

    params = sum(p.numel() for p in model.parameters())
    backend = ops_backend(device)
    result: dict = {"size": size, "device": _device_name(device), "torch": torch.__version__,
                    "triton": _triton_version(), "ops": backend,
                    "interpreted": os.environ.get("TRITON_INTERPRET") == "1",
                    "model": model.config.model_dump(), "params": params,
                    "workload": {"name": workload, **asdict(WORKLOADS[workload])},
                    "repeats": repeats, "errors": {}}
    print(f"numerics-gpu: {size} MoE, {params / 1e9:.3f}B params, on {result['device']} "
          f"({backend} op sets{', Triton interpreter' if result['interpreted'] else ''}), "
          f"workload {workload}")
    return result


def _warm_up_modes(model, modes, spec, seed: int, sync, fast_experts: str, result: dict) -> None:
    """Set fast mode's expert compute, then warm every mode up (a guarded section each)."""
    fast_ops = model.fused_weights("fast", model.lm_head.weight.dtype).ops if "fast" in modes else None
    if fast_experts == "padded_bmm" and hasattr(fast_ops, "grouped_mm"):
        fast_ops.grouped_mm = False
    for mode in modes:
        _guarded(f"{mode}_warm_up", lambda mode=mode: warm_up(model, mode, spec, seed, sync), result)
    if fast_ops is not None:
        result["fast_experts"] = getattr(fast_ops, "experts_path", "per_expert")
        print(f"[fast] experts: {result['fast_experts']}")


def _timed_rounds(model, modes, spec, seed: int, sync, repeats: int, result: dict,
                  save) -> dict[str, list[Wave]]:
    """``repeats`` engine rounds, the modes interleaved (a guarded section each; a mode whose
    round failed runs no more) -> each mode's first round's rollouts."""
    waves: dict[str, list[Wave]] = {}
    rounds: dict[str, list[dict]] = {mode: [] for mode in modes}
    for _ in range(repeats):
        for mode in modes:
            if f"{mode}_engine" in result["errors"]:
                continue

            def timed_round(mode=mode) -> None:
                got, timing = engine_round(model, mode, spec, seed, sync)
                waves.setdefault(mode, got)  # the first round's rollouts feed the trainer
                rounds[mode].append(timing)
                record_engine(result.setdefault(mode, {}), got, rounds[mode], mode)

            _guarded(f"{mode}_engine", timed_round, result)
            save()
    return waves


def _trainer_sections(model, modes, waves: dict[str, list[Wave]], sync, result: dict,
                      save) -> None:
    """The trainer passes over each mode's rollouts, then the cross-mode check (guarded)."""
    for mode, rollouts in waves.items():
        _guarded(f"{mode}_trainer",
                 lambda mode=mode, rollouts=rollouts: trainer_metrics(model, mode, rollouts, sync,
                                                                      result[mode]),
                 result)
        save()
    if "fast" in modes and "deterministic" in waves:
        _guarded("cross_mode", lambda: cross_mode_check(model, waves["deterministic"], sync, result),
                 result)


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
            # the trainer router's own top-k (returned under replay too, which overrides it)
            "deterministic_zero_flips": det["no_replay"]["flip_rate"] == 0.0
            and det["replay"]["flip_rate"] == 0.0,
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


if __name__ == "__main__":
    sys.exit(main(sys.modules[__name__], "numerics-gpu"))
