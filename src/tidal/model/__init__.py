"""Qwen3-architecture decoder (dense and sparse MoE), Hugging Face checkpoint I/O, tokenizers.

Contract used by the engine and the trainer (implemented in qwen3.py / checkpoint.py):

    model = build_model(cfg: ModelConfig) -> CausalLM        # random init, cfg.dtype
    model = from_pretrained(path, dtype=None) -> CausalLM    # config.json + *.safetensors
    save_pretrained(model, path)                             # HF-compatible folder, atomic
    logits = model(input_ids)                                # [B, T] -> [B, T, vocab]
    logits, experts = model(input_ids, return_experts=True)  # experts: [B, T, layers, k] (MoE)
    logits = model(input_ids, positions=pos, cache=kv, slots=slots)   # KV-cached (engine)
    logits = model(input_ids, replay_experts=experts)        # MoE router replay (trainer)
"""
