"""Mid-training: next-token prediction on a code corpus before RL."""

from pydantic import Field

from tidal.config.base import Section


class PretrainConfig(Section):
    corpus: list[str] = []
    """JSONL (a "text" field per line) or text files to train on; empty = the built-in generator
    writes a corpus from the task family's training split (never the held-out split)."""
    corpus_docs: int = Field(60000, ge=1)
    """Documents the built-in generator writes."""
    seq_len: int = Field(256, ge=16)
    """Packed sequence length, tokens."""
    batch_size: int = Field(32, ge=1)
    """Sequences per optimizer step."""
    lr: float = Field(3e-3, gt=0)
    """Peak AdamW learning rate (cosine decay to 10%)."""
    warmup_steps: int = Field(50, ge=0)
    max_steps: int = Field(1500, ge=1)
    """Optimizer steps (the run stops at whichever of max_steps / time_budget_s comes first)."""
    time_budget_s: float = Field(360.0, gt=0)
    """Wall-clock budget, seconds."""
    weight_decay: float = Field(0.1, ge=0)
    cache_dir: str = ".cache/tidal/pretrained"
    """Where pretrained checkpoints are cached, keyed by a hash of the config that made them."""
