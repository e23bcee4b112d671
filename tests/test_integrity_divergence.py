"""The training-vs-serving check: the same tasks through the harness's engine and through tidal
serve's policy server (tidal.bench.integrity_divergence). Same weights and the same seeds must
behave the same on both paths, so any divergence it reports is the policy's, not the plumbing's."""

from test_orchestrator import TINY, ckpt  # noqa: F401  (the module-scoped checkpoint fixture)

from tidal.bench.integrity_divergence import divergence
from tidal.config import load_config
from tidal.env import from_config
from tidal.sandbox import Sandbox


def test_the_serving_path_reproduces_the_training_path(ckpt):  # noqa: F811
    cfg = load_config(None, [*TINY, "--env.name", "hackable", "--model.init_from", str(ckpt)])
    with Sandbox(cfg.env.sandbox) as sandbox:
        env = from_config(cfg.env, sandbox)
        tasks = env.sample_tasks(6, 1, True)
        out = divergence(ckpt, cfg, env, tasks, seed=3)
    assert out["tasks"] == 6 and out["train"]["episodes"] == out["serve"]["episodes"] > 0
    for key in ("flagged", "visible_passes", "hidden_passes", "cheats"):
        assert out["train"][key] == out["serve"][key], key
    assert out["findings"] == []
