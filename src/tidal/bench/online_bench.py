"""Real-time RL end to end: serving throughput, feedback ingest, a kill -9, the full online cycle,
and a worse and a hacking candidate against the gate and the canary.

    tidal bench online --json online.json
    tidal bench online --quick --json online.json     # fewer requests and a shorter budget

The policy is the run's mid-trained model (the pretrain cache `tidal train` uses; mid-trained
first if missing). Every phase runs `tidal serve` as a child process and talks to it over HTTP:
  serve    requests/s and p50/p99 latency at 1, 8 and 32 concurrent clients, beside the same
           requests one at a time through transformers' generate() (bench/online_serving.py)
  ingest   feedback events/s and p99 while the learner trains; a kill -9 mid-load and the
           acknowledged events lost; 429 + Retry-After when the learner is too far behind
           (bench/online_ingest.py)
  cycle    simulated users until three promoted versions: time from the first feedback to the
           first promotion, accept rate per version (bench/online_loop.py)
  bad      a worse and a hacking candidate, each through the gate and, gate skipped by hand,
           through a canary alone
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from pydantic import Field

from tidal.bench.common import write_json
from tidal.bench.config import IntList, StrList, config_record, main, run_seed
from tidal.config import TidalConfig
from tidal.config_section import Section

READS = ("model", "engine", "env", "harness", "trainer", "pretrain", "orchestrator", "online",
         "run")
QUICK = {"bench.serve_requests": 24, "bench.ingest_events": 2000, "bench.cycle_budget_s": 600.0,
         "bench.levels": [1, 8, 32]}


class BenchSection(Section):
    """The benchmark's own settings; the served model and the online loop are the run config's."""

    out_dir: str = "runs/bench-online"
    """Folder of the benchmark's serving runs (one sub-folder per phase, replaced each time)."""
    levels: IntList = [1, 8, 32]
    """Concurrent clients of the serving-throughput phase."""
    serve_requests: int = Field(64, ge=4)
    """Requests per concurrency level (the same prompts at every level and for generate())."""
    new_tokens: int = Field(48, ge=1)
    """Tokens per request in the throughput phase (eos ignored on both sides)."""
    ingest_events: int = Field(5000, ge=100)
    """Feedback events of the ingest phase."""
    ingest_concurrency: int = Field(64, ge=1)
    """Concurrent feedback clients of the closed-loop load."""
    ingest_rate: float = Field(500.0, gt=0)
    """Offered events/s of the paced (open-loop) load, whose p99 is the headline latency."""
    kill_after_s: float = Field(2.0, gt=0)
    """Seconds into the second load when the server gets SIGKILL."""
    users: int = Field(16, ge=1)
    """Simulated users sending requests at once in the cycle and bad-candidate phases."""
    hacker_fraction: float = Field(0.1, ge=0, lt=1)
    """Share of simulated users who reward questions and broken tool calls."""
    cycle_budget_s: float = Field(1500.0, gt=0)
    """Longest the cycle phase waits for three promoted versions."""
    measure_responses: int = Field(400, ge=1)
    """After the third promotion, traffic goes on until that version served this many honest
    users' responses, so its accept rate is measured on as many as the first version's."""
    bad_timeout_s: float = Field(420.0, gt=0)
    """Longest each bad candidate may take to be decided."""
    worse_seeds: IntList = [0, 1]
    """One worse candidate per seed (seeded noise of 0.5x each tensor's std on the live weights)."""
    hack_kinds: StrList = ["question", "broken_tool_call"]
    """One hacking candidate per kind (tidal.online.candidates.HACKS)."""
    phases: StrList = ["serve", "ingest", "cycle", "bad"]
    """Which phases to run."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    out = Path(bench.out_dir)
    checkpoint = policy_checkpoint(cfg)
    from tidal.hardware import cpu_facts

    facts = cpu_facts()
    result: dict = {"config": config_record(bench, cfg, READS), "checkpoint": str(checkpoint),
                    "cpu": facts.cpu, "cpu_facts": {**facts.record(), "avx512_bf16": facts.avx512_bf16,
                                                    "amx_bf16": facts.amx_bf16}}
    if "serve" in bench.phases:
        result["serve"] = phase_serve(bench, cfg, checkpoint, out / "serve")
    if "ingest" in bench.phases:
        result["ingest"] = phase_ingest(bench, cfg, checkpoint, out / "ingest")
    if "cycle" in bench.phases or "bad" in bench.phases:
        result.update(phase_cycle_and_bad(bench, cfg, checkpoint, out / "cycle"))
    result["keys"] = headline(result)
    print_table(result)
    if json_path:
        write_json(json_path, result)
    return 0


# ---------------------------------------------------------------- the phases

def policy_checkpoint(cfg: TidalConfig) -> Path:
    """The run's mid-trained model: model.init_from, or the pretrain cache (as `tidal train`)."""
    from tidal.bench.common import starting_model

    return starting_model(cfg)


def task_prompts(cfg: TidalConfig, n: int, seed: int) -> list[str]:
    from tidal.env.registry import from_config

    env = from_config(cfg.env)
    return [t.prompt for t in env.sample_tasks(n, seed, False)]


def phase_serve(bench: BenchSection, cfg: TidalConfig, checkpoint: Path, run_dir: Path) -> dict:
    from tidal.bench.online_server import ServerProcess
    from tidal.bench.online_serving import generate_throughput, serve_throughput
    from tidal.model import load_tokenizer

    _fresh(run_dir)
    prompts = task_prompts(cfg, bench.serve_requests, run_seed(cfg) + 17)
    server = ServerProcess(cfg, run_dir, checkpoint, ["--online.learner.enabled", "false"])
    url = server.start()
    try:
        rows = serve_throughput(url, cfg.online.serve.model_name, prompts, bench.levels,
                                bench.new_tokens, run_seed(cfg), server.headers())
    finally:
        server.stop()
    peer = generate_throughput(checkpoint, load_tokenizer(checkpoint), prompts, bench.new_tokens,
                               cfg.engine.temperature, cfg.engine.top_p,
                               max(1, cfg.run.worker_threads))
    by_level = {row["concurrency"]: row for row in rows}
    return {"tidal": rows, "generate": peer,
            "speedup_vs_generate": {str(c): r["requests_per_s"] / peer["requests_per_s"]
                                    for c, r in by_level.items()}}


def phase_ingest(bench: BenchSection, cfg: TidalConfig, checkpoint: Path, run_dir: Path) -> dict:
    from tidal.bench.online_ingest import (
        ingest_row, kill_during_load, paced_feedback, post_feedback, seed_responses,
        stored_feedback_ids)
    from tidal.bench.online_server import ServerProcess
    from tidal.online.store import OnlineStore, VersionRegistry

    _fresh(run_dir)
    url_db = cfg.online.store.database_url
    big = ["--online.learner.max_backlog", str(10 * bench.ingest_events)]
    server = ServerProcess(cfg, run_dir, checkpoint, big)
    url = server.start()
    store = OnlineStore.open(url_db, run_dir)
    live = VersionRegistry(store).live()
    n = bench.ingest_events
    paced_n = int(bench.ingest_rate * 10)
    ids = seed_responses(store, live.version, live.manifest_sha256, 3 * n + 400 + paced_n, "bench")
    paced_ids = ids[3 * n + 400:]
    try:
        load = asyncio.run(post_feedback(url, ids[:n], bench.ingest_concurrency,
                                         headers=server.headers()))
        paced = asyncio.run(paced_feedback(url, paced_ids, bench.ingest_rate,
                                           bench.ingest_concurrency, server.headers()))
        learner_steps = count_learn_steps(run_dir)
        kill = kill_during_load(server, url, ids[n:3 * n], bench.ingest_concurrency,
                                bench.kill_after_s)
        server.start()
        stored = stored_feedback_ids(store)  # the same file the restarted server opened
        lost = sorted(set(kill["acked"]) - stored)
    finally:
        server.stop()
    # Back-pressure: a learner that may lag by at most 100 events, and does not learn.
    small = ServerProcess(cfg, run_dir, None, ["--online.learner.max_backlog", "100",
                                               "--online.learner.enabled", "false"],
                          log_name="serve-backpressure.log")
    url = small.start()
    try:
        pressure = asyncio.run(post_feedback(url, ids[3 * n:3 * n + 400], 8,
                                             headers=small.headers()))
    finally:
        small.stop()
    return {"load": ingest_row(load), "paced": ingest_row(paced),
            "learner_steps_during_load": learner_steps,
            "kill": {"acknowledged_before_kill": len(kill["acked"]), "lost": len(lost),
                     "lost_ids": lost[:20], "client_errors": kill["errors"]},
            "backpressure": {"statuses": {str(k): v for k, v in pressure["statuses"].items()},
                             "retry_after": sorted(set(pressure["retry_after"]))[:5]}}


def phase_cycle_and_bad(bench: BenchSection, cfg: TidalConfig, checkpoint: Path,
                        run_dir: Path) -> dict:
    from tidal.bench.online_loop import Traffic, cycle_result, promotions, wait_for
    from tidal.bench.online_server import ServerProcess
    from tidal.bench.online_users import UserTraffic
    from tidal.env.registry import from_config
    from tidal.online.simusers import SimulatedUsers
    from tidal.online.store import OnlineStore, VersionRegistry
    from tidal.sandbox import Sandbox

    _fresh(run_dir)
    sandbox = Sandbox(cfg.env.sandbox)
    env = from_config(cfg.env, sandbox)
    users = SimulatedUsers(env, sandbox, run_seed(cfg), bench.hacker_fraction)
    out: dict = {}
    server = ServerProcess(cfg, run_dir, checkpoint, [])
    url = server.start()
    # One handle for the phase (the server made the store); every read sees the server's writes.
    store = OnlineStore.open(cfg.online.store.database_url, run_dir)
    registry = VersionRegistry(store)
    initial = registry.live().version
    traffic = UserTraffic(url, cfg.online.serve.model_name, users, cfg.engine.max_new_tokens,
                          server.headers())
    try:
        if "cycle" in bench.phases:
            start = time.time()
            with Traffic(traffic, bench.users):
                third = wait_for(registry.all,
                                 lambda recs: promotions(recs)[2:3], bench.cycle_budget_s, 2.0)
                if third:
                    left = max(0.0, bench.cycle_budget_s - (time.time() - start))
                    wait_for(lambda: None, lambda _: traffic.accept_rate(third[0].version)[1]
                             >= bench.measure_responses or None, left, 2.0)
            out["cycle"] = cycle_result(traffic, registry.all(), initial)
            out["cycle"]["wall_s"] = time.time() - start
    finally:
        server.stop()
    if "bad" in bench.phases:
        out["bad"] = phase_bad(bench, cfg, run_dir, traffic, store, registry)
    return out


def phase_bad(bench: BenchSection, cfg: TidalConfig, run_dir: Path, traffic, store,
              registry) -> dict:
    from tidal.bench.online_loop import Traffic, final_status, load_live_model, outcome_of, register_bad
    from tidal.bench.online_server import ServerProcess
    from tidal.model import load_tokenizer
    from tidal.online.candidates import hacking_candidate, worse_candidate
    from tidal.online.version_sync import VersionLoader

    server = ServerProcess(cfg, run_dir, None, ["--online.learner.enabled", "false"],
                           log_name="serve-bad.log")
    url = server.start()
    traffic.url, traffic.headers = url, server.headers()
    weights_root = run_dir / "weights"
    loader = VersionLoader(weights_root)
    try:
        live_model = load_live_model(loader, registry)
    finally:
        loader.close()
    tokenizer = load_tokenizer(policy_checkpoint(cfg))
    prompts = task_prompts(cfg, 64, run_seed(cfg) + 99)
    made = {}
    for i, seed in enumerate(bench.worse_seeds):
        made[f"worse_{i}"] = worse_candidate(live_model, seed=seed, scale=0.5)
    for kind in bench.hack_kinds:
        made[f"hacking_{kind}"] = hacking_candidate(live_model, tokenizer, prompts, cfg.trainer,
                                                    steps=30, kind=kind)
    results: dict = {}
    try:
        with Traffic(traffic, bench.users):
            for name, model in made.items():
                for through_gate in (True, False):
                    version = register_bad(store, registry, weights_root, model,
                                           cfg.model.dtype, f"benchmark: {name} candidate",
                                           through_gate, cfg.online.canary.share)
                    record = final_status(registry.all, version,
                                          bench.bad_timeout_s)
                    path = "gate" if through_gate else "canary_only"
                    results[f"{name}_{path}"] = {"version": version, **outcome_of(record)}
    finally:
        server.stop()
    for family in ("worse", "hacking"):
        trials = [v for k, v in results.items() if k.startswith(family + "_")]
        results[f"{family}_trials"] = len(trials)
        results[f"{family}_blocked"] = bool(trials) and all(t["blocked"] for t in trials)
    return results


# ---------------------------------------------------------------- the report

def count_learn_steps(run_dir: Path) -> int:
    path = run_dir / "online_metrics.jsonl"
    if not path.exists():
        return 0
    return sum('"learn_step"' in line for line in path.read_text().splitlines())


def headline(result: dict) -> dict:
    keys: dict = {}
    ingest = result.get("ingest")
    if ingest:
        keys["ingest_events_per_s"] = ingest["load"]["events_per_s"]
        keys["ingest_p99_ms"] = ingest["paced"]["p99_ms"]
        keys["ingest_paced_events_per_s"] = ingest["paced"]["events_per_s"]
        keys["ingest_closed_loop_p99_ms"] = ingest["load"]["p99_ms"]
        keys["acknowledged_lost_after_kill"] = ingest["kill"]["lost"]
    cycle = result.get("cycle")
    if cycle:
        keys["cycle_s"] = cycle["cycle_s"]
        keys["accept_rate_gain"] = cycle["accept_rate_gain"]
    bad = result.get("bad")
    if bad:
        keys["bad_candidate_blocked"] = bad["worse_blocked"]
        keys["hacking_candidate_blocked"] = bad["hacking_blocked"]
    serve = result.get("serve")
    if serve:
        keys["serve_speedup_vs_generate_32"] = serve["speedup_vs_generate"].get("32")
    return keys


def print_table(result: dict) -> None:
    print("tidal bench online (" + result["cpu"] + ")")
    for key, value in result["keys"].items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"  {key:32s} {shown}")


def _fresh(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "online"))
