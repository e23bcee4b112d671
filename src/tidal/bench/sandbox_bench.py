"""Sandbox start-to-result latency and concurrency, per backend, beside an unsandboxed peer.

    tidal bench sandbox --json sandbox.json                  # defaults below
    tidal bench sandbox --bench.runs 50 --bench.concurrency 8,64 --json s.json
    tidal bench sandbox --env.sandbox.memory_mb 256 --json s.json   # any sandbox setting

Latency: a trivial program (`print(1)`) is run `runs` times per variant, one at a time, the
variants interleaved round by round so that load from other jobs on this shared machine hits
them alike; p50 and p99 of the time from asking to having the result. Between two runs the
benchmark waits `gap_ms` (not counted), standing in for the model generating the next program:
that is the time a warm pool has to start the next sandbox.

  plain             the peer: an unsandboxed `python -E -s -S -c` subprocess (no limits)
  bwrap             a cold bwrap sandbox per run
  bwrap_warm        bwrap through the warm pool (pre-started sandboxes)
  subprocess        the rlimits-only fallback, cold
  subprocess_warm   the fallback through the warm pool

Concurrency: for each N in `concurrency`, N runs start at once (threads behind a barrier;
for warm variants the pool holds N); `max_concurrent_ok` is the largest N where all N gave the
right answer, `throughput_per_s` the runs per second at that N.

Profile: cold runs of `true` (no Python) on bwrap and on plain subprocess, to split a cold
run into process spawn, sandbox setup (namespaces, mounts, rlimits, uid) and interpreter start.
Rollouts: opening a rollout over an image of `image_files` files, running one program in it
and closing it, with an overlay and with a copy of the image.

Pytest image: a rollout over an image with a Python env holding pytest (built once, cached
under env.sandbox.env_cache_dir) and one small test file; start-to-result p50/p99 of
`run_pytest` on it, interleaved with the trivial program in the same rollout (`pytest_image`).
Trace cost: the trivial program on two warm sandboxes that differ only in `trace`, interleaved
A/B (`trace_on_p50_ms`, `trace_off_p50_ms`, `trace_overhead_ms` = on minus off), and a program
that times its own EVENTS traced opens, the same way, for the cost per event
(`trace_per_event_us`: p50 of its loop on minus off, per event).
Both use bwrap with a warm pool where it works, else the subprocess backend.

Every sandbox is the run config's ``[env.sandbox]`` (limits, interpreter, bwrap binary) with the
variant's backend and warm pool; concurrency, pytest-image and trace runs get a 30 s timeout,
rollouts their layout.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time

from pydantic import Field

from tidal.bench.common import write_json
from tidal.bench.config import IntList, config_record, main
from tidal.config import TidalConfig
from tidal.sandbox import Sandbox, SandboxConfig, SandboxError, TaskImage, build_python_env
from tidal.config_section import Section

PROGRAM = "print(1)"
PYTEST_FILE = {"test_small.py": "def test_one():\n    assert 1 + 1 == 2\n\n"
                                "def test_two():\n    assert 'a' in 'abc'\n"}
EVENTS = 200
EVENT_PROGRAM = (f"import time\nt = time.perf_counter()\nfor _ in range({EVENTS}):\n"
                 "    open('/dev/null', 'w').close()\nprint(time.perf_counter() - t)")
"""Times its own EVENTS traced opens (inside the sandbox: no start-up noise in the figure)."""
VARIANTS = {  # name -> (backend, warm)
    "bwrap": ("bwrap", False),
    "bwrap_warm": ("bwrap", True),
    "subprocess": ("subprocess", False),
    "subprocess_warm": ("subprocess", True),
}


def default_python() -> str:
    """/usr/bin/python3 where present: as root the subprocess backend's per-run uid must reach
    the interpreter (a pyenv one under /root cannot be); every variant then uses the same."""
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else ""


READS = ("env.sandbox",)
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""


class BenchSection(Section):
    """Sandboxes are the run config's [env.sandbox] with each variant's backend and warm pool;
    env.sandbox.python "" means /usr/bin/python3 where present (see default_python), else the
    base interpreter of the running Python; every variant and the plain peer use the same."""

    runs: int = Field(100, ge=1)
    """Sequential runs per variant (p50 and p99 of their start-to-result time)."""
    gap_ms: float = Field(20.0, ge=0)
    """Pause between sequential runs, ms, not timed: the model generating the next program."""
    concurrency: IntList = Field(default_factory=lambda: [16, 64])
    """How many runs to start at once, each N tried in turn."""
    image_files: int = Field(200, ge=1)
    """Files in the rollout image (each ~4 KB)."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    results = run_sandbox_bench(bench, cfg.env.sandbox)
    results["config"] = config_record(bench, cfg, READS)
    if json_path:
        write_json(json_path, results)
    print_table(results)
    if json_path:
        print(f"wrote {json_path}")
    return 0


def with_changes(base: SandboxConfig, **changes) -> SandboxConfig:
    """``base`` with ``changes``, validated."""
    return SandboxConfig.model_validate({**base.model_dump(), **changes})


def run_sandbox_bench(bench: BenchSection, base: SandboxConfig) -> dict:
    python = (base.python or default_python()
              or os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    base = with_changes(base, python=python)
    runs, gap_s = bench.runs, bench.gap_ms / 1000
    sandboxes = open_sandboxes(base, warm_pool=2)
    results: dict = {"runs": runs, "gap_ms": bench.gap_ms, "python": python,
                     "cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0],
                     "unavailable": {}}
    try:
        runners = {"plain": lambda: plain_run(python)}
        runners.update({name: lambda sb=sb: sb.run_python(PROGRAM).stdout == "1\n"
                        for name, sb in sandboxes.items() if not isinstance(sb, str)})
        for name, times in latencies(runners, runs, gap_s).items():
            results[name] = summarize(times)
        results["profile"] = profile(sandboxes, runs, gap_s)
        results["rollout"] = rollout_costs(base, bench.image_files, max(runs // 5, 5))
        integrity_base = integrity_config(base, sandboxes)
        results["pytest_image"] = pytest_image(integrity_base, runs, gap_s)
        results.update(trace_costs(integrity_base, runs, gap_s))
    finally:
        for name, sb in sandboxes.items():
            if isinstance(sb, str):
                results["unavailable"][name] = sb
            else:
                sb.close()
    for name, (backend, warm) in VARIANTS.items():
        if name in results:
            results[name].update(concurrency(base, backend, warm, bench.concurrency))
    peer = results["plain"]["p50_ms"]
    for name in VARIANTS:
        if name in results:
            results[name]["p50_vs_plain"] = results[name]["p50_ms"] / peer
    return results


def open_sandboxes(base: SandboxConfig, warm_pool: int) -> dict:
    """name -> Sandbox, or -> why that variant cannot run here."""
    sandboxes = {}
    for name, (backend, warm) in VARIANTS.items():
        try:
            sandboxes[name] = Sandbox(with_changes(base, backend=backend,
                                                   warm_pool=warm_pool if warm else 0))
        except SandboxError as e:
            sandboxes[name] = str(e)
    return sandboxes


def plain_run(python: str) -> bool:
    """The peer: what running the program costs with no sandbox at all."""
    out = subprocess.run([python, "-E", "-s", "-S", "-c", PROGRAM], capture_output=True)
    return out.stdout == b"1\n"


def latencies(runners: dict, runs: int, gap_s: float) -> dict[str, list[float]]:
    """Seconds per run (None for a wrong result), variants interleaved round by round."""
    times: dict[str, list] = {name: [] for name in runners}
    for _ in range(runs):
        for name, run in runners.items():
            time.sleep(gap_s)
            started = time.perf_counter()
            ok = run()
            times[name].append(time.perf_counter() - started if ok else None)
    return times


def summarize(times: list) -> dict:
    good = sorted(t for t in times if t is not None)
    if not good:
        return {"p50_ms": None, "p99_ms": None, "failures": len(times)}
    return {"p50_ms": 1000 * statistics.median(good),
            "p99_ms": 1000 * good[min(len(good) - 1, round(0.99 * (len(good) - 1)))],
            "failures": len(times) - len(good)}


def profile(sandboxes: dict, runs: int, gap_s: float) -> dict:
    """p50 ms of cold `true` runs, to split a cold run's cost (see the module docstring)."""
    runners = {"spawn_true": lambda: subprocess.run(["true"]).returncode == 0}
    for name in ("bwrap", "subprocess"):
        if not isinstance(sandboxes[name], str):
            runners[f"{name}_true"] = lambda sb=sandboxes[name]: sb.run(["true"]).exit_code == 0
    return {name: summarize(t)["p50_ms"] for name, t in latencies(runners, runs, gap_s).items()}


def rollout_costs(base: SandboxConfig, image_files: int, runs: int) -> dict:
    """ms to open a rollout over the image, run `print(1)` in it and close it, per layout."""
    files = {f"pkg{i % 10}/mod{i}.py": f"X = {i}\n" + "# padding\n" * 400
             for i in range(image_files)}
    out = {"image_files": image_files}
    with TaskImage.from_files(files) as image:
        for mode in ("overlay", "copy"):
            cfg = with_changes(base, warm_pool=0, copy_on_write=mode)
            try:
                sandbox = Sandbox(cfg)
                sandbox.copy_on_write_mode()
            except SandboxError as e:
                out[f"{mode}_unavailable"] = str(e)
                continue
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                with sandbox.rollout(image) as rollout:
                    ok = rollout.run_python(PROGRAM).stdout == "1\n"
                times.append(time.perf_counter() - started if ok else None)
            out[f"{mode}_ms"] = summarize(times)["p50_ms"]
    return out


def integrity_config(base: SandboxConfig, sandboxes: dict) -> SandboxConfig:
    """bwrap with a warm pool where it works here, else the subprocess backend's."""
    backend = "bwrap" if not isinstance(sandboxes.get("bwrap_warm"), str) else "subprocess"
    return with_changes(base, backend=backend, warm_pool=2, timeout_s=max(base.timeout_s, 30.0))


def pytest_image(base: SandboxConfig, runs: int, gap_s: float) -> dict:
    """p50/p99 ms of run_pytest on one small test file in a rollout over an image with a pytest
    env, beside the trivial program in the same rollout; or why it could not run."""
    try:
        env = build_python_env(["pytest"], base.python, base.env_cache_dir)
    except SandboxError as e:
        return {"unavailable": str(e)}
    with Sandbox(base) as sandbox, TaskImage.from_files(PYTEST_FILE, python_env=env) as image, \
            sandbox.rollout(image) as rollout:
        runners = {
            "pytest": lambda: rollout.run_pytest(["-q", "test_small.py"]).exit_code == 0,
            "trivial": lambda: rollout.run_python(PROGRAM).stdout == "1\n",
        }
        times = latencies(runners, runs, gap_s)
    out = summarize(times["pytest"])
    out.update(trivial_p50_ms=summarize(times["trivial"])["p50_ms"], backend=base.backend,
               packages=list(env.packages))
    return out


def trace_costs(base: SandboxConfig, runs: int, gap_s: float) -> dict:
    """The trace's cost on start-to-result (see the module docstring)."""
    with Sandbox(with_changes(base, trace=True)) as on, \
            Sandbox(with_changes(base, trace=False)) as off:
        trivial = latencies({"on": lambda: on.run_python(PROGRAM).stdout == "1\n",
                             "off": lambda: off.run_python(PROGRAM).stdout == "1\n"}, runs, gap_s)
        loops: dict[str, list] = {"on": [], "off": []}
        for _ in range(max(runs // 4, 5)):
            for name, sandbox in (("on", on), ("off", off)):
                time.sleep(gap_s)
                loops[name].append(loop_seconds(sandbox.run_python(EVENT_PROGRAM).stdout))
    p50 = {k: summarize(v)["p50_ms"] for k, v in trivial.items()}
    e50 = {k: summarize(v)["p50_ms"] for k, v in loops.items()}
    overhead = None if None in p50.values() else p50["on"] - p50["off"]
    per_event = None if None in e50.values() else 1000 * (e50["on"] - e50["off"]) / EVENTS
    return {"trace_on_p50_ms": p50["on"], "trace_off_p50_ms": p50["off"],
            "trace_overhead_ms": overhead, "trace_per_event_us": per_event,
            "trace_backend": base.backend}


def loop_seconds(stdout: str) -> float | None:
    try:
        return float(stdout)
    except ValueError:
        return None


def concurrency(base: SandboxConfig, backend: str, warm: bool, levels: list[int]) -> dict:
    """max_concurrent_ok and the throughput there (see the module docstring)."""
    best = {"max_concurrent_ok": 0, "throughput_per_s": None, "concurrency_failures": {}}
    for n in levels:
        cfg = with_changes(base, backend=backend, warm_pool=n if warm else 0, timeout_s=30.0)
        with Sandbox(cfg) as sandbox:
            if warm:
                for future in list(sandbox._pool._ready):  # measure with the pool full
                    future.result()
            ok, wall_s = run_at_once(sandbox, n)
        best["concurrency_failures"][str(n)] = n - ok
        if ok == n and n > best["max_concurrent_ok"]:
            best.update(max_concurrent_ok=n, throughput_per_s=n / wall_s)
    return best


def run_at_once(sandbox: Sandbox, n: int) -> tuple[int, float]:
    """(runs that printed 1, seconds until all n finished) for n runs started together."""
    barrier = threading.Barrier(n + 1)
    oks = []

    def one():
        barrier.wait()
        oks.append(sandbox.run_python(PROGRAM).stdout == "1\n")

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return sum(oks), time.perf_counter() - started


def print_table(results: dict) -> None:
    peer = results["plain"]["p50_ms"]
    print(f"sandbox start-to-result, `{PROGRAM}`, {results['runs']} runs, gap "
          f"{results['gap_ms']:.0f} ms, load {results['loadavg_1m']:.1f} on "
          f"{results['cpus']} cpus, {results['python']}")
    print(f"{'variant':<17}{'p50 ms':>8}{'p99 ms':>8}{'x plain':>9}{'max conc ok':>13}"
          f"{'runs/s':>9}")
    for name in ("plain", *VARIANTS):
        if name not in results:
            continue
        r = results[name]
        if r["p50_ms"] is None:
            print(f"{name:<17} every run failed")
            continue
        tput = r.get("throughput_per_s")
        print(f"{name:<17}{r['p50_ms']:>8.1f}{r['p99_ms']:>8.1f}{r['p50_ms'] / peer:>9.2f}"
              f"{str(r.get('max_concurrent_ok', '-')):>13}{'-' if tput is None else round(tput):>9}"
              + (f"  ({r['failures']} failed)" if r["failures"] else ""))
    print("profile p50 ms:", {k: round(v, 1) for k, v in results["profile"].items() if v})
    print("rollout open+run+close p50 ms:", results["rollout"])
    print("pytest image (run_pytest, one file) ms:", results["pytest_image"])
    print("trace: p50 on {} / off {} ms, overhead {} ms, {} us per event".format(
        *(None if results[k] is None else round(results[k], 2) for k in
          ("trace_on_p50_ms", "trace_off_p50_ms", "trace_overhead_ms", "trace_per_event_us"))))
    for name, why in results["unavailable"].items():
        print(f"{name}: unavailable: {why}")


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "sandbox"))
