"""`tidal bench peer`: RL of a pretrained model through tidal and through TRL's GRPOTrainer, side
by side in one run, judged by one evaluator.

    tidal bench peer smollm2 --json peer.json                  # the recipe's model, tasks, settings
    tidal bench peer smollm2 --bench.budget_s 300 --quick      # a shorter look

Both arms start from ``model.init_from`` (the recipe's) with the same training tasks (funcs,
``env.args``), group size (orchestrator.group_size), prompts per step (tasks_per_step), completion
limit (engine.max_new_tokens), temperature, learning rate, reward (partial credit included) and
RL wall budget (``bench.budget_s``; start-up, conversion and evaluations are outside it):

    tidal   `tidal train RECIPE` in a child process (its engine, trainer and Ray workers as a user
            runs them), its in-run evaluations cut to a few tasks (the benchmark evaluates)
    TRL     tidal.bench.peer_trl in a child process: GRPOTrainer, transformers' generate, fp32

One evaluator judges the model before RL and each arm's final checkpoint: tidal's held-out
funcs pass@1 (greedy: orchestrator.eval_temperature = 0, ``bench.heldout_tasks`` tasks) and, for
what the model could already do outside funcs, the "requests" family (plain-English string and
list tasks, ``bench.other_tasks``). Beside it: completions per minute of RL, RL steps, each
arm's peak RSS (its main process: ``ru_maxrss`` of a fresh wrapper's children), tidal's engine
against transformers' ``generate`` at ``bench.engine_batch`` (greedy, fixed length; tidal in
the run's numerics and dtype, generate in fp32 and in the run's dtype, the faster taken), and
the fraction of trained tokens whose engine logprob equals the trainer's bit for bit. JSON keys
``peer.*`` are the headline figures.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from pydantic import Field

from tidal.bench.common import bitwise_equal_fraction, greedy_heldout, train_in_child, write_json
from tidal.bench.config import config_record, main, with_keys
from tidal.config import ConfigError, TidalConfig
from tidal.config_section import Section

READS = ("model", "engine", "trainer", "orchestrator", "env", "harness", "run")
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""
QUICK = {"bench.budget_s": 120.0, "bench.heldout_tasks": 32, "bench.other_tasks": 16}

MEASURE_RSS = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
               "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN)"
               ".ru_maxrss)); sys.exit(rc)")
"""A fresh wrapper process: runs one arm and writes the peak RSS (KiB) of its children alone."""


class BenchSection(Section):
    """The budget and the evaluator's task counts; everything else is the recipe's."""

    budget_s: float = Field(900.0, gt=0)
    """RL wall-clock seconds of each arm (tidal: orchestrator.time_budget_s; TRL: from its first
    step; each finishes the step running when the budget ends)."""
    heldout_tasks: int = Field(256, ge=1)
    """Held-out funcs tasks of the evaluator (greedy pass@1; one standard error ~3 points at 256)."""
    other_tasks: int = Field(64, ge=1)
    """Held-out "requests" tasks (other kinds of plain-English coding requests)."""
    engine_batch: int = Field(32, ge=1)
    """Sequences of the engine-vs-generate measurement."""
    engine_tokens: int = Field(64, ge=1)
    """Tokens each sequence generates there (eos ignored)."""
    runs_dir: str = ""
    """Where the arms' run folders and checkpoints go; "" = runs/bench-peer-<time>."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    if not cfg.model.init_from:
        raise ConfigError("tidal bench peer compares RL of a pretrained model: give a recipe with "
                          "model.init_from, e.g. `tidal bench peer smollm2`")
    if cfg.env.name != "funcs":
        raise ConfigError(f"tidal bench peer runs the funcs family (TRL's arm grades with its "
                          f"grader); env.name is {cfg.env.name!r}")
    root = Path(bench.runs_dir or f"runs/bench-peer-{time.strftime('%Y%m%d-%H%M%S')}").absolute()
    root.mkdir(parents=True, exist_ok=True)
    result = {"before": evaluate(bench, cfg, cfg.model.init_from)}
    print(f"before RL: {result['before']}", flush=True)
    result["engine_vs_generate"] = engine_vs_generate(bench, cfg)
    result["tidal"] = tidal_arm(bench, cfg, root / "tidal")
    result["trl"] = trl_arm(bench, cfg, root / "trl")
    for arm in ("tidal", "trl"):
        result[arm]["after"] = evaluate(bench, cfg, result[arm]["checkpoint"])
    result["peer"] = headline(result)
    result["config"] = config_record(bench, cfg, READS)
    print_table(result)
    write_json(json_path or root / "peer.json", result)
    return 0


# ------------------------------------------------------------------ the arms


def tidal_arm(bench: BenchSection, cfg: TidalConfig, run_dir: Path) -> dict:
    """`tidal train` on the recipe with the budget, in a child process."""
    rss_file = run_dir.parent / "tidal-rss"
    summary, steps = train_in_child(cfg, bench.budget_s, run_dir, run_dir.parent / "tidal-recipe.toml",
                                    lambda command: _measured(command, rss_file))
    completions = summary["trajectories"] + summary.get("dropped_stale", 0)
    return {"steps": summary["steps"], "completions": completions, "rl_wall_s": summary["rl_wall_s"],
            "completions_per_min": 60 * completions / summary["rl_wall_s"],
            "peak_rss_mb": int(rss_file.read_text()) / 1024, "checkpoint": summary["final_checkpoint"],
            "bitwise_equal_fraction": bitwise_equal_fraction(steps),
            "reward_mean_by_step": [s["reward_mean"] for s in steps]}


def trl_arm(bench: BenchSection, cfg: TidalConfig, out: Path) -> dict:
    """tidal.bench.peer_trl with the recipe's settings, in a child process."""
    oc, ec = cfg.orchestrator, cfg.engine
    out.mkdir(parents=True, exist_ok=True)
    spec = {"checkpoint": cfg.model.init_from, "save_to": str(out / "model"),
            "train_seed": cfg.run.seed, "group": oc.group_size, "prompts_per_step": oc.tasks_per_step,
            "max_completion_tokens": ec.max_new_tokens, "temperature": ec.temperature,
            "learning_rate": cfg.trainer.lr, "wall_budget_s": bench.budget_s,
            "torch_threads": cfg.run.trainer_threads, "seed": cfg.run.seed,
            "funcs": cfg.env.args, "sandbox": cfg.env.sandbox.model_dump()}
    (out / "spec.json").write_text(json.dumps(spec, indent=2))
    rss_kb = _measured([sys.executable, "-m", "tidal.bench.peer_trl", "--spec", str(out / "spec.json"),
                        "--out", str(out / "result.json")], out / "rss")
    got = json.loads((out / "result.json").read_text())
    return {"steps": got["steps"], "completions": got["completions"], "rl_wall_s": got["train_wall_s"],
            "completions_per_min": got["completions_per_min"], "peak_rss_mb": rss_kb / 1024,
            "checkpoint": got["saved_to"], "reward_mean_by_step": got["mean_reward_per_step"]}


def _measured(command: list[str], rss_file: Path) -> int:
    """Run ``command`` under a fresh wrapper; its peak RSS in KiB. A failed arm stops the run."""
    subprocess.run([sys.executable, "-c", MEASURE_RSS, str(rss_file), *command], check=True)
    return int(rss_file.read_text())


# ------------------------------------------------------------------ the one evaluator


def evaluate(bench: BenchSection, cfg: TidalConfig, checkpoint: str) -> dict:
    """Greedy held-out pass@1 of a checkpoint folder on funcs and on "requests"."""
    other = {"env.name": "requests", "env.args": {}}
    out = {}
    for name, keys, n in (("funcs", {}, bench.heldout_tasks), ("requests", other, bench.other_tasks)):
        r = greedy_heldout(cfg, checkpoint, n, **keys)
        out[name] = r["pass1"]
        out[f"{name}_by_level"] = r["pass1_by_level"]
    return out


def engine_vs_generate(bench: BenchSection, cfg: TidalConfig) -> dict:
    """Tokens/s of tidal's engine (the run's numerics and dtype) and of transformers' generate
    (fp32, its KV cache) on the same prompt, batch and length, greedy, eos ignored."""
    import torch
    from transformers import AutoModelForCausalLM

    from tidal.engine.engine import Engine
    from tidal.engine.request import GenerationRequest
    from tidal.model import from_pretrained, load_tokenizer

    torch.set_num_threads(cfg.run.trainer_threads or torch.get_num_threads())
    folder = cfg.model.init_from
    tok = load_tokenizer(folder)
    prompt = tok.encode_chat([{"role": "user", "content": "Write a Python function f(x) that "
                                                          "returns x squared."}])
    b, n = bench.engine_batch, bench.engine_tokens
    engine = Engine(from_pretrained(folder, dtype=getattr(torch, cfg.model.dtype)), tok,
                    cfg.engine.model_copy(update={"temperature": 0.0}))
    engine.generate([GenerationRequest(prompt_ids=prompt, max_new_tokens=2)])  # probe, prepare
    start = time.perf_counter()
    engine.generate([GenerationRequest(prompt_ids=prompt, max_new_tokens=n, ignore_eos=True)
                     for _ in range(b)])
    tidal_tps = b * n / (time.perf_counter() - start)
    ids = torch.tensor([prompt] * b)
    generate_tps = {}
    for dtype in dict.fromkeys(("float32", cfg.model.dtype)):  # fp32, and the run's dtype
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
        with torch.no_grad():
            hf.generate(ids[:1], max_new_tokens=2, do_sample=False)
            start = time.perf_counter()
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                        min_new_tokens=n, do_sample=False, pad_token_id=tok.pad_id)
        generate_tps[dtype] = b * n / (time.perf_counter() - start)
    peer = max(generate_tps.values())
    return {"tidal_tokens_per_s": tidal_tps, "generate_tokens_per_s": generate_tps,
            "ratio": tidal_tps / peer, "ratio_against": "the faster generate dtype", "batch": b,
            "tokens": n, "tidal_numerics": cfg.engine.numerics, "tidal_dtype": cfg.model.dtype}


# ------------------------------------------------------------------ report


def headline(r: dict) -> dict:
    gain = lambda arm, fam: r[arm]["after"][fam] - r["before"][fam]
    return {"completions_per_min_ratio": r["tidal"]["completions_per_min"] / r["trl"]["completions_per_min"],
            "tidal_gain": gain("tidal", "funcs"), "trl_gain": gain("trl", "funcs"),
            "tidal_other_change": gain("tidal", "requests"), "trl_other_change": gain("trl", "requests"),
            "bitwise_equal_fraction": r["tidal"]["bitwise_equal_fraction"],
            "engine_vs_generate": r["engine_vs_generate"]["ratio"],
            "tidal_checkpoint": r["tidal"]["checkpoint"]}


def print_table(r: dict) -> None:
    print(f"{'':<26}{'tidal':>12}{'TRL':>12}")
    rows = [("RL steps", "steps", "{:.0f}"), ("completions / min", "completions_per_min", "{:.1f}"),
            ("RL wall s", "rl_wall_s", "{:.0f}"), ("peak RSS MB", "peak_rss_mb", "{:.0f}")]
    for label, key, fmt in rows:
        print(f"{label:<26}{fmt.format(r['tidal'][key]):>12}{fmt.format(r['trl'][key]):>12}")
    for fam in ("funcs", "requests"):
        print(f"{fam + ' pass@1 before':<26}{r['before'][fam]:>12.3f}{r['before'][fam]:>12.3f}")
        print(f"{fam + ' pass@1 after':<26}{r['tidal']['after'][fam]:>12.3f}{r['trl']['after'][fam]:>12.3f}")
    p = r["peer"]
    print(f"completions/min ratio {p['completions_per_min_ratio']:.2f}; gain tidal "
          f"{100 * p['tidal_gain']:+.1f} points, TRL {100 * p['trl_gain']:+.1f}; engine vs generate "
          f"{p['engine_vs_generate']:.2f}x; bitwise-equal fraction {p['bitwise_equal_fraction']}",
          flush=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "peer"))
