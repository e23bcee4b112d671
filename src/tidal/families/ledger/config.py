"""Settings of the long-horizon family "ledger" (``env.args`` when ``env.name = "ledger"``)."""

from pydantic import Field, model_validator

from tidal.config_section import Section


class LedgerConfig(Section):
    num_files: int = Field(24, ge=2, le=676)
    """Files per task, read one by one; the episode's length in tokens grows with it (~60 tokens
    a file). Choose it so that an episode is several context windows long. At most 676 (files are
    named by two letters)."""
    min_ops: int = Field(2, ge=1)
    """Fewest steps of f hidden in the files (each in its own file)."""
    max_ops: int = Field(2, ge=1)
    """Most steps of f hidden in the files (the longest turn, a submit, grows with it)."""
    op_zone: float = Field(0.5, gt=0.0, le=1.0)
    """Steps sit in the first this-fraction of the files, so they are read long before f is
    written and lie many windows back by then (0.5 = the first half)."""
    filler_lines: int = Field(1, ge=0, le=8)
    """Lines of unrelated code in each file besides its step (bulk that fills the window)."""
    num_tests: int = Field(6, ge=1)
    """Hidden test cases of f."""
    heldout_buckets: int = Field(10, ge=2)
    """1 in this many specs (by a hash of the spec) is held out; never trained on."""
    corpus_window: int = Field(384, ge=272)
    """Context window of the demonstrations the mid-training corpus renders, tokens (the
    environment's build_corpus): match the RL run's harness.context_window. At least 272: a
    file, the submit turn and a summary must fit in one context."""
    summary_slip_rate: float = Field(0.08, ge=0.0, lt=1.0)
    """Demonstration realism: the chance that each summary the scripted expert writes drops a
    step or garbles one (the expert then trusts its own summary, so the episode fails). The
    mid-trained model thus loses facts sometimes, and RL on the episode's reward fixes it.
    0 = perfect summaries."""

    @model_validator(mode="after")
    def _check(self) -> "LedgerConfig":
        if self.min_ops > self.max_ops:
            raise ValueError(f"ledger min_ops ({self.min_ops}) exceeds max_ops ({self.max_ops})")
        if self.max_ops > max(1, int(self.num_files * self.op_zone)):
            raise ValueError(
                f"ledger max_ops ({self.max_ops}) does not fit in the first {self.op_zone:.0%} of "
                f"{self.num_files} files; raise num_files or op_zone, or lower max_ops"
            )
        return self
