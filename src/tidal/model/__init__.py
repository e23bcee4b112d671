"""Qwen3- and Llama-architecture decoder (dense; Qwen3 also sparse MoE), Hugging Face checkpoint
I/O, tokenizers.

Contract used by the engine and the trainer (implemented in qwen3.py / checkpoint.py):

    model = build_model(cfg: ModelConfig) -> CausalLM        # random init, cfg.dtype
    model = from_pretrained(path, dtype=None) -> CausalLM    # config.json + *.safetensors
    save_pretrained(model, path)                             # HF-compatible folder, atomic
    logits = model(input_ids)                                # [B, T] -> [B, T, vocab]
    logits, experts = model(input_ids, return_experts=True)  # experts: [B, T, layers, k] (MoE)
    logits = model(input_ids, positions=pos, cache=kv, slots=slots)   # KV-cached (engine)
    logits = model(input_ids, replay_experts=experts)        # MoE router replay (trainer)
"""

from tidal.model.checkpoint import CheckpointError, from_pretrained, save_pretrained
from tidal.model.config import ModelConfig
from tidal.model.kv_cache import KVCache
from tidal.model.presets import preset
from tidal.model.qwen3 import CausalLM, build_model
from tidal.model.tokenizer import ByteTokenizer, load_tokenizer

__all__ = [
    "ByteTokenizer",
    "CausalLM",
    "CheckpointError",
    "KVCache",
    "ModelConfig",
    "build_model",
    "from_pretrained",
    "load_tokenizer",
    "preset",
    "save_pretrained",
]
