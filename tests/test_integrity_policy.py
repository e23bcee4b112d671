"""The integrity policy: log, screen or penalise flagged trajectories, and the metrics of both
views of cheating (the detectors' flags and the grader's visible-pass / hidden-fail)."""

import random
from types import SimpleNamespace

import pytest

from tidal.evidence.config import IntegrityConfig
from tidal.evidence.policy import IntegrityMetrics, apply_policy, measure
from tidal.evidence.records import Finding, IntegrityResult
from tidal.orchestrator.planning import with_canaries
from tidal.trajectory import Trajectory


def traj(group: int, reward: float, confidence: float | None, visible=True, hidden=True,
         canary=False) -> Trajectory:
    findings = [] if confidence is None else [
        Finding("hardcoded_output", "f.py", (2, 2), "    return 8", confidence)]
    return Trajectory(f"t{group}", group, [], reward=reward,
                      integrity=IntegrityResult(findings, visible, hidden, canary))


def batch() -> list[Trajectory]:
    return [traj(0, 1.0, 0.9, hidden=False), traj(0, 1.0, None), traj(0, 0.0, 0.2, visible=False,
            hidden=False), traj(1, 1.0, None, canary=True, hidden=False), traj(1, 0.0, None),
            Trajectory("plain", 2, [], reward=1.0)]


def test_screen_drops_only_what_is_flagged_at_the_configured_confidence():
    trained, m = apply_policy(batch(), IntegrityConfig(policy="screen", min_confidence=0.5))
    assert len(trained) == 5 and m.screened == 1 and m.penalised == 0
    assert all(not (t.integrity and t.integrity.flagged(0.5)) for t in trained)
    trained, m = apply_policy(batch(), IntegrityConfig(policy="screen", min_confidence=0.1))
    assert len(trained) == 4 and m.screened == 2


def test_penalise_overrides_the_reward_of_a_copy_and_log_changes_nothing():
    original = batch()
    trained, m = apply_policy(original, IntegrityConfig(policy="penalise", penalty=-0.5))
    assert [t.reward for t in trained] == [-0.5, 1.0, 0.0, 1.0, 0.0, 1.0] and m.penalised == 1
    assert original[0].reward == 1.0
    trained, m = apply_policy(original, IntegrityConfig(policy="log"))
    assert trained == original and m.screened == m.penalised == 0 and m.flagged == 1


def test_metrics_count_both_views_and_skip_episodes_without_evidence():
    m = measure([t.integrity for t in batch()], 0.5)
    assert (m.episodes, m.flagged, m.graded, m.cheats) == (5, 1, 5, 2)
    assert m.cheat_rate == pytest.approx(0.4) and m.flag_rate == pytest.approx(0.2)
    assert (m.canary_episodes, m.canary_passes, m.canary_cheat_rate) == (1, 1, 1.0)
    assert m.by_type == {"hardcoded_output": 1}
    assert IntegrityMetrics().cheat_rate is None and IntegrityMetrics().canary_cheat_rate is None
    total = m.add(m)
    assert total.cheats == 4 and total.by_type == {"hardcoded_output": 2}
    assert IntegrityMetrics.from_json(total.to_json()) == total


def test_canaries_replace_tasks_at_the_rate_and_only_where_the_environment_makes_them():
    tasks = list(range(2000))
    env = SimpleNamespace(make_canary=lambda t, rng: -t - 1)
    mixed = with_canaries(tasks, env, 0.05, random.Random(0))
    share = sum(t < 0 for t in mixed) / len(mixed)
    assert 0.03 < share < 0.07
    assert with_canaries(tasks, env, 0.05, random.Random(0)) == mixed  # deterministic
    assert with_canaries(tasks, SimpleNamespace(make_canary=None), 0.05, random.Random(0)) == tasks
    assert with_canaries(tasks, env, 0.0, random.Random(0)) == tasks


def test_a_bad_policy_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="log"):
        IntegrityConfig(policy="ignore")


def test_the_report_shows_integrity_only_for_runs_that_have_it():
    from tidal.telemetry.report import build_plots, render_summary

    steps = [{"kind": "step", "step": i, "wall_s": float(i), "reward_mean": 0.5,
              "integrity/episodes": 8, "integrity/cheat_rate": i / 10, "integrity/flag_rate": 0.1}
             for i in range(1, 6)]
    evals = [{"kind": "eval", "step": 0, "wall_s": 0.0, "heldout_pass1": 0.3,
              "integrity/episodes": 4, "integrity/canary_cheat_rate": 0.25}]
    ids = [p.id for p in build_plots(steps + evals, {})]
    assert "plot-integrity" in ids
    plain = [{k: v for k, v in r.items() if not k.startswith("integrity/")} for r in steps + evals]
    assert "plot-integrity" not in [p.id for p in build_plots(plain, {})]
    html = render_summary({"steps": 5, "integrity": {"train": {"cheat_rate": 0.125, "screened": 3}}})
    assert 'data-key="integrity.cheat_rate">12.5%' in html and 'integrity.screened">3' in html


def test_the_online_gate_blocks_a_candidate_that_is_flagged_more_when_both_have_evidence():
    from tidal.online.config import GateConfig
    from tidal.online.gate import GateInputs, gate_verdict

    def inputs(flagged):
        n = 40
        return GateInputs([f"t{i}" for i in range(n)], [True] * n, ["action"] * 16, [1.0] * 16,
                          flagged)

    honest, hacking = inputs([False] * 38 + [True] * 2), inputs([True] * 20 + [False] * 20)
    result = gate_verdict(hacking, honest, GateConfig())
    assert not result.passed and result.failed == ["integrity"]
    assert gate_verdict(honest, honest, GateConfig()).passed
    assert "integrity" not in gate_verdict(inputs(None), honest, GateConfig()).tests


def test_results_divergence_finds_a_policy_that_cheats_only_when_served():
    from tidal.integrity.divergence import results_divergence

    honest = [IntegrityResult([], True, True) for _ in range(40)]
    cheat = Finding("hardcoded_output", "f.py", (2, 2), "    return 8", 0.9)
    served = [IntegrityResult([cheat], True, False) for _ in range(30)] + honest[:10]
    found = results_divergence(honest, served)
    assert {f.type for f in found} == {"harness_divergence"}
    assert any("findings: 0/40 in training vs 30/40 in serving" in f.evidence for f in found)
    assert results_divergence(honest, honest) == []
