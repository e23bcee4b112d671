"""`tidal train | pretrain | eval | report`: the main job and what inspects its results."""

from __future__ import annotations

import json
import time
from pathlib import Path


def _load(args, rest):
    from tidal.config import load_config

    return load_config(args.config, rest)


TRAIN_DTYPES = ("model.dtype", "trainer.dtype", "pretrain.dtype")
"""The dtypes `tidal train` computes in (pretrain.dtype: when no pretrained model is cached)."""
PRETRAIN_DTYPES = ("pretrain.dtype", "model.dtype")
"""The dtypes of `tidal pretrain`: its forward pass, and the saved checkpoint's parameters."""


def _print_config(cfg, dtypes: tuple[str, ...]) -> None:
    print(_config_toml(cfg, dtypes, recipe=True), end="")


def dtype_line(cfg, keys: tuple[str, ...]) -> str:
    """The dtypes a command computes in, and why "auto" chose what it did, on one line:
    ``dtype: model auto -> float32, trainer auto -> float32 (no native bf16: <CPU>, <why>)``."""
    from tidal.hardware import explain_dtype

    choices = [(key.removesuffix(".dtype"), cfg.dtype_choices()[key]) for key in keys]
    parts = [f"{name} auto -> {c['resolved']}" if c["requested"] == "auto" else f"{name} {c['resolved']}"
             for name, c in choices]
    why = f" ({explain_dtype()})" if any(c["requested"] == "auto" for _, c in choices) else ""
    return "dtype: " + ", ".join(parts) + why


def check_environment(cfg, mid_training: bool, sandbox=None):
    """Import and build the selected environment now, so a wrong env.name, a missing module or
    a bad env.args fails in the first second instead of after mid-training; with
    ``mid_training``, also that a corpus can be had. Returns (the EnvironmentSpec, built on
    ``sandbox``: the run's one, handed on to the pretrain cache and the RL loop; a comment line
    naming the environment and its resolved args)."""
    from tidal.env import from_config, registry, require_corpus, resolved_args

    spec = from_config(cfg.env, sandbox)
    if mid_training and not cfg.pretrain.corpus:
        require_corpus(spec, cfg.env.name)
    args = json.dumps(resolved_args(cfg.env), sort_keys=True)
    return spec, f"# env: {cfg.env.name} ({registry.module_path(cfg.env.name)}), args {args}"


def cmd_train(args, rest) -> int:
    if args.resume:
        return _resume(args, rest)
    cfg = _load(args, rest)
    if args.dry_run:
        print(check_environment(cfg, mid_training=not cfg.model.init_from)[1])
        _print_config(cfg, TRAIN_DTYPES)
        return 0
    from tidal.openmp import pretrain_child_env
    from tidal.pretrain.cache import cached_pretrained
    from tidal.pretrain.loop import budget_bound
    from tidal.sandbox import Sandbox

    env, _ = check_environment(cfg, not cfg.model.init_from, Sandbox(cfg.env.sandbox))

    print(dtype_line(cfg, TRAIN_DTYPES), flush=True)
    run_dir = Path(args.run_dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(_config_toml(cfg, TRAIN_DTYPES, recipe=False))
    t0 = time.perf_counter()
    init = cfg.model.init_from or cached_pretrained(cfg, child_env=pretrain_child_env(), env=env)
    info = {"init_checkpoint": str(init), "pretrain_s": time.perf_counter() - t0,
            "pretrain_budget_bound": budget_bound(init)}
    (run_dir / "run_info.json").write_text(json.dumps(info))
    return _rl(cfg, run_dir, info, resume=False, t0=t0, env=env)


def _resume(args, rest) -> int:
    from tidal.config import ConfigError, load_config

    run_dir = Path(args.resume)
    if not (run_dir / "config.toml").is_file() or not (run_dir / "run_info.json").is_file():
        raise ConfigError(f"--resume {run_dir}: not a tidal run folder (no config.toml / run_info.json)")
    cfg = load_config(run_dir / "config.toml", rest)
    from tidal.sandbox import Sandbox

    env, _ = check_environment(cfg, False, Sandbox(cfg.env.sandbox))
    print(dtype_line(cfg, TRAIN_DTYPES), flush=True)
    info = json.loads((run_dir / "run_info.json").read_text())
    return _rl(cfg, run_dir, info, resume=True, t0=time.perf_counter(), env=env)


def numerics_line(cfg) -> str:
    """``numerics: deterministic float32: linear=onednn attention=unpadded ...``: the paths the
    engine and the trainer run on this machine (tidal doctor lists every candidate)."""
    if cfg.engine.numerics != "deterministic":
        return f"numerics: {cfg.engine.numerics}"
    from tidal.orchestrator.numerics_watch import opset_of

    return "numerics: " + opset_of(cfg.model)


def _rl(cfg, run_dir: Path, info: dict, resume: bool, t0: float, env) -> int:
    from tidal.fleet.pools import RemoteFleet
    from tidal.orchestrator.loop import run_rl
    from tidal.orchestrator.report import print_summary
    from tidal.orchestrator.run_output import write_summary
    from tidal.telemetry.plots import plot_run

    print(numerics_line(cfg), flush=True)
    summary = run_rl(cfg, run_dir, info["init_checkpoint"], resume=resume, remote_pools=RemoteFleet,
                     env=env)
    summary.pretrain_s = info["pretrain_s"]
    summary.pretrain_budget_bound = info.get("pretrain_budget_bound", False)
    summary.wall_s = None if resume else time.perf_counter() - t0  # t0: before mid-training
    summary.plot = str(plot_run(run_dir))
    summary.report = str(run_dir / "report.html")
    path = write_summary(run_dir, summary)  # first: the report's header reads it
    _report(run_dir)
    print_summary(summary, path)
    if cfg.orchestrator.guard.numerics_mismatch == "stop" and (summary.numerics or {}).get("mismatched_steps"):
        from tidal.orchestrator.numerics_watch import NumericsMismatch

        raise NumericsMismatch(f"RL stopped at {summary.numerics['mismatch']} (the final checkpoint, report "
                               f"and summary are saved in {run_dir})")
    return 0


def _report(run_dir: Path) -> str:
    from tidal.telemetry.report import write_report

    return str(write_report(run_dir))


def _config_toml(cfg, dtypes: tuple[str, ...], recipe: bool) -> str:
    """The config as TOML, opening with the dtype line as a comment. ``recipe``: each "auto"
    dtype stays "auto" (portable: it resolves on the machine that loads it; `--dry-run`); else
    the dtypes resolved here (a run folder's record, which a resumed run must keep)."""
    from tidal.config.dump import recipe_tree, to_toml

    tree = recipe_tree(cfg) if recipe else cfg.model_dump(mode="json")
    note = ('"auto" kept: it resolves on the machine that loads this recipe' if recipe
            else "resolved on the machine that ran this; a resumed run keeps them")
    return f"# {dtype_line(cfg, dtypes)}\n# ({note})\n\n" + to_toml(tree) + "\n"


def cmd_pretrain(args, rest) -> int:
    cfg = _load(args, rest)
    _, env_line = check_environment(cfg, mid_training=True)
    if args.dry_run:
        print(env_line)
        _print_config(cfg, PRETRAIN_DTYPES)
        return 0
    from tidal.pretrain.loop import pretrain

    print(dtype_line(cfg, PRETRAIN_DTYPES), flush=True)
    out = Path(args.out or f"runs/pretrain-{time.strftime('%Y%m%d-%H%M%S')}")
    path = pretrain(cfg, out)
    print(f"pretrained checkpoint: {path}")
    return 0


def cmd_eval(args, rest) -> int:
    """Held-out pass@1 of a checkpoint folder, or of a run directory's final and best
    checkpoints (each named, with its step; one evaluation when they are the same folder)."""
    import json

    from tidal.env import from_config
    from tidal.orchestrator.evaluate import evaluate_checkpoint
    from tidal.sandbox import Sandbox

    target = Path(args.checkpoint)
    named = run_checkpoints(target) if is_run_dir(target) else None
    if named is not None and args.config is None and (target / "config.toml").is_file():
        args.config = str(target / "config.toml")  # the run's own env, seeds and sampler
    cfg = _load(args, rest)
    env = from_config(cfg.env, Sandbox(cfg.env.sandbox))  # first: a bad env fails at once
    if named is None:
        print(json.dumps(evaluate_checkpoint(cfg, env, target, args.tasks), indent=2))
        return 0
    done: dict[str, dict] = {}
    out = {}
    for name, (path, step) in named.items():
        result = done.get(path) or evaluate_checkpoint(cfg, env, Path(path), args.tasks)
        done[path] = result
        out[name] = {**result, "step": step}
    print(json.dumps({"run_dir": str(target), **out}, indent=2))
    return 0


def is_run_dir(path: Path) -> bool:
    """A tidal run directory (summary.json or checkpoints/), not a checkpoint folder."""
    return path.is_dir() and not (path / "config.json").is_file() and (
        (path / "summary.json").is_file() or (path / "checkpoints").is_dir())


def run_checkpoints(run_dir: Path) -> dict[str, tuple[str, int]]:
    """{"final": (folder, step), "best": (folder, step)} of a run: from summary.json, or, for a
    run that has not finished, its latest checkpoint (as "final") and the best its state names."""
    from tidal.config import ConfigError

    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        s = json.loads(summary_path.read_text())
        final = (s["final_checkpoint"], s["steps"])
        if s.get("best_checkpoint") is None:  # a run from before the guard
            return {"final": final}
        return {"final": final, "best": (s["best_checkpoint"], s["best_step"])}
    from tidal.trainer.checkpoint import TRAINER_STATE, _read_state, latest_checkpoint

    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise ConfigError(f"{run_dir} has no summary.json and no complete checkpoint: nothing to "
                          "evaluate yet; pass a checkpoint folder instead")
    state = _read_state(latest / TRAINER_STATE)["extra"].get("state", {})
    named = {"final": (str(latest), int(state.get("step", 0)))}
    if state.get("best"):
        named["best"] = (state["best"]["path"], state["best"]["step"])
    return named


def cmd_report(args, rest) -> int:
    if rest:
        raise SystemExit(f"tidal report: unexpected arguments {rest}")
    from tidal.config import ConfigError
    from tidal.telemetry.report import write_report

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} does not exist")
    if not (run_dir / "metrics.jsonl").is_file():
        raise ConfigError(f"{run_dir / 'metrics.jsonl'} not found: is {run_dir} a tidal run directory?")
    print(write_report(run_dir))
    return 0


def add_parsers(sub) -> None:
    t = sub.add_parser("train", help="the main job: mid-train if needed, then RL, then report")
    t.add_argument("config", nargs="?", help="TOML recipe (default: the built-in recipe)")
    t.add_argument("--run-dir", help="where metrics, checkpoints and the summary go")
    t.add_argument("--dry-run", action="store_true", help="print the resolved config and exit")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    t.set_defaults(fn=cmd_train)

    pt = sub.add_parser("pretrain", help="mid-train a model by next-token prediction on a corpus")
    pt.add_argument("config", nargs="?")
    pt.add_argument("--out", help="output checkpoint folder")
    pt.add_argument("--dry-run", action="store_true")
    pt.set_defaults(fn=cmd_pretrain)

    e = sub.add_parser("eval", help="held-out pass@1 of a checkpoint, or of a run's final and best checkpoints")
    e.add_argument("checkpoint", help="Hugging Face checkpoint folder, or a run directory (its final "
                   "and best checkpoints, with the run's config.toml unless a config is given)")
    e.add_argument("config", nargs="?")
    e.add_argument("--tasks", type=int, help="held-out tasks (default orchestrator.heldout_tasks)")
    e.set_defaults(fn=cmd_eval)

    r = sub.add_parser("report", help="write RUN_DIR/report.html: summary, reward, staleness, workers, throughput")
    r.add_argument("run_dir", help="a run directory holding metrics.jsonl")
    r.set_defaults(fn=cmd_report)
