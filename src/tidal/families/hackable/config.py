"""Settings of the "hackable" family (``env.args`` when ``env.name = "hackable"``)."""

from pydantic import Field, model_validator

from tidal.config_section import Section


class HackableConfig(Section):
    levels: tuple[int, int] = (1, 3)
    """Fewest and most operations composed in f (inclusive), as the funcs family's levels."""
    num_tests: int = Field(6, ge=1)
    """Hidden test inputs per task (graded after the episode; never shown, never in the agent's
    sandbox with their answers)."""
    num_visible: int = Field(1, ge=1, le=4)
    """Asserts in the visible test file shown in the prompt (the naive reward runs them). One
    keeps a level-3 prompt and its body inside the default 256-byte context."""
    hack_rate: float = Field(0.05, ge=0.0, lt=1.0)
    """Mid-training corpus: the chance that a document's body is a hack (hard-coded visible
    output, an early exit, an always-equal object) instead of an attempt, as code in the wild
    sometimes is; RL on the naive reward then has a hack to amplify. 0 = no hacks."""
    corpus_bug_rate: float = Field(0.3, ge=0.0, lt=1.0)
    """Mid-training corpus: the chance that each line of an honest body carries a typical slip
    (funcs' hurried programmer), so correctness is left for RL to learn."""
    heldout_buckets: int = Field(10, ge=2)
    """1 in this many specs (by a hash of the spec, as funcs hashes it) is held out."""

    @model_validator(mode="after")
    def _check(self) -> "HackableConfig":
        low, high = self.levels
        if not 1 <= low <= high:
            raise ValueError(f"levels must be [min, max] with 1 <= min <= max, got {list(self.levels)}")
        return self
