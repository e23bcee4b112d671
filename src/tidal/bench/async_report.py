"""The async benchmark's JSON and table: per-seed races to the target, medians over seeds, the
elastic run's accounting, and the simulator's out-of-sample error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tidal.bench.async_figures import (
    default_target,
    median,
    relative_error,
    time_to_target,
)

MODES = ("sync", "async")

GOALS = {"speedup_time_to_target": 1.7, "final_pass1_points_below_sync": 2.0, "worker_utilisation": 0.9,
         "sim_error": 0.10, "elastic_lost": 0, "elastic_duplicated": 0}



def seeds_of(figures: dict[str, dict]) -> list[str]:
    """The seed prefixes ("seed0", ...) that have both modes, in order."""
    return [n.removesuffix("-sync") for n in figures if n.endswith("-sync") and
            n.removesuffix("-sync") + "-async" in figures]


def race(bench, sync: dict, asyn: dict) -> dict[str, Any]:
    """One seed's race: its target and each mode's time to it, the speedup."""
    before = sync["before_pass1"]
    best = {m: max(p["pass1"] for p in f["curve"]) for m, f in (("sync", sync), ("async", asyn))}
    target = bench.target_pass1 if bench.target_pass1 is not None else default_target(
        before, best["sync"], best["async"], bench.target_fraction)
    t = {m: time_to_target(f["curve"], target) for m, f in (("sync", sync), ("async", asyn))}
    speedup = t["sync"] / t["async"] if t["sync"] and t["async"] else None
    return {"target": target, "before": before, "before_async": asyn["before_pass1"], "best": best,
            "time_to_target_s": t, "speedup": speedup}


def mode_summary(runs: list[dict], races: list[dict], mode: str) -> dict[str, Any]:
    """A mode's medians over seeds, and every run."""
    hist: dict[str, int] = {}
    for f in runs:
        for k, n in f["staleness_hist"].items():
            hist[k] = hist.get(k, 0) + n
    return {
        "final_pass1": median(f["final_pass1"] for f in runs),
        "time_to_target_s": median(r["time_to_target_s"][mode] for r in races),
        "worker_utilisation": median(f["worker_utilisation"] for f in runs),
        "step_time_s": median(f["step_time_s"] for f in runs),
        "steps": median(f["steps"] for f in runs),
        "generate_s_per_step": median(f["generate_s_median"] for f in runs),
        "train_s_per_step": median(f["train_s_median"] for f in runs),
        "staleness_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "runs": [{k: v for k, v in f.items() if k != "membership"} for f in runs],
    }


def simulator(figures: dict[str, dict], configs: dict, calibrate_on: str) -> dict[str, Any]:
    """Calibrate on ``calibrate_on``'s run, predict every other run; the median relative errors."""
    from tidal.bench.async_runs import predict
    from tidal.fleet.calibrate import calibrate

    model = calibrate(Path(figures[calibrate_on]["run_dir"]))
    preds = []
    for name, f in figures.items():
        if name == calibrate_on:
            continue
        p = predict(configs[name], model, f, configs[name].run.seed)
        preds.append({"run": name, "predicted": p,
                      "measured": {"step_time_s": f["step_time_s"], "worker_utilisation": f["worker_utilisation"],
                                   "staleness_hist": f["staleness_hist"]},
                      "error": {"step_time": relative_error(p["step_time_s"], f["step_time_s"]),
                                "utilisation": relative_error(p["worker_utilisation"], f["worker_utilisation"])}})
    compared = [p for p in preds if p["run"] != "elastic"]
    return {"calibrated_on": calibrate_on, "model": model.model_dump(mode="json"),
            "step_time": median(p["error"]["step_time"] for p in compared),
            "utilisation": median(p["error"]["utilisation"] for p in compared),
            "predicted_runs": len(compared), "predictions": preds}


def elastic_summary(f: dict, sim: dict | None) -> dict[str, Any]:
    fleet = f["fleet"]
    out = {"lost_trajectories": f["accounting"]["lost"],
           "duplicated_trajectories": f["accounting"]["duplicated"],
           "duplicates_dropped": fleet.get("duplicates", 0),
           "worker_utilisation": f["worker_utilisation"], "requeued": fleet.get("requeued", 0),
           "joined": fleet.get("joined", 0), "left": fleet.get("left", 0),
           "member_s": fleet.get("member_s"), "steps": f["steps"], "final_pass1": f["final_pass1"],
           "membership": f["membership"], "run": {k: v for k, v in f.items() if k != "membership"}}
    if sim is not None:
        pred = next((p for p in sim["predictions"] if p["run"] == "elastic"), None)
        out["simulated"] = pred
    return out


def summarize(bench, cfg, figures: dict[str, dict], configs: dict, runs_dir: Path, model_dir: Path) -> dict:
    """The JSON: headline keys are medians over seeds; ``races``, ``sync.runs``, ``async.runs``
    hold each one."""
    seeds = seeds_of(figures)
    races = {s: race(bench, figures[f"{s}-sync"], figures[f"{s}-async"]) for s in seeds}
    out: dict[str, Any] = {m: mode_summary([figures[f"{s}-{m}"] for s in seeds], list(races.values()), m)
                           for m in MODES}
    out["speedup_time_to_target"] = median(r["speedup"] for r in races.values())
    out["speedup_step_time"] = (out["sync"]["step_time_s"] / out["async"]["step_time_s"]
                                if out["async"]["step_time_s"] else None)
    out["ceiling"] = _ceiling(out["async"])
    out["races"] = races
    out["target_rule"] = (f"bench.target_pass1 = {bench.target_pass1}" if bench.target_pass1 is not None else
                          f"per seed: before + {bench.target_fraction} x min(best sync gain, best async gain)")
    sim = simulator(figures, configs, f"{seeds[0]}-sync") if bench.simulate and len(figures) > 1 else None
    out["sim_error"] = ({"step_time": sim["step_time"], "utilisation": sim["utilisation"],
                         "detail": sim} if sim else {"step_time": None, "utilisation": None})
    if "elastic" in figures:
        out["elastic"] = elastic_summary(figures["elastic"], sim)
    else:
        out["elastic"] = {"lost_trajectories": None, "duplicated_trajectories": None}
    oc = cfg.orchestrator
    out["heldout"] = {"tasks": oc.heldout_tasks, "samples_per_task": oc.eval_samples_per_task,
                      "eval_every_steps": bench.eval_every, "off_the_clock": oc.eval_every == 0}
    out["final_pass1_points_async_minus_sync"] = _points(out)
    out["goals"] = _goals(out)
    out["runs_dir"], out["init_model"], out["seeds"] = str(runs_dir), str(model_dir), len(seeds)
    from tidal.hardware import cpu_facts

    out["cpu"] = cpu_facts().record()
    return out


def _ceiling(a: dict) -> float | None:
    gen, train = a["generate_s_per_step"], a["train_s_per_step"]
    return (gen + train) / max(gen, train) if gen and train else None


def _points(out: dict) -> float | None:
    s, a = out["sync"]["final_pass1"], out["async"]["final_pass1"]
    return None if s is None or a is None else 100 * (a - s)


def _goals(out: dict) -> dict[str, Any]:
    def met(value, ok):
        return None if value is None else bool(ok(value))

    return {"targets": GOALS,
            "speedup": met(out["speedup_time_to_target"], lambda v: v >= GOALS["speedup_time_to_target"]),
            "final_pass1": met(out["final_pass1_points_async_minus_sync"],
                               lambda v: v >= -GOALS["final_pass1_points_below_sync"]),
            "utilisation": met(out["async"]["worker_utilisation"], lambda v: v >= GOALS["worker_utilisation"]),
            "sim_step_time": met(out["sim_error"]["step_time"], lambda v: v <= GOALS["sim_error"]),
            "sim_utilisation": met(out["sim_error"]["utilisation"], lambda v: v <= GOALS["sim_error"]),
            "elastic": met(out["elastic"]["lost_trajectories"],
                           lambda v: v == 0 and out["elastic"]["duplicated_trajectories"] == 0)}


def _f(v, fmt=".3f") -> str:
    return "-" if v is None else format(v, fmt)


def print_table(r: dict) -> None:
    print(f"\nasync vs sync ({r['seeds']} seeds; held-out {r['heldout']['tasks']} tasks x "
          f"{r['heldout']['samples_per_task']}; runs in {r['runs_dir']})")
    print(f"{'seed':>8} {'target':>7} {'sync t':>8} {'async t':>8} {'speedup':>8}")
    for s, race_ in r["races"].items():
        t = race_["time_to_target_s"]
        print(f"{s:>8} {race_['target']:>7.3f} {_f(t['sync'], '.0f'):>8} {_f(t['async'], '.0f'):>8} "
              f"{_f(race_['speedup'], '.2f'):>8}")
    for m in MODES:
        x = r[m]
        print(f"{m:>6}: final pass@1 {_f(x['final_pass1'])}, utilisation {_f(x['worker_utilisation'], '.2f')}, "
              f"step {_f(x['step_time_s'], '.1f')} s (gen {_f(x['generate_s_per_step'], '.1f')} s, train "
              f"{_f(x['train_s_per_step'], '.1f')} s), staleness {x['staleness_hist']}")
    print(f"speedup to target {_f(r['speedup_time_to_target'], '.2f')}x (step time "
          f"{_f(r['speedup_step_time'], '.2f')}x, ceiling {_f(r['ceiling'], '.2f')}x); sim error: step time "
          f"{_f(r['sim_error']['step_time'])}, utilisation {_f(r['sim_error']['utilisation'])}")
    e = r["elastic"]
    if e.get("lost_trajectories") is not None:
        print(f"elastic: utilisation {e['worker_utilisation']:.2f}, joined {e['joined']}, left {e['left']}, "
              f"requeued {e['requeued']}, lost {e['lost_trajectories']}, duplicated {e['duplicated_trajectories']}")
    print(f"goals met: {r['goals']}")

