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
    # The same model as a Llama (no q/k norms; written as model_type "llama"), with Llama-style
    # RoPE theta and norm eps (SmolLM2's) so the config plumbing is exercised.
    "tiny-llama": lambda: ModelConfig(qk_norm=False, rope_theta=100000.0, rms_norm_eps=1e-5),
    # Same trunk, every layer a sparse MoE: 8 experts, top-2 (router replay, expert capture).
    "tiny-moe": lambda: ModelConfig(num_experts=8, num_experts_per_tok=2),
    # ~24M-param dense model for throughput benchmarks.
    "small": lambda: ModelConfig(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
    ),
    # The GPU numerics benchmark's MoE models (tidal bench numerics-gpu --bench.size tiny|smoke|1b):
    # untied lm_head, RoPE theta 1e6 and head sizes that are powers of two (the Triton kernels').
    # CPU runs and tests, also through Triton's interpreter (2 layers, hidden 64).
    "numerics-gpu-tiny": lambda: _gpu_moe(hidden_size=64, num_attention_heads=4, head_dim=16,
                                          num_experts=8, num_experts_per_tok=2,
                                          moe_intermediate_size=32, num_hidden_layers=2),
    # GPU smoke run: every kernel path at once, in seconds.
    "numerics-gpu-smoke": lambda: _gpu_moe(vocab_size=4096, hidden_size=256, num_attention_heads=4,
                                           head_dim=64, num_experts=8, num_experts_per_tok=2,
                                           moe_intermediate_size=128, num_hidden_layers=2),
    # The GPU benchmark: ~2.1B parameters (Qwen3-30B-A3B's layer shapes, fewer layers/experts).
    "numerics-gpu-1b": lambda: _gpu_moe(vocab_size=32768, hidden_size=2048, num_hidden_layers=12,
                                        num_attention_heads=16, num_key_value_heads=4,
                                        head_dim=128, num_experts=32, num_experts_per_tok=4,
                                        moe_intermediate_size=768),
}


def _gpu_moe(**sizes) -> ModelConfig:
    """What the numerics-gpu presets share."""
    shared = dict(num_key_value_heads=2, rope_theta=1_000_000.0, max_position_embeddings=1024,
                  tie_word_embeddings=False, dtype="bfloat16")
    return ModelConfig(**{**shared, **sizes})


def preset(name: str) -> ModelConfig:
    """A fresh ModelConfig for a named size."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()
