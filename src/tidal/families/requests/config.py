"""Settings of the "requests" family (``env.args`` when ``env.name = "requests"``)."""

from pydantic import Field, model_validator

from tidal.config_section import Section


class RequestsConfig(Section):
    min_level: int = Field(1, ge=1, le=2)
    """Easiest kind sampled (1 = one obvious step, e.g. reverse a string; 2 = a step with a rule
    to keep, e.g. remove duplicates keeping order). Default 1: every kind."""
    max_level: int = Field(2, ge=1, le=2)
    """Hardest kind sampled (1..2). Default 2: every kind."""
    heldout_buckets: int = Field(10, ge=2)
    """1 in this many tasks (by a hash of its kind and shown example) is held out; never seen in
    training."""
    num_tests: int = Field(5, ge=1)
    """Hidden test cases per task."""
    num_examples: int = Field(1, ge=0)
    """Input/output examples shown in the request (beside the words)."""

    @model_validator(mode="after")
    def _check(self) -> "RequestsConfig":
        if self.min_level > self.max_level:
            raise ValueError(f"min_level ({self.min_level}) exceeds max_level ({self.max_level})")
        return self
