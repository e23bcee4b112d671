"""Engine-vs-trainer mismatch on the same weights and tokens.

The engine samples token t with logprob ``a_t`` (behaviour policy); the trainer recomputes ``b_t``
for the same token in its training forward. In exact arithmetic a == b; in floating point they
differ whenever the two sides sum in a different order. These figures say by how much:

- ``bitwise_equal_fraction``: tokens whose two float32 logprobs have the same bits;
- ``mean_abs_logprob_diff`` / ``max_abs_logprob_diff``: |a − b| over tokens;
- ``kl_k3``: Schulman's k3 estimator of KL(engine ‖ trainer) on tokens sampled from the engine,
  mean of (r − 1) − log r with r = exp(b − a); non-negative per token, exactly 0 iff a == b.

For MoE, routing flips compare the engine's top-k expert set with the trainer's, per token and
layer (order within the top-k does not matter: the same set sends the token to the same experts).
"""

from __future__ import annotations

import torch


def mismatch_metrics(engine_logprobs: torch.Tensor, trainer_logprobs: torch.Tensor) -> dict[str, float]:
    """Compare two 1-D tensors of per-token logprobs (same tokens, same order)."""
    a = engine_logprobs.detach().to(torch.float32).flatten()
    b = trainer_logprobs.detach().to(torch.float32).flatten()
    if a.shape != b.shape:
        raise ValueError(f"logprob tensors differ in length: engine {a.numel()}, trainer {b.numel()}")
    if a.numel() == 0:
        return {"tokens": 0, "bitwise_equal_fraction": 1.0, "mean_abs_logprob_diff": 0.0,
                "max_abs_logprob_diff": 0.0, "kl_k3": 0.0}
    same_bits = a.view(torch.int32) == b.view(torch.int32)
    diff = (a.double() - b.double())
    log_r = -diff  # log(p_trainer / p_engine)
    k3 = torch.expm1(log_r) - log_r
    return {
        "tokens": int(a.numel()),
        "bitwise_equal_fraction": float(same_bits.double().mean()),
        "mean_abs_logprob_diff": float(diff.abs().mean()),
        "max_abs_logprob_diff": float(diff.abs().max()),
        "kl_k3": float(k3.mean()),
    }


def routing_flip_metrics(engine_experts: torch.Tensor, trainer_experts: torch.Tensor) -> dict:
    """Compare top-k expert ids, each ``[tokens, layers, k]`` (integers).

    Returns ``flip_rate_per_layer`` (list: fraction of tokens whose expert set differs, per layer),
    ``flip_rate`` (over all token-layer pairs) and ``tokens_with_flip_fraction`` (tokens with a
    flip in at least one layer).
    """
    if engine_experts.shape != trainer_experts.shape or engine_experts.dim() != 3:
        raise ValueError(f"expert id tensors must both be [tokens, layers, k]; got "
                         f"{tuple(engine_experts.shape)} and {tuple(trainer_experts.shape)}")
    if engine_experts.shape[0] == 0:
        layers = engine_experts.shape[1]
        return {"flip_rate_per_layer": [0.0] * layers, "flip_rate": 0.0, "tokens_with_flip_fraction": 0.0}
    a = engine_experts.sort(dim=-1).values
    b = trainer_experts.sort(dim=-1).values
    flipped = (a != b).any(dim=-1)  # [tokens, layers]
    return {
        "flip_rate_per_layer": flipped.double().mean(dim=0).tolist(),
        "flip_rate": float(flipped.double().mean()),
        "tokens_with_flip_fraction": float(flipped.any(dim=1).double().mean()),
    }
