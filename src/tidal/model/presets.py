"""Named model sizes for tests and benchmarks, so no test restates architecture numbers.

    cfg = preset("tiny-moe")

Every preset uses the byte tokenizer's vocabulary (the ModelConfig default) unless it says
otherwise; all other defaults stay in ModelConfig.
"""

from __future__ import annotations

from collections.abc import Callable

from tidal.model.config import ModelConfig

PRESETS: dict[str, Callable[[], ModelConfig]] = {
    # The default recipe's model (~1.6M params): the ModelConfig defaults, nothing restated.
    "tiny": lambda: ModelConfig(),
    # Same trunk, every layer a sparse MoE: 8 experts, top-2 (router replay, expert capture).
    "tiny-moe": lambda: ModelConfig(num_experts=8, num_experts_per_tok=2),
    # ~24M-param dense model for throughput benchmarks.
    "small": lambda: ModelConfig(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
    ),
}


def preset(name: str) -> ModelConfig:
    """A fresh ModelConfig for a named size."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()
