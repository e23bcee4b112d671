"""Training harness vs serving harness on the same tasks: does the policy behave differently
when it is served?

    held-out tasks ──run_episodes(engine)──────────────────────────> training-side results
                   └─run_episodes(client=ServedClient(PolicyServer))─> serving-side results
    results_divergence(train, serve) ──> harness_divergence findings (two-proportion tests on
                                         the flag rate, visible and hidden pass rates)

The serving side is tidal serve's own PolicyServer (its step thread, continuous batching and
the sampling a served request without settings gets); the environment, the episodes' seeds and
the grading are the training side's, so only the path that generates differs.
"""

from __future__ import annotations

from tidal.engine.request import GenerationRequest, GenerationResult


class ServedClient:
    """The harness's generate() through a PolicyServer, as a served completion request: the
    prompt's token ids, the turn's max_tokens, stop strings and seed; the server's defaults for
    the rest."""

    def __init__(self, policy):
        self.policy = policy

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        from tidal.online.serving import Sampling

        sampling = Sampling(max_tokens=request.max_new_tokens, stop=request.stop, seed=request.seed)
        generation = await self.policy.generate(request.prompt_ids, sampling)
        [result] = await generation.results()
        return result


def divergence(checkpoint, cfg, env, tasks: list, seed: int) -> dict:
    """Both sides on ``tasks`` (one sample each) from ``checkpoint``; their integrity rates and
    the harness_divergence findings."""
    import torch

    from tidal.engine.engine import Engine
    from tidal.harness import run_episodes
    from tidal.harness.seeds import derive_seed
    from tidal.evidence.policy import measure
    from tidal.integrity.divergence import results_divergence
    from tidal.model import from_pretrained, load_tokenizer
    from tidal.online.serving import PolicyServer

    dtype = getattr(torch, cfg.model.dtype)
    tokenizer = load_tokenizer(checkpoint)
    engine = Engine(from_pretrained(checkpoint, dtype=dtype), tokenizer, cfg.engine, version=0)
    episode_seed = derive_seed(seed, "divergence")
    train, _ = run_episodes(engine, env, tasks, cfg.harness, 1, seed=episode_seed)
    policy = PolicyServer(cfg.engine, tokenizer, dtype=cfg.model.dtype)
    policy.add_version(0, "", from_pretrained(checkpoint, dtype=dtype))
    policy.start()
    try:
        serve, _ = run_episodes(engine, env, tasks, cfg.harness, 1, seed=episode_seed,
                                client=ServedClient(policy))
    finally:
        policy.stop()
    train_results = [t.integrity for t in train if t.integrity is not None]
    serve_results = [t.integrity for t in serve if t.integrity is not None]
    conf = cfg.env.integrity.min_confidence
    return {"tasks": len(tasks),
            "train": measure(train_results, conf).to_json(),
            "serve": measure(serve_results, conf).to_json(),
            "findings": [f.to_json() for f in results_divergence(train_results, serve_results,
                                                                  min_confidence=conf)]}
