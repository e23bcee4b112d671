"""Long-horizon success: RL with self-summarization vs the same RL budget with a sliding window.

    tidal bench horizon --json horizon.json                 # ~28 min on 2 CPU cores
    tidal bench horizon --quick --json horizon.json         # smaller budgets (QUICK; not timed)

On the "ledger" family (tidal.envs.ledger: the steps of f are read early, in files many
context windows before f is written), at each context window W:

    drill + mid-train once (cached) ──> model before RL ──┬─> eval, summarize mode ──> before_rl
                                                          ├─> eval, truncate mode
                                                          ├─> RL (summarize) for rl_s ──> eval ──> summarize
                                                          └─> RL (truncate)  for rl_s ──> eval ──> truncate

The peer is plain truncation: the harness's sliding window (keep the head and the newest turns)
with the same model, the same mid-training, the same RL algorithm and the same wall-clock budget.
Mid-training is next-token prediction of the scripted expert's turns and summaries in its
episodes, in the harness's own token format (tidal.envs.ledger.demos): first a drill at a
small window (one file per context, so a summary to copy every ~200 tokens), then the compared
windows. Without the drill, 10 minutes on the compared windows taught the model to carry each
step's operator but not its constant (success 0.00-0.12); with 5 + 5 minutes it carries both
most of the time, and what it still gets wrong (two steps with the same operator swapped, a step
never added) is what RL on the episode's reward can fix.

The RL loop here is synchronous and in-process (one engine, one trainer, no Ray): on 2 cores the
orchestrator's workers would only compete with the trainer, and both modes must see exactly the
same kind of budget. Each step: G episodes on each of ``tasks_per_step`` training tasks through
``run_episodes``, one GRPO ``Trainer.step`` on their segments (summaries included, each with its
episode's advantage), weights copied into the engine.

Figures: success = fraction of held-out episodes whose f passes every hidden test (one sample
per task at the RL sampler); the reward RL sees adds partial credit (< 1) for each step carried
right, so GRPO has a signal before the first full success. effective_horizon = the harness's transcript tokens / W of the
episodes run (mean and min), for the model and for the scripted expert. Budgets are wall-clock,
so on a busy machine fewer RL steps fit; the JSON records the steps each run made.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Literal

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from pydantic import Field  # noqa: E402

import tidal  # noqa: E402
from tidal.bench.common import write_json  # noqa: E402
from tidal.envs.ledger.demos import harness_for  # noqa: E402  (the family's harness settings)
from tidal.section import Section  # noqa: E402

MODES = ("summarize", "truncate")


class HorizonBenchConfig(Section):
    windows: list[int] = [384, 512]
    """Context windows compared, tokens (each >= 320: the head, a summary and a turn must fit)."""
    horizon: float = Field(10.5, gt=1.0)
    """Files per task are chosen so the expert's episode is at least this many windows long."""
    preset: str = "tiny"
    """Model size (tidal.model.presets)."""
    demo_episodes: int = Field(4000, ge=2)
    """Expert episodes rendered for mid-training, spread over the windows."""
    slip_rate: float = Field(0.0, ge=0.0, lt=1.0)
    """Chance that each expert summary drops or garbles a step (LedgerConfig.summary_slip_rate)."""
    drill_window: int = Field(272, ge=272)
    """Mid-training starts with demonstrations at this small window, about one file per context,
    so every ~200 tokens end in a summary that copies the steps' constants. On the real windows
    a summary comes every 400-500 tokens, and 10 minutes of that taught a tiny model each step's
    operator but not its digit; the short contexts make the copy signal 2-3x denser per token.
    (At 272 a file, the submit turn and a summary fit in one context; at 256 they do not, and
    the expert's episode never ends.)"""
    drill_files: int = Field(12, ge=2)
    """Files per drill task (its episodes are short: only the copying is drilled)."""
    drill_s: float = Field(300.0, ge=0)
    """Wall-clock budget of the drill stage, seconds (0 = no drill)."""
    pretrain_s: float = Field(300.0, gt=0)
    """Mid-training wall-clock budget on the compared windows (after the drill), seconds."""
    pretrain_lr: float = Field(3e-3, gt=0)
    """Peak mid-training learning rate."""
    pretrain_batch: int = Field(16, ge=1)
    """Segments per mid-training step."""
    rl_s: float = Field(180.0, gt=0)
    """RL wall-clock budget of each run (each window x mode), seconds."""
    rl_max_steps: int = Field(200, ge=0)
    """RL steps per run at most (the budget usually ends a run first)."""
    tasks_per_step: int = Field(4, ge=1)
    """Training tasks per RL step."""
    group_size: int = Field(4, ge=2)
    """Episodes per task per RL step (GRPO group)."""
    lr: float = Field(1e-4, gt=0)
    """RL learning rate (AdamW)."""
    eval_tasks: int = Field(32, ge=1)
    """Held-out tasks per evaluation (one episode each)."""
    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature of RL and evaluation."""
    numerics: Literal["deterministic", "fast"] = "fast"
    """engine.numerics of RL and evaluation (the trainer follows). "fast" here, unlike tidal's
    default: on 2 CPU cores the deterministic trainer forward takes 2x as long (an RL step of 16
    episodes at window 384: 25.6 s vs 15.1 s), and this benchmark measures what RL learns in a
    wall-clock budget; both modes get the same numerics."""
    threads: int = Field(2, ge=1)
    """Torch threads while the benchmark runs."""
    seed: int = 0
    cache_dir: str = ".cache/tidal/horizon"
    """Mid-trained models are cached here, keyed by what made them."""
    init_model: str | None = None
    """A mid-trained model folder to start from instead of mid-training (its corpus must match
    the windows and family settings; the JSON then says so)."""


QUICK = {"demo_episodes": 2000, "drill_s": 150.0, "pretrain_s": 150.0, "rl_s": 45.0, "eval_tasks": 16}
"""--quick: shorter budgets (figures from these are marked "quick" in the JSON)."""


# ---------------------------------------------------------------- per-window settings

def ledger_for(window: int, horizon: float, slip_rate: float):
    """A LedgerConfig whose expert episodes are at least ``horizon`` windows long at ``window``:
    the file count is scaled from a first guess by the expert's measured horizon, then grown
    until every probe episode is long enough."""
    from tidal.envs.ledger.config import LedgerConfig

    files = math.ceil(horizon * window / 110)
    for _ in range(20):
        cfg = LedgerConfig(num_files=files, summary_slip_rate=slip_rate)
        low = min(expert_stats(cfg, window)["effective_horizon"])
        if low >= horizon:
            return cfg
        files = max(files + 1, math.ceil(files * horizon / low))
    raise RuntimeError(f"could not make ledger episodes {horizon} windows long at window {window}")


def expert_stats(cfg, window: int, n: int = 8) -> dict:
    """The slip-free expert on ``n`` training tasks: per-episode horizon, tokens, resets."""
    from tidal.envs.ledger.tasks import sample_tasks
    from tidal.envs.ledger.demos import play_expert

    results = play_expert(sample_tasks(cfg, n, 7, False), window, 0.0, 0,
                          harness_for(window, "summarize", max_ops=cfg.max_ops))
    return {"effective_horizon": [r.effective_horizon for r in results],
            "model_tokens": [r.model_tokens for r in results],
            "turns": [r.turns for r in results],
            "resets": [r.resets for r in results],
            "reward": [r.reward for r in results]}


def expert_success(spec, tasks, setup: "WindowSetup", mode: str) -> float:
    """The slip-free scripted expert's success on ``tasks`` in ``mode``, graded like the model:
    the family's ceiling with summaries, and what a perfect reader keeps through a sliding
    window (nothing: the steps are read windows before f is written)."""
    from tidal.envs.ledger.demos import play_expert

    results = play_expert(tasks, setup.window, 0.0, 0, setup.harness(mode), env=spec.make)
    return sum(spec.success(r.reward, r.info) for r in results) / len(results)


class WindowSetup:
    """Everything that depends on the window: the family's settings and the harness budgets."""

    def __init__(self, window: int, bc: HorizonBenchConfig):
        self.window = window
        self.ledger = ledger_for(window, bc.horizon, bc.slip_rate)
        self.expert = expert_stats(self.ledger, window)
        # Budgets: twice what the expert needs, so a looping model is cut off, never a good one.
        self.max_turns = 2 * max(self.expert["turns"]) + 8
        self.max_tokens = 2 * max(self.expert["model_tokens"])

    def harness(self, mode: str):
        return harness_for(self.window, mode, self.max_turns, self.max_tokens, self.ledger.max_ops)


# ---------------------------------------------------------------- mid-training


def tidal_config(bc: HorizonBenchConfig):
    """The model, engine and pretrain sections used throughout (the largest window decides)."""
    from tidal.config import TidalConfig
    from tidal.model.presets import preset

    longest = max(bc.windows)
    model = preset(bc.preset).model_copy(update={"max_position_embeddings": longest})
    return TidalConfig.model_validate({
        "model": model.model_dump(),
        "engine": {"max_seq_len": longest, "max_new_tokens": 96, "temperature": bc.temperature,
                   "numerics": bc.numerics,
                   "max_batch_size": bc.tasks_per_step * bc.group_size + bc.eval_tasks,
                   "seed": bc.seed},
        "pretrain": {"seq_len": longest, "batch_size": bc.pretrain_batch, "lr": bc.pretrain_lr,
                     "time_budget_s": bc.pretrain_s, "max_steps": 1_000_000, "warmup_steps": 30,
                     "log_every": 50},
        "run": {"seed": bc.seed, "pretrain_threads": bc.threads},
    })


def midtrain_key(bc: HorizonBenchConfig, setups: list[WindowSetup]) -> str:
    """Hashes what makes the mid-trained model: the demonstrations' settings and the model and
    pretrain sections ``tidal_config`` builds (all of them, as tidal.pretrain.cache does)."""
    from tidal.pretrain.cache import NOT_HASHED
    from tidal.envs.ledger import tasks as longhorizon

    cfg = tidal_config(bc)
    what = {"bench": bc.model_dump(include={"windows", "horizon", "demo_episodes", "slip_rate", "seed",
                                            "drill_window", "drill_files", "drill_s"}),
            "model": cfg.model.model_dump(mode="json"),
            "pretrain": cfg.pretrain.model_dump(mode="json", exclude=NOT_HASHED["pretrain"]),
            "ledger": [s.ledger.model_dump(exclude={"corpus_window"}) for s in setups],
            "harness": [s.harness("summarize").model_dump() for s in setups],
            "generator": longhorizon.GENERATOR_VERSION, "tidal": tidal.__version__}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]


def midtrain(bc: HorizonBenchConfig, setups: list[WindowSetup], progress: bool) -> tuple[Path, dict]:
    """The mid-trained model folder (cached) and facts about its corpus and training: the drill
    stage (small window, if ``drill_s``), then the compared windows, from the drilled model."""
    from tidal.fsutil import replace_dir
    from tidal.model.checkpoint import COMPLETE_MARKER
    from tidal.pretrain.loop import MODEL_DIR

    root = Path(bc.cache_dir) / midtrain_key(bc, setups)
    if (root / MODEL_DIR / COMPLETE_MARKER).is_file():
        return root / MODEL_DIR, json.loads((root / "midtrain.json").read_text())
    cfg = tidal_config(bc)
    staging = root.parent / f".{root.name}.tmp-{uuid.uuid4().hex[:8]}"
    facts = {}
    if bc.drill_s > 0:
        from tidal.envs.ledger.config import LedgerConfig

        drill = LedgerConfig(num_files=bc.drill_files, summary_slip_rate=bc.slip_rate)
        episodes = max(1, bc.demo_episodes // 2)
        drill_cfg = cfg.model_copy(deep=True)
        drill_cfg.pretrain.seq_len = bc.drill_window
        drill_cfg.pretrain.time_budget_s = bc.drill_s
        facts["drill"] = _midtrain_stage(
            drill_cfg, staging / "drill", [(drill, bc.drill_window, harness_for(bc.drill_window, "summarize", max_ops=drill.max_ops))],
            episodes, bc.seed + 100, progress)
        cfg.model.init_from = str(staging / "drill" / MODEL_DIR)
    per_window = max(1, bc.demo_episodes // len(setups))
    facts.update(_midtrain_stage(cfg, staging, [(s.ledger, s.window, s.harness("summarize")) for s in setups],
                                 per_window, bc.seed, progress))
    (staging / "midtrain.json").write_text(json.dumps(facts))
    root.parent.mkdir(parents=True, exist_ok=True)
    replace_dir(staging, root)
    return root / MODEL_DIR, facts


def _midtrain_stage(cfg, out: Path, windows: list, episodes: int, seed: int, progress: bool) -> dict:
    """Next-token training on the expert's segments of ``episodes`` episodes per (ledger config,
    window, harness) in ``windows``; the model lands in ``out``. Returns the stage's facts."""
    from tidal.model.tokenizer import ByteTokenizer
    from tidal.pretrain.loop import METRICS_FILE, pretrain
    from tidal.envs.ledger.demos import demo_rows, demo_segments

    t0 = time.perf_counter()
    segments = []
    for i, (ledger, window, harness) in enumerate(windows):
        segments += demo_segments(ledger, window, episodes, seed + i, harness)
    rows = demo_rows(segments, cfg.pretrain.seq_len, ByteTokenizer().pad_id)
    corpus_s = time.perf_counter() - t0
    pretrain(cfg, out, rows=rows, progress=progress)
    curve = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    return {"segments": len(segments), "episodes": episodes * len(windows), "corpus_s": corpus_s,
            "steps": curve[-1]["step"], "final_loss": curve[-1]["loss"],
            "train_s": curve[-1]["elapsed_s"]}


# ---------------------------------------------------------------- RL and evaluation


class Policy:
    """A trainer and an engine on the same weights (the engine is refreshed after each step)."""

    def __init__(self, model_dir: Path, cfg, lr: float):
        from tidal.engine.engine import Engine
        from tidal.model import from_pretrained, load_tokenizer
        from tidal.trainer.config import TrainerConfig
        from tidal.trainer.trainer import Trainer

        model = from_pretrained(model_dir, dtype=torch.float32)
        tcfg = TrainerConfig(lr=lr, warmup_steps=0, micro_batch_size=16)
        self.trainer = Trainer(model, tcfg, temperature=cfg.engine.temperature,
                               pad_id=load_tokenizer(model_dir).pad_id, numerics=cfg.engine.numerics)
        self.engine = Engine(copy.deepcopy(model), load_tokenizer(model_dir), cfg.engine)

    def sync(self) -> None:
        self.engine.load_weights(self.trainer.model, self.trainer.version)


def episodes(policy: Policy, spec, tasks, harness, samples: int):
    from tidal.harness import run_episodes

    trajs, _ = run_episodes(policy.engine, spec, tasks, harness, samples_per_task=samples)
    return trajs


def rl(policy: Policy, spec, setup: WindowSetup, mode: str, bc: HorizonBenchConfig) -> dict:
    """GRPO for ``bc.rl_s`` seconds (or ``rl_max_steps``) in ``mode``; returns the run's curve."""
    from tidal.types import Batch

    curve = []
    start = time.perf_counter()
    step = 0
    while step < bc.rl_max_steps and time.perf_counter() - start < bc.rl_s:
        tasks = spec.sample_tasks(bc.tasks_per_step, bc.seed * 1_000_003 + step, False)
        trajs = episodes(policy, spec, tasks, setup.harness(mode), bc.group_size)
        metrics = policy.trainer.step(Batch(trajs, policy.trainer.version))
        policy.sync()
        step += 1
        curve.append({"step": step, "wall_s": time.perf_counter() - start,
                      "success": sum(t.solved for t in trajs) / len(trajs),
                      "loss": metrics.loss, "kl": metrics.kl})
    return {"steps": step, "wall_s": time.perf_counter() - start, "curve": curve}


def evaluate(policy: Policy, spec, tasks, harness) -> dict:
    trajs = episodes(policy, spec, tasks, harness, 1)
    horizon = [t.episode.effective_horizon for t in trajs]
    return {"success": sum(t.solved for t in trajs) / len(trajs),
            "effective_horizon": statistics.mean(horizon),
            "effective_horizon_min": min(horizon),
            "resets": statistics.mean(t.episode.resets for t in trajs),
            "summary_tokens_mean": statistics.mean(t.episode.summary_tokens_mean for t in trajs),
            "tool_errors": statistics.mean(t.episode.tool_errors for t in trajs),
            "episodes": len(trajs)}


def run_window(model_dir: Path, setup: WindowSetup, bc: HorizonBenchConfig, sandbox, log) -> dict:
    from tidal.envs.ledger.environment import load_environment

    cfg = tidal_config(bc).model_copy()
    cfg.engine.max_seq_len = setup.window
    spec = load_environment(sandbox, setup.ledger)
    heldout = spec.sample_tasks(bc.eval_tasks, 20261130, True)
    before = Policy(model_dir, cfg, bc.lr)
    out = {"window": setup.window, "num_files": setup.ledger.num_files,
           "expert_effective_horizon": statistics.mean(setup.expert["effective_horizon"]),
           "expert_resets": statistics.mean(setup.expert["resets"]),
           "expert_success": {mode: expert_success(spec, heldout, setup, mode) for mode in MODES}}
    for mode in MODES:
        out[f"before_rl_{mode}"] = evaluate(before, spec, heldout, setup.harness(mode))
        log(f"W={setup.window} before RL, {mode}: success {out[f'before_rl_{mode}']['success']:.2f}")
    for mode in MODES:
        policy = Policy(model_dir, cfg, bc.lr)
        out[f"rl_{mode}"] = rl(policy, spec, setup, mode, bc)
        out[f"after_rl_{mode}"] = evaluate(policy, spec, heldout, setup.harness(mode))
        log(f"W={setup.window} after {out[f'rl_{mode}']['steps']} RL steps, {mode}: "
            f"success {out[f'after_rl_{mode}']['success']:.2f}")
    return out


# ---------------------------------------------------------------- the benchmark


def run_horizon_bench(bc: HorizonBenchConfig, json_path: str | Path | None = None,
                      progress: bool = True, quick: bool = False) -> dict:
    from tidal.pretrain.loop import torch_threads
    from tidal.sandbox import Sandbox
    from tidal.sandbox.config import SandboxConfig

    t0 = time.perf_counter()
    log = (lambda msg: print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)) if progress else (lambda msg: None)
    torch.manual_seed(bc.seed)
    with torch_threads(bc.threads):
        setups = [WindowSetup(w, bc) for w in bc.windows]
        if bc.init_model:
            model_dir, mid = Path(bc.init_model), {"given": bc.init_model}
        else:
            model_dir, mid = midtrain(bc, setups, progress)
        log(f"mid-trained: {mid}")
        sandbox = Sandbox(SandboxConfig())
        windows = [run_window(model_dir, s, bc, sandbox, log) for s in setups]
    result = summarize_result(bc, windows, mid, quick, time.perf_counter() - t0)
    print_table(result)
    if json_path:
        write_json(json_path, result)
    return result


def summarize_result(bc: HorizonBenchConfig, windows: list[dict], mid: dict, quick: bool,
                     wall_s: float) -> dict:
    """The JSON: headline keys are means over the windows; ``by_window`` holds each one."""

    def mean(key: str, field: str = "success") -> float:
        return statistics.mean(w[key][field] for w in windows)

    summarize = mean("after_rl_summarize")
    truncate = mean("after_rl_truncate")
    return {
        "summarize": {"success": summarize, "effective_horizon": mean("after_rl_summarize", "effective_horizon")},
        "truncate": {"success": truncate, "effective_horizon": mean("after_rl_truncate", "effective_horizon")},
        "before_rl": {"success": mean("before_rl_summarize"),
                      "truncate_success": mean("before_rl_truncate")},
        "effective_horizon": min(min(w["after_rl_summarize"]["effective_horizon"],
                                     w["expert_effective_horizon"]) for w in windows),
        "summarize_minus_truncate_points": 100 * (summarize - truncate),
        "targets": {"effective_horizon": 10.0, "summarize_minus_truncate_points": 25.0},
        "windows": bc.windows,
        "by_window": {str(w["window"]): w for w in windows},
        "midtrain": mid,
        "budget": budget_label(bc, quick),
        "config": bc.model_dump(),
        "wall_s": wall_s,
        "torch": torch.__version__,
    }


def budget_label(bc: HorizonBenchConfig, quick: bool) -> str:
    """"full" only for the default budgets; "quick" for --quick; else "custom" (see config)."""
    if quick:
        return "quick"
    budgets = ("demo_episodes", "drill_s", "pretrain_s", "rl_s", "rl_max_steps", "eval_tasks", "init_model")
    default = HorizonBenchConfig()
    return "full" if all(getattr(bc, k) == getattr(default, k) for k in budgets) else "custom"


def print_table(r: dict) -> None:
    print(f"\nledger family, success on held-out tasks ({r['budget']} budgets)")
    print(f"{'window':>7} {'files':>6} {'before RL':>10} {'summarize':>10} {'truncate':>9} "
          f"{'diff pts':>9} {'horizon':>8} {'RL steps (s/t)':>15}")
    for key, w in r["by_window"].items():
        s, t = w["after_rl_summarize"]["success"], w["after_rl_truncate"]["success"]
        print(f"{key:>7} {w['num_files']:>6} {w['before_rl_summarize']['success']:>10.2f} "
              f"{s:>10.2f} {t:>9.2f} {100 * (s - t):>9.1f} "
              f"{w['after_rl_summarize']['effective_horizon']:>8.1f} "
              f"{w['rl_summarize']['steps']:>7}/{w['rl_truncate']['steps']}")
    print(f"mean: summarize {r['summarize']['success']:.2f}, truncate {r['truncate']['success']:.2f}, "
          f"before RL {r['before_rl']['success']:.2f}; effective horizon (min) "
          f"{r['effective_horizon']:.1f}x the window (targets: >= 10x, >= 25 points)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--quick", action="store_true", help="shorter budgets: " + json.dumps(QUICK))
    parser.add_argument("--windows", help="comma-separated context windows, e.g. 384,512")
    parser.add_argument("--rl-s", type=float, help="RL seconds per run")
    parser.add_argument("--pretrain-s", type=float, help="mid-training seconds")
    parser.add_argument("--threads", type=int, help="torch threads")
    parser.add_argument("--eval-tasks", type=int, help="held-out tasks per evaluation")
    parser.add_argument("--init-model", help="a mid-trained model folder (skips mid-training)")


def run_from_args(args) -> int:
    overrides = dict(QUICK) if args.quick else {}
    if args.windows:
        overrides["windows"] = [int(w) for w in args.windows.split(",")]
    for key in ("rl_s", "pretrain_s", "threads", "eval_tasks", "init_model"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    run_horizon_bench(HorizonBenchConfig(**overrides), args.json, quick=args.quick)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(p)
    raise SystemExit(run_from_args(p.parse_args()))
