"""Mid-training: next-token prediction on a code corpus before RL."""

from typing import Literal

from pydantic import Field, field_validator

from tidal.config_section import DtypeName, Section


class PretrainConfig(Section):
    corpus: list[str] = []
    """JSONL (a "text" field per line) or text files (one document per file) to train on (one
    path alone is a list of one: ``--pretrain.corpus data.jsonl``); empty = the selected
    environment writes its own corpus (``EnvironmentSpec.build_corpus``, from its training
    split, never the held-out split)."""
    corpus_docs: int = Field(60000, ge=1)
    """Documents the environment's build_corpus writes (unused when ``corpus`` names files)."""
    seq_len: int = Field(288, ge=16)
    """Row length, tokens (the model reads seq_len - 1 and predicts the next of each). 288: two
    of the funcs corpus's documents (77-227 tokens) fill a row ~97% with whole documents."""
    packing: Literal["stream", "documents"] = "documents"
    """How documents become rows: "stream" = concatenated and cut every seq_len tokens (a
    document may start in one row and end in the next); "documents" = each document whole in
    one row, rows filled best-fit and the rest padded, untrained (corpus.pack_documents). With
    whole documents the default recipe's model reaches the held-out pass@1 it had from stream
    packing in a quarter of the tokens (docs/results/notes-midtraining.md)."""
    batch_size: int = Field(8, ge=1)
    """Sequences per optimizer step."""
    lr: float = Field(3e-3, gt=0)
    """Peak AdamW learning rate (cosine decay to 10%)."""
    warmup_steps: int = Field(50, ge=0)
    """Linear learning-rate warm-up, optimizer steps."""
    max_steps: int = Field(600, ge=1)
    """Optimizer steps (the run stops at whichever of max_steps / time_budget_s comes first).
    The default recipe stops on steps, so a run is reproducible bit for bit (same config, seed
    and machine) and a machine shared with other work gets the same model, only later; a run
    cut by a time budget gets a model that depends on the machine's load
    (docs/results/notes-midtraining.md)."""
    time_budget_s: float = Field(1200.0, gt=0)
    """Wall-clock budget of the training steps, seconds: a safety net (building the corpus and
    saving are outside it), about 4x what the default steps take on 2 free cores of the slowest
    CPU measured (an AVX2-only AMD EPYC in fp32), so a machine shared with other work still
    ends on steps and reproducibly. The learning rate is a
    function of the step alone until the last 10% of the budget (loop.BUDGET_COOLDOWN); a run
    still going then anneals against the clock, so one cut by its budget still ends at the low
    learning rate. Such a run depends on the machine's speed and is not reproducible: its
    metrics say ``budget_bound`` and a warning is logged."""
    weight_decay: float = Field(0.1, ge=0)
    """AdamW weight decay, applied to matrices (embeddings, projections) only, not norms."""
    dtype: DtypeName = "float32"
    """Compute dtype of the forward pass (CPU/GPU autocast); weights and optimizer state stay fp32.
    float32 by default: at the default shapes on a CPU with native bf16, bf16 autocast was 1.38x
    faster but its model much weaker (final loss 0.148 against 0.138, held-out pass@1 before RL
    0.05 against 0.193; docs/results/notes-midtraining.md). "auto" = bfloat16 where this CPU computes bf16 natively (avx512_bf16
    or AMX), else float32 (emulated bf16 makes a matmul ~4x slower than fp32)."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the global gradient norm to this value."""
    log_every: int = Field(10, ge=1)
    """Append a line to pretrain_metrics.jsonl every this many optimizer steps (and the last)."""
    cache_dir: str = ".cache/tidal/pretrained"
    """Where pretrained checkpoints are cached, keyed by a hash of the config that made them."""

    @field_validator("corpus", mode="before")
    @classmethod
    def _one_path_is_a_list(cls, value):
        return [value] if isinstance(value, str) else value
