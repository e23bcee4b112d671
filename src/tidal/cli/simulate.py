"""`tidal simulate CONFIG | calibrate RUN_DIR`: predict a fleet's run, or fit the models to one.

    tidal simulate CONFIG.toml [--json PATH] [--steps N] [--seed S] [--SECTION.KEY VALUE ...]
    tidal simulate local | global          the shipped examples (tidal/fleet/examples/)
    tidal simulate calibrate RUN_DIR [--out MODEL.toml]

CONFIG is a tidal recipe ([orchestrator], [fleet], ...) plus a [simulate] table of the models'
constants (tidal.fleet.sim_model.SimModel); docs/fleet.md, "Simulator".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parsers(sub) -> None:
    p = sub.add_parser("simulate", help="simulate a fleet's run on a simulated clock, or calibrate its models",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", metavar="CONFIG", help="a simulate recipe, an example name (local, global), "
                   "or `calibrate`")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="with `calibrate`: the measured run's folder")
    p.add_argument("--json", help="write the prediction as JSON here")
    p.add_argument("--steps", type=int, help="trainer steps to simulate (default orchestrator.steps)")
    p.add_argument("--seed", type=int, help="seed of the rollout lengths (default run.seed)")
    p.add_argument("--out", help="with `calibrate`: write the fitted [simulate] table here")
    p.set_defaults(fn=cmd_simulate)


def cmd_simulate(args, rest) -> int:
    from tidal.fleet.sim_model import SimulateError

    if args.config == "calibrate":
        if not args.run_dir:
            raise SimulateError("tidal simulate calibrate needs RUN_DIR: the folder of a `tidal train` run")
        return cmd_calibrate(args)
    if args.run_dir:
        raise SimulateError(f"unexpected argument {args.run_dir!r} (only `calibrate` takes a RUN_DIR)")
    return cmd_predict(args, rest)


def cmd_calibrate(args) -> int:
    from tidal.fleet.calibrate import calibrate, model_toml

    text = model_toml(calibrate(args.run_dir), args.run_dir)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    print(text, end="")
    return 0


def cmd_predict(args, rest) -> int:
    from tidal.fleet.sim_model import SimulateError
    from tidal.fleet.simulate import load_simulate_recipe, simulate_config

    cfg, model = load_simulate_recipe(args.config, rest)
    steps = cfg.orchestrator.steps if args.steps is None else args.steps
    if steps < 1:
        raise SimulateError(f"--steps must be at least 1, got {steps}")
    result = simulate_config(cfg, model, steps, cfg.run.seed if args.seed is None else args.seed)
    print(summary_table(result.to_json()))
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def summary_table(r: dict) -> str:
    """The prediction's headline figures, one per line."""
    rows = [
        ("steps", f"{r['steps']} in {r['wall_s']:.0f} simulated s" + (" (stalled: no capacity)" if r["stalled"] else "")),
        ("step time", f"mean {r['step_time_s']:.2f} s, median {r['step_time_median_s']:.2f} s"),
        ("throughput", (f"{r['steps_per_hour']:.1f} steps/h, {r['trajectories_per_s']:.2f} trajectories/s, "
                        f"{r['tokens_per_s']:.0f} tokens/s")),
        ("utilisation", f"{r['worker_utilisation']:.3f} (" + ", ".join(
            f"{p} {u:.3f}" for p, u in r["utilisation_by_pool"].items()) + ")"),
        ("staleness", ", ".join(f"{k}: {n}" for k, n in r["staleness_hist"].items()) or "-"),
        ("sync latency", ", ".join(f"{k} {v:.3f} s" for k, v in r["sync_latency_s"].items()) or "-"),
        ("re-queued", f"{r['requeued']} " + str(r["requeued_by_pool"] or "") +
         f"; duplicates {r['duplicates']}, lost {r['lost']}, trained twice {r['trained_twice']}"),
    ]
    return "\n".join(f"{k:<13} {v}" for k, v in rows)
