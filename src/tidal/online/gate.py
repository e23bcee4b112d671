"""The promotion gate: a candidate version gets traffic only if it is not significantly worse
than the incumbent on held-out tasks and on the behaviour guards.

    measure(candidate engine ...) ─┐
                                   ├─> gate_verdict(cand, inc, cfg) -> GateResult
    measure(incumbent engine ...) ─┘

Each version runs the SAME held-out tasks (one sample per task, the same seeds, so both draw
the same random numbers and differ by their weights only) and the SAME guard prompts (greedy,
or a fixed seed per prompt). The tests, each one-sided at ``cfg.alpha`` (a candidate is blocked
when any one fails):

    heldout_pass1      exact McNemar on the paired per-task results (stats.mcnemar_one_sided)
    invalid_tool_call  Fisher's exact test: is the candidate's rate higher (stats.proportion_worse)
    empty              the same, for empty answers
    question           the same, for questions instead of an action
    action_rate        the same on the rate of NOT acting (so: is its action rate lower)
    latency            median latency (decode steps) per guard response > incumbent's x latency_tolerance
                       (a ratio, no p-value)
    integrity          Fisher's exact test on the rate of held-out episodes the integrity detectors
                       flag (tidal.integrity), when the environment keeps evidence for both versions
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tidal.engine.request import GenerationRequest
from tidal.harness import HarnessConfig, run_episodes
from tidal.harness.seeds import derive_seed
from tidal.online.behaviour import classify
from tidal.online.config import GateConfig
from tidal.online.stats import mcnemar_one_sided, median, proportion_worse

RATE_GUARDS = ("invalid_tool_call", "empty", "question")
"""Behaviours whose rate must not rise significantly."""


@dataclass
class GateInputs:
    """One version's results on the gate's held-out tasks and guard prompts (same tasks, same
    prompts, same order for both versions)."""

    task_ids: list[str]
    solved: list[bool]
    """Per held-out task: solved by the environment's rule (Trajectory.solved)."""
    behaviours: list[str]
    """Per guard prompt: tidal.online.behaviour.classify of the response."""
    latencies: list[float]
    """Per guard prompt: engine steps from submission to the finished response, all prompts
    decoded together. Latency in decode steps, not wall-clock: on a shared CPU two wall-clock
    measurements of the same weights differed by 1.5x (710 vs 1097 ms median) and blocked a
    candidate on noise; the steps depend on the weights alone (same seeds), and a step's cost is
    the same for every version of one architecture."""

    flagged: list[bool] | None = None
    """Per held-out task: whether integrity checking flagged the episode (a finding at least
    ``env.integrity.min_confidence`` sure); None when the environment keeps no evidence."""

    @property
    def pass1(self) -> float:
        return sum(self.solved) / len(self.solved) if self.solved else 0.0

    def rate(self, behaviour: str) -> float:
        return self.behaviours.count(behaviour) / len(self.behaviours) if self.behaviours else 0.0


@dataclass
class GateMeasurement(GateInputs):
    """GateInputs as ``measure`` took them, with the guard responses' texts."""

    texts: list[str] = field(default_factory=list)


@dataclass
class GateResult:
    passed: bool
    tests: dict[str, dict[str, Any]]
    """name -> {name, statistic, p_value (None for latency), threshold, passed, and counts}."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def failed(self) -> list[str]:
        return [name for name, t in self.tests.items() if not t["passed"]]


def gate_verdict(cand: GateInputs, inc: GateInputs, cfg: GateConfig) -> GateResult:
    """Every test of the module docs; passed only if all pass."""
    _check_paired(cand, inc)
    tests = [_heldout(cand, inc, cfg.alpha)]
    n_c, n_i = len(cand.behaviours), len(inc.behaviours)
    for b in RATE_GUARDS:
        tests.append(_rate_test(b, cand.behaviours.count(b), n_c, inc.behaviours.count(b), n_i,
                                cfg.alpha))
    not_acting = [n_c - cand.behaviours.count("action"), n_i - inc.behaviours.count("action")]
    tests.append(_rate_test("action_rate", not_acting[0], n_c, not_acting[1], n_i, cfg.alpha,
                            of="action"))
    tests.append(_latency(cand, inc, cfg.latency_tolerance))
    if cand.flagged is not None and inc.flagged is not None:
        tests.append(_rate_test("integrity", sum(cand.flagged), len(cand.flagged),
                                sum(inc.flagged), len(inc.flagged), cfg.alpha))
    by_name = {t["name"]: t for t in tests}
    return GateResult(all(t["passed"] for t in tests), by_name)


def _check_paired(cand: GateInputs, inc: GateInputs) -> None:
    for x in (cand, inc):
        if len(x.solved) != len(x.task_ids) or len(x.behaviours) != len(x.latencies):
            raise ValueError("gate inputs: one solved flag per task and one latency per guard "
                             "response are needed")
    if cand.task_ids != inc.task_ids:
        raise ValueError("gate: the candidate and the incumbent were scored on different "
                         "held-out tasks; measure both on the same tasks in the same order")
    if len(cand.behaviours) != len(inc.behaviours) or not cand.behaviours or not cand.task_ids:
        raise ValueError(f"gate: both versions need the same, non-zero number of guard "
                         f"responses and held-out tasks (got {len(cand.behaviours)} and "
                         f"{len(inc.behaviours)} guard responses, {len(cand.task_ids)} tasks)")


def _heldout(cand: GateInputs, inc: GateInputs, alpha: float) -> dict[str, Any]:
    p, b, c = mcnemar_one_sided(cand.solved, inc.solved)
    return {"name": "heldout_pass1", "statistic": cand.pass1 - inc.pass1, "p_value": p,
            "threshold": alpha, "passed": p >= alpha, "candidate": cand.pass1,
            "incumbent": inc.pass1, "lost": b, "gained": c, "tasks": len(cand.solved)}


def _rate_test(name: str, bad_c: int, n_c: int, bad_i: int, n_i: int, alpha: float,
               of: str | None = None) -> dict[str, Any]:
    """Fisher's exact test on ``bad`` counts; ``of``: report the complementary rate instead
    (the action rate, tested through the rate of not acting)."""
    p = proportion_worse(bad_c, n_c, bad_i, n_i)
    rc, ri = bad_c / n_c, bad_i / n_i
    if of is not None:
        rc, ri = 1 - rc, 1 - ri
    return {"name": name, "statistic": rc - ri, "p_value": p, "threshold": alpha,
            "passed": p >= alpha, "candidate": rc, "incumbent": ri, "responses": n_c}


def _latency(cand: GateInputs, inc: GateInputs, tolerance: float) -> dict[str, Any]:
    mc, mi = median(cand.latencies), median(inc.latencies)
    ratio = mc / mi if mi > 0 else (1.0 if mc <= 0 else 1e300)  # JSON has no infinity
    return {"name": "latency", "statistic": ratio, "p_value": None, "threshold": tolerance,
            "passed": ratio <= tolerance, "candidate": mc, "incumbent": mi}


# ---------------------------------------------------------------------- measuring one version


def measure(engine, env_spec, tasks: list[Any], guard_prompts: list[str | list[int]],
            harness_cfg: HarnessConfig, seed: int, temperature: float = 0.0,
            min_confidence: float = 0.5) -> GateMeasurement:
    """One version's GateInputs: its held-out episodes through the harness (one sample per
    task, seeded by ``seed`` so every version draws the same numbers) and its responses to the
    guard prompts (text, encoded with BOS, or token ids), sampled at ``temperature`` (0 =
    greedy) with a fixed seed per prompt. ``engine`` must be idle (no other requests in it).
    Where every held-out episode kept evidence, ``flagged`` says which the integrity detectors
    flagged (findings at least ``min_confidence`` sure)."""
    if getattr(engine, "has_work", False):
        raise ValueError("gate.measure needs an idle engine: other requests are in flight")
    trajs, _ = run_episodes(engine, env_spec, tasks, harness_cfg, samples_per_task=1,
                            seed=derive_seed(seed, "gate-heldout"))
    texts, latencies = guard_responses(engine, guard_prompts, seed, temperature)
    kept = all(t.integrity is not None for t in trajs)
    flagged = [t.integrity.flagged(min_confidence) for t in trajs] if kept and trajs else None
    return GateMeasurement(task_ids=[t.task_id for t in trajs], solved=[t.solved for t in trajs],
                           behaviours=[classify(t) for t in texts], latencies=latencies,
                           flagged=flagged, texts=texts)


def guard_responses(engine, prompts: list[str | list[int]], seed: int,
                    temperature: float = 0.0) -> tuple[list[str], list[float]]:
    """(text, engine steps from submission to finish) per prompt, decoded together (as
    served: continuous batching)."""
    ids = {}
    steps = 0
    for i, p in enumerate(prompts):
        prompt_ids = engine.tokenizer.encode(p, add_bos=True) if isinstance(p, str) else list(p)
        rid = engine.submit(GenerationRequest(prompt_ids, temperature=temperature,
                                              seed=derive_seed(seed, "gate-guard", i)))
        ids[rid] = i
    texts: list[str] = [""] * len(prompts)
    latencies = [0.0] * len(prompts)
    left = set(ids)
    while left:
        finished = engine.step()
        steps += 1
        for r in finished:
            texts[ids[r.request_id]] = r.text
            latencies[ids[r.request_id]] = float(steps)
            left.discard(r.request_id)
    return texts, latencies
