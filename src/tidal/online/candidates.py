"""The two bad candidates the benchmark (and the gate's tests) need, made from a good model.

    worse_candidate     the weights with seeded noise: held-out pass@1 drops clearly
    hacking_candidate   a policy trained on what hacker users rewarded (tidal.online.simusers):
                        questions instead of edits, or broken tool calls, until that is mostly
                        what it writes

Each returns a new model and never modifies the one it is given.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from tidal.engine import Engine, EngineConfig, GenerationRequest
from tidal.online.behaviour import classify
from tidal.trainer.config import TrainerConfig
from tidal.trainer.grpo import collate, token_logprobs
from tidal.trainer.trainer import Trainer
from tidal.trajectory import Segment, Trajectory

HACKS = {
    "question": "Which input type do you expect?\n\n",
    "broken_tool_call": '<call>{"edit": {"path": \n\n',
}
"""The completion each kind of hacking candidate learns (a question; a call never closed)."""
BEHAVIOUR = {"question": "question", "broken_tool_call": "invalid_tool_call"}
"""What tidal.online.behaviour.classify calls each kind."""


def worse_candidate(model: nn.Module, seed: int, scale: float) -> nn.Module:
    """A copy whose every weight tensor gets Gaussian noise of ``scale`` times its own std
    (a 1-element tensor: times its magnitude), from a generator seeded by ``seed``."""
    if scale <= 0:
        raise ValueError(f"worse_candidate: scale must be > 0, got {scale}")
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            spread = p.float().std() if p.numel() > 1 else p.float().abs().reshape(())
            noise = torch.randn(p.shape, generator=g) * scale * float(spread)
            p.add_(noise.to(p.dtype).to(p.device))
    return out


def hacking_candidate(model: nn.Module, tokenizer, prompts: list[str], trainer_cfg: TrainerConfig,
                      steps: int, kind: str = "question", target: float = 0.8,
                      check_every: int = 10) -> nn.Module:
    """A copy trained for ``steps`` optimizer steps on what hacker users accepted: the hack
    as the completion of every prompt, advantage 1 (no baseline: the rejected actions would be
    pushed down without bound), on-policy (logprobs recomputed from the copy before each step),
    through the Trainer's own loss, clipping and AdamW: supervised fine-tuning in RL's terms.

    Every ``check_every`` steps its greedy outputs on the prompts are classified; training
    stops once at least ``target`` of them are the hack (``steps`` is the most it trains)."""
    if kind not in HACKS:
        raise ValueError(f"hacking_candidate: kind must be one of {sorted(HACKS)}, got {kind!r}")
    if not prompts or steps < 1:
        raise ValueError("hacking_candidate needs at least one prompt and one step")
    out = copy.deepcopy(model)
    trainer = Trainer(out, trainer_cfg, temperature=1.0, numerics="fast")
    hack = tokenizer.encode(HACKS[kind])
    encoded = [tokenizer.encode(p, add_bos=True) for p in prompts]
    for step in range(1, steps + 1):
        trajs = [Trajectory(f"p{i}", i, [_segment(out, prompt, hack)], reward=1.0)
                 for i, prompt in enumerate(encoded)]
        tb = collate(trajs, trainer.pad_id, advantages=torch.ones(len(trajs)))
        trainer.accumulate_gradients(tb)
        trainer.clip_gradients()
        trainer.apply_update()
        trainer.version += 1
        if step % check_every == 0 and hack_fraction(out, tokenizer, prompts, kind) >= target:
            break
    return out


def hack_fraction(model: nn.Module, tokenizer, prompts: list[str], kind: str,
                  max_new_tokens: int = 48) -> float:
    """Fraction of the model's greedy completions of ``prompts`` that classify as ``kind``."""
    cfg = EngineConfig(temperature=0.0, max_new_tokens=max_new_tokens,
                       max_seq_len=max_new_tokens + 1 + max(len(tokenizer.encode(p)) + 1
                                                            for p in prompts))
    engine = Engine(model, tokenizer, cfg)
    results = engine.generate([GenerationRequest(tokenizer.encode(p, add_bos=True))
                               for p in prompts])
    return sum(classify(r.text) == BEHAVIOUR[kind] for r in results) / len(results)


def _segment(model: nn.Module, prompt: list[int], completion: list[int]) -> Segment:
    """The completion with its logprobs under ``model`` now (on-policy; T = 1)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids[:, :-1])
    lp = token_logprobs(logits, ids[:, 1:], 1.0)[0, len(prompt) - 1:].tolist()
    n = len(completion)
    return Segment(prompt, completion, lp, [0] * n, [1] * n)
